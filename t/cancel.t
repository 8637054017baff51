#!/usr/bin/perl

# "Stop generating" from every state: the answer comes once the turn is
# down, the provider and tool connections are closed, every call keeps a
# paired result, and the next turn shows the model what was cut.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use Test::Agent;
use Test::Agent::Engine;
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
            proxy_read_timeout 30s;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $tools, agent => 'tools slow ask_user;', server => $server));
$t->run;

sub types { log_types(inspect($t, $_[0])->{json}) }

# idle: nothing to cancel, nothing changes

$mock->script({ text => 'done' });
send_message($t, 'i1', 'hi');
wait_state($t, 'i1', 'idle');

my $r = cancel($t, 'i1');
is($r->{status}, 200, 'cancel when idle');
is_deeply($r->{json}, { conversation => 'i1', cancelled => JSON::PP::false,
                        state => 'idle' }, 'says there was nothing to cancel');
is(types('i1'), 'user_msg assistant_msg turn_completed', 'log unchanged');

is(cancel($t, 'nope')->{status}, 404, 'unknown conversation');
is(http_get_status('/c/i1/cancel'), 405, 'GET is not a cancel');

my $c;

# streaming: on whichever worker the cancel lands, several times

for my $n (1 .. 4) {
    my $cid = "s$n";

    $mock->reset;
    $mock->script({ text => 'one two three four', chunks => 4,
                    pause_after => 3 },
                  { text => 'after' });

    send_message($t, $cid, 'talk');
    $mock->wait_paused(0, 5);

    $r = cancel($t, $cid);
    is($r->{status}, 200, "$cid: cancel answered");
    ok($r->{json}{cancelled}, "$cid: cancelled");

    my $c = inspect($t, $cid)->{json};
    is($c->{state}, 'idle', "$cid: idle when the answer came");
    is(log_types($c), 'user_msg assistant_msg cancelled',
       "$cid: partial reply, then cancelled");
    is($c->{messages}[-1]{seq}, $r->{json}{seq}, "$cid: the answer's seq");
    is($c->{messages}[1]{status}, 'cancelled', "$cid: reply marked");
    like($c->{messages}[1]{content}, qr/^one/, "$cid: partial text kept");
    ok($mock->wait_closed(0, 5), "$cid: provider connection closed");

    next unless $n == 1;

    send_message($t, $cid, 'again');
    wait_state($t, $cid, 'idle');
    my $sent = $mock->requests->[1]{json}{messages};
    like($sent->[2]{content}, qr/\[cancelled\]/,
         'the next turn shows the cut reply as cancelled');
}

# streaming a call: the call begun is kept, marked, never run, and
# paired with its error result; the next request sends neither

$mock->reset;
$mock->script({ tool_calls => [{ id => 'p1', name => 'slow',
                                 arguments => '{"n": 12345}' }],
                chunks => 4, pause_after => 3 },
              { text => 'after' });

send_message($t, 'p', 'work');
$mock->wait_paused(0, 5);

ok(cancel($t, 'p')->{json}{cancelled}, 'cancel while a call streams');

$c = inspect($t, 'p')->{json};
is(log_types($c), 'user_msg assistant_msg tool_call tool_result cancelled',
   'the call begun is kept, with its result');
is($c->{messages}[2]{status}, 'cancelled', 'the call marked cancelled');
like($c->{messages}[3]{error}, qr/^\[cancelled\].*not run/,
     'its result says it did not run');
is(scalar @{$mock->requests}, 1, 'the tool was not called');

send_message($t, 'p', 'next');
wait_state($t, 'p', 'idle');
is_deeply([map { $_->{role} } @{$mock->requests->[1]{json}{messages}}],
          [qw(system user assistant user)],
          'next request: the cut call and its result are not sent');

# executing_tools: the running tool is aborted with a [cancelled] result

$mock->reset;
$mock->script({ tool_calls => [{ id => 'x1', name => 'slow',
                                 arguments => '{}' }] },
              { stall_head => 1 },
              { text => 'ok' });

send_message($t, 'x', 'work');
$mock->wait_requests(2, 5);

$r = cancel($t, 'x');
ok($r->{json}{cancelled}, 'cancel while a tool runs');

$c = inspect($t, 'x')->{json};
is(log_types($c), 'user_msg assistant_msg tool_call tool_result cancelled',
   'the call got its result, then cancelled');
is($c->{messages}[3]{error}, '[cancelled]', 'a [cancelled] result');
ok($mock->wait_closed(1, 5), 'the tool location\'s connection closed');

send_message($t, 'x', 'next');
wait_state($t, 'x', 'idle');
my @sent = @{$mock->requests->[2]{json}{messages}};
is_deeply([map { $_->{role} } @sent],
          [qw(system user assistant tool user)],
          'next request: the call paired with its result');

# awaiting_input: waiting calls resolve as cancelled

$mock->reset;
$mock->script({ tool_calls => [{ id => 'h1', name => 'ask_user',
                                 arguments => '{}' }] });

send_message($t, 'a', 'ask');
wait_state($t, 'a', 'awaiting_input');

$r = cancel($t, 'a');
ok($r->{json}{cancelled}, 'cancel while waiting for input');

$c = inspect($t, 'a')->{json};
is(log_types($c), 'user_msg assistant_msg tool_call suspension resolution '
   . 'tool_result cancelled', 'resolved as cancelled');
ok($c->{messages}[4]{cancelled}, 'resolution marked cancelled');
is($c->{messages}[5]{error}, 'user cancelled', 'user cancelled result');
is_deeply($c->{pending}, [], 'nothing waits');
is(resolve($t, 'a', 'h1', { result => 'late' })->{status}, 409,
   'a later resolve is stale');

$mock->stop;
$t->done;


sub http_get_status {
    my ($uri) = @_;
    return Test::Agent::HTTP::http_get($uri, port => $t->port(8080))
        ->{status};
}
