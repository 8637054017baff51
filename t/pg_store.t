#!/usr/bin/perl

# agent_store on PostgreSQL: the schema made once by masters that start
# together, the log written as it was logged (its bytes, in order), a
# worker killed in a turn, and a server that goes away or stops
# answering while nginx runs: writes fail and are tried again, inputs
# get 503 not_durable after their wait, the event loop stays free, and
# the backlog is written once the server is back.  The tests of the
# store's behaviour that hold for either backend run against PostgreSQL
# in t/pg_suite.t.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep time);
use JSON::PP;
use POSIX ();

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::Postgres;

plan(skip_all => Test::Agent::Postgres->missing)
    if Test::Agent::Postgres->missing;

my $pg = Test::Agent::Postgres->new;
my $conninfo = $pg->conninfo;

# a connection string libpq cannot read is refused by nginx -t

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'stored reply', chunks => 3 };
});

my $bad = Test::Agent->new;
$bad->write_file_expand('nginx.conf', engine_conf($mock,
    http => 'agent_store "postgres:host=/tmp dbname";'));
my ($rc, $out) = $bad->test_config;
isnt($rc, 0, 'a bad connection string: nginx -t fails');
like($out, qr/invalid PostgreSQL connection string/, 'and says why');

# masters that start together on a new database: one makes the schema,
# the others find it made

$pg->sql('CREATE DATABASE fresh');
(my $fresh = $conninfo) =~ s/dbname=agent/dbname=fresh/;

my @confs;
for my $i (1 .. 3) {
    my $ti = Test::Agent->new;
    $ti->write_file_expand('nginx.conf', engine_conf($mock,
        http => "agent_store \"$fresh\";"));
    push @confs, $ti;
}

my @pids;
for my $ti (@confs) {
    my $pid = fork // die "fork: $!\n";
    if ($pid == 0) {
        my ($r) = $ti->test_config;
        POSIX::_exit($r);
    }
    push @pids, $pid;
}

my $ok = 0;
for (@pids) {
    waitpid $_, 0;
    $ok++ if $? == 0;
}
is($ok, 3, 'three masters at once: each starts');

{
    local $pg->{db} = 'fresh';
    is($pg->sql("SELECT string_agg(version::text, ',' ORDER BY version)"
                . ' FROM schema_version'), '1,2,3,4',
       'the schema made once, versioned');
    is($pg->sql("SELECT count(*) FROM information_schema.tables"
                . " WHERE table_schema = 'public' AND table_name IN"
                . " ('nodes', 'conversations', 'events', 'tool_calls',"
                . " 'queued', 'model_calls')"), 6, 'its tables');
    is($pg->sql("SELECT string_agg(column_name, ' ' ORDER BY column_name)"
                . " FROM information_schema.columns"
                . " WHERE table_name = 'conversations' AND column_name IN"
                . " ('node', 'epoch', 'takeovers', 'takeover_seq',"
                . " 'queue_id')"),
       'epoch node queue_id takeover_seq takeovers',
       'conversations ready for owners');
}

# a master that finds the schema made says nothing of it: libpq's
# notices ("already exists, skipping") are not printed

($rc, $out) = $confs[0]->test_config;
is($rc, 0, 'nginx -t on a schema made before');
unlike($out, qr/NOTICE|already exists/, 'with no notice of the server\'s')
    or diag($out);

# the log, written as logged

my $t = Test::Agent->new;
$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store \"$conninfo\";",
    server => 'location = /metrics { agent_metrics; }'));
($rc, $out) = $t->test_config;
is($rc, 0, 'nginx -t with a PostgreSQL store') or diag($out);

$t->run;

for my $round (1 .. 2) {
    send_message($t, "s$_", "round $round") for 1 .. 4;
    wait_state($t, "s$_", 'idle') for 1 .. 4;
}

for my $i (1 .. 4) {
    my $c = inspect($t, "s$i")->{json};
    my $want = join "\n", map { "$_->{seq}|$_->{type}" } @{$c->{messages}};

    is($pg->wait_sql("SELECT seq, type FROM events WHERE conversation ="
                     . " 's$i' ORDER BY seq", qr/^\Q$want\E$/),
       $want, "conversation $i: the whole log, in order");
}

is($pg->sql("SELECT agent, last_seq, state FROM conversations"
            . " WHERE id = 's1'"), 'chat|6|idle', 'the conversation\'s row');

my $m = http_get('/metrics', port => $t->port(8080))->{body} // '';
my ($sum) = $m =~ /^agent_store_write_seconds_sum ([\d.e+-]+)$/m;
my ($count) = $m =~ /^agent_store_write_seconds_count (\d+)$/m;
diag(sprintf 'PostgreSQL: a batch written in %.2f ms on average (%d batches)',
     1000 * ($sum // 0) / ($count || 1), $count // 0);


# bytes that JSON escapes, and some it does not: stored as they came

my $text = "h\x{e9}llo \"quoted\" back\\slash \x{1f600}";
is(send_message($t, 'b1', $text)->{status}, 202, 'a message of odd bytes');
wait_state($t, 'b1', 'idle');

my $stored = $pg->sql("SELECT data FROM events WHERE conversation = 'b1'"
                      . " AND seq = 1");
is(eval { decode_json($stored)->{content} }, $text,
   'the message\'s text stored as it came');
is($pg->sql("SELECT octet_length(data) FROM events"
            . " WHERE conversation = 'b1' AND seq = 1"), length $stored,
   'as text: the bytes written, not a value made again (jsonb)');

# a worker killed in the middle of a reply: the turn is taken over, and
# the log has it once

$mock->script({ text => 'lost words', chunks => 2, pause_after => 2 },
              { text => 'the answer' });
my $before = scalar @{$mock->requests};
send_message($t, 'k1', 'hello');
$mock->wait_paused($before, 5);

my $lease;
for (1 .. 100) {
    $lease = inspect($t, 'k1')->{json}{lease};
    last if $lease;
    sleep 0.02;
}
ok($lease, 'a worker holds the turn');
$t->kill_worker($lease);

wait_state($t, 'k1', 'idle', 10);
is($pg->wait_sql(types('k1'), qr/turn_completed/),
   'user_msg assistant_msg turn_completed',
   'killed mid-turn: one reply, written once');

# the server goes away: writes fail and are tried again, an input to a
# conversation the zone holds is answered 503 not_durable after its
# wait, one that needs a read of the store 503 at once; the rest of
# nginx goes on

sub types {
    my ($cid) = @_;
    return "SELECT group_concat(type, ' ') FROM (SELECT type FROM events"
           . " WHERE conversation = '$cid' ORDER BY seq) e";
}

sub metrics_time {
    my $start = time;
    my $r = http_get('/metrics', port => $t->port(8080));
    return $r->{status} == 200 ? time - $start : 99;
}

my $turns = 'user_msg assistant_msg turn_completed';

$pg->stop;

my $start = time;
my $r = send_message($t, 's3', 'while the database is down',
                     timeout => 20);
is($r->{status}, 503, 'no database: 503');
like($r->{body}, qr/not_durable/, 'not durable');
cmp_ok(time - $start, '>=', 9, 'after the input\'s wait');

cmp_ok(metrics_time(), '<', 1, 'nginx answers meanwhile, at once');

$r = send_message($t, 'n1', 'a conversation the zone does not hold');
is($r->{status}, 503, 'one to read from the store: 503');
like($r->{body}, qr/unavailable/, 'unavailable');

like($t->read_file('error.log'),
     qr/agent store "postgres:[^"]*dbname=agent[^"]*"/,
     'the failure logged with the store\'s name');
unlike($t->read_file('error.log'), qr/password/, 'and no password');

$pg->start;

# the message's turn runs on, or fails if it needed the history while
# the server was away; either way it is written to its end

my $end = '(assistant_msg turn_completed|turn_failed)';
my $ended = qr/^(\Q$turns\E ){2}user_msg $end$/;

like($pg->wait_sql(types('s3'), $ended, 30), $ended,
     'the server back: the backlog is written');

# the server stops answering (its processes paused): a write waits for
# its deadline, not for ever, and its connection is closed

sub server_pids {
    open my $fh, '<', $pg->dir . '/data/postmaster.pid' or return ();
    my $pid = <$fh>;
    chomp $pid;
    my @children = split ' ', `pgrep -P $pid`;
    return ($pid, @children);
}

my @paused = server_pids();
kill 'STOP', @paused;

$r = send_message($t, 's4', 'to a server that does not answer',
                 timeout => 20);
is($r->{status}, 503, 'a paused server: 503');
like($r->{body}, qr/not_durable/, 'not durable');

cmp_ok(metrics_time(), '<', 1, 'nginx answers meanwhile, at once');

my $timed_out;
for (1 .. 100) {
    $timed_out = $t->read_file('error.log') =~ /did not answer in time/;
    last if $timed_out;
    sleep 0.1;
}
ok($timed_out, 'a write waited for its deadline and gave up');

kill 'CONT', @paused;

# so does this one's

like($pg->wait_sql(types('s4'), $ended, 20), $ended,
     'the server answering again: the backlog is written');

is(metric($t, 'agent_store_lag_events'), 0, 'nothing left to write');

$mock->stop;
$t->allow_alert(qr/exited on signal 9/);
$t->done;
