#!/usr/bin/perl

# A message for a conversation that is not idle, by the location's
# agent_busy policy: reject (409, tested in turn.t), queue (taken, runs
# after the turn, in order), interrupt (the turn is cancelled, then the
# message runs), in streaming, executing_tools and awaiting_input.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mport = $mock->port;

my $tools = <<'EOF';
    agent_tool ask_user {
        executor human;
        timeout 1h;
    }

    agent_tool slow {
        location /tools/slow;
    }
EOF

my $server = <<"EOF";
        location ~ ^/q/(?<cid>[^/]+)\$ {
            agent chat;
            agent_conversation \$cid;
            agent_busy queue;
            agent_message;
        }

        location ~ ^/i/(?<cid>[^/]+)\$ {
            agent chat;
            agent_conversation \$cid;
            agent_busy interrupt;
            agent_message;
        }

        location = /tools/slow {
            internal;
            proxy_pass http://127.0.0.1:$mport/v1/chat/completions;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $tools, agent => 'tools ask_user slow;', server => $server));
$t->run;

sub post {
    my ($policy, $cid, $content) = @_;
    my $r = http_post("/$policy/$cid", encode_json({ content => $content }),
                      port => $t->port(8080),
                      headers => { 'Content-Type' => 'application/json' });
    $r->{json} = eval { decode_json($r->{body}) };
    return $r;
}

sub users {
    my ($c) = @_;
    return join ' ', map { $_->{content} }
        grep { $_->{type} eq 'user_msg' } @{$c->{messages}};
}

# queue while streaming: both run after the turn, in order

$mock->script({ text => 'first reply', chunks => 2, pause_after => 1 },
              { text => 'second reply' }, { text => 'third reply' });

is(post('q', 'q1', 'one')->{status}, 202, 'idle: runs at once');
$mock->wait_paused(0, 5);

my $r = post('q', 'q1', 'two');
is($r->{status}, 202, 'streaming: queued');
ok($r->{json}{queued}, 'said queued');
is($r->{json}{position}, 1, 'first in the queue');
is(post('q', 'q1', 'three')->{json}{position}, 2, 'second in the queue');

$mock->release;

my $c = wait_state($t, 'q1', 'idle');
$c = wait_state($t, 'q1', 'idle') until users($c) eq 'one two three'
    && $c->{messages}[-1]{type} eq 'turn_completed';
is(users($c), 'one two three', 'queued messages ran in order');
is(scalar(grep { $_->{type} eq 'turn_completed' } @{$c->{messages}}), 3,
   'three turns completed');

# a cancel with a message queued: answered once the cancelled turn is
# down, while the queued message's turn runs on

$mock->reset;
$mock->script({ text => 'cut short here', chunks => 3, pause_after => 2 },
              { text => 'the queued reply', chunks => 2, pause_after => 1 });

post('q', 'q4', 'talk');
$mock->wait_paused(0, 5);
ok(post('q', 'q4', 'next')->{json}{queued}, 'a message queued');

$r = cancel($t, 'q4');
is($r && $r->{status}, 200, 'a cancel with a message queued: answered')
    or diag($r && $r->{body});
ok($r && $r->{json}{cancelled}, 'the turn cancelled');
ok($mock->wait_paused(1, 5), 'the queued message\'s turn runs meanwhile');

$mock->release;
$c = wait_state($t, 'q4', 'idle');
$c = wait_state($t, 'q4', 'idle') until users($c) eq 'talk next'
    && $c->{messages}[-1]{type} eq 'turn_completed';
is(log_types($c), 'user_msg assistant_msg cancelled user_msg assistant_msg '
   . 'turn_completed', 'the turn cancelled, then the queued message ran');
is($r && $r->{json}{seq}, $c->{messages}[2]{seq}, 'the answer\'s seq');

# queue while awaiting input: after the waiting call's turn ends

$mock->reset;
$mock->script({ tool_calls => [{ id => 'h1', name => 'ask_user',
                                 arguments => '{}' }] },
              { text => 'answered' }, { text => 'queued one' });

post('q', 'q2', 'ask me');
wait_state($t, 'q2', 'awaiting_input');
is(post('q', 'q2', 'later')->{status}, 202, 'awaiting_input: queued');
is(inspect($t, 'q2')->{json}{state}, 'awaiting_input', 'still waiting');

resolve($t, 'q2', 'h1', { result => 'yes' });
$c = wait_state($t, 'q2', 'idle');
$c = wait_state($t, 'q2', 'idle') until users($c) eq 'ask me later'
    && $c->{messages}[-1]{type} eq 'turn_completed';
is(users($c), 'ask me later', 'the queued message ran after the turn');

# queue while executing tools

$mock->reset;
$mock->script({ tool_calls => [{ id => 's1', name => 'slow',
                                 arguments => '{}' }] },
              { text => 'tool done', chunks => 1, latency => 0.5 },
              { text => 'after tools' }, { text => 'queued reply' });

post('q', 'q3', 'use the tool');
$mock->wait_requests(2, 5);
is(post('q', 'q3', 'meanwhile')->{status}, 202, 'executing_tools: queued');

$c = wait_state($t, 'q3', 'idle');
$c = wait_state($t, 'q3', 'idle') until users($c) eq 'use the tool meanwhile'
    && $c->{messages}[-1]{type} eq 'turn_completed';
is(users($c), 'use the tool meanwhile', 'ran after the tool turn');

# interrupt while streaming: cancelled, then the new message runs

$mock->reset;
$mock->script({ text => 'long answer here', chunks => 3, pause_after => 2 },
              { text => 'new answer' });

post('i', 'i1', 'talk');
$mock->wait_paused(0, 5);

$r = post('i', 'i1', 'stop, do this');
is($r->{status}, 202, 'streaming: interrupt taken');
ok($r->{json}{interrupting}, 'said interrupting');

$c = wait_state($t, 'i1', 'idle');
$c = wait_state($t, 'i1', 'idle') until users($c) eq 'talk stop, do this'
    && $c->{messages}[-1]{type} eq 'turn_completed';
is(log_types($c), 'user_msg assistant_msg cancelled user_msg assistant_msg '
   . 'turn_completed', 'the turn was cancelled, then the message ran');
is($c->{messages}[1]{status}, 'cancelled', 'the cut reply marked');
ok($mock->wait_closed(0, 5), 'the provider saw its connection close');

# interrupt while awaiting input: the waiting call resolves as cancelled

$mock->reset;
$mock->script({ tool_calls => [{ id => 'h2', name => 'ask_user',
                                 arguments => '{}' }] },
              { text => 'fresh start' });

post('i', 'i2', 'ask me');
wait_state($t, 'i2', 'awaiting_input');

$r = post('i', 'i2', 'never mind');
is($r->{status}, 202, 'awaiting_input: interrupt taken');
ok($r->{json}{seq}, 'it ran at once, with its seq');

$c = wait_state($t, 'i2', 'idle');
is(log_types($c), 'user_msg assistant_msg tool_call suspension resolution '
   . 'tool_result cancelled user_msg assistant_msg turn_completed',
   'waiting call cancelled, then the message ran');
is(resolve($t, 'i2', 'h2', { result => 'x' })->{status}, 409,
   'the cancelled call is stale');

$mock->stop;
$t->done;
