#!/usr/bin/perl

# An input another worker's batch writes is answered when that batch is
# written: the writer wakes the input's worker, which does not wait for
# its next poll.  Two workers, A and B.  A message to w1 comes to A while
# another process holds the database's lock: A's batch waits on the
# pool's thread for the lock, and A is the store's writer.  A message to
# w2 comes to B meanwhile: B may not write beside A, and A's batch takes
# w2's user_msg on at its end.  Once the lock goes, the one batch writes
# both; both are answered, and B's debug log shows the wake-up A sent it
# (A, which answers its own input at the batch's end, sends itself none).
# flush=5s: the audit's row of w1's model call, queued before that batch,
# is not due while the lock is held, and goes later.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep);
use JSON::PP;
use Socket qw(AF_UNIX SOCK_DGRAM pack_sockaddr_un);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { pause_after => 1, text => 'later' };
});

my ($t, $db) = store_engine($mock, store => 'flush=5s', workers => 2,
                            debug => 1);

my ($a, $b) = worker_pids($t);

ok($a && $b, "two workers, $a and $b");

my $batches = metric($t, 'agent_store_batch_events_count');
my $written = metric($t, 'agent_store_batch_events_sum');

ok($db->lock, 'the database is locked by another process');

sub message_on {
    my ($pid, $cid) = @_;

    my $s = worker_connection($t, $pid) or return undef;

    print $s http_request('POST', "/c/$cid/messages",
                          encode_json({ content => 'hello' }),
                          headers => { 'Content-Type' => 'application/json' });
    return $s;
}

my $first = message_on($a, 'w1');

# its batch is on A's pool, waiting for the lock

ok(wait_recorded($t, 'w1'), 'the message to worker A is in the zone');

my $second = message_on($b, 'w2');

ok(wait_recorded($t, 'w2'), 'the message to worker B is in the zone');

is(metric($t, 'agent_store_batch_events_count'), $batches,
   'nothing is written while the lock is held');

$db->unlock;

is(http_status($first, 15), 202, 'the message to worker A is acknowledged');
is(http_status($second, 15), 202, 'the message to worker B is acknowledged');

is(metric($t, 'agent_store_batch_events_count') - $batches, 1,
   'once one batch is written');
is(metric($t, 'agent_store_batch_events_sum') - $written, 2,
   'of the two user_msgs');

is($db->sql("SELECT group_concat(conversation || ':' || seq, ' ')"
            . " FROM (SELECT * FROM events ORDER BY conversation)"),
   'w1:1 w2:1', 'each conversation\'s user_msg in SQLite');

SKIP: {
    skip 'nginx built without --with-debug', 2
        unless `@{[ Test::Agent->binary ]} -V 2>&1` =~ /--with-debug/;

    my $log = $t->read_file('debug.log');

    like($log, qr/\[debug\] $b#\d+: agent wake: inputs written/,
         'worker B was woken by the batch that wrote its input');
    unlike($log, qr/\[debug\] $a#\d+: agent wake: inputs written/,
           'worker A, which wrote it, was not');
}

# the sockets are open to any local process: datagrams from outside,
# empty or not, only make a worker look again

socket(my $u, AF_UNIX, SOCK_DGRAM, 0) or die "socket: $!\n";

for my $pid ($a, $b) {
    my $to = pack_sockaddr_un("\0ngx_http_agent_wake:$pid");

    ok(defined send($u, '', 0, $to), "an empty datagram to worker $pid");
    send($u, $_, 0, $to) for 'w1', 'w2', 'nowhere', 'x' x 5000, "\0" x 3;
}

close $u;

is(inspect($t, 'w1')->{json}{state}, 'streaming',
   'w1\'s turn goes on, its model call waiting');

$mock->release;

wait_state($t, $_, 'idle', 15) for qw(w1 w2);

is($db->wait_sql("SELECT count(*) FROM conversations WHERE state = 'idle'",
                 qr/^2$/, 10), 2, 'then both conversations at rest in SQLite');

is($db->whole_logs, 2, 'each conversation\'s log from seq 1, with no gap');

store_stop($t, $mock);

done_testing;
