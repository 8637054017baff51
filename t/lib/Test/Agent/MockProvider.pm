package Test::Agent::MockProvider;

=head1 NAME

Test::Agent::MockProvider - a scripted LLM provider for the test suite

=head1 SYNOPSIS

    use Test::Agent::MockProvider;

    my $mock = Test::Agent::MockProvider->new;    # or new(port => $port)

    $mock->script({ text => 'Hello world', chunks => 5, delay => 0.1 },
                  { tool_calls => [{ id => 'call_1', name => 'get_weather',
                                     arguments => '{"city":"Paris"}' }],
                    chunks => 4 });

    # ... point nginx at $mock->url, run a turn ...

    my $reqs = $mock->wait_requests(2, 5);
    is($reqs->[0]{json}{model}, 'gpt-test');

=head1 DESCRIPTION

A forked child process listening on 127.0.0.1 that answers each provider
request with the next scripted reply, byte for byte in the provider's wire
format, and records every request.  The test drives it through the methods
below (internally: HTTP under C</__mock/> on the same port).

The API is chosen by the request path (suffix match, so a base URL prefix
is fine); each API has a framer package that produces its bytes:

    /v1/chat/completions   openai_chat   Test::Agent::MockProvider::OpenAIChat
    /v1/responses          openai_responses
                           Test::Agent::MockProvider::OpenAIResponses
    /v1/messages           anthropic_messages
                           Test::Agent::MockProvider::Anthropic

A new API is a new framer package registered in
C<%Test::Agent::MockProvider::Server::API>; the interface is described
in Test::Agent::MockProvider::Framer.  Any other path answers 404 with a
JSON error, as an unknown URL does on a real provider, and consumes no
reply.  A method other than POST gets 405.

=head1 REPLY SCRIPT

Each reply is a hash.  Every request to a known API path pops one; an
empty queue answers 500 with error code C<empty_queue>.  Strings are Perl
character strings.

=over

=item Text

C<< { text => 'Hello world', chunks => 5, delay => 0.1 } >>: the text
split into C<chunks> content deltas (default 1), C<delay> seconds between
any two SSE events of the stream (default 0).

=item Tool calls

C<< { tool_calls => [{ id => 'call_1', name => 'get_weather',
arguments => '{"city":"Paris"}' }, ...], chunks => 4 } >>: parallel calls
in order, each announced with its id and name, then its arguments split
into C<chunks> pieces (a call's own C<chunks> overrides; C<arguments> may
be a hash, sent as canonical JSON; C<index> overrides the position).
C<text> may come too and is streamed first.  C<finish_reason> defaults to
C<tool_calls> with calls, C<stop> without.

=item Reasoning (OpenAI Chat)

C<< reasoning => 'text' >>: C<reasoning_content> deltas (in C<chunks>)
before the text, as DeepSeek and vLLM stream them.

=item Reasoning and hosted tools (OpenAI Responses)

C<< reasoning => 'summary' >> (or parts, or C<< { summary =>,
encrypted_content => } >>) and C<< web_search => { query =>, url => } >>
(or a list): output items before the text; see
Test::Agent::MockProvider::OpenAIResponses.

=item Thinking and hosted tools (Anthropic Messages)

C<< thinking => 'text' >> (with C<signature>) and C<< web_search =>
{ query =>, results => [...], citations => [...] } >>: content blocks
before the text; see Test::Agent::MockProvider::Anthropic.
C<< content => [{ type => 'thinking', ... }, ...] >>: any content blocks,
each given whole as the unstreamed API returns it, fields the module does
not know included, streamed as the API streams them.

=item Usage

C<< usage => { prompt_tokens => 42, completion_tokens => 7 } >> (defaults
10 and 5; C<total_tokens> defaults to the sum; C<cached_tokens>,
C<reasoning_tokens> optional; any count may be C<< { raw => TEXT } >>,
the JSON text sent in its place).  As on OpenAI, the usage chunk
(C<"choices":[]>) is sent only when the request has
C<stream_options.include_usage>; C<< include_usage => 1 | 0 >> forces it.

=item Other content fields

C<model> (default: the request's), C<id> (default: random
C<chatcmpl-...>), C<< headers => { name => value } >> added to the
response, C<< raw => [$event, ...] >> sent verbatim instead of the
framer's events (one HTTP chunk each; for malformed or split events).

=item HTTP error

C<< { status => 429, retry_after => 2 } >>: a JSON error body in the API's
format, defaults by status (OpenAI 429: type C<requests>, code
C<rate_limit_exceeded>); C<< error => { message =>, type =>, code =>,
param => } >> overrides fields, C<body> replaces the whole body.

=item Stream faults

Counts are SSE events (= HTTP chunks), the role chunk, finish chunk,
usage chunk and C<[DONE]> included.

C<< error_after => N >>: N events, then the provider's mid-stream error
event (C<error> overrides its fields; for OpenAI Chat, fields beyond
C<message>, C<type>, C<param> and C<code>, like Groq's
C<failed_generation>, follow them), then the stream ends properly
without C<[DONE]>.

C<< cut_after => N >>: N events, then the socket is closed: no C<[DONE]>,
no terminating zero-length chunk.  With C<< reset => 1 >> it is reset (RST).

C<< stall_after => N >>: headers and N events, then nothing; the
connection is held open until the client closes it or C<release>, which
closes it like a cut.  C<< stall_head => 1 >>: not even the headers.

C<< pause_after => N >> (or C<[N, M, ...]>): stop after N events until
C<release>, then go on.  C<< latency => $s >>: wait before the headers.

=back

Without C<"stream": true> in the request, the reply is a non-streamed
C<chat.completion> JSON object, as the real API would send.

=head1 REQUEST RECORDS

C<requests> returns hashes, in arrival order: C<index>, C<method>,
C<uri>, C<path>, C<version>, C<headers> (lowercase names), C<body> (raw
bytes), C<json> (decoded body or undef), C<api>, C<reply> (the scripted
reply or undef), C<status>, C<sent> (events sent), C<received_at>,
C<finished> / C<finished_at> (the reply went out whole),
C<client_closed> / C<closed_at> (the client closed first), C<paused>,
C<stalled>, C<cut>.  Times are Time::HiRes::time in the same clock as the
test's.

=head1 METHODS

C<new(port =E<gt> $port, default =E<gt> sub { my ($req) = @_; ... })>
(C<default>, if given, makes the reply for a request that finds the queue
empty, from its record; the demo's offline provider uses it), C<port>, C<url>, C<pid>, C<script(@replies)>,
C<requests>, C<pending> (replies left in the queue),
C<wait_requests($n, $timeout)>, C<wait_paused($index, $timeout)>,
C<release($index)> (all paused or stalled streams without an index;
returns how many), C<wait_closed($index, $timeout)>, C<reset>, C<stop>.

=cut

use v5.36;
use Carp qw(croak);
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX ();
use Time::HiRes qw(time sleep);

use Test::Agent::MockProvider::Server;

my $JSON = JSON::PP->new->utf8->canonical;

my %REPLY_KEYS = map { $_ => 1 } qw(
    text chunks delay tool_calls finish_reason usage include_usage model id
    headers raw status retry_after error body error_after cut_after reset
    stall_after stall_head pause_after latency reasoning web_search
    thinking signature content);

my %TOOL_CALL_KEYS = map { $_ => 1 } qw(id name arguments chunks index);

sub new ($class, %args) {
    my ($listen, $ppid, $pid, $self);

    # bound before the fork: the port is known and accepting on return
    $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                    LocalPort => $args{port} // 0,
                                    Proto => 'tcp', Listen => 128,
                                    ReuseAddr => 1)
        or croak "mock provider: cannot listen on 127.0.0.1:"
                 . ($args{port} // 0) . ": $@";

    $ppid = $$;
    $pid = fork // croak "mock provider: fork: $!";

    if ($pid == 0) {
        close_inherited(fileno $listen);

        my $ok = eval {
            Test::Agent::MockProvider::Server->new(listen => $listen,
                                                   ppid => $ppid,
                                                   default => $args{default})
                ->run;
            1;
        };
        warn "mock provider: $@" unless $ok;

        # _exit: the test's END blocks and Test::More belong to the parent
        POSIX::_exit($ok ? 0 : 1);
    }

    $self = bless { pid => $pid, owner => $$, port => $listen->sockport },
                  $class;
    close $listen;

    $self->_control(GET => '/__mock/requests');

    return $self;
}

# The child keeps only its listening socket and stderr: a client socket
# the test holds would otherwise stay open after the test closes it, and
# a copy of the TAP pipe would keep prove waiting.  Inherited descriptors
# are pointed at /dev/null rather than closed: Perl handles of the test
# still own those numbers, and PerlIO would never really close a new
# socket that got one of them.
sub close_inherited ($keep) {
    my ($max, $null);

    open STDIN, '<', '/dev/null';
    open STDOUT, '>', '/dev/null';
    open $null, '+<', '/dev/null' or return;

    $max = POSIX::sysconf(POSIX::_SC_OPEN_MAX()) // 1024;
    $max = 4096 if $max > 4096;

    for my $fd (3 .. $max - 1) {
        next if $fd == $keep || $fd == fileno $null;

        # open?  (POSIX::fcntl wants a handle, dup takes a number)
        my $probe = POSIX::dup($fd);
        next unless defined $probe;
        POSIX::close($probe);

        POSIX::dup2(fileno $null, $fd);
    }
}

sub port ($self) { return $self->{port} }
sub pid ($self) { return $self->{pid} }
sub url ($self) { return "http://127.0.0.1:$self->{port}" }

sub script ($self, @replies) {
    # a mistyped key would otherwise be ignored silently
    for my $r (@replies) {
        croak 'mock provider: a reply must be a hash' unless ref $r eq 'HASH';

        my @bad = grep { !$REPLY_KEYS{$_} } keys %$r;
        for my $tc (@{ $r->{tool_calls} // [] }) {
            push @bad, grep { !$TOOL_CALL_KEYS{$_} } keys %$tc;
        }

        croak "mock provider: unknown reply key(s): @bad" if @bad;
    }

    return $self->_control(POST => '/__mock/script', \@replies)->{queued};
}

sub requests ($self) {
    return $self->_control(GET => '/__mock/requests')->{requests};
}

sub pending ($self) {
    return $self->_control(GET => '/__mock/requests')->{queued};
}

sub wait_requests ($self, $n, $timeout = 5) {
    my $reqs;

    $self->_wait(sub { $reqs = $self->requests; @$reqs >= $n }, $timeout);

    return $reqs;
}

sub wait_paused ($self, $index, $timeout = 5) {
    return $self->_wait(sub {
        my $r = $self->requests->[$index];
        $r && ($r->{paused} || $r->{stalled});
    }, $timeout);
}

sub wait_closed ($self, $index, $timeout = 5) {
    return $self->_wait(sub {
        my $r = $self->requests->[$index];
        $r && $r->{client_closed};
    }, $timeout);
}

sub release ($self, $index = undef) {
    return $self->_control(POST => '/__mock/release',
                           { defined $index ? (request => $index) : () })
               ->{released};
}

sub reset ($self) {
    $self->_control(POST => '/__mock/reset');
    return;
}

sub stop ($self) {
    my $pid = delete $self->{pid} or return;

    kill 'TERM', $pid;

    for (1 .. 100) {
        return if waitpid($pid, POSIX::WNOHANG()) != 0;
        sleep 0.02;
    }

    kill 'KILL', $pid;
    waitpid($pid, 0);
}

sub DESTROY ($self) {
    # a process forked from the test must not stop the test's mock
    local ($?, $!, $@);
    $self->stop if $$ == $self->{owner};
}

sub _wait ($self, $cond, $timeout) {
    my $deadline = time + $timeout;

    while (1) {
        return 1 if $cond->();
        return 0 if time >= $deadline;
        sleep 0.02;
    }
}

sub _control ($self, $method, $path, $data = undef) {
    my ($body, $s, $msg, $resp, $sel, $deadline);

    croak 'mock provider: stopped' unless $self->{pid};

    $body = defined $data ? $JSON->encode($data) : '';
    $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                               PeerPort => $self->{port},
                               Proto => 'tcp', Timeout => 5)
        or croak "mock provider: cannot connect to port $self->{port}: $@";

    $msg = "$method $path HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           . "Connection: close\r\nContent-Type: application/json\r\n"
           . 'Content-Length: ' . length($body) . "\r\n\r\n$body";

    while (length $msg) {
        my $n = syswrite($s, $msg) // croak "mock provider: write: $!";
        substr($msg, 0, $n, '');
    }

    $resp = '';
    $sel = IO::Select->new($s);
    # a mock busy with a long reply answers between its writes, and late
    # on a loaded machine
    $deadline = time + 30;

    while (1) {
        my $left = $deadline - time;
        croak "mock provider: no answer to $method $path"
            unless $left > 0 && $sel->can_read($left);

        my $n = sysread($s, $resp, 65536, length $resp)
            // croak "mock provider: read: $!";
        last if $n == 0;
    }

    my ($head, $rbody) = split /\r\n\r\n/, $resp, 2;
    croak "mock provider: $method $path: " . ($rbody // $head)
        unless $head =~ m{^HTTP/1\.1 200 };

    return $JSON->decode($rbody);
}

1;
