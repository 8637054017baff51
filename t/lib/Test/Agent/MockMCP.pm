package Test::Agent::MockMCP;

=head1 NAME

Test::Agent::MockMCP - an MCP server over Streamable HTTP for the tests

=head1 SYNOPSIS

    my $mcp = Test::Agent::MockMCP->new;          # or new(port => $port)
    ... proxy_pass http://127.0.0.1:$port/mcp ...
    my @reqs = $mcp->requests;                    # every JSON-RPC message
    $mcp->restart;                                # same port, no sessions

=head1 DESCRIPTION

A forked server on 127.0.0.1 that speaks the Streamable HTTP transport
of MCP (revision 2025-06-18) at any path: a POST of one JSON-RPC message
answered by JSON or by an SSE stream, C<Mcp-Session-Id> given by
initialize and required on every later message (404 for one it does not
know, 400 without one), C<MCP-Protocol-Version> checked, C<Accept> must
name both application/json and text/event-stream (406), notifications
get 202.  Each connection is served by a child of its own, so calls run
side by side; what they share (sessions, the log, calls already seen)
lives in files of a directory.

Tools: C<echo> (its arguments, _meta and Idempotency-Key back as JSON
text), C<add> (structuredContent), C<count> (SSE: C<n> progress
notifications 0.3 s apart, then the result), C<fail> (isError),
C<broken> (a JSON-RPC error), C<remove> (for approval), C<hang> (the
first call of an id waits 60 s; another with the same id answers at
once), C<secret> (left out by the tests' tools=).  tools/list answers in
two pages, the second as an SSE stream.

C<confirm> asks the client (elicitation/create, on the call's SSE
stream, id C<el-PID>) whether to remove C<path>, waits up to 60 s for
the client's answer (a POST of the JSON-RPC response) and ends with a
text saying what it got: C<confirmed: CONTENT> (accept), C<declined>,
C<cancelled>, or C<stopped> once notifications/cancelled for the call
came.  What the server sent is logged too, with C<http> C<SENT>.

Hostile ones: C<stall> (or C<hush>) answers by an SSE stream of
C<: keep-alive> comments every 0.5 s and never a result; C<giveup> asks as C<confirm>
does, then gives its question up a second later as the SDK does when
its request times out (notifications/cancelled for it, on the stream)
and ends a second after that with C<gave up>; C<askend> asks and ends
the call a second later with C<ended>, without waiting for the answer.

Options of new: C<tools> (the list tools/list answers, in one page, in
place of the tools above; a name may repeat), C<list =E<gt> 'stall'>
(tools/list answered as C<stall> is), C<notes =E<gt> 'stall'>
(notifications but notifications/initialized, and answers of the
client, answered as C<stall> is).

A location for nginx.conf that reaches a server on C<$port>:

    Test::Agent::MockMCP::location('/mcp/files', $port)

=cut

use strict;
use warnings;

use Carp;
use Fcntl qw(:flock);
use File::Temp qw(tempdir);
use IO::Socket::INET;
use JSON::PP;
use POSIX ();
use Time::HiRes qw(sleep);

my $JSON = JSON::PP->new->canonical;

my @TOOLS = (
    { name => 'echo', description => 'Echoes its arguments',
      inputSchema => { type => 'object',
                       properties => { text => { type => 'string' } },
                       required => ['text'] } },
    { name => 'add', description => 'Adds two numbers',
      inputSchema => { type => 'object',
                       properties => { a => { type => 'number' },
                                       b => { type => 'number' } } } },
    { name => 'count', description => 'Counts slowly, with progress',
      inputSchema => { type => 'object',
                       properties => { n => { type => 'integer' } } } },
    { name => 'fail', description => 'Always fails',
      inputSchema => { type => 'object' } },
    { name => 'broken', description => 'Answers a JSON-RPC error',
      inputSchema => { type => 'object' } },
    { name => 'remove', description => 'Removes a file',
      inputSchema => { type => 'object',
                       properties => { path => { type => 'string' } } } },
    { name => 'hang', description => 'Takes a minute the first time',
      inputSchema => { type => 'object' } },
    { name => 'secret', description => 'Not for agents',
      inputSchema => { type => 'object' } },
    { name => 'confirm', description => 'Removes a file, if you confirm',
      inputSchema => { type => 'object',
                       properties => { path => { type => 'string' } } } },
);

sub new {
    my ($class, %args) = @_;

    my $self = bless { owner => $$, dir => tempdir(CLEANUP => 1),
                       port => $args{port}, opts => { %args } }, $class;

    $self->start;

    return $self;
}

sub port { $_[0]{port} }

# the internal location an agent_mcp names, proxying to 127.0.0.1:$port
sub location {
    my ($uri, $port, $more) = @_;

    $more //= '';

    return <<"EOF";
        location = $uri {
            internal;
            proxy_pass http://127.0.0.1:$port/mcp;
            proxy_http_version 1.1;
            proxy_buffering off;
            $more
        }
EOF
}

sub start {
    my ($self) = @_;

    mkdir "$self->{dir}/$_" for qw(sessions seen answers cancelled);

    my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                       LocalPort => $self->{port} // 0,
                                       Proto => 'tcp', Listen => 128,
                                       ReuseAddr => 1)
        or croak "mock mcp: cannot listen: $@";

    $self->{port} = $listen->sockport;

    my $pid = fork // croak "mock mcp: fork: $!";

    if ($pid == 0) {
        $SIG{CHLD} = 'IGNORE';
        open STDIN, '<', '/dev/null';
        open STDOUT, '>', '/dev/null';

        while (1) {
            my $c = $listen->accept or next;

            my $child = fork;
            next unless defined $child;

            if ($child == 0) {
                close $listen;
                eval { serve($self->{dir}, $c, $self->{opts}) };
                POSIX::_exit(0);
            }

            close $c;
        }
    }

    close $listen;
    $self->{pid} = $pid;
}

# a new server on the same port: it knows no session
sub restart {
    my ($self) = @_;

    $self->stop;
    unlink glob "$self->{dir}/sessions/*";
    $self->start;
}

sub stop {
    my ($self) = @_;

    my $pid = delete $self->{pid} or return;

    kill 'KILL', $pid;
    waitpid($pid, 0);
}

sub DESTROY {
    my ($self) = @_;

    local ($?, $!, $@);
    $self->stop if $$ == $self->{owner};
}

# every message received: { http => 'POST', session, version, accept,
# key (Idempotency-Key), status (answered), message }
sub requests {
    my ($self) = @_;

    open my $fh, '<', "$self->{dir}/requests.log" or return ();
    my @r = map { $JSON->decode($_) } <$fh>;

    return @r;
}

# the messages of a JSON-RPC method
sub calls {
    my ($self, $method) = @_;

    return grep { ($_->{message}{method} // '') eq $method } $self->requests;
}

# the messages of a method, once there is one (up to 5 s)
sub wait_calls {
    my ($self, $method) = @_;

    my $deadline = Time::HiRes::time() + 5;
    my @m;

    until (@m = $self->calls($method)) {
        last if Time::HiRes::time() > $deadline;
        sleep 0.05;
    }

    return @m;
}

sub record {
    my ($dir, $entry) = @_;

    open my $fh, '>>', "$dir/requests.log" or return;
    flock $fh, LOCK_EX;
    print $fh $JSON->encode($entry), "\n";
    close $fh;
}

sub write_file {
    my ($path, $data) = @_;

    open my $fh, '>', "$path.tmp" or return;
    print $fh $data;
    close $fh;
    rename "$path.tmp", $path;
}

sub read_file {
    my ($path) = @_;

    open my $fh, '<', $path or return '';
    local $/;
    return <$fh>;
}

# an SSE stream that sends nothing but comments, for up to 60 s
sub stall {
    my ($c) = @_;

    syswrite($c, "HTTP/1.1 200 OK\r\nConnection: close\r\n"
                 . "Content-Type: text/event-stream\r\n\r\n");

    for (1 .. 120) {
        syswrite($c, ": keep-alive\n\n") or return;
        sleep 0.5;
        POSIX::_exit(0) if getppid() == 1;
    }
}

sub serve {
    my ($dir, $c, $opts) = @_;

    $opts //= {};

    my ($head, $body) = ('', '');

    while ($head !~ /\r\n\r\n/) {
        sysread($c, $head, 4096, length $head) or return;
    }

    ($head, $body) = split /\r\n\r\n/, $head, 2;

    my ($method) = $head =~ /^(\S+)/;
    my %h;
    for (split /\r\n/, $head) {
        $h{lc $1} = $2 if /^([^:]+):\s*(.*)$/;
    }

    my $len = $h{'content-length'} // 0;
    while (length $body < $len) {
        sysread($c, $body, $len - length $body, length $body) or return;
    }

    my $msg = eval { $JSON->decode($body) };
    my $entry = { http => $method, session => $h{'mcp-session-id'},
                  version => $h{'mcp-protocol-version'},
                  accept => $h{accept}, key => $h{'idempotency-key'},
                  message => $msg };

    my $reply = sub {
        my ($status, $type, $data, @more) = @_;
        $entry->{status} = $status;
        record($dir, $entry);
        my $text = { 200 => 'OK', 202 => 'Accepted', 400 => 'Bad Request',
                     404 => 'Not Found', 405 => 'Method Not Allowed',
                     406 => 'Not Acceptable' }->{$status};
        my $out = "HTTP/1.1 $status $text\r\nConnection: close\r\n";
        $out .= "$_\r\n" for @more;
        $out .= "Content-Type: $type\r\n" if $type;
        $out .= 'Content-Length: ' . length($data) . "\r\n"
            if defined $data;
        $out .= "\r\n" . ($data // '');
        syswrite($c, $out);
    };

    return $reply->(405, undef, '') if $method ne 'POST';

    return $reply->(406, undef, '')
        unless ($h{accept} // '') =~ m{application/json}
               && ($h{accept} // '') =~ m{text/event-stream};

    return $reply->(400, undef, '') unless ref $msg eq 'HASH';

    my $rpc = $msg->{method} // '';

    if ($rpc eq 'initialize') {
        my $sid = sprintf('s%d-%d', $$, int(rand(1e9)));
        open my $fh, '>', "$dir/sessions/$sid";
        close $fh;
        return $reply->(200, 'application/json', $JSON->encode({
            jsonrpc => '2.0', id => $msg->{id},
            result => { protocolVersion => '2025-06-18',
                        capabilities => { tools => {} },
                        serverInfo => { name => 'mock', version => '1' } } }),
            "Mcp-Session-Id: $sid");
    }

    my $sid = $h{'mcp-session-id'};

    return $reply->(400, undef, '') unless defined $sid;
    return $reply->(404, undef, '') unless -e "$dir/sessions/$sid";
    return $reply->(400, undef, '')
        unless ($h{'mcp-protocol-version'} // '') eq '2025-06-18';

    my $note = ($opts->{notes} // '') eq 'stall'
               && $rpc ne 'notifications/initialized'
               ? sub { $entry->{status} = 200; record($dir, $entry);
                       stall($c) }
               : sub { $reply->(202, undef, '') };

    if (!exists $msg->{method} && exists $msg->{id}) {
        # an answer of the client to a request of ours
        write_file("$dir/answers/" . unpack('H*', $msg->{id}),
                   $JSON->encode($msg));
        return $note->();
    }

    if ($rpc eq 'notifications/cancelled') {
        write_file("$dir/cancelled/"
                   . unpack('H*', $msg->{params}{requestId} // ''), '');
    }

    return $note->() unless exists $msg->{id};

    my $result = sub {
        $JSON->encode({ jsonrpc => '2.0', id => $msg->{id}, result => $_[0] });
    };

    if ($rpc eq 'tools/list' && ($opts->{list} // '') eq 'stall') {
        $entry->{status} = 200;
        record($dir, $entry);
        return stall($c);
    }

    if ($rpc eq 'tools/list' && $opts->{tools}) {
        return $reply->(200, 'application/json',
                        $result->({ tools => $opts->{tools} }));
    }

    if ($rpc eq 'tools/list') {
        my $cursor = $msg->{params}{cursor};

        return $reply->(200, 'application/json',
                        $result->({ tools => [@TOOLS[0 .. 3]],
                                    nextCursor => 'page-2' }))
            unless defined $cursor;

        return $reply->(200, 'text/event-stream',
                        "event: message\ndata: "
                        . $result->({ tools => [@TOOLS[4 .. $#TOOLS]] })
                        . "\n\n");
    }

    return $reply->(200, 'application/json', $JSON->encode({
        jsonrpc => '2.0', id => $msg->{id},
        error => { code => -32601, message => 'Method not found' } }))
        if $rpc ne 'tools/call';

    my $name = $msg->{params}{name} // '';
    my $args = $msg->{params}{arguments} // {};
    my $text = sub {
        { content => [{ type => 'text', text => $_[0] }] }
    };

    if ($name eq 'echo') {
        return $reply->(200, 'application/json', $result->($text->(
            $JSON->encode({ args => $args, meta => $msg->{params}{_meta},
                            key => $h{'idempotency-key'},
                            rpc_id => $msg->{id} }))));
    }

    if ($name eq 'add') {
        my $sum = ($args->{a} // 0) + ($args->{b} // 0);
        return $reply->(200, 'application/json', $result->({
            content => [{ type => 'text', text => "$sum" }],
            structuredContent => { sum => $sum } }));
    }

    if ($name eq 'fail') {
        return $reply->(200, 'application/json', $result->({
            %{ $text->('disk full') }, isError => JSON::PP::true }));
    }

    if ($name eq 'broken') {
        return $reply->(200, 'application/json', $JSON->encode({
            jsonrpc => '2.0', id => $msg->{id},
            error => { code => -32000, message => 'backend exploded' } }));
    }

    if ($name eq 'remove') {
        return $reply->(200, 'application/json',
                        $result->($text->("removed $args->{path}")));
    }

    if ($name eq 'stall' || $name eq 'hush') {
        $entry->{status} = 200;
        record($dir, $entry);
        return stall($c);
    }

    if ($name eq 'giveup' || $name eq 'askend') {
        $entry->{status} = 200;
        record($dir, $entry);

        syswrite($c, "HTTP/1.1 200 OK\r\nConnection: close\r\n"
                     . "Content-Type: text/event-stream\r\n\r\n");

        my $send = sub {
            record($dir, { http => 'SENT', session => $sid,
                           message => $_[0] });
            syswrite($c, "event: message\ndata: " . $JSON->encode($_[0])
                         . "\n\n");
        };

        $send->({ jsonrpc => '2.0', id => "el-$$",
                  method => 'elicitation/create',
                  params => { message => 'Go on?',
                              requestedSchema => {
                                  type => 'object',
                                  properties => {
                                      go => { type => 'boolean' } } } } });
        sleep 1;

        if ($name eq 'giveup') {
            $send->({ jsonrpc => '2.0', method => 'notifications/cancelled',
                      params => { requestId => "el-$$",
                                  reason => 'Request timed out' } });
            sleep 1;
        }

        $send->(decode_json($result->($text->(
            $name eq 'giveup' ? 'gave up' : 'ended'))));
        return;
    }

    if ($name eq 'confirm') {
        $entry->{status} = 200;
        record($dir, $entry);

        syswrite($c, "HTTP/1.1 200 OK\r\nConnection: close\r\n"
                     . "Content-Type: text/event-stream\r\n\r\n");

        my $ask = { jsonrpc => '2.0', id => "el-$$",
                    method => 'elicitation/create',
                    params => { message => "Remove $args->{path}?",
                                requestedSchema => {
                                    type => 'object',
                                    properties => {
                                        confirm => { type => 'boolean' } },
                                    required => ['confirm'] } } };

        record($dir, { http => 'SENT', session => $sid, message => $ask });
        syswrite($c, "event: message\ndata: " . $JSON->encode($ask)
                     . "\n\n");

        my $answer = "$dir/answers/" . unpack('H*', "el-$$");
        my $stop = "$dir/cancelled/" . unpack('H*', $msg->{id});
        my $said = 'no answer';

        for (1 .. 600) {
            if (-e $stop) {
                $said = 'stopped';
                last;
            }

            if (-e $answer) {
                my $got = eval { $JSON->decode(read_file($answer)) } // {};
                my $action = $got->{result}{action} // 'none';

                $said = $action eq 'accept'
                        ? 'confirmed: ' . $JSON->encode($got->{result}{content})
                        : $action eq 'decline' ? 'declined'
                        : $action eq 'cancel' ? 'cancelled' : "got $action";
                last;
            }

            sleep 0.1;
            POSIX::_exit(0) if getppid() == 1;
        }

        syswrite($c, "event: message\ndata: "
                     . $result->($text->($said)) . "\n\n");
        return;
    }

    if ($name eq 'count' || $name eq 'hang') {
        $entry->{status} = 200;
        record($dir, $entry);

        syswrite($c, "HTTP/1.1 200 OK\r\nConnection: close\r\n"
                     . "Content-Type: text/event-stream\r\n\r\n");

        my $token = $msg->{params}{_meta}{progressToken};
        my $event = sub {
            syswrite($c, "event: message\ndata: "
                         . $JSON->encode($_[0]) . "\n\n");
        };

        if ($name eq 'hang') {
            my $seen = "$dir/seen/" . unpack('H*', $msg->{id});
            if (!-e $seen) {
                open my $fh, '>', $seen;
                close $fh;
                $event->({ jsonrpc => '2.0',
                           method => 'notifications/progress',
                           params => { progressToken => $token,
                                       progress => 0 } });
                for (1 .. 600) {
                    sleep 0.1;
                    POSIX::_exit(0) if getppid() == 1;
                }
            }
            $event->(decode_json($result->($text->('woke up'))));
            return;
        }

        my $n = $args->{n} // 3;

        for my $i (1 .. $n) {
            $event->({ jsonrpc => '2.0', method => 'notifications/progress',
                       params => { progressToken => $token, progress => $i,
                                   total => $n,
                                   message => "step $i of $n" } });
            sleep 0.3;
        }

        $event->(decode_json($result->($text->("counted to $n"))));
        return;
    }

    return $reply->(200, 'application/json', $result->({
        %{ $text->("unknown tool $name") }, isError => JSON::PP::true }));
}

1;
