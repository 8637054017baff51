#!/usr/bin/perl

# The tables the store derives from the log, written by the writer in the
# log's own transactions: a tool call's row follows it (called, then
# suspended with its kind and deadline, then done with its result), and
# a conversation's state follows its turns (running, awaiting_input while
# a call waits for a person, idle once a turn ends, a halted one too).
# The state is written only when it changes: a trigger of the test's
# counts every write of a state the row had already, and finds none.
# The module's events are marked derived; another writer's (an older
# module's workers beside a binary upgrade, which know no such column)
# are derived by the store's trigger.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $mock = Test::Agent::MockProvider->new;

# the before hook continues ({}) unless the test scripts a halt
my $hook = Test::Agent::MockProvider->new(default => sub {
    return { status => 200, body => '{}' };
});

my $hport = $hook->port;
my $t = Test::Agent->new;
my $path = $t->testdir . '/agent.db';
my $db = Test::Agent::Store->new($path);

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => "agent_store $path;",
    tools => $ECHO_TOOL . <<'EOF',
    agent_tool ask_user {
        executor human;
        timeout 1h;
    }
EOF
    agent => "tools echo ask_user;\n"
        . "        hook_before /hook/before timeout=1s;",
    server => $ECHO_LOCATION . <<"EOF"));
        location = /hook/before {
            internal;
            proxy_pass http://127.0.0.1:$hport/v1/chat/completions;
        }
EOF
$t->run;

# every write of a conversation's state, and those that changed nothing

$db->sql('CREATE TABLE writes (n INTEGER PRIMARY KEY, conversation TEXT,'
         . ' state TEXT, same INTEGER); CREATE TRIGGER state_written AFTER'
         . ' UPDATE OF state ON conversations BEGIN INSERT INTO writes'
         . ' (conversation, state, same) VALUES (new.id, new.state,'
         . ' old.state = new.state); END;');

sub state_in_store {
    my ($cid, $want) = @_;
    return $db->wait_sql("SELECT state FROM conversations WHERE id = '$cid'",
                         qr/^\Q$want\E$/, 10);
}

# a turn with a call of a server tool

$mock->script({ tool_calls => [{ id => 'call_e1', name => 'echo',
                                 arguments => '{"n":1}' }] },
              { text => 'echoed' });

is(send_message($t, 'd1', 'echo')->{status}, 202, 'a turn with a tool call');
wait_state($t, 'd1', 'idle');

is(state_in_store('d1', 'idle'), 'idle', 'at rest in the store');
is($db->wait_sql("SELECT id, name, executor, status, ok FROM tool_calls"
                 . " WHERE conversation = 'd1'", qr/done/),
   'call_e1|echo|server|done|1', 'its call, done');
like($db->sql("SELECT result FROM tool_calls WHERE id = 'call_e1'"),
     qr/"n":1/, 'with its result');

# a call that waits for a person

$mock->script({ tool_calls => [{ id => 'call_q1', name => 'ask_user',
                                 arguments => '{"question":"ok?"}' }] },
              { text => 'thanks' });

is(send_message($t, 'd2', 'ask')->{status}, 202, 'a turn that asks');
wait_state($t, 'd2', 'awaiting_input');

is(state_in_store('d2', 'awaiting_input'), 'awaiting_input',
   'awaiting input in the store');
is($db->wait_sql("SELECT status, kind, executor FROM tool_calls"
                 . " WHERE id = 'call_q1'", qr/suspended/),
   'suspended|elicitation|human', 'its call, suspended');
like($db->sql("SELECT deadline FROM tool_calls WHERE id = 'call_q1'"),
     qr/^\d{13}$/, 'with its deadline');

is(resolve($t, 'd2', 'call_q1', { result => 'yes' })->{status}, 200,
   'answered');
wait_state($t, 'd2', 'idle');

is(state_in_store('d2', 'idle'), 'idle', 'then at rest in the store');
is($db->wait_sql("SELECT status, ok, result FROM tool_calls"
                 . " WHERE id = 'call_q1'", qr/done/),
   'done|1|yes', 'its call done, with the answer');

# a turn the hook halts: turn_halted ends it

$hook->script({ status => 200, body => '{"halt":"off topic"}' });

is(send_message($t, 'd3', 'halt')->{status}, 202, 'a turn the hook halts');
is(log_types(wait_state($t, 'd3', 'idle')), 'user_msg turn_halted',
   'halted');
is(state_in_store('d3', 'idle'), 'idle', 'at rest in the store');

# the module's events are all marked derived

is($db->sql('SELECT count(*) FROM events WHERE derived = 0'), 0,
   'every event of the module\'s is marked derived');

# another writer's events, without the column: the trigger derives them

# (the JSON's quotes as '!', which the shell leaves alone)

$db->sql("INSERT INTO conversations (id, agent, last_seq, updated)"
         . " VALUES ('o1', 'chat', 3, 0);"
         . "INSERT INTO events (conversation, seq, type, data)"
         . " SELECT conversation, seq, type, replace(data, '!', char(34))"
         . " FROM (SELECT 'o1' AS conversation, 1 AS seq,"
         . " 'user_msg' AS type, '{}' AS data"
         . " UNION ALL SELECT 'o1', 2, 'tool_call', '{!tool_call_id!:"
         . "!call_o1!,!name!:!ask_user!,!executor!:!human!}'"
         . " UNION ALL SELECT 'o1', 3, 'suspension', '{!tool_call_id!:"
         . "!call_o1!,!kind!:!elicitation!,!executor!:!human!,"
         . "!deadline!:4102444800000}');");

is($db->sql("SELECT status, kind, deadline FROM tool_calls"
            . " WHERE id = 'call_o1'"), 'suspended|elicitation|4102444800000',
   'another writer\'s call, derived by the trigger');
is($db->sql("SELECT state FROM conversations WHERE id = 'o1'"),
   'awaiting_input', 'and its conversation\'s state');

# each write changed the state

is($db->sql('SELECT count(*) FROM writes WHERE same'), 0,
   'no write left a state as it was');
like($db->sql("SELECT group_concat(state, ' ') FROM (SELECT state FROM"
              . " writes WHERE conversation = 'd2' ORDER BY n)"),
     qr/awaiting_input .*idle$/, 'd2: awaiting input, then at rest');

$t->stop;
$mock->stop;
$hook->stop;

unlike($t->read_file('error.log'), qr/\[(alert|emerg)\]/,
       'no alert in error.log');

done_testing;
