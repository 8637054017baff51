#!/usr/bin/perl

# Subscribers on a node that does not own the conversation (two nginx
# nodes on one PostgreSQL): agent_events there is served from the store,
# not answered 421: every canonical event of several turns (a server
# tool's call and result, a reply of 200 deltas) in order, once each, as
# the rows have them, and no live delta; the commits notify once a batch,
# not once a delta; a kill -9 of the worker that listens (another takes
# its place), that worker paused (the poll reads), the listener's
# connection killed, a reload of the node, and PostgreSQL restarted cost
# the subscriber nothing; and a subscriber of the owner killed with -9
# that comes back to the other node with Last-Event-ID gets every event
# after it once, across the take-over.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep time);
use IO::Select;
use JSON::PP;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::SSE;
use Test::Agent::MockProvider;
use Test::Agent::Postgres;

plan(skip_all => Test::Agent::Postgres->missing)
    if Test::Agent::Postgres->missing;

my $pg = Test::Agent::Postgres->new;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'a reply', chunks => 2 };
});

my ($n1, $addr1, $n2, $addr2);

sub node {
    my ($id) = @_;

    my $t = Test::Agent->new;
    my $addr = '127.0.0.1:' . $t->port(8080);
    my $conf = engine_conf($mock, workers => 2, tools => $ECHO_TOOL,
                           server => $ECHO_LOCATION . $WORKERS_SERVER,
                           http => $pg->node_lines($id, $addr));

    $t->write_file_expand('nginx.conf', $conf);
    is(($t->test_config)[0], 0, "nginx -t of node $id");
    $t->run;

    return ($t, $addr);
}

# the pid of the node's worker that listens now, once one does

sub listener {
    my ($t, $not) = @_;

    for (1 .. 100) {
        my @pids = $t->read_file('error.log')
            =~ /\[notice\] (\d+)#\d+: .*listens for the store's notif/g;
        return $pids[-1] if @pids && (!defined $not || $pids[-1] != $not);
        sleep 0.1;
    }

    return undef;
}

# agent_events on the node, on a connection of a worker other than $not

sub subscribe {
    my ($t, $cid, %opts) = @_;

    my $s;

    if (defined $opts{not}) {
        my @pids = grep { $_ != $opts{not} } worker_pids($t);
        $s = worker_connection($t, $pids[0]);
        ${*$s}{worker} = $pids[0];
    } else {
        $s = Test::Agent::HTTP::connect_to($t->port(8080));
    }

    print $s events_request($cid, %{$opts{headers} || {}});

    my $sse = Test::Agent::SSE->new(bless {
        sock => $s, sel => IO::Select->new($s), buf => '', eof => 0,
        started => time }, 'Test::Agent::HTTP::Stream');
    $sse->stream->read_head(10) or die "no head\n";
    return $sse;
}

# the rows: "seq type" and the data, in order

sub rows {
    my ($cid, $after) = @_;
    $after //= 0;
    my @rows = split /\n/, $pg->sql("SELECT seq || ' ' || type || ' '"
        . " || data FROM events WHERE conversation = '$cid'"
        . " AND seq > $after ORDER BY seq");
    return @rows;
}

sub got {
    return map { "$_->{id} $_->{event} $_->{data}" } @_;
}

# the events until the rows' last one, or the timeout

sub until_seq {
    my ($sse, $seq, $timeout) = @_;
    return $sse->events_until(sub { ($_[0]{id} // 0) >= $seq }, $timeout);
}

# a turn on n1; the time from its end there to its last event on the
# subscriber: the listener's relay, not the poll of every 3 s

my @late;

sub turn_seen {
    my ($sse, $seen, $content) = @_;

    is(send_message($n1, 'f1', $content)->{status}, 202, "a turn: $content");
    wait_state($n1, 'f1', 'idle');

    my $start = time;
    my $last = last_seq('f1');
    push @$seen, until_seq($sse, $last, 10);
    push @late, time - $start;
}

sub last_seq {
    my ($cid) = @_;
    return $pg->sql("SELECT max(seq) FROM events WHERE conversation = '$cid'");
}

($n1, $addr1) = node('n1');
($n2, $addr2) = node('n2');

my $l2 = listener($n2);
ok($l2, 'a worker of n2 listens');

# (a) the conversation is n1's; a subscriber on n2 is served

is(send_message($n1, 'f1', 'hello')->{status}, 202, 'a message to n1');
wait_state($n1, 'f1', 'idle');
is($pg->sql("SELECT node FROM conversations WHERE id = 'f1'"), 'n1',
   'n1 owns it');

is(http_get('/c/nothing/events', port => $n2->port(8080))->{status}, 404,
   'a conversation nobody has: 404 on n2');

my $sub = subscribe($n2, 'f1', not => $l2);
is($sub->stream->status, 200, 'agent_events on n2: 200, not 421');

my @seen = until_seq($sub, 3, 10);
is_deeply([got(@seen)], [rows('f1')], 'the first turn, as the rows have it');

is($pg->sql("SELECT node, epoch FROM conversations WHERE id = 'f1'"),
   'n1|0', 'the subscriber claimed nothing');

# the notifications of the next turns, as a LISTEN of psql sees them

my $dir = $pg->dir;
open my $listen, '|-', "psql -X -q -At -h $dir -U agent -d $pg->{db}"
    . " > $dir/notified 2>&1"
    or die "psql: $!\n";
select((select($listen), $| = 1)[0]);
print $listen "LISTEN agent;\n";
sleep 0.3;

# (b) a turn with a server tool, and a reply of 200 deltas

$mock->script({ tool_calls => echo_calls(1) }, { text => 'the tool said' });
turn_seen($sub, \@seen, 'use the tool');

$mock->script({ text => 'x' x 200, chunks => 200 });
turn_seen($sub, \@seen, 'a long reply');

my $last = last_seq('f1');

is_deeply([got(@seen)], [rows('f1')],
          'every canonical event, in order, once, as the rows have them');
like(join(' ', map { $_->{event} } @seen), qr/tool_call tool_result/,
     'the tool\'s call and result among them');
ok(!(grep { !defined $_->{id} } @seen), 'no live event');

print $listen "SELECT 1;\n";
close $listen;

my @notes = grep { /payload "f1:\d+"/ } split /\n/,
    `cat $dir/notified`;
my @seqs = map { /payload "f1:(\d+)"/ } @notes;
ok(@notes >= 2, 'the commits notified') or diag(`cat $dir/notified`);
cmp_ok(scalar @notes, '<', 20, 'a batch a notification, not a delta');
is($seqs[-1], $last, 'the last names the last seq');
diag(scalar(@notes) . ' notifications for two turns and 200 deltas');

# (c) the worker that listens killed: another listens, the subscriber
# (of the other worker) gets what follows

kill 'KILL', $l2;
my $l2b = listener($n2, $l2);
ok($l2b && $l2b != $l2, 'another worker of n2 listens');

turn_seen($sub, \@seen, 'after the kill');
is_deeply([got(@seen)], [rows('f1')], 'the subscriber has it all');

ok(!(grep { $_ > 1 } @late), 'each turn seen on n2 within 1 s of its end')
    or diag("@late");
diag(sprintf 'seen on n2 %s s after the turn ended on n1',
     join ', ', map { sprintf '%.3f', $_ } @late);

# (d) the listener's connection killed: the turn written meanwhile comes

is($pg->sql("SELECT count(*) FROM (SELECT pg_terminate_backend(pid)"
            . " FROM pg_stat_activity WHERE query = 'LISTEN agent') k"), 2,
   'the listeners\' connections killed, one a node');
is(send_message($n1, 'f1', 'while it is away')->{status}, 202, 'a turn');
wait_state($n1, 'f1', 'idle');
$last = last_seq('f1');
push @seen, until_seq($sub, $last, 10);
is_deeply([got(@seen)], [rows('f1')], 'the subscriber has that too');

is($pg->wait_sql("SELECT count(*) FROM pg_stat_activity"
                 . " WHERE query = 'LISTEN agent'", qr/^2$/, 10), 2,
   'each node\'s listener connected again')
    or diag($n2->read_file('error.log'));

# the listening worker paused: no notification is relayed, the
# subscriber's poll (every 3 s) brings the turn all the same

my $quiet = listener($n2);
$last = last_seq('f1');
my $other = subscribe($n2, 'f1', not => $quiet,
                      headers => { 'Last-Event-ID' => $last });
my @other;

kill 'STOP', $quiet;
@late = ();
turn_seen($other, \@other, 'while the listener sleeps');
kill 'CONT', $quiet;
is_deeply([got(@other)], [rows('f1', $last)],
          'the poll of a subscriber of another worker brought it');
cmp_ok($late[0], '<', 5, 'within a poll\'s interval and a read');
diag(sprintf 'seen %.3f s after the turn ended, by the poll', $late[0]);
$other->stream->close;

$last = last_seq('f1');
push @seen, until_seq($sub, $last, 10);
is_deeply([got(@seen)], [rows('f1')], 'the first subscriber has it too');

# (e) n2 reloaded: its old workers end their streams and let go of the
# listener, a new worker listens; the subscriber comes back with
# Last-Event-ID and gets what follows, woken as before

ok($n2->reload, 'n2 reloaded');
my $l2c = listener($n2, $l2b);
ok($l2c && $l2c != $l2b, 'a new worker of n2 listens');

my @tail = $sub->events_until(sub { 0 }, 3);
ok($sub->stream->finished, 'the old worker ended the stream');
is(scalar @tail, 0, 'with nothing more');
$sub->stream->close;

$sub = subscribe($n2, 'f1', not => $l2c,
                 headers => { 'Last-Event-ID' => $last });
@late = ();
@seen = ();
turn_seen($sub, \@seen, 'after the reload');
is_deeply([got(@seen)], [rows('f1', $last)],
          'the events after Last-Event-ID, on the reloaded node');
ok($late[0] < 1, 'seen within 1 s: the new listener relays')
    or diag("@late");
$last = last_seq('f1');

# (f) a subscriber of n1 that n1's kill -9 cuts comes back to n2 with
# Last-Event-ID: every event after it, once

$mock->script({ text => 'cut words', chunks => 3, pause_after => 1 },
              { text => 'the answer' });
my $before = scalar @{$mock->requests};

my $own = subscribe($n1, 'f1', headers => { 'Last-Event-ID' => $last });
is(send_message($n1, 'f1', 'a long one')->{status}, 202, 'a turn on n1');
$mock->wait_paused($before, 5);

my @head = $own->events_until(sub { ($_[0]{event} // '') eq 'user_msg' },
                              10);
my @canon = grep { defined $_->{id} } @head;
ok(@canon, 'the owner\'s subscriber got the turn\'s user_msg');
my $cursor = $canon[-1]{id};

kill 'KILL', $n1->master_pid, $n1->worker_pids;
$own->stream->close;

my $back = subscribe($n2, 'f1', headers => { 'Last-Event-ID' => $cursor });
is($back->stream->status, 200, 'back on n2 with Last-Event-ID');

is($pg->wait_sql("SELECT type FROM events WHERE conversation = 'f1'"
                 . " ORDER BY seq DESC LIMIT 1", qr/turn_completed/, 15),
   'turn_completed', 'n2 took the turn over and ended it');
$last = last_seq('f1');

my @rest = until_seq($back, $last, 15);
is_deeply([got(@rest)], [rows('f1', $cursor)],
          'every event after Last-Event-ID, once, across the take-over');
is($pg->sql("SELECT node FROM conversations WHERE id = 'f1'"), 'n2',
   'n2 owns it now');

# and once n2 owns it, from its zone and its store

my $later = subscribe($n2, 'f1', headers => { 'Last-Event-ID' => $cursor });
is_deeply([got(until_seq($later, $last, 10))], [rows('f1', $cursor)],
          'the same from the new owner');
$later->stream->close;

$sub->stream->close;
$back->stream->close;

# (g) PostgreSQL restarted under a subscriber of a third node: what is
# written after it comes (the turn completes: a read on a connection the
# restart cut is done again on a new one, see pg_reconnect.t)

my ($n3) = node('n3');
my $s3 = subscribe($n3, 'f1', headers => { 'Last-Event-ID' => $last });
is($s3->stream->status, 200, 'a subscriber on n3');

$pg->stop;
sleep 0.5;
$pg->start;

my $r;
for (1 .. 20) {
    $r = send_message($n2, 'f1', 'after the restart',
                      source_id => 'after-restart');
    last if $r->{status} == 202 || $r->{status} == 200;
    sleep 0.2;
}
ok($r->{status} == 202 || $r->{status} == 200,
   'a message to n2 after PostgreSQL restarted');

is($pg->wait_sql("SELECT type FROM events WHERE conversation = 'f1'"
                 . " AND seq > $last ORDER BY seq DESC LIMIT 1",
                 qr/^turn_(completed|failed)$/, 15),
   'turn_completed', 'its turn completed');
my $end = last_seq('f1');
is_deeply([got(until_seq($s3, $end, 15))], [rows('f1', $last)],
          'the subscriber on n3 has every event written after the restart');
$s3->stream->close;

$mock->stop;

$n3->done(more => 1);
$n2->allow_alert(qr/exited on signal 9/);
$n2->done;
