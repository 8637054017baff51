#!/usr/bin/perl

# agent_inspect shows what waits and what runs: "pending" lists the calls
# that wait for outside input (kind, executor, deadline), and
# "in_flight_tools" the server calls of the last batch still running.
# A human call waits while a slow server call of its batch runs; the
# server call leaves in_flight_tools when its result is recorded, the
# human call leaves pending when it is resolved.  An approved gated call
# moves from pending to in_flight_tools.
#
# The slow tool's location is the mock provider sending a raw body that
# it holds until the test releases it.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mport = $mock->port;

my $tools = <<'EOF';
    agent_tool slow {
        description "Takes its time";
        location /tools/slow;
    }

    agent_tool deploy {
        description "Deploys, once approved";
        approval requires_approval;
        location /tools/slow;
        timeout 1h;
    }

    agent_tool ask_user {
        executor human;
        timeout 1h;
    }
EOF

my $server = <<"EOF";
        location = /tools/slow {
            internal;
            proxy_pass http://127.0.0.1:$mport/tools/v1/chat/completions;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_read_timeout 30s;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, tools => $tools,
    agent => 'tools slow deploy ask_user; max_model_calls 3;',
    server => $server));
$t->run;

sub call {
    my ($id, $name, $args) = @_;
    return { id => $id, name => $name, arguments => $args // '{}' };
}

sub events_of {
    my ($c, $type) = @_;
    return grep { $_->{type} eq $type } @{($c || {})->{messages} || []};
}

# polls inspect until the callback accepts the conversation; returns the
# last one seen

sub wait_for {
    my ($cid, $cond, $timeout) = @_;

    my $deadline = time + ($timeout // 10);
    my $c;

    while (time < $deadline) {
        my $r = inspect($t, $cid);
        $c = $r->{json} if $r && $r->{status} == 200;
        return $c if $c && $cond->($c);
        sleep 0.05;
    }

    return $c;
}

# the slow tool's reply: headers, then nothing until released

my $slow = { raw => ['{"deployed":', 'true}'], pause_after => 0 };

# a fresh conversation shows nothing waiting or running

$mock->script({ text => 'Hi.' });
send_message($t, 'i0', 'hello');
my $c = wait_state($t, 'i0', 'idle');
is_deeply($c->{pending}, [], 'idle: nothing pending');
is_deeply($c->{in_flight_tools}, [], 'idle: nothing in flight');

# a slow server call and a human call in one batch

$mock->reset;
$mock->script({ tool_calls => [call('s1', 'slow', '{"n":1}'),
                               call('h1', 'ask_user',
                                    '{"question":"Which city?"}')] },
              $slow,
              { text => 'Paris, then.' });

send_message($t, 'i1', 'plan my trip');
ok($mock->wait_paused(1, 10), 'the server call is running');

$c = wait_for('i1', sub { events_of($_[0], 'suspension') == 1 });

is($c->{state}, 'awaiting_input', 'running: awaiting input');
ok(defined $c->{lease}, 'running: a turn holds the lease');
is_deeply($c->{in_flight_tools}, [{ tool_call_id => 's1', name => 'slow' }],
          'running: the server call is in flight');
is(scalar @{$c->{pending} || []}, 1, 'running: one call pending');

my $p = $c->{pending}[0] || {};
is($p->{tool_call_id}, 'h1', 'pending: the human call');
is($p->{name}, 'ask_user', 'pending: its tool');
is($p->{kind}, 'elicitation', 'pending: kind elicitation');
is($p->{executor}, 'human', 'pending: executor human');
my ($susp) = events_of($c, 'suspension');
is($p->{deadline}, $susp->{deadline}, 'pending: the suspension\'s deadline');
cmp_ok(($p->{deadline} // 0) / 1000 - time, '>', 3500,
       'pending: deadline from the tool\'s timeout');
ok(!events_of($c, 'tool_result'), 'running: no result yet');

# the server call ends: it leaves in_flight_tools, the human call waits

$mock->release(1);

$c = wait_state($t, 'i1', 'awaiting_input');
is_deeply([map { $_->{tool_call_id} } events_of($c, 'tool_result')], ['s1'],
          'ended: the server result recorded');
is_deeply($c->{in_flight_tools}, [], 'ended: nothing in flight');
is_deeply([map { $_->{tool_call_id} } @{$c->{pending} || []}], ['h1'],
          'ended: the human call still pending');

# resolved: nothing waits

is(resolve($t, 'i1', 'h1', { result => 'Paris' })->{status}, 200,
   'resolved: 200');
$c = wait_state($t, 'i1', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'resolved: turn completed');
is_deeply($c->{pending}, [], 'resolved: nothing pending');
is_deeply($c->{in_flight_tools}, [], 'resolved: nothing in flight');

# a gated server call: pending for approval, then in flight once
# approved, then neither

$mock->reset;
$mock->script({ tool_calls => [call('a1', 'deploy', '{"env":"prod"}')] },
              $slow,
              { text => 'Deployed.' });

send_message($t, 'i2', 'deploy');
$c = wait_state($t, 'i2', 'awaiting_input');

is_deeply([map { [$_->{tool_call_id}, $_->{kind}, $_->{executor}] }
           @{$c->{pending} || []}], [['a1', 'approval', 'server']],
          'gated: pending approval, a server call');
is_deeply($c->{in_flight_tools}, [], 'gated: not running');

is(resolve($t, 'i2', 'a1', { decision => 'approve' })->{status}, 200,
   'approved: 200');
ok($mock->wait_paused(1, 10), 'approved: the call runs');

$c = wait_for('i2', sub { @{$_[0]{in_flight_tools} || []} });
is_deeply($c->{in_flight_tools}, [{ tool_call_id => 'a1', name => 'deploy' }],
          'approved: in flight');
is_deeply($c->{pending}, [], 'approved: no longer pending');

$mock->release(1);
$c = wait_state($t, 'i2', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'approved: turn completed');
my ($res) = events_of($c, 'tool_result');
is_deeply($res && $res->{result}, { deployed => JSON::PP::true },
          'approved: the result recorded');
is_deeply($c->{in_flight_tools}, [], 'done: nothing in flight');
is_deeply($c->{pending}, [], 'done: nothing pending');

$mock->stop;
$t->done;
