#!/usr/bin/perl

# Time to first token the module adds over the provider, per run, against
# stock proxy_pass relaying the same stream (the floor).
#
#   perl bench/relay.pl [runs] [tokens]    (make first; TEST_NGINX_* as in t/)
#
# The provider is a mock that has its reply ready before the request
# comes: once a request is read whole it writes the headers and the
# first token at once, and the rest of the stream (tokens - 1 more, the
# finish and usage chunks, [DONE]) 2 ms later.  It reports, per request,
# when the request was read and when the first token was written.  A run
# is one of three paths, in turn:
#
#   proxy_pass  POST /plain/v1/chat/completions, proxy_pass to the mock
#               with proxy_buffering off; first "content":"w1"
#   module      agent_create, an agent_events subscriber (its headers
#               read), then the message POSTed to agent_message; first
#               text_delta on the subscriber
#   aisdk       one POST to agent_aisdk answered by the turn's stream;
#               first text-delta
#
# added = (client's first token - client's POST)
#         - (mock's first token written - mock's request read)
#
# split into "before" (POST to the request read at the mock: the
# message handler, the turn, the rendered request, the subrequest and
# its connection) and "after" (first token written to the client having
# it: the upstream read, the parse, the live delta, the subscriber's
# wake-up, the write).  One worker.  With RELAY_PIN (default 1) and two
# or more CPUs the worker runs on CPU 1, this client and the mock on
# CPU 0.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../t/lib";

use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(sysconf);
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(time);

use Test::Agent;
use Test::Agent::Engine;

my $runs = shift // 300;
my $tokens = shift // 20;
my $pin = $ENV{RELAY_PIN} // 1;
my $rt = $ENV{RELAY_RT} // 0;
my $nworkers = $ENV{RELAY_WORKERS} // 1;
my %want = map { $_ => 1 }
           split /,/, $ENV{RELAY_PATHS} // 'proxy_pass,module,aisdk';
my $http = ($ENV{RELAY_STORE} ? "agent_store %%TESTDIR%%/agent.db;" : '')
    . ($ENV{RELAY_DELTA_INTERVAL}
       ? "agent_delta_interval $ENV{RELAY_DELTA_INTERVAL};" : '');
my $desc = ($ENV{RELAY_STORE} ? ', agent_store' : '')
    . ($ENV{RELAY_DELTA_INTERVAL}
       ? ", agent_delta_interval $ENV{RELAY_DELTA_INTERVAL}" : '');
my $gap = 0.002;
my $warmup = 20;

# the mock provider: a child process, one select() loop

my $listen = IO::Socket::INET->new(Listen => 128, LocalAddr => '127.0.0.1',
                                   LocalPort => 0, ReuseAddr => 1)
    or die "listen: $!\n";

pipe(my $report_r, my $report_w) or die "pipe: $!\n";

sub chunk {
    my ($s) = @_;
    return sprintf("%x\r\n%s\r\n", length $s, $s);
}

sub sse {
    my ($delta, $finish, $usage) = @_;

    return chunk('data: ' . JSON::PP->new->canonical->encode({
        id => 'chatcmpl-relay', object => 'chat.completion.chunk',
        created => 1, model => 'gpt-test',
        choices => $usage ? [] : [{ index => 0, delta => $delta,
                                    finish_reason => $finish }],
        $usage ? (usage => { prompt_tokens => 10,
                             completion_tokens => $tokens,
                             total_tokens => 10 + $tokens }) : () })
        . "\n\n");
}

my $first = "HTTP/1.1 200 OK\r\n"
    . "Content-Type: text/event-stream; charset=utf-8\r\n"
    . "Transfer-Encoding: chunked\r\n"
    . "Connection: close\r\n\r\n"
    . sse({ role => 'assistant', content => '' }, undef)
    . sse({ content => 'w1' }, undef);

my $rest = join('', map { sse({ content => " w$_" }, undef) } 2 .. $tokens)
    . sse({}, 'stop') . sse(undef, undef, 1)
    . chunk("data: [DONE]\n\n") . "0\r\n\r\n";

sub mock {
    my $sel = IO::Select->new($listen);
    my %c;

    $report_w->autoflush(1);

    while (1) {
        my $now = time;
        my ($due) = sort { $a <=> $b } grep { defined }
                    map { $_->{due} } values %c;

        for my $r ($sel->can_read(defined $due ? $due - $now : undef)) {
            if ($r == $listen) {
                my $s = $listen->accept or next;
                $s->blocking(0);
                setsockopt($s, IPPROTO_TCP, TCP_NODELAY, 1);
                $sel->add($s);
                $c{fileno $s} = { sock => $s, buf => '' };
                next;
            }

            my $c = $c{fileno $r};
            my $n = sysread($r, $c->{buf}, 65536, length $c->{buf});

            if (!$n) {
                next if !defined $n && $!{EAGAIN};
                $sel->remove($r);
                delete $c{fileno $r};
                close $r;
                next;
            }

            next if $c->{written};
            next unless $c->{buf} =~ /\r\n\r\n/;

            my $head = $`;
            my $body = $';
            my ($len) = $head =~ /^content-length:\s*(\d+)/mi;
            next if length $body < ($len // 0);

            my $arrived = time;
            syswrite($r, $first) == length $first or die "mock write\n";
            my $written = time;

            my ($mark) = $body =~ /go-(\d+)/;
            printf $report_w "%s %.6f %.6f\n", $mark // '-', $arrived,
                   $written;

            $c->{written} = 1;
            $c->{due} = $written + $gap;
        }

        $now = time;

        for my $c (values %c) {
            next unless defined $c->{due} && $c->{due} <= $now;

            delete $c->{due};
            my $s = $c->{sock};
            $s->blocking(1);
            syswrite($s, $rest);
            $s->blocking(0);
            shutdown($s, 1);
        }
    }
}

my $mock_pid = fork // die "fork: $!\n";

if ($mock_pid == 0) {
    close $report_r;
    mock();
    POSIX::_exit(0);
}

close $report_w;

my $report = IO::Select->new($report_r);

sub mock_report {
    my ($mark) = @_;

    $report->can_read(5) or die "no report from the mock\n";
    my $line = <$report_r>;
    my ($m, $arrived, $written) = split ' ', $line;
    die "the mock answered $m, not go-$mark\n" unless $m eq $mark;

    return ($arrived, $written);
}

my $t = Test::Agent->new;

# engine_conf() asks the mock only for its port
my $mock = bless { port => $listen->sockport }, 'Relay::Mock';
sub Relay::Mock::port { return $_[0]{port} }

$t->write_file_expand('nginx.conf', engine_conf($mock, zone => '64m',
    workers => $nworkers, http => $http,
    server => "location = /new {
                   agent chat;
                   agent_create;
               }

               location /api/chat {
                   agent chat;
                   agent_aisdk;
               }

               location /plain/ {
                   proxy_pass http://127.0.0.1:${\ $mock->port}/;
                   proxy_http_version 1.1;
                   proxy_set_header Connection \"\";
                   proxy_buffering off;
               }"));

$t->run;

my $port = $t->port(8080);
my @workers = $t->wait_workers($nworkers);
my $hz = sysconf(POSIX::_SC_CLK_TCK()) || 100;

if ($pin && (`nproc` // 1) >= 2) {
    for my $pid (@workers) {
        system("taskset -pc 1 $pid >/dev/null") == 0 or die "taskset\n";
    }

    system("taskset -pc 0 $$ >/dev/null") == 0 or die "taskset\n";
    system("taskset -pc 0 $mock_pid >/dev/null") == 0 or die "taskset\n";
}

if ($rt) {
    for my $pid (@workers, $$, $mock_pid) {
        system("chrt -f -p 10 $pid") == 0 or die "chrt\n";
    }
}

sub cpu {
    my $cpu = 0;

    for my $pid (@workers) {
        open my $fh, '<', "/proc/$pid/stat" or die "$!\n";
        my @f = split / /, (split /\) /, <$fh>)[1];
        $cpu += ($f[11] + $f[12]) / $hz;
    }

    return $cpu;
}

sub connect_nginx {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port)
        or die "connect: $!\n";
    setsockopt($s, IPPROTO_TCP, TCP_NODELAY, 1);
    return $s;
}

sub request {
    my ($method, $uri, $body) = @_;

    return "$method $uri HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        . (defined $body ? "Content-Type: application/json\r\n"
                           . "Content-Length: " . length($body) . "\r\n"
                         : '')
        . "\r\n" . ($body // '');
}

# reads each [socket, \$buffer, regex] until its regex matches what came
# so far; the times of those reads

sub read_until {
    my @w = @_;
    my @got;
    my $sel = IO::Select->new(map { $_->[0] } @w);

    while (1) {
        for my $i (0 .. $#w) {
            $got[$i] //= time if ${$w[$i][1]} =~ $w[$i][2];
        }

        my @left = grep { !defined $got[$_] } 0 .. $#w;
        last unless @left;

        my @r = $sel->can_read(10)
            or die "timed out waiting for $w[$left[0]][2]\n";

        for my $r (@r) {
            my ($i) = grep { $w[$_][0] == $r } 0 .. $#w;
            my $buf = $w[$i][1];

            next if sysread($r, $$buf, 65536, length $$buf);
            die "closed waiting for $w[$i][2]:\n$$buf\n" unless $got[$i];
            $sel->remove($r);
        }
    }

    return @got;
}

sub read_all {
    my ($s, $buf) = @_;

    1 while sysread($s, $$buf, 65536, length $$buf);
    close $s;
}

my $n = 0;
my @acked;

sub plain {
    my $mark = $n++;
    my $body = encode_json({ model => 'm', stream => JSON::PP::true,
                             messages => [{ role => 'user',
                                            content => "go-$mark" }] });
    my $s = connect_nginx();
    my $buf = '';
    my $start = time;

    syswrite($s, request('POST', '/plain/v1/chat/completions', $body));
    my ($got) = read_until([$s, \$buf, qr/"content":"w1"/]);

    read_all($s, \$buf);
    die "proxy_pass: no [DONE]\n" unless $buf =~ /data: \[DONE\]/;

    return ($mark, $start, $got);
}

sub module {
    my $mark = $n++;
    my ($s, $buf, $ev, $evbuf, $start, $got, $acked);

    $s = connect_nginx();
    $buf = '';
    syswrite($s, request('POST', '/new', ''));
    read_all($s, \$buf);
    my ($cid) = $buf =~ /"conversation":"(\w+)"/ or die "create: $buf\n";

    $ev = connect_nginx();
    $evbuf = '';
    syswrite($ev, request('GET', "/c/$cid/events"));
    read_until([$ev, \$evbuf, qr/\r\n\r\n/]);
    die "events: $evbuf\n" unless $evbuf =~ m{^HTTP/1.1 200};

    $s = connect_nginx();
    $buf = '';
    $start = time;

    syswrite($s, request('POST', "/c/$cid/messages",
                         encode_json({ content => "go-$mark" })));
    ($got, $acked) = read_until(
        [$ev, \$evbuf, qr/event: text_delta\ndata: [^\n]*w1/],
        [$s, \$buf, qr/\r\n\r\n/]);

    read_all($s, \$buf);
    die "message: $buf\n" unless $buf =~ m{^HTTP/1.1 202};
    push @acked, $acked - $start;

    read_until([$ev, \$evbuf, qr/event: turn_completed/]);
    die "module: not the whole reply\n"
        unless $evbuf =~ /event: assistant_msg\n[^\n]*w1 w2/;
    close $ev;

    return ($mark, $start, $got);
}

sub aisdk {
    my $mark = $n++;
    my $body = encode_json({ id => "a$mark", trigger => 'submit-message',
                             messages => [{ id => "a$mark-u",
                                            role => 'user',
                                            parts => [{ type => 'text',
                                                 text => "go-$mark" }] }] });
    my $s = connect_nginx();
    my $buf = '';
    my $start = time;

    syswrite($s, request('POST', '/api/chat', $body));
    my ($got) = read_until([$s, \$buf, qr/"type":"text-delta"[^\n]*w1/]);

    read_all($s, \$buf);
    die "aisdk: no finish\n" unless $buf =~ /"type":"finish"/;

    return ($mark, $start, $got);
}

my @paths = grep { $want{$_->[0]} }
            (['proxy_pass', \&plain], ['module', \&module],
             ['aisdk', \&aisdk]);
my (%added, %before, %after, %cpu);

sub one {
    my ($path) = @_;

    my $cpu0 = cpu();
    my ($mark, $start, $got) = $path->[1]->();
    my ($arrived, $written) = mock_report($mark);

    $cpu{$path->[0]} += cpu() - $cpu0;

    return ($got - $start - ($written - $arrived), $arrived - $start,
            $got - $written);
}

sub pct {
    my ($list, $p) = @_;
    my @s = sort { $a <=> $b } @$list;
    return 1000 * $s[int($#s * $p + 0.5)];
}

my @load = split ' ', `cat /proc/loadavg`;

for (1 .. $warmup) {
    one($_) for @paths;
}

%cpu = ();
@acked = ();

for (1 .. $runs) {
    for my $path (@paths) {
        my ($added, $before, $after) = one($path);
        push @{$added{$path->[0]}}, $added;
        push @{$before{$path->[0]}}, $before;
        push @{$after{$path->[0]}}, $after;
    }
}

my @load2 = split ' ', `cat /proc/loadavg`;

printf "time to first token added over the provider, ms; %d runs per path,"
       . " %d tokens, %d worker%s%s%s%s\n", $runs, $tokens, $nworkers,
       $nworkers > 1 ? 's' : '',
       $pin ? ', pinned' : '', $rt ? ', SCHED_FIFO' : '',
       $desc;
printf "load average before %s %s %s, after %s %s %s\n", @load[0 .. 2],
       @load2[0 .. 2];
printf "%-11s %6s %6s %6s %6s   %6s %6s   %6s %6s   %s\n", 'path',
       'p50', 'p90', 'p99', 'max', 'before', 'p99', 'after', 'p99',
       'cpu/run';

for my $path (map { $_->[0] } @paths) {
    printf "%-11s %6.2f %6.2f %6.2f %6.2f   %6.2f %6.2f   %6.2f %6.2f"
           . "   %.2f\n", $path,
           (map { pct($added{$path}, $_) } 0.5, 0.9, 0.99, 1),
           pct($before{$path}, 0.5), pct($before{$path}, 0.99),
           pct($after{$path}, 0.5), pct($after{$path}, 0.99),
           1000 * $cpu{$path} / $runs;
}

printf "module: the message's 202 after %.2f / %.2f / %.2f / %.2f ms\n",
       map { pct(\@acked, $_) } 0.5, 0.9, 0.99, 1 if @acked;

kill 'TERM', $mock_pid;
waitpid $mock_pid, 0;
$t->stop;
