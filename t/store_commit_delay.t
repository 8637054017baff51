#!/usr/bin/perl

# agent_store ... commit_delay=time: an input's batch waits that long for
# the inputs that follow, which go in its commit (one fdatasync for them
# all); each answer waits for it.  It needs flush=, without which every
# event, the input's own too, starts its batch at once.  Here 500ms: a
# message alone is answered once it has passed; three messages 100 ms
# apart share one batch.  The replies wait for the test, and flush=5s
# keeps every other write (the audit's rows) for later.  A delay that is
# not one is refused at configuration; every parameter at once is not.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { pause_after => 1, text => 'later' };
});

# a delay that is not one

my $t = Test::Agent->new;
my $db = $t->testdir . '/agent.db';

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => "agent_store $db commit_delay=soon;"));
my ($rc, $err) = $t->test_config;
isnt($rc, 0, 'commit_delay=soon refused');
like($err, qr/invalid commit delay "commit_delay=soon"/, 'and said why');

# without flush= an event starts its batch at once, the input's own too

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => "agent_store $db commit_delay=2ms;"));

($rc, $err) = $t->test_config;
isnt($rc, 0, 'commit_delay without flush refused');
like($err, qr/"commit_delay" needs "flush"/, 'and said why');

# every parameter at once

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => "agent_store $db thread_pool=default flush=10ms"
            . " commit_delay=2ms history=1m sync=normal;"));

($rc, $err) = $t->test_config;
is($rc, 0, 'agent_store with its five parameters taken') or diag($err);

my $store;
($t, $store) = store_engine($mock, store => 'flush=5s commit_delay=500ms');

my $batches = metric($t, 'agent_store_batch_events_count');
my $written = metric($t, 'agent_store_batch_events_sum');

# alone: written once the delay has passed

my $start = time;
my $r = send_message($t, 'a1', 'alone');
my $took = time - $start;

is($r->{status}, 202, 'a message alone is acknowledged');
ok($took >= 0.45 && $took < 3,
   sprintf('once the delay has passed (%.3f s)', $took));
is(metric($t, 'agent_store_batch_events_count') - $batches, 1,
   'in one batch');

$batches = metric($t, 'agent_store_batch_events_count');
$written = metric($t, 'agent_store_batch_events_sum');

# three, 100 ms apart: one commit

$start = time;

my @s;

for my $cid (qw(g1 g2 g3)) {
    push @s, send_message_later($t, $cid, 'together');
    sleep 0.1;
}

is(http_status($_, 15), 202, 'a message is acknowledged') for @s;

$took = time - $start;

ok($took >= 0.45 && $took < 3,
   sprintf('all three once the first one\'s delay has passed (%.3f s)',
           $took));
is(metric($t, 'agent_store_batch_events_count') - $batches, 1,
   'in one batch');
is(metric($t, 'agent_store_batch_events_sum') - $written, 3,
   'of the three user_msgs');

is($store->sql("SELECT group_concat(conversation || ':' || seq, ' ')"
               . " FROM (SELECT * FROM events WHERE conversation LIKE 'g%'"
               . " ORDER BY conversation)"),
   'g1:1 g2:1 g3:1', 'each conversation\'s user_msg in SQLite');

# the turns go on and are written as usual

$mock->release;

wait_state($t, $_, 'idle', 15) for qw(a1 g1 g2 g3);

is($store->wait_sql("SELECT count(*) FROM conversations"
                    . " WHERE state = 'idle'", qr/^4$/, 15), 4,
   'then every conversation at rest in SQLite');
is($store->whole_logs, 4, 'each conversation\'s log from seq 1, with no gap');

store_stop($t, $mock);

done_testing;
