#!/usr/bin/perl

# With agent_store, the canonical log is written behind to SQLite (WAL)
# on a thread pool: every event, in order, whatever worker ran the turn.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use IO::Select;
use IO::Socket::INET;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless `sqlite3 -version 2>&1` =~ /^3/;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'stored reply', chunks => 3 };
});

my $db = $t->testdir . '/agent.db';

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store $db;"));

my ($rc, $out) = $t->test_config;
is($rc, 0, 'nginx -t with a store');

$t->run;

sub sql {
    my ($q) = @_;
    my $r = `sqlite3 -cmd '.timeout 5000' -separator '|' '$db' "$q" 2>&1`;
    chomp $r;
    return $r;
}

like(sql('PRAGMA journal_mode'), qr/^wal$/, 'WAL mode');
is(sql("SELECT value FROM meta WHERE key = 'schema_version'"), '11',
   'schema versioned');

# conversations side by side, some turns each

for my $round (1 .. 3) {
    send_message($t, "s$_", "round $round") for 1 .. 4;
    wait_state($t, "s$_", 'idle') for 1 .. 4;
}

for my $i (1 .. 4) {
    my $c = inspect($t, "s$i")->{json};
    my $want = join "\n", map { "$_->{seq}|$_->{type}" } @{$c->{messages}};

    my $got;
    for (1 .. 100) {
        $got = sql("SELECT seq, type FROM events WHERE conversation = 's$i'"
                   . " ORDER BY seq");
        last if $got eq $want;
        sleep 0.05;
    }

    is($got, $want, "conversation $i: the whole log, in order");
}

my $row = sql("SELECT data FROM events WHERE conversation = 's1' AND seq = 1");
like($row, qr/"type":"user_msg","seq":1,.*"content":"round 1"/,
     'events stored as logged');
is(sql("SELECT agent, last_seq FROM conversations WHERE id = 's1'"),
   'chat|9', 'conversation row');

# a message is acknowledged once it is written: the row is there when
# the answer comes

for my $n (1 .. 5) {
    my $r = send_message($t, "a$n", 'durable?');
    is($r->{status}, 202, "message $n acknowledged");
    is(sql("SELECT type FROM events WHERE conversation = 'a$n' AND seq = "
           . $r->{json}{seq}), 'user_msg', "message $n written before its 202");
    wait_state($t, "a$n", 'idle');
}

$mock->stop;
$t->done(more => 1);

# one worker, the database locked by another process: the message is
# taken but not acknowledged until its row is written, and meanwhile the
# worker answers other requests, since SQLite waits on a pool thread,
# never in the event loop

$t = Test::Agent->new;
$mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'stored reply' };
});
$db = $t->testdir . '/agent.db';

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 1,
    http => "agent_store $db;"));
$t->run;

send_message($t, 'w0', 'first');
wait_state($t, 'w0', 'idle');

# another process holds the write lock (see Test::Agent::Store)
my $store = Test::Agent::Store->new($db);
ok($store->lock, 'the database is locked by another process');

my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                 PeerPort => $t->port(8080)) or die "$!\n";
print $sock Test::Agent::HTTP::http_request('POST', '/c/w1/messages',
    '{"content":"wait for the disk"}',
    headers => { 'Content-Type' => 'application/json' });

my $sel = IO::Select->new($sock);
ok(!$sel->can_read(0.8), 'no answer while the write cannot happen');

my $start = time;
my $r = inspect($t, 'w0');
is($r->{status}, 200, 'the worker answers another request meanwhile');
cmp_ok(time - $start, '<', 2,
       'at once, not after the 5 s busy timeout: the event loop is free');

$store->unlock;

ok($sel->can_read(8), 'the answer once the lock is gone');
sysread($sock, my $answer, 4096);
like($answer, qr{^HTTP/1\.1 202}, 'and it is a 202');
close $sock;

wait_state($t, 'w1', 'idle');
is(sql("SELECT type FROM events WHERE conversation = 'w1' AND seq = 1"),
   'user_msg', 'written once the lock was gone');

# nginx -s quit in the middle of a turn: the worker finishes the turn and
# writes it before it exits

$mock->script({ text => 'finished after quit', chunks => 2,
                pause_after => 2 });
my $before = scalar @{$mock->requests};
send_message($t, 'q1', 'quit now');
$mock->wait_paused($before, 5);

kill 'QUIT', $t->master_pid;
sleep 0.3;
$mock->release;
$t->stop;

is(sql("SELECT group_concat(type, ' ') FROM"
       . " (SELECT type FROM events WHERE conversation = 'q1' ORDER BY seq)"),
   'user_msg assistant_msg turn_completed',
   'the turn completed and was written before the worker exited');

$mock->stop;
$t->done;
