#!/usr/bin/perl

# SIGKILL of a turn's worker inside the windows that have no I/O in
# them, which no timing of a test opens: gdb, attached to the worker,
# stops it at the window's function, the test sees through the other
# worker what it left in the zone, and gdb kills it there.  The turn is
# taken over from the log and ends once; the model is asked no more
# than the log says it must be, and no tool runs twice.
#
#   - a call's suspension is logged, the state is not yet awaiting_input
#     (ngx_http_agent_tools_state() is about to set it): the turn is
#     taken over, the call still waits, and its approval ends the turn;
#   - a model's reply and its tool calls are about to go into the log
#     (ngx_http_agent_emit_all()): none of them is there, the model is
#     asked again;
#   - they have just gone into the log, the call has not run: it runs
#     once, with its id, and the model is not asked again for it.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::Gdb;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $t = Test::Agent->new;

my $why = Test::Agent::Gdb->missing($t->module);
plan(skip_all => $why) if $why;

my $mock = Test::Agent::MockProvider->new;

# the tools' backend: each request is a run of a tool

my $tool = Test::Agent::MockProvider->new(default => sub {
    return { status => 200, body => '{"done":true}' };
});
my $tport = $tool->port;

my $tools = <<'EOF';
    agent_tool deploy {
        description "Deploys";
        approval requires_approval;
        location /tools/run;
        timeout 1h;
    }

    agent_tool lookup {
        description "Looks something up";
        location /tools/run;
    }
EOF

my $server = <<"EOF";
        location = /tools/run {
            internal;
            proxy_pass http://127.0.0.1:$tport/v1/chat/completions;
        }
EOF

my $db = $t->testdir . '/agent.db';
my $store = Test::Agent::Store->new($db);

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $tools, agent => 'tools deploy lookup;', server => $server,
    http => "agent_store $db;"));
$t->run;

my $n = 0;

# the turn of conversation $cid, its first reply paused by the mock:
# gdb attached to the worker that holds it, a breakpoint at $break; then
# the reply goes on, up to there.  The gdb, the pid and where it stopped.

sub stop_turn_at {
    my ($cid, $break) = @_;

    is(send_message($t, $cid, 'go')->{status}, 202, "$cid: a message");
    ok($mock->wait_paused(0, 10), "$cid: the model's reply under way");

    my $pid = lease_of($t, $cid);
    ok($pid, "$cid: a worker holds the turn");

    my $gdb = Test::Agent::Gdb->attach($pid,
                                       $t->testdir . '/gdb.' . ++$n . '.log');

    ok($gdb->break_at($break), "$cid: a breakpoint at $break")
        or diag($gdb->output);

    $mock->release(0);

    my $stop = $gdb->stopped(30);
    ok($stop, "$cid: the worker stopped there") or diag($gdb->output);

    return ($gdb, $pid, $stop // '');
}

# gdb kills the stopped worker: the master sees it die of SIGKILL, and
# a worker takes its turn over

sub killed {
    my ($cid, $gdb, $pid) = @_;

    ok($gdb->sigkill, "$cid: SIGKILL of the worker, stopped there")
        or diag($gdb->output);
    ok($t->wait_log(qr/worker process $pid exited on signal 9/, 10),
       "$cid: the master saw it killed");
    ok($t->wait_log(qr/turn of "$cid" lost its worker $pid, recovered/, 15),
       "$cid: its turn taken over");
}

# the turn of $cid ended, its log as $types: gapless, and the same in
# the store (once its end is there); the conversation

sub ended {
    my ($cid, $types) = @_;

    my $c = wait_state($t, $cid, 'idle', 15) // {};
    my @seq = map { $_->{seq} } @{$c->{messages} || []};

    is(log_types($c), $types, "$cid: the turn ended");
    is("@seq", join(' ', 1 .. @seq), "$cid: seq gapless");

    is($store->wait_sql("SELECT group_concat(type, ' ') FROM (SELECT type"
                        . " FROM events WHERE conversation = '$cid'"
                        . " ORDER BY seq)", qr/turn_\w+$/, 10),
       $types, "$cid: the store holds the log, once");

    return $c;
}

sub model_calls {
    return scalar grep { !$_->{headers}{'idempotency-key'} }
                  @{$mock->requests};
}

sub tool_runs {
    return join ' ', map { $_->{headers}{'idempotency-key'} // '-' }
                     @{$tool->requests};
}

# 1. the call's suspension is logged, the state is still streaming

$mock->script({ pause_after => 1,
                tool_calls => [{ id => 'd1', name => 'deploy',
                                 arguments => '{"env":"prod"}' }] },
              { text => 'deployed' });

my ($gdb, $pid, $stop) = stop_turn_at('s1',
    'ngx_http_agent_tools_state if input == NGX_HTTP_AGENT_FSM_SUSPEND');

like($stop, qr/input=\S*NGX_HTTP_AGENT_FSM_SUSPEND/,
     's1: about to set the state for the call that waits');

my $c = inspect($t, 's1')->{json};
is($c->{lease}, $pid, 's1: the stopped worker holds the turn');
is($c->{state}, 'streaming', 's1: the state is still streaming');
is(log_types($c), 'user_msg assistant_msg tool_call suspension',
   's1: the suspension is in the log');
is(join(" ", map { $_->{tool_call_id} } @{$c->{pending} || []}), 'd1',
   's1: the call waits');

killed('s1', $gdb, $pid);

$c = wait_state($t, 's1', 'awaiting_input', 15);
is($c->{state}, 'awaiting_input', 's1: taken over, the turn waits');
is(log_types($c), 'user_msg assistant_msg tool_call suspension',
   's1: for the call, with nothing more in the log');
is($c->{pending}[0]{tool_call_id}, 'd1', 's1: the call still waits');
is($c->{pending}[0]{kind}, 'approval', 's1: for its approval');
is(tool_runs(), '', 's1: the tool has not run');

is(resolve($t, 's1', 'd1', { decision => 'approve' })->{status}, 200,
   's1: the call approved');

$c = ended('s1', 'user_msg assistant_msg tool_call suspension resolution '
           . 'tool_result assistant_msg turn_completed');
is($c->{messages}[-2]{content}, 'deployed', 's1: with the second reply');
is(tool_runs(), 'd1', 's1: the tool ran once, as d1');
is(model_calls(), 2, 's1: the model was asked twice');

# 2. the reply and its call are about to go into the log

$mock->reset;
$tool->reset;
$mock->script({ pause_after => 1,
                tool_calls => [{ id => 'e1', name => 'lookup',
                                 arguments => '{"q":1}' }] },
              { tool_calls => [{ id => 'e2', name => 'lookup',
                                 arguments => '{"q":2}' }] },
              { text => 'found' });

($gdb, $pid, $stop) = stop_turn_at('s2', 'ngx_http_agent_emit_all');

$c = inspect($t, 's2')->{json};
is(log_types($c), 'user_msg', 's2: nothing of the reply is in the log');
is($c->{lease}, $pid, 's2: the stopped worker holds the turn');

killed('s2', $gdb, $pid);

$c = ended('s2', 'user_msg assistant_msg tool_call tool_result '
           . 'assistant_msg turn_completed');
is($c->{messages}[2]{tool_call_id}, 'e2',
   's2: the call of the reply the model gave again');
is(tool_runs(), 'e2', 's2: the lost reply\'s call never ran');
is(model_calls(), 3, 's2: the model was asked again for the lost reply');

# 3. the reply and its call have just gone into the log

$mock->reset;
$tool->reset;
$mock->script({ pause_after => 1,
                tool_calls => [{ id => 'f1', name => 'lookup',
                                 arguments => '{"q":3}' }] },
              { text => 'found' },
              { text => 'asked twice' });

($gdb, $pid, $stop) = stop_turn_at('s3', 'ngx_http_agent_emit_all');

ok(defined $gdb->command('finish'), 's3: the worker past the recording')
    or diag($gdb->output);

$c = inspect($t, 's3')->{json};
is($c->{lease}, $pid, 's3: the stopped worker holds the turn');
is(log_types($c), 'user_msg assistant_msg tool_call',
   's3: the reply and its call are in the log');
is(tool_runs(), '', 's3: the call has not run');

killed('s3', $gdb, $pid);

$c = ended('s3', 'user_msg assistant_msg tool_call tool_result '
           . 'assistant_msg turn_completed');
is($c->{messages}[3]{tool_call_id}, 'f1', 's3: the result is f1\'s');
is($c->{messages}[-2]{content}, 'found', 's3: the model answered it');
is(tool_runs(), 'f1', 's3: the call ran once, with its id');
is(model_calls(), 2, 's3: the model was not asked again for the call');

is(join("\n", grep { /has no transition/ }
              split /\n/, $t->read_file('error.log')), '',
   'no input without a transition');

$t->allow_alert(qr/worker process \d+ exited on signal 9/);
$mock->stop;
$tool->stop;
$t->done;
