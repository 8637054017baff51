#!/usr/bin/perl

# agent_events: a conversation's events as Server-Sent Events.  The
# durable snapshot, then the live tail; canonical events carry their seq
# as the SSE id, so a client resumes with Last-Event-ID (or ?after=) with
# no gap and no duplicate.  Subscribers on any of 4 workers get the same
# events in the same order, pushed as they happen; a slow subscriber may
# miss deltas but never a canonical event; idle streams get heartbeats;
# a graceful shutdown ends the streams instead of waiting for them.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use List::Util qw(max min sum);
use Socket qw(SOL_SOCKET SO_RCVBUF);
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::SSE;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

# 8080: the API; 8081: reuseport, so that the kernel spreads subscribers
# over the workers; 8082: a small send buffer, for the slow subscriber

$t->write_file_expand('nginx.conf', engine_conf($mock,
    workers => 4,
    zone => '4m',
    http => "agent_heartbeat 300ms;\n"
        . "    log_format pids '\$pid \$request_uri \$status';",
    server => "listen 127.0.0.1:%%PORT_8081%% reuseport;\n"
        . "        listen 127.0.0.1:%%PORT_8082%% sndbuf=4k;\n"
        . "        access_log %%TESTDIR%%/pids.log pids;"));
$t->run;

my $port = $t->port(8080);
my $spread = $t->port(8081);

sub subscribe {
    my ($cid, %opts) = @_;

    my %h = %{$opts{headers} || {}};
    my $uri = "/c/$cid/events" . ($opts{args} ? "?$opts{args}" : '');
    my $req = "GET $uri HTTP/1.1\r\nHost: localhost\r\n";
    $req .= "$_: $h{$_}\r\n" for sort keys %h;

    return Test::Agent::SSE->new(http_stream("$req\r\n",
                                             port => $opts{port} // $port));
}

sub json_of { my $d = eval { decode_json($_[0]{data} // '') }; $d // {} }

sub canonical { grep { defined $_->{id} } @_ }
sub ids { join ' ', map { $_->{id} } canonical(@_) }
sub types { join ' ', map { $_->{event} } canonical(@_) }

sub is_type { my $type = shift; sub { ($_[0]{event} // '') eq $type } }

# events of several subscribers read side by side, each as soon as it
# arrives, until each has seen an event the callback accepts (or the
# timeout); heartbeats left out

sub collect {
    my ($sses, $done, $timeout) = @_;

    my $deadline = time + ($timeout // 10);
    my @got = map { [] } @$sses;
    my @finished = map { 0 } @$sses;
    my %index = map { fileno($sses->[$_]->stream->socket) => $_ }
        0 .. $#$sses;

    while (time < $deadline && grep { !$_ } @finished) {
        my $sel = IO::Select->new(map { $sses->[$_]->stream->socket }
                                  grep { !$finished[$_] } 0 .. $#$sses);

        my @ready = map { $index{fileno $_} } $sel->can_read(0.05);

        # every ready socket read first, so that one's parsing does not
        # delay the arrival time of the next

        my %e = map { $_ => $sses->[$_]->next_event(0.0001) } @ready;

        for my $i (@ready) {
            my $e = $e{$i};

            while ($e && !$finished[$i]) {
                unless ($e->{comment} && !defined $e->{data}) {
                    push @{$got[$i]}, $e;
                    $finished[$i] = 1 if $done->($e);
                }

                $e = $sses->[$i]->next_event(0.0001);
            }
        }
    }

    return @got;
}

###############################################################################

# bad requests: a JSON 4xx

my $r = http_get('/c/nope/events', port => $port);
is($r->{status}, 404, 'unknown conversation');
like($r->{headers}{'content-type'}, qr{^application/json}, 'JSON error');
is(json_of({ data => $r->{body} })->{error}{code}, 'not_found',
   'not_found code');

$r = http_post('/c/nope/events', '{}', port => $port);
is($r->{status}, 405, 'POST');
is($r->{headers}{allow}, 'GET, HEAD', 'Allow header');
is(json_of({ data => $r->{body} })->{error}{code}, 'method_not_allowed',
   'method_not_allowed code');

$r = http_get('/c/bad%20id/events', port => $port);
is($r->{status}, 400, 'invalid conversation id');
is(json_of({ data => $r->{body} })->{error}{code}, 'invalid_conversation',
   'invalid_conversation code');

$r = http_get('/c/c1/events?after=abc', port => $port);
is($r->{status}, 400, 'after not a number');

###############################################################################

# a turn as a subscriber sees it: the snapshot (the user message), then
# the reply streamed as deltas, the canonical events with their seq as id.
# The reply is held before its first piece until the subscriber has the
# snapshot, and after it until its delta has come.

$mock->script({ text => 'one two three four', chunks => 4, delay => 0.1,
                pause_after => [0, 2] });

is(send_message($t, 'c1', 'hi')->{status}, 202, 'message sent');

my $sse = subscribe('c1');
is($sse->stream->status, 200, 'subscribed');
like($sse->stream->header('content-type'), qr{^text/event-stream},
     'content type');
is($sse->stream->header('cache-control'), 'no-cache', 'not cached');
is($sse->stream->header('x-accel-buffering'), 'no', 'not buffered');
ok(!defined $sse->stream->header('content-length'), 'no length');

my @ev = $sse->events_until(is_type('user_msg'), 10);
ok($mock->wait_paused(0, 10), 'the reply held before its first piece');
$mock->release(0);

push @ev, $sse->events_until(is_type('text_delta'), 10);
ok($mock->wait_paused(0, 10) && !grep({ $_->{event} eq 'assistant_msg' } @ev),
   'a delta pushed as it came, before the provider finished');
$mock->release(0);

push @ev, $sse->events_until(is_type('turn_ended'), 10);

is(ids(@ev), '1 2 3', 'canonical ids');
is(types(@ev), 'user_msg assistant_msg turn_completed', 'canonical types');
ok(!(grep { json_of($_)->{seq} != $_->{id} } canonical(@ev)),
   'each id is the event seq');
ok(!(grep { defined $_->{id} } grep { $_->{event} =~ /delta|turn_ended/ }
     @ev), 'live events carry no id');
is($ev[-1]{event}, 'turn_ended', 'turn_ended last');

my @deltas = grep { $_->{event} eq 'text_delta' } @ev;
is(join('', map { json_of($_)->{delta} } @deltas), 'one two three four',
   'deltas make the reply');
# pieces that reach the worker in one pass of its event loop are one
# delta
is(join(' ', map { json_of($_)->{delta_seq} } @deltas),
   join(' ', 1 .. @deltas), 'deltas in order, gapless');

my ($user, $assistant) = canonical(@ev);
is(json_of($user)->{content}, 'hi', 'user message');
is(json_of($assistant)->{content}, 'one two three four', 'reply');

my %idx = map { $ev[$_]{event} => $_ } reverse 0 .. $#ev;
ok($idx{text_delta} > $idx{user_msg} && $idx{assistant_msg} > $idx{text_delta},
   'user message, deltas, reply');

# heartbeats on the idle stream

my @beats;
my $until = time + 1.5;
while (time < $until) {
    my $e = $sse->next_event($until - time) or last;
    push @beats, $e if ($e->{comment} // '') =~ /heartbeat/;
}
cmp_ok(scalar @beats, '>=', 2, 'heartbeats on an idle stream');
cmp_ok(scalar @beats, '<=', 6, 'no more often than agent_heartbeat');
cmp_ok(min(map { $beats[$_]{t} - $beats[$_ - 1]{t} } 1 .. $#beats), '>=',
       0.2, 'heartbeats spaced') if @beats > 1;

$sse->stream->close;

# subscribing with nothing to send yet: the head comes at once, not
# with the first event or heartbeat

# (had it waited, it would have come in one read with the first
# heartbeat, 300 ms later)

$sse = subscribe('c1', headers => { 'Last-Event-ID' => 3 });
my $head = $sse->stream->{last_read};
is($sse->stream->status, 200, 'empty snapshot: 200');
my $beat = $sse->next_event(2);
like($beat->{comment} // '', qr/heartbeat/, 'then a heartbeat');
cmp_ok(($beat->{t} // $head) - $head, '>=', 0.1,
       'head sent at once on an empty snapshot, apart from the heartbeat');
$sse->stream->close;

# HEAD: the head only

$r = http(http_request('HEAD', '/c/c1/events', undef), port => $port);
is($r->{status}, 200, 'HEAD');
is($r->{body}, '', 'HEAD has no body');

###############################################################################

# resuming: ?after= and Last-Event-ID give what follows, and the header
# wins over the argument

$sse = subscribe('c1', args => 'after=1');
is(ids($sse->events_until(sub { ($_[0]{id} // 0) == 3 }, 5)), '2 3',
   '?after=1');
$sse->stream->close;

$sse = subscribe('c1', headers => { 'Last-Event-ID' => 2 },
                 args => 'after=0');
is(ids($sse->events_until(sub { ($_[0]{id} // 0) == 3 }, 5)), '3',
   'Last-Event-ID before ?after=');
$sse->stream->close;

# a client that leaves mid-turn and comes back with Last-Event-ID

$mock->script({ text => 'alpha beta gamma', chunks => 3, delay => 0.05,
                pause_after => 3, latency => 0.3 });

wait_state($t, 'c1', 'idle');

my $one = subscribe('c1', headers => { 'Last-Event-ID' => 3 });
is(send_message($t, 'c1', 'again')->{status}, 202, 'second message');

my @first = $one->events_until(is_type('text_delta'), 5);
is(ids(@first), '4', 'first connection got the new message');
$one->stream->close;

ok($mock->wait_paused(1, 5), 'provider paused mid-reply');

my $two = subscribe('c1', headers => { 'Last-Event-ID' => 4 });
$mock->release;

my @second = $two->events_until(is_type('turn_ended'), 5);
is(ids(@second), '5 6', 'reconnect: the rest, no gap, no duplicate');
is(json_of((canonical(@second))[0])->{content}, 'alpha beta gamma',
   'the whole reply after the reconnect');
$two->stream->close;

# reconnecting after every canonical event, turn after turn, while the
# turns run: the ids seen add up to the log, each once

$mock->script(map { { text => "reply $_", chunks => 3, delay => 0.03 } }
              1 .. 3);

my $last = 6;
my @seen;

for my $turn (1 .. 3) {
    wait_state($t, 'c1', 'idle');
    is(send_message($t, 'c1', "m$turn")->{status}, 202, "turn $turn sent");

    my $deadline = time + 10;
    while (time < $deadline) {
        my $s = subscribe('c1', headers => { 'Last-Event-ID' => $last });
        my ($e) = grep { defined $_->{id} }
            $s->events_until(sub { defined $_[0]{id} }, 2);
        $s->stream->close;
        next unless $e;
        push @seen, $e->{id};
        $last = $e->{id};
        last if $e->{event} eq 'turn_completed';
    }
}

is("@seen", join(' ', 7 .. 15), 'one reconnect per event: no gap, no dup');

###############################################################################

# 4 workers: subscribers spread over them all get the same events in the
# same order, pushed from whichever worker runs the turn.  The reply is
# held before its first piece until each has the snapshot.

my $reply = join(' ', map { "w$_" } 1 .. 40);
my $index = @{$mock->requests};

$mock->script({ text => $reply, chunks => 20, delay => 0.02,
                pause_after => 0 });

is(send_message($t, 'c9', 'fan out')->{status}, 202, 'fan-out message');

my @subs = map { subscribe('c9', port => $spread) } 1 .. 8;
my @got = map { [$_->events_until(is_type('user_msg'), 10)] } @subs;

ok($mock->wait_paused($index, 10), 'fan-out: the reply held');
$mock->release($index);

my @rest = collect(\@subs, is_type('turn_ended'), 15);
push @{$got[$_]}, @{$rest[$_]} for 0 .. $#got;

my $want = join '|', map { "$_->{id} $_->{data}" } canonical(@{$got[0]});
is(types(@{$got[0]}), 'user_msg assistant_msg turn_completed',
   'fan-out: canonical events');

for my $i (1 .. $#got) {
    is(join('|', map { "$_->{id} $_->{data}" } canonical(@{$got[$i]})),
       $want, "subscriber $i: the same canonical events");
}

my @streams = map {
    join '|', map { json_of($_)->{delta_seq} . ' ' . json_of($_)->{delta} }
        grep { $_->{event} eq 'text_delta' } @$_
} @got;

is(scalar(grep { $_ eq $streams[0] } @streams), 8,
   'all subscribers got the same deltas');

my @fanned = map { json_of($_) }
    grep { $_->{event} eq 'text_delta' } @{$got[0]};
is(join(' ', map { $_->{delta_seq} } @fanned), join(' ', 1 .. @fanned),
   'every delta, in order');
is(join('', map { $_->{delta} } @fanned), $reply, 'they make the reply');

# how much later than the first subscriber the others got each delta:
# the cost of a wake-up across workers

my @lag;
for my $k (0 .. $#fanned) {
    my @t = map { (grep { $_->{event} eq 'text_delta' } @$_)[$k]{t} } @got;
    next if grep { !defined } @t;
    push @lag, max(@t) - min(@t);
}
@lag = sort { $a <=> $b } @lag;
diag(sprintf('delta spread across 8 subscribers: median %.2f ms, max %.2f ms',
             1000 * $lag[@lag / 2], 1000 * $lag[-1])) if @lag;
# polling at heartbeats (300 ms) would put the median near 150 ms
cmp_ok($lag[@lag / 2] // 1, '<', 0.1, 'pushed to every worker at once');

$_->stream->close for @subs;

# which workers served them (the access log names the pid)

my $deadline = time + 5;
my %pids;
while (time < $deadline) {
    %pids = ();
    for ($t->read_file('pids.log') =~ m{^(\d+) /c/c9/events 200$}mg) {
        $pids{$_}++;
    }
    last if (sum(values %pids) // 0) >= 8;
    sleep 0.1;
}
cmp_ok(scalar keys %pids, '>', 1, 'subscribers were on several workers');

###############################################################################

# a slow subscriber: it reads nothing while a long reply streams, then
# everything.  Deltas may be missing, never reordered; every canonical
# event is there.

my $text = join ' ', map { sprintf 'word%04d', $_ } 1 .. 6000;
$mock->script({ text => $text, chunks => 1500, latency => 0.5 });

is(send_message($t, 's1', 'long')->{status}, 202, 'long message');

my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                 PeerPort => $t->port(8082))
    or die "connect: $!\n";
setsockopt($sock, SOL_SOCKET, SO_RCVBUF, 4096);
print $sock events_request('s1');

my $c = wait_state($t, 's1', 'idle', 30);
is($c && $c->{state}, 'idle', 'long turn done while the client slept');

my $slow = Test::Agent::SSE->new(bless {
    sock => $sock, sel => IO::Select->new($sock), buf => '', eof => 0,
    started => time }, 'Test::Agent::HTTP::Stream');
$slow->stream->read_head(10);

my @all = $slow->events_until(is_type('turn_ended'), 20);
is(ids(@all), '1 2 3', 'slow subscriber: every canonical event');
is(json_of((canonical(@all))[1])->{content}, $text, 'the whole reply');

my @seqs = map { json_of($_)->{delta_seq} }
    grep { $_->{event} eq 'text_delta' } @all;
ok(!(grep { $seqs[$_] <= $seqs[$_ - 1] } 1 .. $#seqs),
   'deltas never reordered');
diag(sprintf('slow subscriber got %d of 1500 deltas', scalar @seqs));
$slow->stream->close;

###############################################################################

# a reload: the old workers end their streams properly; the clients
# resume on the new workers with Last-Event-ID and miss nothing

my @old = map { subscribe('c9', port => $spread) } 1 .. 4;
$_->events_until(is_type('turn_completed'), 5) for @old;

my %before = map { $_ => 1 } $t->worker_pids;
ok($t->reload, 'reloaded');

my $ended = 0;
for my $s (@old) {
    $s->stream->rest(5);
    $ended++ if $s->stream->finished;
}
is($ended, 4, 'streams of the old workers ended with their last chunk');

# an old worker that has not yet seen the reload may still accept on its
# reuseport socket: the new subscribers come once they are all gone

for (1 .. 200) {
    last unless grep { $before{$_} } $t->worker_pids;
    sleep 0.05;
}

$mock->script({ text => 'after the reload', chunks => 2, delay => 0.05,
                latency => 0.5 });

my @new = map { subscribe('c9', port => $spread,
                          headers => { 'Last-Event-ID' => 3 }) } 1 .. 4;
is(send_message($t, 'c9', 'still there?')->{status}, 202,
   'message after the reload');

@got = collect(\@new, is_type('turn_ended'), 10);
is(scalar(grep { ids(@$_) eq '4 5 6' } @got), 4,
   'resumed on the new workers: the new turn, nothing twice');
$_->stream->close for @new;

###############################################################################

# a graceful shutdown ends the streams properly rather than wait for them

my @open = map { subscribe('c9', port => $spread) } 1 .. 4;
$_->events_until(is_type('turn_completed'), 5) for @open;

my $start = time;
$t->stop;
# held, it would wait for the harness's kill ($t->stop: 20 s, 60 s
# sanitized)
cmp_ok(time - $start, '<', $t->sanitized ? 15 : 5,
       'quit not held by open streams');

$ended = 0;
for my $s (@open) {
    $s->stream->rest(2);
    $ended++ if $s->stream->finished;
}
is($ended, 4, 'each stream ended with its last chunk');

$mock->stop;
$t->done;
