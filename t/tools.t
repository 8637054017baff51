#!/usr/bin/perl

# Server tools are nginx locations: the turn POSTs each call's arguments
# to its tool's location, concurrently, records one tool_result per
# tool_call whatever happens, and calls the model again with the results
# paired with their calls.  Calls that wait for a person are suspended.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mport = $mock->port;

my $tools = <<'EOF';
    agent_tool echo {
        description "Echoes what it got";
        parameters '{"type":"object","properties":{"n":{"type":"integer"}}}';
        location /tools/echo;
    }

    agent_tool broken {
        location /tools/broken;
    }

    agent_tool slow {
        location /tools/slow;
    }

    agent_tool ask_user {
        executor human;
        timeout 1h;
    }
EOF

my $server = <<"EOF";
        location = /tools/echo {
            internal;
            default_type application/json;
            return 200 '{"args":\$request_body,"key":"\$http_idempotency_key",
                "conversation":"\$http_x_agent_conversation",
                "tool":"\$http_x_agent_tool","method":"\$request_method"}';
        }

        location = /tools/broken {
            internal;
            return 500;
        }

        location = /tools/slow {
            internal;
            proxy_pass http://127.0.0.1:$mport/v1/chat/completions;
            proxy_read_timeout 1s;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, tools => $tools,
    agent => 'tools echo broken slow ask_user; max_model_calls 3;',
    server => $server));
$t->run;

sub call {
    my ($id, $name, $args) = @_;
    return { id => $id, name => $name, arguments => $args };
}

sub results {
    my ($c) = @_;
    return { map { $_->{tool_call_id} => $_ }
             grep { $_->{type} eq 'tool_result' } @{$c->{messages}} };
}

# two server calls in parallel, then the model answers with the results

$mock->script({ tool_calls => [call('c1', 'echo', '{"n":1}'),
                               call('c2', 'echo', '{"n":2}')],
                chunks => 3 },
              { text => 'Both done.' });

send_message($t, 't1', 'run two');
my $c = wait_state($t, 't1', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_call tool_result '
   . 'tool_result assistant_msg turn_completed', 'log of a tool round trip');
is_deeply([map { $_->{seq} } @{$c->{messages}}], [1 .. 8], 'gapless seq');

my $res = results($c);
ok($res->{c1}{ok} && $res->{c2}{ok}, 'both results ok');
is_deeply($res->{c1}{result}{args}, { n => 1 }, 'first call got its args');
is_deeply($res->{c2}{result}{args}, { n => 2 }, 'second call got its args');
is($res->{c1}{result}{key}, 'c1', 'tool_call_id as Idempotency-Key');
is($res->{c1}{result}{conversation}, 't1', 'conversation header');
is($res->{c1}{result}{tool}, 'echo', 'tool header');
is($res->{c1}{result}{method}, 'POST', 'POSTed');

my $sent = $mock->requests->[1]{json}{messages};
is_deeply([map { $_->{role} } @$sent],
          [qw(system user assistant tool tool)], 'results sent back');
is_deeply([map { $_->{id} } @{$sent->[2]{tool_calls}}], ['c1', 'c2'],
          'the assistant message carries its calls');
is_deeply([sort map { $_->{tool_call_id} } @$sent[3, 4]], ['c1', 'c2'],
          'each result paired with its call');

my ($r1) = grep { $_->{tool_call_id} eq 'c1' } @$sent[3, 4];
my $content = decode_json($r1->{content});
ok($content->{ok}, 'model sees {"ok":true,...}');
is($content->{result}{args}{n}, 1, 'and the result');

# every call gets exactly one result, whatever happens

$mock->reset;
$mock->script({ tool_calls => [call('u1', 'nosuch', '{}'),
                               call('u2', 'echo', '{"n":'),
                               call('u3', 'broken', '{}'),
                               call('u4', 'slow', '{}')] },
              { stall_head => 1 },
              { text => 'Noted the failures.' });

my $start = time;
send_message($t, 't2', 'break things');
$c = wait_state($t, 't2', 'idle', 15);

is(log_types($c), 'user_msg assistant_msg tool_call tool_call tool_call '
   . 'tool_call tool_result tool_result tool_result tool_result '
   . 'assistant_msg turn_completed', 'four calls, four results');

$res = results($c);
is(scalar keys %$res, 4, 'one result per call');
like($res->{u1}{error}, qr/unknown tool "nosuch"/, 'unknown tool');
like($res->{u2}{error}, qr/arguments is not valid JSON/, 'bad arguments');
like($res->{u3}{error}, qr/answered 500/, 'tool location failing');
like($res->{u4}{error}, qr/answered 504/, 'tool location timing out');
ok(!grep({ $_->{ok} } values %$res), 'all four are errors');

$sent = $mock->requests->[2]{json}{messages};
is(scalar(grep { $_->{role} eq 'tool' } @$sent), 4,
   'the model got four results');

# a human call suspends the turn

$mock->reset;
$mock->script({ tool_calls => [call('h1', 'ask_user',
                                    '{"question":"Which city?"}'),
                               call('h2', 'echo', '{"n":3}')] });

send_message($t, 't3', 'ask me');
$c = wait_state($t, 't3', 'awaiting_input');

is($c->{state}, 'awaiting_input', 'awaiting input');
my ($susp) = grep { $_->{type} eq 'suspension' } @{$c->{messages}};
is($susp->{tool_call_id}, 'h1', 'suspension of the human call');
is($susp->{kind}, 'elicitation', 'kind elicitation');
is($susp->{arguments}{question}, 'Which city?', 'with its arguments');
cmp_ok($susp->{deadline} / 1000 - time, '>', 3500, 'deadline from timeout');
ok(results($c)->{h2}{ok}, 'the server call of the batch ran');
is(scalar @{$mock->requests}, 1, 'no model call while a call waits');

is(send_message($t, 't3', 'more')->{status}, 409,
   'a message while awaiting input is refused');

# max_model_calls bounds a turn

$mock->reset;
$mock->script(map { { tool_calls => [call("m$_", 'echo', '{}')] } } 1 .. 3);

send_message($t, 't4', 'loop');
$c = wait_state($t, 't4', 'idle');
like($c->{messages}[-1]{reason}, qr/max_model_calls/,
     'turn failed at max_model_calls');
is(scalar @{$mock->requests}, 3, 'three model calls');
is(scalar(grep { $_->{type} eq 'tool_call' } @{$c->{messages}}),
   scalar(grep { $_->{type} eq 'tool_result' } @{$c->{messages}}),
   'every call paired');

$mock->stop;
$t->done;
