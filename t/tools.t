#!/usr/bin/perl

# Server tools are nginx locations: the turn POSTs each call's arguments
# to its tool's location, concurrently, records one tool_result per
# tool_call whatever happens, and calls the model again with the results
# paired with their calls; a failing location's body goes to the model in
# its error result.  Calls that wait for a person are suspended.

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

    agent_tool failing {
        location /tools/failing;
    }

    agent_tool unavailable {
        location /tools/unavailable;
    }

    agent_tool garbled {
        location /tools/garbled;
    }

    agent_tool proxied {
        location /tools/proxied;
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

        location = /tools/failing {
            internal;
            default_type application/json;
            return 500 '{"error":"database is down","retry":false}';
        }

        location = /tools/unavailable {
            internal;
            return 503 "\\r\\n \\t Service unavailable: try again later \\n\\n";
        }

        location = /tools/garbled {
            internal;
            return 500 "bad \xff\xfe bytes \xc3";
        }

        location = /tools/proxied {
            internal;
            proxy_pass http://127.0.0.1:$mport/tools/v1/chat/completions;
            proxy_read_timeout 5s;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, tools => $tools,
    agent => 'tools echo broken slow failing unavailable garbled proxied '
             . 'ask_user; max_model_calls 3;',
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
is($res->{u3}{error}, 'the tool failed: its location answered 500',
   'tool location failing without a body');
is($res->{u4}{error}, 'the tool failed: its location answered 504',
   'tool location timing out');
ok(!grep({ $_->{ok} } values %$res), 'all four are errors');

$sent = $mock->requests->[2]{json}{messages};
is(scalar(grep { $_->{role} eq 'tool' } @$sent), 4,
   'the model got four results');

# the results as the model got them (the request's JSON is decoded: its
# strings are characters)

sub sent_results {
    my ($req) = @_;
    my $json = JSON::PP->new;

    return { map { $_->{tool_call_id} => $json->decode($_->{content}) }
             grep { $_->{role} eq 'tool' } @{$req->{json}{messages}} };
}

# the body of a failing location goes with its status, trimmed, to the
# model

my $db_down = 'the tool failed: its location answered 500: '
              . '{"error":"database is down","retry":false}';
my $unavailable = 'the tool failed: its location answered 503: '
                  . 'Service unavailable: try again later';

$mock->reset;
$mock->script({ tool_calls => [call('e1', 'failing', '{}'),
                               call('e2', 'unavailable', '{}')] },
              { text => 'The database is down.' });

send_message($t, 't5', 'fail with a body');
$c = wait_state($t, 't5', 'idle');

$res = results($c);
is($res->{e1}{error}, $db_down,
   'a failing location\'s JSON body in the error result');
is($res->{e2}{error}, $unavailable, 'a text body, trimmed');

$sent = sent_results($mock->requests->[1]);
is_deeply($sent->{e1}, { ok => JSON::PP::false, error => $db_down },
          'the model sees the body');
is_deeply($sent->{e2}, { ok => JSON::PP::false, error => $unavailable },
          'the model sees the text body');

# a large body is cut between two characters at 4 KiB, and says so

my $large = 'a' . ("\x{e9}" x 5000);

$mock->reset;
$mock->script({ tool_calls => [call('e3', 'proxied', '{}')] },
              { status => 500, body => "$large\n" },
              { text => 'Too much.' });

send_message($t, 't6', 'fail at length');
$c = wait_state($t, 't6', 'idle');

my $cut = 'the tool failed: its location answered 500: a'
          . ("\x{e9}" x 2047) . '...';

is(results($c)->{e3}{error}, $cut, 'a large body: its first 4 KiB');
is(sent_results($mock->requests->[2])->{e3}{error}, $cut,
   'a large body: what the model sees');
is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'a large body: the turn went on');

# 4 KiB and trailing whitespace: nothing is cut

$mock->reset;
$mock->script({ tool_calls => [call('e4', 'proxied', '{}')] },
              { status => 500, body => ('b' x 4096) . (' ' x 100) . "\n" },
              { text => 'Just fits.' });

send_message($t, 't7', 'fail at 4 KiB');
$c = wait_state($t, 't7', 'idle');

is(results($c)->{e4}{error},
   'the tool failed: its location answered 500: ' . ('b' x 4096),
   'a body of 4 KiB and whitespace: whole, not marked cut');

# bytes that are not UTF-8 become U+FFFD, and the conversation goes on

$mock->reset;
$mock->script({ tool_calls => [call('e5', 'garbled', '{}')] },
              { text => 'Garbled.' },
              { text => 'Still here.' });

send_message($t, 't8', 'fail with bad bytes');
$c = wait_state($t, 't8', 'idle');

my $garbled = "the tool failed: its location answered 500: "
              . "bad \x{fffd}\x{fffd} bytes \x{fffd}";

is(results($c)->{e5}{error}, $garbled, 'bad bytes: U+FFFD in the result');
is(sent_results($mock->requests->[1])->{e5}{error}, $garbled,
   'bad bytes: what the model sees');

is(send_message($t, 't8', 'and now?')->{status}, 202,
   'bad bytes: the next message is taken');
$c = wait_state($t, 't8', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed user_msg assistant_msg turn_completed',
   'bad bytes: the log reads back, and the next turn ran');
is($c->{messages}[-2]{content}, 'Still here.', 'bad bytes: the model answered');
is(sent_results($mock->requests->[2])->{e5}{error}, $garbled,
   'bad bytes: the next turn\'s context carries the result');

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
