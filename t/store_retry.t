#!/usr/bin/perl

# A batch the store failed to write is tried again a second later, and
# by then another worker may be the store's writer.  Two workers, A and
# B.  A message to w1 comes to A while another process holds the
# database's lock: A's batch waits for it on the pool's thread and fails
# at SQLite's busy timeout.  A message to w2 comes to B, whose batch
# takes both user_msgs and waits for the lock in turn.  A's retry a
# second after its failure finds B writing and leaves it to B: no worker
# exits, and once the lock goes both messages are acknowledged and
# written and both conversations' turns complete.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { pause_after => 1, text => 'later' };
});

my ($t, $db) = store_engine($mock, workers => 2);

my ($a, $b) = worker_pids($t);

ok($a && $b, "two workers, $a and $b");

sub message_on {
    my ($pid, $cid) = @_;

    my $s = worker_connection($t, $pid) or return undef;

    print $s http_request('POST', "/c/$cid/messages",
                          encode_json({ content => 'hello' }),
                          headers => { 'Content-Type' => 'application/json' });
    return $s;
}

ok($db->lock, 'the database is locked by another process');

my $first = message_on($a, 'w1');

ok($t->wait_log(qr/$a#\d+: agent store could not write \d+ events/, 15),
   'worker A\'s batch failed at the busy timeout');

# B's batch takes both user_msgs and waits for the lock in turn: B is the
# store's writer when A's retry comes, a second after its failure

my $second = message_on($b, 'w2');

sleep 2;

unlike($t->read_file('error.log'), qr/worker process \d+ exited/,
       'A\'s retry found B writing, and A goes on');

$db->unlock;

is(http_status($second, 15), 202, 'the message to worker B is acknowledged');
is(http_status($first, 15), 202, 'the message to worker A is acknowledged');

is($db->sql("SELECT group_concat(conversation || ':' || seq, ' ')"
            . " FROM (SELECT * FROM events ORDER BY conversation)"),
   'w1:1 w2:1', 'each conversation\'s user_msg in SQLite');

$mock->release;

wait_state($t, $_, 'idle', 15) for qw(w1 w2);

is($db->wait_sql("SELECT count(*) FROM conversations WHERE state = 'idle'",
                 qr/^2$/, 10), 2, 'both conversations at rest in SQLite');

is($db->whole_logs, 2, 'each conversation\'s log from seq 1, with no gap');

store_stop($t, $mock);

$t->done;
