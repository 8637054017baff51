#!/usr/bin/perl

# Every waiting call has a deadline, kept with it in the zone: past it the
# call resolves to an error the model can recover from and the turn goes
# on, whichever worker is alive to see it.  A client call with nobody
# connected to run it fails fast after a grace period.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::SSE;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

my $tools = <<'EOF';
    agent_tool ask_user {
        executor human;
        timeout 1s;
    }

    agent_tool locate {
        executor client;
        timeout 1h;
    }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $tools, agent => 'tools ask_user locate;',
    http => 'agent_client_grace 1s;'));
$t->run;

sub call {
    my ($id, $name) = @_;
    return { tool_calls => [{ id => $id, name => $name,
                              arguments => '{}' }] };
}

sub of {
    my ($c, $type, $id) = @_;
    my ($e) = grep { $_->{type} eq $type && $_->{tool_call_id} eq $id }
        @{$c->{messages}};
    return $e;
}

# seconds from the conversation's first event to this one, as logged:
# what the test's polling adds is not in it

sub since_start {
    my ($c, $e) = @_;
    return (($e // {})->{ts} // 0) / 1000 - $c->{messages}[0]{ts} / 1000;
}

# a deadline expiring while the conversation waits

$mock->script(call('d1', 'ask_user'), { text => 'Moving on.' });

send_message($t, 'e1', 'ask me');
my $c = wait_state($t, 'e1', 'awaiting_input');
is($c->{state}, 'awaiting_input', 'waiting for the answer');

$c = wait_state($t, 'e1', 'idle', 10);
my $waited = since_start($c, of($c, 'resolution', 'd1'));

ok(of($c, 'resolution', 'd1') && of($c, 'resolution', 'd1')->{expired},
   'resolution marked expired');
like(of($c, 'tool_result', 'd1')->{error}, qr/did not respond/,
     'an error result the model can read');
cmp_ok($waited, '>=', 0.9, 'not before the deadline');
cmp_ok($waited, '<', 5, 'soon after it');
is($c->{messages}[-1]{type}, 'turn_completed', 'the turn went on');
like($mock->requests->[1]{json}{messages}[-1]{content}, qr/did not respond/,
     'the model got the expiry as the result');
is(resolve($t, 'e1', 'd1', { result => 'late' })->{status}, 409,
   'a late answer is stale');

# the deadline holds after the workers that suspended the call are gone

$mock->reset;
$mock->script(call('d2', 'ask_user'), { text => 'Still here.' });

send_message($t, 'e2', 'ask again');
wait_state($t, 'e2', 'awaiting_input');

$t->kill_worker($_) for $t->worker_pids;
$t->wait_workers(2);

$c = wait_state($t, 'e2', 'idle', 10);
ok(of($c, 'tool_result', 'd2'), 'expired by a worker started later');
is($c->{messages}[-1]{type}, 'turn_completed', 'and the turn went on');
is(scalar(grep { $_->{type} eq 'tool_result' } @{$c->{messages}}), 1,
   'expired once');

# a client call with no subscriber fails after the grace period

$mock->reset;
$mock->script(call('k1', 'locate'), { text => 'No location then.' });

send_message($t, 'e3', 'where am I');
$c = wait_state($t, 'e3', 'idle', 10);

like(of($c, 'tool_result', 'k1')->{error}, qr/no client/,
     'client call without a subscriber fails');
cmp_ok(since_start($c, of($c, 'tool_result', 'k1')), '<', 4,
       'fast, not at the 1h deadline');

# with a subscriber the call waits for it

$mock->reset;
$mock->script({ text => 'first' }, call('k2', 'locate'),
              { text => 'Thanks.' });

send_message($t, 'e4', 'hello');
wait_state($t, 'e4', 'idle');

my $sse = Test::Agent::SSE->new(http_stream(events_request('e4'),
                                            port => $t->port(8080)));
send_message($t, 'e4', 'where am I');
wait_state($t, 'e4', 'awaiting_input');
sleep 1.5;

$c = inspect($t, 'e4')->{json};
is($c->{state}, 'awaiting_input', 'still waiting past the grace period');
is(resolve($t, 'e4', 'k2', { result => { lat => 1 } })->{status}, 200,
   'the browser resolves it');
$c = wait_state($t, 'e4', 'idle');
is(of($c, 'tool_result', 'k2')->{result}{lat}, 1, 'with its result');

$sse->stream->close;

$t->allow_alert(qr/worker process \d+ exited on signal 9/);
$mock->stop;
$t->done;
