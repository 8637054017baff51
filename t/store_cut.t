#!/usr/bin/perl

# A batch of the backlog ends early for an input: an input that comes
# while a batch is being written waits only for the event the batch is
# writing, not for the whole batch.
#
# Two turns of 64 tool calls each record their 262 events while the
# database is locked by another process; with flush=1s they wait, then
# one batch takes 256 of them (one conversation's whole, the other's
# start) and waits for the lock.  A message to a new conversation comes
# meanwhile.  Once the lock goes, the batch writes the first event of
# the first conversation, ends there, with the conversation's row set
# back to it, and the message's user_msg is written next: before the
# rest of the batch (a trigger of the test's records the order of the
# rows, and the conversations' rows as each comes).  Written whole, the
# batch would put 256 events first.  Then everything is written, each
# log whole.

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

# 'urgent' answered at once, every other message held after its first
# event until the database is locked
my $mock = Test::Agent::MockProvider->new(default => held_calls($calls,
    sub { ($_[0]{content} // '') eq 'urgent' ? { text => 'noted' } : undef }));

my ($t, $db) = store_engine($mock, store => 'flush=1s');


# the order in which rows go into the events table, and the last seq
# each conversation's row says then
$db->sql('CREATE TABLE written (n INTEGER PRIMARY KEY, conversation TEXT,'
         . ' seq INTEGER, rows TEXT); CREATE TRIGGER written_order AFTER'
         . ' INSERT ON events BEGIN INSERT INTO written (conversation,'
         . ' seq, rows) VALUES (new.conversation, new.seq, (SELECT'
         . " group_concat(id || ':' || last_seq, ' ') FROM (SELECT * FROM"
         . ' conversations ORDER BY id))); END;');

store_backlog($t, $mock, $db, $calls);

# flush=1s has passed since the first of them: a batch took 256
sleep 1.5;

my $urgent = send_message_later($t, 'u1', 'urgent');

ok(wait_recorded($t, 'u1'), 'the message is in the zone');

is(metric($t, 'agent_store_batches_cut_total'), 0, 'no batch cut yet');

$db->unlock;

is(http_status($urgent, 15), 202, 'the message is acknowledged');

is(metric($t, 'agent_store_batches_cut_total'), 1,
   'the batch ended early, once');

my $u = $db->sql("SELECT n FROM written WHERE conversation = 'u1'"
                 . ' AND seq = 1');

like($u, qr/^\d+$/, 'its user_msg is written');

# the two turns' user_msgs were written before the lock

my %before = map { split /\|/ } split /\n/,
    $db->sql("SELECT conversation, count(*) FROM written WHERE n < $u"
             . ' AND seq > 1 GROUP BY conversation');

is(scalar(keys %before), 1, 'before it, one turn\'s events');

my ($first) = keys %before;
my ($second) = grep { $_ ne ($first // '') } qw(w1 w2);

is($before{$first}, 1, "$first\'s first event, alone");

is($db->sql("SELECT count(*) FROM written WHERE conversation = '$second'"
            . " AND n < $u AND seq > 1"), 0, "none of $second\'s");

# when the message's event is written, the cut batch's conversation row
# says the last seq written, not the last the batch held

is($db->sql("SELECT rows FROM written WHERE n = $u"),
   join(' ', sort "$first:2", "$second:1", 'u1:1'),
   'the conversations\' rows say what is written');

my $all = 2 * (2 * $calls + 4) + 3;

is($db->wait_sql('SELECT count(*) FROM events', qr/^$all$/, 30), $all,
   'then every event is written');

is($db->whole_logs, 3,
   'each conversation\'s log from seq 1, with no gap');

is($db->sql("SELECT count(*) FROM conversations WHERE state = 'idle'"), 3,
   'every conversation at rest in SQLite');

is(metric($t, 'agent_store_errors_total'), 0, 'no batch failed');

store_stop($t, $mock);

done_testing;
