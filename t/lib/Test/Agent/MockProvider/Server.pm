package Test::Agent::MockProvider::Server;

# The mock's child process: one IO::Select loop, a small state machine per
# connection (head -> body -> reply -> head again on keep-alive) and a
# timer per connection for scripted delays.  Nothing blocks, so a stalled
# or paused stream never holds up another request.
#
# A reply is compiled into a list of steps, run in order:
#   [wait => $s]   [head => $status, \@headers, $length]   [body => $bytes]
#   [event => $bytes] (one SSE event, one HTTP chunk)      [pause] [stall]
#   [cut => $reset]   [end]

use v5.36;
use Errno qw(EAGAIN EINTR EWOULDBLOCK);
use IO::Select;
use JSON::PP;
use Socket qw(IPPROTO_TCP SOL_SOCKET SO_LINGER TCP_NODELAY);
use Time::HiRes qw(time);

use Test::Agent::MockProvider::Framer;
use Test::Agent::MockProvider::OpenAIChat;
use Test::Agent::MockProvider::OpenAIResponses;
use Test::Agent::MockProvider::Anthropic;

# Provider APIs by path suffix (a base URL may add a prefix), each with
# its own framer package; any other path answers 404.
our %API = (
    '/v1/chat/completions' => 'Test::Agent::MockProvider::OpenAIChat',
    '/v1/responses'        => 'Test::Agent::MockProvider::OpenAIResponses',
    '/v1/messages'         => 'Test::Agent::MockProvider::Anthropic',
);

use constant DEFAULT_FRAMER => 'Test::Agent::MockProvider::Framer';

my $JSON = JSON::PP->new->utf8->canonical->allow_nonref;

my %REASON = (
    100 => 'Continue', 200 => 'OK', 400 => 'Bad Request',
    401 => 'Unauthorized', 403 => 'Forbidden', 404 => 'Not Found',
    405 => 'Method Not Allowed', 408 => 'Request Timeout',
    409 => 'Conflict', 413 => 'Payload Too Large',
    422 => 'Unprocessable Entity', 429 => 'Too Many Requests',
    500 => 'Internal Server Error', 502 => 'Bad Gateway',
    503 => 'Service Unavailable', 504 => 'Gateway Timeout',
    529 => 'Site Overloaded',
);

sub new ($class, %args) {
    return bless {
        listen  => $args{listen},
        ppid    => $args{ppid},
        conns   => {},    # "$fh" => connection state
        queue   => [],    # scripted replies not used yet
        records => [],    # one per provider request, in arrival order
        default => $args{default},  # sub ($req) -> reply, for an empty queue
    }, $class;
}

sub run ($self) {
    local $SIG{PIPE} = 'IGNORE';

    srand();
    $self->{listen}->blocking(0);

    # polling getppid is how the child notices that its test died without
    # calling stop: no mock outlives its test
    while (getppid() == $self->{ppid}) {
        my @conns = values %{ $self->{conns} };
        my $r = IO::Select->new($self->{listen}, map { $_->{fh} } @conns);
        my $w = IO::Select->new(map { $_->{fh} }
                                grep { length $_->{wbuf} } @conns);

        my ($rr, $ww) = IO::Select->select($r, $w->count ? $w : undef,
                                           undef, $self->timeout);

        for my $fh (@{ $ww // [] }) {
            my $c = $self->{conns}{"$fh"} or next;
            $self->flush($c);
            $self->step($c);
        }

        for my $fh (@{ $rr // [] }) {
            if ($fh == $self->{listen}) {
                $self->on_accept;
                next;
            }

            my $c = $self->{conns}{"$fh"} or next;
            $self->on_read($c);
        }

        for my $c (values %{ $self->{conns} }) {
            $self->step($c) if defined $c->{wake} && $c->{wake} <= time;
        }
    }
}

sub timeout ($self) {
    my $t = 0.2;

    for my $c (values %{ $self->{conns} }) {
        next unless defined $c->{wake};
        my $d = $c->{wake} - time;
        $t = $d if $d < $t;
    }

    return $t < 0 ? 0 : $t;
}

sub on_accept ($self) {
    while (my $fh = $self->{listen}->accept) {
        $fh->blocking(0);

        # one SSE event must leave at once, not wait for Nagle
        setsockopt($fh, IPPROTO_TCP, TCP_NODELAY, 1);

        # the connection's number, in each of its requests' records
        $self->{conns}{"$fh"} = { fh => $fh, rbuf => '', wbuf => '',
                                  state => 'head',
                                  serial => ++$self->{accepted} };
    }
}

sub on_read ($self, $c) {
    my $n = sysread($c->{fh}, $c->{rbuf}, 65536, length $c->{rbuf});

    if (!defined $n && ($! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR)) {
        return;
    }

    return $self->gone($c) unless $n;

    # while replying, input is kept for the next request on the connection
    $self->parse($c) if $c->{state} ne 'reply';
}

sub parse ($self, $c) {
    my ($req, $h);

    if ($c->{state} eq 'head') {
        my $end = index($c->{rbuf}, "\r\n\r\n");

        if ($end < 0) {
            $self->drop($c) if length $c->{rbuf} > 65536;
            return;
        }

        my ($line, @lines) = split /\r\n/, substr($c->{rbuf}, 0, $end + 4, '');
        my ($method, $uri, $minor) = $line =~ m{^(\S+) (\S+) HTTP/1\.([01])$}
            or return $self->drop($c);

        my %headers;
        for (@lines) {
            my ($k, $v) = /^([^:\s]+):\s*(.*?)\s*$/ or next;
            $k = lc $k;
            $headers{$k} = exists $headers{$k} ? "$headers{$k}, $v" : $v;
        }

        $c->{http11} = $minor == 1;
        $c->{keep} = $minor == 1
                     && ($headers{connection} // '') !~ /\bclose\b/i;
        $c->{req} = { method => $method, uri => $uri,
                      version => "HTTP/1.$minor", headers => \%headers };
        $c->{state} = 'body';

        if ($minor == 1 && lc($headers{expect} // '') eq '100-continue') {
            $self->output($c, "HTTP/1.1 100 Continue\r\n\r\n");
        }
    }

    $req = $c->{req};
    $h = $req->{headers};

    if (($h->{'transfer-encoding'} // '') =~ /chunked/i) {
        my ($body, $used) = eval { dechunk($c->{rbuf}) };
        return $self->drop($c) if $@;
        return unless defined $used;

        substr($c->{rbuf}, 0, $used, '');
        $req->{body} = $body;

    } else {
        my $len = $h->{'content-length'} // 0;
        return $self->drop($c) unless $len =~ /^\d+$/;
        return if length $c->{rbuf} < $len;

        $req->{body} = substr($c->{rbuf}, 0, $len, '');
    }

    $c->{state} = 'reply';
    $self->dispatch($c);
}

# A chunked request body: (body, bytes used), or () until it is complete.
sub dechunk ($buf) {
    my ($pos, $body) = (0, '');

    while (1) {
        my $eol = index($buf, "\r\n", $pos);
        return if $eol < 0;

        my ($size) = substr($buf, $pos, $eol - $pos) =~ /^([0-9a-fA-F]+)/
            or die "bad chunk size\n";
        $size = hex $size;
        $pos = $eol + 2;

        if ($size == 0) {
            # skip trailer lines up to the empty one
            while (1) {
                my $e = index($buf, "\r\n", $pos);
                return if $e < 0;
                my $empty = $e == $pos;
                $pos = $e + 2;
                return ($body, $pos) if $empty;
            }
        }

        return if length $buf < $pos + $size + 2;
        $body .= substr($buf, $pos, $size);
        $pos += $size + 2;
    }
}

sub api ($path) {
    for my $suffix (keys %API) {
        return $API{$suffix}
            if length $path >= length $suffix
               && substr($path, -length $suffix) eq $suffix;
    }

    return;
}

sub dispatch ($self, $c) {
    my ($req, $framer, $reply);

    $req = $c->{req};
    ($req->{path}) = $req->{uri} =~ m{^([^?#]*)};

    if ($req->{path} =~ m{^/__mock/}) {
        $c->{control} = 1;
        $c->{keep} = 0;
        return $self->control($c, $req);
    }

    $req->{json} = eval { $JSON->decode($req->{body}) }
        if length $req->{body};
    $req->{received_at} = time;
    $req->{client_closed} = 0;
    $req->{finished} = 0;
    $req->{sent} = 0;
    $req->{index} = scalar @{ $self->{records} };
    $req->{connection} = $c->{serial};
    push @{ $self->{records} }, $req;

    $framer = api($req->{path});
    $req->{api} = $framer ? $framer->name : undef;

    if (!$framer) {
        $c->{steps} = $self->error(DEFAULT_FRAMER, 404, $req,
            "Invalid URL ($req->{method} $req->{path})");

    } elsif ($req->{method} ne 'POST') {
        $c->{steps} = $self->error($framer, 405, $req,
            "Invalid method for URL ($req->{method} $req->{path})");

    } elsif ($reply = shift @{ $self->{queue} }
             // ($self->{default} && $self->{default}->($req)))
    {
        $req->{reply} = $reply;
        $c->{steps} = $self->plan($framer, $reply, $req);

    } else {
        # loud on purpose: a test that forgot to script a reply must notice
        $c->{steps} = $self->error($framer, 500, $req,
            "mock provider: no scripted reply for request #$req->{index}"
            . " ($req->{method} $req->{uri})", 'mock_error', 'empty_queue');
    }

    $self->step($c);
}

sub error ($self, $framer, $status, $req, $message, $type = undef,
           $code = undef)
{
    my %err = (message => $message, defined $type ? (type => $type) : (),
               defined $code ? (code => $code) : ());
    my ($headers, $body) = $framer->error($status, \%err, $req);

    return whole($status, $headers, $body);
}

sub whole ($status, $headers, $body) {
    return [[head => $status, $headers, length $body], [body => $body],
            ['end']];
}

sub plan ($self, $framer, $reply, $req) {
    my (@steps, @extra, @events, $stop, %pause);

    push @steps, [wait => $reply->{latency}] if $reply->{latency};
    return [@steps, ['stall']] if $reply->{stall_head};

    @extra = map { [$_, $reply->{headers}{$_}] }
             sort keys %{ $reply->{headers} // {} };

    if ($reply->{status}) {
        my ($headers, $body) = $framer->error($reply->{status},
                                              $reply->{error}, $req);
        if (defined $reply->{body}) {
            $body = $reply->{body};
            utf8::encode($body);
        }
        push @$headers, ['retry-after', $reply->{retry_after}]
            if defined $reply->{retry_after};

        return [@steps, @{ whole($reply->{status}, [@$headers, @extra],
                                 $body) }];
    }

    if (!$reply->{raw} && !$framer->streaming($req)) {
        my ($headers, $body) = $framer->complete($reply, $req);
        return [@steps, @{ whole(200, [@$headers, @extra], $body) }];
    }

    @events = $reply->{raw}
              ? map { my $e = $_; utf8::encode($e); $e } @{ $reply->{raw} }
              : $framer->events($reply, $req);

    # a stream that does not end normally: keep the first N events
    for my $k (qw(error_after cut_after stall_after)) {
        next unless defined $reply->{$k};
        splice @events, $reply->{$k} if $reply->{$k} < @events;
        $stop = $k;
        last;
    }

    push @events, $framer->stream_error($reply, $req)
        if ($stop // '') eq 'error_after';

    %pause = map { $_ => 1 } ref $reply->{pause_after}
             ? @{ $reply->{pause_after} }
             : defined $reply->{pause_after} ? $reply->{pause_after} : ();

    push @steps, [head => 200, [$framer->stream_headers($reply, $req),
                                @extra], undef];
    push @steps, ['pause'] if $pause{0};

    for my $i (0 .. $#events) {
        push @steps, [wait => $reply->{delay}] if $i && $reply->{delay};
        push @steps, [event => $events[$i]];
        push @steps, ['pause'] if $pause{ $i + 1 };
    }

    push @steps, !$stop || $stop eq 'error_after' ? ['end']
                 : $stop eq 'cut_after' ? [cut => $reply->{reset}]
                 : ['stall'];

    return \@steps;
}

# Run a connection's steps until one has to wait: a timer, a release, or
# (for a cut) the output buffer draining.
sub step ($self, $c) {
    while (!$c->{dead} && $c->{steps} && @{ $c->{steps} }) {
        my ($op, @arg) = @{ $c->{steps}[0] };

        if ($op eq 'wait') {
            $c->{wake} //= time + $arg[0];
            return if time < $c->{wake};
            delete $c->{wake};

        } elsif ($op eq 'head') {
            $c->{req}{status} = $arg[0];
            $self->output($c, $self->head($c, @arg));

        } elsif ($op eq 'body') {
            $self->output($c, $arg[0]);

        } elsif ($op eq 'event') {
            $c->{req}{sent}++;
            $self->output($c, $c->{chunked}
                             ? sprintf("%x\r\n%s\r\n", length $arg[0], $arg[0])
                             : $arg[0]);

        } elsif ($op eq 'pause' || $op eq 'stall') {
            my $flag = $op eq 'pause' ? 'paused' : 'stalled';

            if (!$c->{released}) {
                $c->{req}{$flag} = 1;
                $c->{req}{"${flag}_at"} //= time;
                return;
            }

            delete $c->{released};
            $c->{req}{$flag} = 0;

            # a released stall ends the way a dying provider does
            if ($op eq 'stall') {
                $c->{steps} = [['cut']];
                next;
            }

        } elsif ($op eq 'cut') {
            return if length $c->{wbuf};

            # linger 0: close sends RST instead of FIN
            setsockopt($c->{fh}, SOL_SOCKET, SO_LINGER, pack('ii', 1, 0))
                if $arg[0];

            $c->{req}{cut} = 1;
            return $self->drop($c);

        } elsif ($op eq 'end') {
            shift @{ $c->{steps} };
            $c->{ending} = 1;
            $self->output($c, $c->{chunked} ? "0\r\n\r\n" : '');
            return;
        }

        shift @{ $c->{steps} };
    }
}

sub head ($self, $c, $status, $headers, $length) {
    my (@ct, @rest, @framing);

    @ct = grep { lc $_->[0] eq 'content-type' } @$headers;
    @rest = grep { lc $_->[0] ne 'content-type' } @$headers;

    if (defined $length) {
        @framing = (['Content-Length', $length]);

    } elsif ($c->{http11}) {
        @framing = (['Transfer-Encoding', 'chunked']);
        $c->{chunked} = 1;

    } else {
        # an HTTP/1.0 stream ends when the connection does
        $c->{keep} = 0;
    }

    return "HTTP/1.1 $status " . ($REASON{$status} // 'Unknown') . "\r\n"
           . join('', map { "$_->[0]: $_->[1]\r\n" }
                          ['Date', http_date()], @ct, @framing,
                          ['Connection', $c->{keep} ? 'keep-alive' : 'close'],
                          @rest)
           . "\r\n";
}

sub http_date () {
    my @t = gmtime;

    return sprintf '%s, %02d %s %04d %02d:%02d:%02d GMT',
        (qw(Sun Mon Tue Wed Thu Fri Sat))[$t[6]], $t[3],
        (qw(Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec))[$t[4]],
        $t[5] + 1900, @t[2, 1, 0];
}

sub output ($self, $c, $bytes) {
    $c->{wbuf} .= $bytes;
    $self->flush($c);
}

sub flush ($self, $c) {
    while (length $c->{wbuf}) {
        my $n = syswrite($c->{fh}, $c->{wbuf});

        if (!defined $n) {
            return if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
            return $self->gone($c);
        }

        substr($c->{wbuf}, 0, $n, '');
    }

    $self->finish($c) if $c->{ending} && !$c->{dead};
}

sub finish ($self, $c) {
    delete $c->{ending};

    if (!$c->{control}) {
        $c->{req}{finished} = 1;
        $c->{req}{finished_at} = time;
    }

    return $self->drop($c) unless $c->{keep};

    delete @$c{qw(req steps chunked)};
    $c->{state} = 'head';
    $self->parse($c) if length $c->{rbuf};
}

# The client went away (EOF, reset, or a failed write).
sub gone ($self, $c) {
    my $req = $c->{req};

    if ($req && !$c->{control} && $c->{state} eq 'reply'
        && !$req->{finished})
    {
        $req->{client_closed} = 1;
        $req->{closed_at} = time;
    }

    $self->drop($c);
}

sub drop ($self, $c) {
    return if $c->{dead};

    $c->{dead} = 1;
    delete $self->{conns}{"$c->{fh}"};
    close $c->{fh};
}

# The control channel: plain HTTP under /__mock/ on the same port, one
# request per connection.
sub control ($self, $c, $req) {
    my ($in, $op, $status, $out, $body);

    $in = length $req->{body} ? eval { $JSON->decode($req->{body}) } : undef;
    $op = "$req->{method} $req->{path}";
    $status = 200;

    if ($op eq 'POST /__mock/script' && ref $in eq 'ARRAY') {
        push @{ $self->{queue} }, @$in;
        $out = { queued => scalar @{ $self->{queue} } };

    } elsif ($op eq 'GET /__mock/requests') {
        $out = { requests => $self->{records},
                 queued => scalar @{ $self->{queue} } };

    } elsif ($op eq 'POST /__mock/release') {
        $out = { released => $self->release(ref $in eq 'HASH'
                                            ? $in->{request} : undef) };

    } elsif ($op eq 'POST /__mock/reset') {
        $self->clear;
        $out = {};

    } else {
        $status = 400;
        $out = { error => "bad mock control request: $op" };
    }

    $c->{steps} = whole($status, [['Content-Type', 'application/json']],
                        $JSON->encode($out));
    $self->step($c);
}

sub release ($self, $index) {
    my @released;

    for my $c (values %{ $self->{conns} }) {
        next if $c->{control} || !$c->{steps} || !@{ $c->{steps} };
        next unless $c->{steps}[0][0] =~ /^(?:pause|stall)$/;
        next if defined $index && $c->{req}{index} != $index;

        $c->{released} = 1;
        push @released, $c;
    }

    $self->step($_) for @released;

    return scalar @released;
}

# Replies in flight are dropped so that nothing from a previous test
# writes into the new records; idle keep-alive connections stay, since
# an upstream would fail a request sent on a connection closed under it.
sub clear ($self) {
    $self->{queue} = [];
    $self->{records} = [];

    for my $c (values %{ $self->{conns} }) {
        $self->drop($c) if !$c->{control} && $c->{state} ne 'head';
    }
}

1;
