#!/usr/bin/perl

# SIGKILL of the worker that runs a turn: another worker notices, takes
# the turn over from the log and finishes it.  A log that ends in the
# user_msg calls the model again; a tool_call without a result is sent
# again with the same tool_call_id, and the model is not called again
# for that step; waiting calls stay waiting and resolvable.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mport = $mock->port;

my $tools = <<'EOF';
    agent_tool slow {
        location /tools/slow;
    }

    agent_tool ask_user {
        executor human;
        timeout 1h;
    }
EOF

my $server = <<"EOF";
        location = /tools/slow {
            internal;
            proxy_pass http://127.0.0.1:$mport/v1/chat/completions;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $tools, agent => 'tools slow ask_user;', server => $server));
$t->run;

sub gapless {
    my ($c) = @_;
    my @seq = map { $_->{seq} } @{$c->{messages}};
    return "@seq" eq join ' ', 1 .. scalar @seq;
}

# killed while streaming: the model call is made again

$mock->script({ text => 'lost words', chunks => 2, pause_after => 2 },
              { text => 'the answer' });

send_message($t, 'k1', 'hello');
$mock->wait_paused(0, 5);

my $pid = lease_of($t, 'k1');
ok($pid, 'a worker holds the turn');
$t->kill_worker($pid);

my $c = wait_state($t, 'k1', 'idle', 10);
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'recovered: one reply, the turn completed');
is($c->{messages}[1]{content}, 'the answer', 'from the model called again');
ok(gapless($c), 'seq gapless');
ok($mock->wait_closed(0, 5), 'the dead worker\'s provider connection went');
is(scalar @{$mock->requests}, 2, 'two model calls in all');
like($t->read_file('error.log'), qr/lost its worker \d+, recovered/,
     'the take-over is logged');

# killed while a tool runs: the same call again, no new model call

$mock->reset;
$mock->script({ tool_calls => [{ id => 'call_k2', name => 'slow',
                                 arguments => '{"n":1}' }] },
              { stall_head => 1 },
              { text => 'tool result' },
              { text => 'final' });

send_message($t, 'k2', 'work');
$mock->wait_requests(2, 5);

$pid = lease_of($t, 'k2');
$t->kill_worker($pid);

$c = wait_state($t, 'k2', 'idle', 10);
is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'recovered: one call, one result');
ok(gapless($c), 'seq gapless');

my @reqs = @{$mock->requests};
my @tool = grep { $_->{headers}{'idempotency-key'} } @reqs;
is(scalar @tool, 2, 'the tool location got the call twice');
is_deeply([map { $_->{headers}{'idempotency-key'} } @tool],
          ['call_k2', 'call_k2'], 'with the same Idempotency-Key');
is(scalar(grep { !$_->{headers}{'idempotency-key'} } @reqs), 2,
   'the model was not called again for that step');
is($c->{messages}[2]{tool_call_id}, 'call_k2', 'the call keeps its id');

# every worker killed while a call waits: it stays waiting, resolvable

$mock->reset;
$mock->script({ tool_calls => [{ id => 'h1', name => 'ask_user',
                                 arguments => '{}' }] },
              { text => 'thanks' });

send_message($t, 'k3', 'ask');
wait_state($t, 'k3', 'awaiting_input');

$t->kill_worker($_) for $t->worker_pids;
$t->wait_workers(2);

$c = inspect($t, 'k3')->{json};
is($c->{state}, 'awaiting_input', 'still waiting');
is($c->{pending}[0]{tool_call_id}, 'h1', 'the call is pending');
is(resolve($t, 'k3', 'h1', { result => 'yes' })->{status}, 200,
   'and resolvable');
$c = wait_state($t, 'k3', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'the turn went on');

# subscribers that died with their worker do not hold the conversation's
# subscriber slots (16) for ever

$mock->reset;
$mock->script(map { { text => "reply $_" } } 1 .. 21);

send_message($t, 'k4', 'start');
wait_state($t, 'k4', 'idle');

for my $n (1 .. 20) {
    my $s = Test::Agent::HTTP::http_stream(events_request('k4'),
                                           port => $t->port(8080));
    $t->kill_worker($_) for $t->worker_pids;
    $t->wait_workers(2);
    $s->close;

    send_message($t, 'k4', "again $n");
    wait_state($t, 'k4', 'idle');
}

my $s = Test::Agent::HTTP::http_stream(events_request('k4'),
                                       port => $t->port(8080));
is($s->status, 200, 'a subscriber after 20 dead ones is taken');
$s->close;

$t->allow_alert(qr/worker process \d+ exited on signal 9/);
$mock->stop;
$t->done;
