#!/usr/bin/perl

# Inputs that come while a batch is being written go in that batch's
# commit, whatever the batch: here an input's own.  A message to g1 comes
# while another process holds the database's lock: its batch waits on the
# pool's thread for the lock.  Messages to g2 and g3 come meanwhile.  Once
# the lock goes, the one batch writes the three user_msgs and commits
# once, and the three are answered: one batch of three events, not one
# batch each.  The replies wait for the test, and flush=5s keeps every
# other write (the audit's rows) for later, so that nothing but the
# inputs is written meanwhile: not due while the lock is held.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

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

my ($t, $db) = store_engine($mock, store => 'flush=5s');

# nothing waits: the counts before

is(metric($t, 'agent_store_lag_events'), 0, 'nothing waits for the store');

my $batches = metric($t, 'agent_store_batch_events_count');
my $written = metric($t, 'agent_store_batch_events_sum');

ok($db->lock, 'the database is locked by another process');

my $first = send_message_later($t, 'g1', 'first');

# its batch is on the pool's thread, waiting for the lock

ok(wait_recorded($t, 'g1'), 'the first message is in the zone');

my @more = map { send_message_later($t, $_, 'meanwhile') } qw(g2 g3);

ok(wait_recorded($t, $_), "the message to $_ is in the zone") for qw(g2 g3);

is(metric($t, 'agent_store_batch_events_count'), $batches,
   'nothing is written while the lock is held');

$db->unlock;

is(http_status($_, 15), 202, 'a message is acknowledged')
    for $first, @more;

is(metric($t, 'agent_store_batch_events_count') - $batches, 1,
   'once one batch is written');
is(metric($t, 'agent_store_batch_events_sum') - $written, 3,
   'of the three user_msgs');
is(metric($t, 'agent_store_batches_cut_total'), 0,
   'the batch was not cut: it took the others on at its end');

is($db->sql("SELECT group_concat(conversation || ':' || seq, ' ')"
            . " FROM (SELECT * FROM events ORDER BY conversation)"),
   'g1:1 g2:1 g3:1', 'each conversation\'s user_msg in SQLite');

is($db->sql("SELECT count(*) FROM conversations WHERE state = 'running'"),
   3, 'each conversation\'s turn running there');

# the turns go on and are written as usual

$mock->release;

wait_state($t, $_, 'idle', 15) for qw(g1 g2 g3);

is($db->wait_sql("SELECT count(*) FROM conversations WHERE state = 'idle'",
                 qr/^3$/, 10), 3, 'then every conversation at rest in SQLite');

is($db->whole_logs, 3,
   'each conversation\'s log from seq 1, with no gap');

store_stop($t, $mock);

done_testing;
