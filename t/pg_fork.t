#!/usr/bin/perl

# A node's copy of a conversation that is not the log's: the log holds,
# at the seq the node writes next, an event of an older epoch (written
# by a node that held the conversation before, here by psql).  The
# write is refused (agent_write, schema version 4: AG002), nothing of
# the batch goes in, the node logs it and drops the conversation from
# its zone; the input that waited for the write is not acknowledged;
# the next request revives the conversation from the log, which goes on
# gapless.  So too for another event of the node's own epoch at that
# seq (a batch collected before its lease lapsed and written after the
# node claimed the conversation again).  A batch written twice still
# changes nothing (t/pg_store.t).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep);

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

my $t = Test::Agent->new;
my $addr = '127.0.0.1:' . $t->port(8080);

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store \"$conninfo\";\n"
            . "    agent_node id=n1 addr=$addr heartbeat=500ms ttl=2s;\n"
            . "    agent_evict_idle 3s;"));
$t->run;

sub log_of {
    my ($cid) = @_;
    return $pg->sql("SELECT string_agg(seq || ':' || type || ':' || epoch,"
                    . " ' ' ORDER BY seq) FROM events"
                    . " WHERE conversation = '$cid'");
}

# a first turn, at epoch 0; let go once evicted at rest, claimed again
# by a read: epoch 1, the node's copy at seq 3

is(send_message($t, 'f1', 'first')->{status}, 202, 'a message');
wait_state($t, 'f1', 'idle');
is($pg->wait_sql("SELECT coalesce(node, 'none') FROM conversations"
                 . " WHERE id = 'f1'", qr/^none$/, 10), 'none',
   'evicted at rest: let go');

is(inspect($t, 'f1')->{status}, 200, 'read again');
is($pg->sql("SELECT node, epoch, last_seq FROM conversations"
            . " WHERE id = 'f1'"), 'n1|1|3', 'claimed again, at epoch 1');

# a turn of epoch 0 in the log at seqs 4 to 6, which the node's copy has
# not (what a node that held the conversation before wrote): its events
# as the first turn's, of turn 2

$pg->sql("INSERT INTO events (conversation, seq, type, data, epoch)"
         . " SELECT conversation, seq + 3, type,"
         . " replace(replace(data, '\"turn\":1', '\"turn\":2'),"
         . " 'first', 'an older epoch''s'), 0 FROM events"
         . " WHERE conversation = 'f1' ORDER BY seq;"
         . " UPDATE conversations SET last_seq = 6 WHERE id = 'f1'");
is(log_of('f1'), '1:user_msg:0 2:assistant_msg:0 3:turn_completed:0'
   . ' 4:user_msg:0 5:assistant_msg:0 6:turn_completed:0',
   'the log holds an older epoch\'s turn past the node\'s copy');
my $kept = $pg->sql("SELECT data FROM events WHERE conversation = 'f1'"
                    . " AND seq = 4");

# the node writes its next event at seq 4

my $r = send_message($t, 'f1', 'forked', timeout => 15);
isnt($r->{status} // 0, 202, 'the message written at seq 4 is not'
     . ' acknowledged');
ok(($r->{status} // 0) == 421 || ($r->{status} // 0) == 503,
   "answered $r->{status}: to be sent again");
ok($t->wait_log(qr/agent conversation "f1": the log at seq 4 holds another/),
   'the node logs the log\'s event at seq 4');

is($pg->sql("SELECT data FROM events WHERE conversation = 'f1'"
            . " AND seq = 4"), $kept, 'the log keeps its event at seq 4');
is(log_of('f1'), '1:user_msg:0 2:assistant_msg:0 3:turn_completed:0'
   . ' 4:user_msg:0 5:assistant_msg:0 6:turn_completed:0',
   'and nothing of the refused batch');
unlike($pg->sql("SELECT string_agg(data, ' ') FROM events"
                . " WHERE conversation = 'f1'"), qr/forked/,
       'the message is not in the log');
is($pg->sql("SELECT node, epoch, last_seq, state FROM conversations"
            . " WHERE id = 'f1'"), 'n1|1|6|idle', 'the row as it was');

# the next request revives it from the log

my $c = inspect($t, 'f1')->{json} // {};
is(join(' ', map { $_->{content} } grep { $_->{type} eq 'user_msg' }
                                         @{$c->{messages} // []}),
   'first an older epoch\'s', 'revived from the log: the older epoch\'s'
   . ' turn after the first');

$r = send_message($t, 'f1', 'sent again');
is($r->{status}, 202, 'the message sent again: acknowledged');
$c = wait_state($t, 'f1', 'idle');
is(log_of('f1'), '1:user_msg:0 2:assistant_msg:0 3:turn_completed:0'
   . ' 4:user_msg:0 5:assistant_msg:0 6:turn_completed:0'
   . ' 7:user_msg:1 8:assistant_msg:1 9:turn_completed:1',
   'the conversation goes on gapless, at the node\'s epoch');
is($pg->sql("SELECT count(*) FROM events WHERE conversation = 'f1'"
            . " AND type = 'user_msg' AND data LIKE '%sent again%'"), 1,
   'the acknowledged message once');
is($pg->sql("SELECT count(*) FROM events WHERE conversation = 'f1'"
            . " AND data LIKE '%forked%'"), 0,
   'the refused one never');
is($pg->sql("SELECT last_seq FROM conversations WHERE id = 'f1'"), 9,
   'the row\'s last seq');

# another event at the seq the node writes next, of the node's own epoch
# (a batch of this node, collected before its lease lapsed, written
# after it claimed the conversation again, the epoch kept): the same
# type, other bytes

$pg->sql("INSERT INTO events (conversation, seq, type, data, epoch)"
         . " SELECT conversation, 10, type,"
         . " replace(replace(data, '\"turn\":3', '\"turn\":4'),"
         . " 'sent again', 'a lapsed batch'), epoch FROM events"
         . " WHERE conversation = 'f1' AND seq = 7;"
         . " UPDATE conversations SET last_seq = 10 WHERE id = 'f1'");

$r = send_message($t, 'f1', 'forked too', timeout => 15);
isnt($r->{status} // 0, 202, 'a user_msg of the same epoch, other bytes,'
     . ' at seq 10: not acknowledged');
ok($t->wait_log(qr/agent conversation "f1": the log at seq 10 holds/),
   'logged');
is($pg->sql("SELECT count(*) FROM events WHERE conversation = 'f1'"
            . " AND data LIKE '%forked too%'"), 0, 'not in the log');

# revived, the log's turn taken over (it ends inside one); then the
# message again

wait_state($t, 'f1', 'idle');
is(send_message($t, 'f1', 'forked too, again')->{status}, 202,
   'sent again: acknowledged');
wait_state($t, 'f1', 'idle');
is(log_of('f1'), join(' ', map { "$_->[0]:$_->[1]" }
   [1, 'user_msg:0'], [2, 'assistant_msg:0'], [3, 'turn_completed:0'],
   [4, 'user_msg:0'], [5, 'assistant_msg:0'], [6, 'turn_completed:0'],
   [7, 'user_msg:1'], [8, 'assistant_msg:1'], [9, 'turn_completed:1'],
   [10, 'user_msg:1'], [11, 'assistant_msg:1'], [12, 'turn_completed:1'],
   [13, 'user_msg:1'], [14, 'assistant_msg:1'], [15, 'turn_completed:1']),
   'gapless: the log\'s turn at seq 10 taken over, then the message');
is($pg->sql("SELECT string_agg(data::json->>'content', ' | ' ORDER BY seq)"
            . " FROM events WHERE conversation = 'f1' AND seq > 9"
            . " AND type = 'user_msg'"), 'a lapsed batch | forked too, again',
   'the messages as the log has them');

# a batch on its way when the node's lease lapses (its heartbeat held
# by a lock on the nodes table; the batch's insert slowed down by a
# trigger, the conversation's row locked): its conversation leaves the
# zone, the input waiting for it is answered 421, and the batch must not
# commit after that (the writer checks the lease before its COMMIT)

$pg->sql("CREATE FUNCTION slowly() RETURNS trigger LANGUAGE plpgsql AS"
         . " \$\$ BEGIN IF NEW.data LIKE '%slowly%' THEN"
         . " PERFORM pg_sleep(4); END IF; RETURN NEW; END \$\$;"
         . " CREATE TRIGGER slowly BEFORE INSERT ON events FOR EACH ROW"
         . " EXECUTE FUNCTION slowly()");

ok($pg->lock('nodes'), 'the heartbeat held');
$r = send_message($t, 'f1', 'slowly', timeout => 15);
is($r->{status}, 421, 'a message written as the lease lapses: 421');
ok($t->wait_log(qr/lease lapsed while a batch was written/, 8),
   'the batch on its way is rolled back');
$pg->unlock;
is($pg->sql("SELECT count(*) FROM events WHERE conversation = 'f1'"
            . " AND data LIKE '%slowly%'"), 0,
   'the message answered 421 is not in the log');
$pg->sql('DROP TRIGGER slowly ON events');

sleep 1.5;
is(send_message($t, 'f1', 'quickly')->{status}, 202,
   'once the heartbeat is back: a message');
wait_state($t, 'f1', 'idle');
is($pg->sql("SELECT count(*) || ' ' || max(seq) FROM events"
            . " WHERE conversation = 'f1'"), '18 18', 'gapless');

# agent_write itself: a batch written twice (its COMMIT's answer lost)
# changes nothing; another event at a seq it holds is refused, AG002 (a
# whole turn, of a node with no heartbeat: the sweep leaves it at rest)

my $batch = sub {
    my ($content) = @_;
    return "SELECT agent_write(ARRAY['w1', 'w1'], ARRAY['chat', 'chat'],"
           . " ARRAY['', ''],"
           . " ARRAY[1, 2]::bigint[], ARRAY['user_msg', 'turn_completed'],"
           . " ARRAY[1, 2]::bigint[], ARRAY['{\"type\":\"user_msg\","
           . "\"seq\":1,\"turn\":1,\"content\":\"$content\"}',"
           . " '{\"type\":\"turn_completed\",\"seq\":2,\"turn\":1}'],"
           . " 'n9', ARRAY[0, 0]::bigint[])";
};

is($pg->sql($batch->('once')), 2, 'a batch written');
is($pg->sql($batch->('once')), 2, 'written again');
is($pg->sql("SELECT count(*) || ' ' || max(last_seq) FROM events e"
            . " JOIN conversations c ON c.id = e.conversation"
            . " WHERE conversation = 'w1'"), '2 2', 'it changed nothing');
like($pg->sql($batch->('other')),
     qr/ERROR:  the log at seq 1 holds another event/,
     'another event at its seqs: refused');
is($pg->sql("SELECT count(*) FROM events WHERE conversation = 'w1'"
            . " AND data LIKE '%other%'"), 0, 'and not written');

$mock->stop;
$t->stop;

is(join("\n", $t->log_problems), '', 'no alert');

done_testing;
