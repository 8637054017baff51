#!/usr/bin/perl

# agent_store on PostgreSQL: the connections a worker keeps for its
# reads, cut under it, cost no turn.  Each turn reads its history from
# the store (history=0, and nginx restarted so that the zone has none
# of it).  Then every session of nginx's is ended (pg_terminate_backend)
# while it waits, ended under a revival's read, a page of the list and
# the enqueue of a queued message, each waiting for a lock, and
# PostgreSQL is restarted: each time the next turn completes, the list
# and the audit answer 200 at once, and the sweep's heartbeat goes on.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep time);
use JSON::PP;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::Postgres;

plan(skip_all => Test::Agent::Postgres->missing)
    if Test::Agent::Postgres->missing;

my $pg = Test::Agent::Postgres->new;
my $conninfo = $pg->conninfo;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'a reply', chunks => 2 };
});

my $server = <<'EOF';
        location = /all {
            agent chat;
            agent_owner off;
            agent_list;
        }

        location = /metrics {
            agent_metrics;
        }
EOF

my $t = Test::Agent->new;
$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => "agent_store \"$conninfo\" history=0;\n"
            . "    agent_busy queue;\n"
            . '    agent_node id=n1 addr=127.0.0.1:' . $t->port(8080)
            . ' heartbeat=1s ttl=3s;',
    server => $server));
my ($rc, $out) = $t->test_config;
is($rc, 0, 'nginx -t') or diag($out);

my $NGINX = "application_name = 'nginx agent'";

sub last_type {
    my ($cid) = @_;
    return $pg->sql("SELECT type FROM events WHERE conversation = '$cid'"
                    . ' ORDER BY seq DESC LIMIT 1');
}

# a message, and the type of the last event once its turn ended

sub turn {
    my ($cid, $text) = @_;

    my $r = send_message($t, $cid, $text);
    return "POST $r->{status}" unless $r->{status} == 202;

    return $pg->wait_sql("SELECT type FROM events WHERE conversation ="
                         . " '$cid' ORDER BY seq DESC LIMIT 1",
                         qr/^turn_(completed|failed)$/, 15);
}

sub store_reads {
    my $body = http_get('/metrics', port => $t->port(8080))->{body} // '';
    my ($n) = $body
        =~ /^agent_store_history_reads_total\{from="store"\} (\d+)/m;
    return $n // 0;
}

# the list and the audit, once each: no second try

sub answers {
    my ($cid) = @_;

    my $list = http_get('/all', port => $t->port(8080));
    my $audit = inspect($t, $cid, 'view=model_calls');
    my $convs = eval { decode_json($list->{body})->{conversations} };

    return join ' ', $list->{status}, scalar(@{$convs || []}),
                     $audit->{status},
                     scalar @{$audit->{json}{model_calls} || []};
}

sub heartbeat {
    return $pg->sql("SELECT extract(epoch FROM heartbeat) FROM nodes"
                    . " WHERE id = 'n1'");
}

# the heartbeat written after now, by a sweep

sub beats_after {
    my ($since) = @_;
    my $deadline = time + 5;

    while (time < $deadline) {
        return 1 if (heartbeat() || 0) > $since;
        sleep 0.1;
    }

    return 0;
}

# nginx's sessions ended (each at once: it waits for its client); their
# count

sub terminate {
    return $pg->sql("SELECT count(pg_terminate_backend(pid))"
                    . " FROM pg_stat_activity WHERE $NGINX");
}

# nginx's sessions ended once $cond (a boolean query on
# pg_stat_activity) holds: 1 then, 0 if it did not within 5 s

sub terminate_when {
    my ($cond) = @_;
    my $n = $pg->wait_sql("SELECT CASE WHEN ($cond) THEN"
                          . " (SELECT count(pg_terminate_backend(pid))"
                          . " FROM pg_stat_activity WHERE $NGINX)"
                          . " ELSE 0 END", qr/^[1-9]/, 5);
    return ($n =~ /^[1-9]/) ? 1 : 0;
}

# who holds or waits for a lock, for a test that could not take one

sub blockers {
    return "sessions:\n" . $pg->sql("SELECT pid, application_name, state,"
        . " wait_event_type, pg_blocking_pids(pid), substr(query, 1, 80)"
        . " FROM pg_stat_activity WHERE datname = 'agent'")
        . "\nlocks:\n" . $pg->sql("SELECT l.pid, c.relname, l.mode,"
        . " l.granted FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
        . " WHERE c.relname IN ('queued', 'tool_calls')");
}

sub errors_since {
    my ($from, $re) = @_;
    my $log = $t->read_file('error.log');
    return grep { /$re/ } split /\n/, substr($log, $from);
}

# three conversations of two turns each; then nginx restarted, so that
# the next turns read their history from the store

$t->run;

for my $cid (qw(a b c)) {
    for my $n (1, 2) {
        is(turn($cid, "$cid $n"), 'turn_completed', "$cid: turn $n");
    }
}

$t->stop;
$t->run;

is(turn('a', 'a 3'), 'turn_completed', 'a turn after a restart of nginx');
ok(store_reads() > 0, 'its history read from the store');
is(answers('a'), '200 3 200 3', 'the list and the audit');

# (a) every session of nginx's ended while the connections wait: a few
# kept, by pages of the list asked for at once

sub lists_at_once {
    my @s = map {
        my $s = Test::Agent::HTTP::connect_to($t->port(8080));
        print $s http_request('GET', '/all');
        $s;
    } 1 .. 6;

    return join ' ', map { http_status($_, 10) } @s;
}

is(lists_at_once(), '200 200 200 200 200 200', 'pages of the list at once');

my $from = length $t->read_file('error.log');
my $before = store_reads();
my $beat = time;

ok(terminate() > 0, 'nginx\'s sessions ended');

is(turn('b', 'b 3'), 'turn_completed',
   'the next turn completes on a new connection');
ok(store_reads() > $before, 'its history read from the store');
is(answers('b'), '200 3 200 3', 'the list and the audit at once');
ok(beats_after($beat), 'the sweep\'s heartbeat goes on');

# a statement of one that broke under it, if any, was tried again

my @failed = errors_since($from, qr/\[error\].*: (read|heartbeat|sweep|list
                                   |audit): |cannot read/x);
my @again = errors_since($from, qr/: (read|sweep|list|audit): the
                                   \ connection\ was\ lost,\ tried/x);
ok(@failed <= @again, 'no read, sweep, list or audit failed')
    or diag(join "\n", @failed);

# (b) sessions ended under statements: with nginx restarted, a message
# to a conversation revives it, and its read waits for a lock on the
# queued messages, as the list does for one on the tool calls; the
# sessions are ended, and each is done again on a new connection

$t->stop;
$t->run;

$from = length $t->read_file('error.log');
$before = store_reads();

# two tables locked in one statement, one after the other: a statement
# of nginx's that holds the second and wants the first (the sweep reads
# both) makes a deadlock, and PostgreSQL ends one of the two; the test's
# is tried again

my $locked = 0;
for my $try (1 .. 5) {
    $locked = $pg->hold("psql -X -q -At -h " . $pg->dir . " -U agent"
                        . " -d agent", "BEGIN; LOCK TABLE queued, tool_calls"
                        . " IN ACCESS EXCLUSIVE MODE; SELECT 'held';\n");
    last if $locked;

    diag("the locks not taken (try $try): " . $pg->held_output);
    $pg->unlock;
}
ok($locked, 'the queue and the calls locked') or diag(blockers());

my $msg = send_message_later($t, 'c', 'c 3');

my $list = Test::Agent::HTTP::connect_to($t->port(8080));
print $list http_request('GET', '/all');

# seen waiting and ended in one statement: a lock is waited for at
# most lock_timeout (half the statement's 5 s), and a loaded machine's
# psql may take longer than that between two statements

is(terminate_when("SELECT string_agg(substr(query, 1, 14), ','"
                  . " ORDER BY query) = 'SELECT id, dat,SELECT id, sta'"
                  . " FROM pg_stat_activity"
                  . " WHERE $NGINX AND wait_event_type = 'Lock'"
                  . " AND (query LIKE 'SELECT id, data FROM queued%'"
                  . " OR query LIKE 'SELECT id, state, updated%')"),
   1, 'the revival\'s read and the list wait for the locks, and nginx\'s'
      . ' sessions are ended under them');
$pg->unlock;

is(http_status($msg, 10), 202, 'the message is taken');
is(http_status($list, 10), 200, 'the list answers');

is($pg->wait_sql("SELECT type FROM events WHERE conversation = 'c'"
                 . ' ORDER BY seq DESC LIMIT 1',
                 qr/^turn_(completed|failed)$/, 15),
   'turn_completed', 'its turn completes');
ok(store_reads() > $before, 'its history read from the store');
ok(scalar errors_since($from,
                       qr/: read: the connection was lost, tried again/),
   'the read was done again on a new connection');
ok(scalar errors_since($from,
                       qr/: list: the connection was lost, tried again/),
   'the list too');
is(answers('c'), '200 3 200 3', 'the list and the audit');

# (c) a session ended under the enqueue of a message queued behind a
# turn: queued once, on a new connection, and run once

$from = length $t->read_file('error.log');

$mock->reset;
$mock->script({ text => 'a held reply', chunks => 2, pause_after => 1 });

is(send_message($t, 'b', 'b 4')->{status}, 202, 'a turn');
ok($mock->wait_paused(0, 10), 'its reply held');

ok($pg->hold("psql -X -q -At -h " . $pg->dir . " -U agent -d agent",
             "BEGIN; LOCK TABLE queued IN ACCESS EXCLUSIVE MODE;"
             . " SELECT 'held';\n"), 'the queue locked');

$msg = send_message_later($t, 'b', 'b 5');

is(terminate_when("SELECT count(*) > 0 FROM pg_stat_activity"
                  . " WHERE $NGINX AND wait_event_type = 'Lock'"
                  . " AND query LIKE '%agent_enqueue(%'"),
   1, 'a message queued behind it waits for the lock, and nginx\'s sessions'
      . ' are ended under it');
$pg->unlock;

is(http_status($msg, 10), 202, 'the queued message is taken');
ok(scalar errors_since($from,
                       qr/: queue: the connection was lost, tried again/),
   'its enqueue was done again on a new connection');

$mock->release;

is($pg->wait_sql("SELECT count(*) FROM events WHERE conversation = 'b'"
                 . " AND type = 'turn_completed'", qr/^5$/, 15),
   5, 'both turns completed');
is($pg->sql("SELECT count(*) FROM events WHERE conversation = 'b'"
            . " AND type = 'user_msg' AND data LIKE '%\"b 5\"%'"), 1,
   'the queued message ran once');
is($pg->sql("SELECT count(*) FROM queued"), 0, 'and left the queue');

# (d) PostgreSQL restarted

$pg->stop;
$pg->start;

$before = store_reads();
$beat = time;

is(turn('a', 'a 4'), 'turn_completed',
   'a turn after PostgreSQL restarted completes');
ok(store_reads() > $before, 'its history read from the store');
is(answers('a'), '200 3 200 4', 'the list and the audit at once');
ok(beats_after($beat), 'the sweep\'s heartbeat goes on');

is($pg->sql("SELECT count(*) FROM events WHERE type = 'turn_failed'"), 0,
   'no turn failed');

$mock->stop;
$t->done;
