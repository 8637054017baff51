#!/usr/bin/perl

# The conversation's state machine, seen from outside: executing_tools
# while server calls run and no call waits, in every path that gets
# there (a normal batch, the last waiting call resolved or expired while
# a server call still runs, an approved call, a takeover), with its
# state_changed events and the busy 409 naming it.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::SSE;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mport = $mock->port;

# the slow tool's location is the mock: a scripted reply that stalls
# holds the call running until the test releases it

my $tools = <<'EOF';
    agent_tool ask_user {
        executor human;
        timeout 1h;
    }

    agent_tool quick_ask {
        executor human;
        timeout 1s;
    }

    agent_tool slow {
        location /tools/slow;
    }

    agent_tool gated {
        approval requires_approval;
        location /tools/slow;
    }
EOF

my $server = <<"EOF";
        location = /tools/slow {
            internal;
            proxy_pass http://127.0.0.1:$mport/v1/chat/completions;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $tools, server => $server,
    agent => 'tools ask_user quick_ask slow gated;'));
$t->run;

my $port = $t->port(8080);

sub call {
    my ($id, $name) = @_;
    return { id => $id, name => $name, arguments => '{}' };
}

sub state_of {
    my ($cid) = @_;
    return inspect($t, $cid)->{json}{state} // '';
}

# the state once it settles on one of the wanted ones, or the last seen

sub state_becomes {
    my ($cid, $want, $timeout) = @_;
    my $deadline = time + ($timeout // 5);
    my $s;

    while (time < $deadline) {
        $s = state_of($cid);
        return $s if $s eq $want;
        sleep 0.05;
    }

    return $s;
}

# a subscriber from after the conversation's first turn

sub subscribe {
    my ($cid) = @_;

    $mock->script({ text => 'hello' });
    send_message($t, $cid, 'hello');
    my $c = wait_state($t, $cid, 'idle');

    return Test::Agent::SSE->new(http_stream(events_request($cid,
        'Last-Event-ID' => $c->{messages}[-1]{seq}), port => $port));
}

sub transitions {
    my ($sse) = @_;
    my @ev = $sse->events_until(
        sub { ($_[0]{event} // '') eq 'state_changed'
              && decode_json($_[0]{data})->{to} eq 'idle' }, 15);

    return join ' ', map { my $d = decode_json($_->{data}); "$d->{from}>$d->{to}" }
        grep { $_->{event} eq 'state_changed' } @ev;
}

# the tool request of the mock's queue: the index of the n-th request

sub tool_paused {
    my ($index) = @_;
    return $mock->wait_paused($index, 5);
}

###############################################################################

# a normal batch: a server call runs, nothing waits

$mock->reset;
my $sse = subscribe('a');

$mock->script({ tool_calls => [call('s1', 'slow')] },
              { stall_head => 1 },
              { text => 'done' });

send_message($t, 'a', 'use the tool');
ok(tool_paused(2), 'batch: the tool runs');
is(state_becomes('a', 'executing_tools'), 'executing_tools',
   'batch: executing_tools while it runs');

my $r = send_message($t, 'a', 'meanwhile');
is($r->{status}, 409, 'batch: a message meanwhile is refused');
is(eval { decode_json($r->{body})->{error}{state} }, 'executing_tools',
   'batch: and the 409 names the state');

$mock->release(2);
my $c = wait_state($t, 'a', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'batch: the turn completes');
is(transitions($sse),
   'idle>preparing preparing>streaming streaming>executing_tools '
   . 'executing_tools>streaming streaming>idle',
   'batch: state_changed at each transition');

# the last waiting call resolved while a server call still runs

$mock->reset;
$sse = subscribe('b');

$mock->script({ tool_calls => [call('h1', 'ask_user'), call('s2', 'slow')] },
              { stall_head => 1 },
              { text => 'done' });

send_message($t, 'b', 'ask and work');
ok(tool_paused(2), 'resolved: the server call runs');
is(state_becomes('b', 'awaiting_input'), 'awaiting_input',
   'resolved: awaiting_input while a call waits');

$r = resolve($t, 'b', 'h1', { result => 'yes' });
is($r->{status}, 200, 'resolved: the answer is taken');
is(state_becomes('b', 'executing_tools'), 'executing_tools',
   'resolved: executing_tools once nothing waits');
is(scalar @{inspect($t, 'b')->{json}{pending} // []}, 0,
   'resolved: nothing pending');

$mock->release(2);
$c = wait_state($t, 'b', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'resolved: the turn completes');
is(transitions($sse),
   'idle>preparing preparing>streaming streaming>awaiting_input '
   . 'awaiting_input>executing_tools executing_tools>streaming '
   . 'streaming>idle',
   'resolved: state_changed at each transition');

# the last waiting call expired while a server call still runs

$mock->reset;
subscribe('c');

$mock->script({ tool_calls => [call('q1', 'quick_ask'), call('s3', 'slow')] },
              { stall_head => 1 },
              { text => 'done' });

send_message($t, 'c', 'ask quickly and work');
ok(tool_paused(2), 'expired: the server call runs');
is(state_becomes('c', 'awaiting_input'), 'awaiting_input',
   'expired: awaiting_input while a call waits');
is(state_becomes('c', 'executing_tools', 5), 'executing_tools',
   'expired: executing_tools once the call expired');

$c = inspect($t, 'c')->{json};
ok(grep({ $_->{type} eq 'resolution' && $_->{expired} } @{$c->{messages}}),
   'expired: the call expired');

$mock->release(2);
$c = wait_state($t, 'c', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'expired: the turn completes');

# an approved server call: awaiting approval, then executing_tools

$mock->reset;
subscribe('d');

$mock->script({ tool_calls => [call('g1', 'gated')] },
              { stall_head => 1 },
              { text => 'done' });

send_message($t, 'd', 'do the gated thing');
is(wait_state($t, 'd', 'awaiting_input')->{state}, 'awaiting_input',
   'approval: waits for it');

$r = resolve($t, 'd', 'g1', { decision => 'approve' });
is($r->{status}, 200, 'approval: taken');
ok(tool_paused(2), 'approval: the call runs');
is(state_becomes('d', 'executing_tools'), 'executing_tools',
   'approval: executing_tools while it runs');

$mock->release(2);
$c = wait_state($t, 'd', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'approval: the turn completes');

# a takeover: the call sent again runs in executing_tools

$mock->reset;
subscribe('e');

$mock->script({ tool_calls => [call('s5', 'slow')] },
              { stall_head => 1 },
              { stall_head => 1 },
              { text => 'done' });

send_message($t, 'e', 'work, and die');
ok(tool_paused(2), 'takeover: the tool runs');

my $lease = inspect($t, 'e')->{json}{lease};
$t->kill_worker($lease);

ok(tool_paused(3), 'takeover: the call is sent again');
$c = inspect($t, 'e')->{json};
isnt($c->{lease}, $lease, 'takeover: another worker holds the turn');
is(state_becomes('e', 'executing_tools'), 'executing_tools',
   'takeover: executing_tools while it runs');

$mock->release;
$c = wait_state($t, 'e', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'takeover: the turn completes');

$t->allow_alert(qr/worker process \d+ exited on signal 9/);
$mock->stop;
$t->done;
