#!/usr/bin/perl

# An input that comes while a batch of the backlog is being written goes
# in that batch's commit: the batch ends early (t/store_cut.t), takes
# the input's events on, commits once, and the input is answered then,
# not after a commit of its own.
#
# As in store_cut.t, two turns of 64 tool calls record their 262 events
# while another process holds the database's lock; with flush=1s a batch
# takes 256 of them and waits for the lock; a message to a new
# conversation comes meanwhile.  A trigger of the test's refuses every
# event of the backlog past the first written after the lock, so that
# no batch of the backlog commits after that one until the test drops
# it: the message is answered once one batch more is written, of two
# events (the backlog's first and the message's user_msg).  Answered
# after a commit of its own, it would have taken two batches of one.
# Then the trigger goes and everything is written, each log whole.

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

my $calls = 64;

# the message's reply waits for the test (no event of its turn but the
# user_msg is written meanwhile), every other is held after its first
# event until the database is locked
my $mock = Test::Agent::MockProvider->new(default => held_calls($calls,
    sub { ($_[0]{content} // '') eq 'urgent'
          ? { pause_after => 1, text => 'noted' } : undef }));

my ($t, $db) = store_engine($mock, store => 'flush=1s');


# the order in which rows go into the events table; past the first of
# the backlog written after the lock, its events are refused

$db->sql('CREATE TABLE written (n INTEGER PRIMARY KEY, conversation TEXT,'
         . ' seq INTEGER); CREATE TRIGGER written_order AFTER INSERT ON'
         . ' events BEGIN INSERT INTO written (conversation, seq) VALUES'
         . ' (new.conversation, new.seq); END;');

$db->sql("CREATE TRIGGER held BEFORE INSERT ON events WHEN"
         . " new.conversation <> 'u1' AND new.seq > 1 AND EXISTS (SELECT 1"
         . " FROM written WHERE conversation <> 'u1' AND seq > 1) BEGIN"
         . " SELECT RAISE(ABORT, 'held by the test'); END;");

store_backlog($t, $mock, $db, $calls);

# flush=1s has passed since the first of them: a batch took 256

sleep 1.5;

my $batches = metric($t, 'agent_store_batch_events_count');
my $written = metric($t, 'agent_store_batch_events_sum');

ok($batches > 0, "$batches batches written before the lock");

my $urgent = send_message_later($t, 'u1', 'urgent');

ok(wait_recorded($t, 'u1'), 'the message is in the zone');

is(metric($t, 'agent_store_batches_cut_total'), 0, 'no batch cut yet');

$db->unlock;

is(http_status($urgent, 15), 202, 'the message is acknowledged');

is(metric($t, 'agent_store_batch_events_count') - $batches, 1,
   'once one batch more is written');
is(metric($t, 'agent_store_batch_events_sum') - $written, 2,
   'of two events');
is(metric($t, 'agent_store_batches_cut_total'), 1,
   'the batch ended early, once');

is($db->sql('SELECT group_concat(conversation || \':\' || seq, \' \')'
            . ' FROM (SELECT * FROM written WHERE seq > 1'
            . " OR conversation = 'u1' ORDER BY n)"),
   $db->sql("SELECT conversation || ':2 u1:1' FROM written"
            . " WHERE conversation <> 'u1' AND seq = 2"),
   'the backlog\'s first event, then the message\'s user_msg');

is($db->sql("SELECT state FROM conversations WHERE id = 'u1'"), 'running',
   'the message\'s conversation is in SQLite, its turn running');

# the backlog goes on once the test lets it

$db->sql('DROP TRIGGER held');

$mock->release;

wait_state($t, 'u1', 'idle', 30);

my $all = 2 * (2 * $calls + 4) + 3;

is($db->wait_sql('SELECT count(*) FROM events', qr/^$all$/, 30), $all,
   'then every event is written');

is($db->whole_logs, 3,
   'each conversation\'s log from seq 1, with no gap');

is($db->wait_sql("SELECT count(*) FROM conversations WHERE state = 'idle'",
                 qr/^3$/, 10), 3,
   'every conversation at rest in SQLite');

like(store_stop($t, $mock), qr/held by the test/,
     'the backlog was refused meanwhile');

done_testing;
