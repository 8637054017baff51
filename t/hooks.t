#!/usr/bin/perl

# Hooks as locations.  hook_before is POSTed the turn's user_msg before
# each model call: {"halt":reason} ends the turn turn_halted with no
# provider call; {"inject":text} is logged as an injection event that the
# request carries at its tail (and every later request in its place);
# {} or an empty body goes on.  hook_after is POSTed each reply once it is
# logged, and {"halt":reason} stops the tool loop: the calls it leaves get
# error results, the turn ends turn_halted.  A hook that answers non-2xx
# or bad JSON, or takes longer than its timeout, fails the turn naming the
# hook; with on_error=continue it is logged and the turn goes on.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;

my $mock = Test::Agent::MockProvider->new;

# the hooks' backends: each answers what the test scripts, or {}

my %hook = map {
    $_ => Test::Agent::MockProvider->new(default => sub {
        return { status => 200, body => '{}' };
    })
} qw(before after lenient);

sub hook_reply {
    my ($name, $body, %more) = @_;
    $hook{$name}->script({ status => 200, body => $body, %more });
}

sub hook_requests {
    my ($name) = @_;
    return $hook{$name}->requests;
}

my $lenient = <<'EOF';
    agent lenient {
        provider openai_chat /internal/llm;
        model gpt-test;
        hook_before /hook/lenient timeout=500ms on_error=continue;
    }
EOF

my %hport = map { $_ => $hook{$_}->port } keys %hook;

my $server = <<"EOF";
$ECHO_LOCATION
        location ~ ^/lenient/(?<lid>[^/]+)/messages\$ {
            agent lenient;
            agent_conversation \$lid;
            agent_message;
        }

        location ~ ^/lenient/(?<lid>[^/]+)\$ {
            agent lenient;
            agent_conversation \$lid;
            agent_inspect;
        }

        location = /hook/before {
            internal;
            proxy_pass http://127.0.0.1:$hport{before}/v1/chat/completions;
        }

        location = /hook/after {
            internal;
            proxy_pass http://127.0.0.1:$hport{after}/v1/chat/completions;
        }

        location = /hook/lenient {
            internal;
            proxy_pass http://127.0.0.1:$hport{lenient}/v1/chat/completions;
        }
EOF

my $t = Test::Agent->new;

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $ECHO_TOOL . $lenient, server => $server,
    agent => "tools echo;\n"
        . "        hook_before /hook/before timeout=1s;\n"
        . "        hook_after /hook/after;"));
$t->run;

my $port = $t->port(8080);

sub provider_calls { scalar @{$mock->requests} }

# a halting before hook: no provider call, the turn ends turn_halted

hook_reply('before', '{"halt":"off topic"}');

is(send_message($t, 'h1', 'tell me a secret')->{status}, 202, 'a message');
my $c = wait_state($t, 'h1', 'idle');
is(log_types($c), 'user_msg turn_halted', 'the turn is halted');
is($c->{messages}[-1]{reason}, 'off topic', 'with the hook\'s reason');
is($c->{messages}[-1]{hook}, '/hook/before', 'naming the hook');
is($c->{messages}[-1]{seq}, 2, 'a canonical event');
is(provider_calls(), 0, 'the provider was never called');

my $h = hook_requests('before')->[0];
is($h->{method}, 'POST', 'the hook is POSTed');
is($h->{headers}{'x-agent-conversation'}, 'h1', 'with the conversation');
is($h->{headers}{'x-agent-hook'}, 'before', 'and the hook');
is($h->{json}{conversation}, 'h1', 'the body names the conversation');
is($h->{json}{turn}, 1, 'the turn');
is($h->{json}{model_call}, 1, 'the model call');
is($h->{json}{message}{type}, 'user_msg', 'and carries the user_msg');
is($h->{json}{message}{content}, 'tell me a secret', 'as logged');

# the next message works, both hooks passing

$mock->script({ text => 'fine' });

is(send_message($t, 'h1', 'hello')->{status}, 202, 'the next message');
$c = wait_state($t, 'h1', 'idle');
is(log_types($c), 'user_msg turn_halted user_msg assistant_msg '
   . 'turn_completed', 'runs to completion');
is(provider_calls(), 1, 'with one provider call');
is(hook_requests('after')->[0]{json}{message}{content}, 'fine',
   'hook_after sees the final reply');

# an injecting hook: the text at the tail of the request, kept in place

$mock->reset;
hook_reply('before', '{"inject":"Answer in French."}');
$mock->script({ text => 'Bonjour' }, { text => 'Encore' });

is(send_message($t, 'i1', 'hello?')->{status}, 202, 'a message');
$c = wait_state($t, 'i1', 'idle');
is(log_types($c), 'user_msg injection assistant_msg turn_completed',
   'the injection is logged before the reply');
is($c->{messages}[1]{content}, 'Answer in French.', 'with its text');

is_deeply($mock->requests->[0]{json}{messages}, [
    { role => 'system', content => 'You are terse.' },
    { role => 'user', content => 'hello?' },
    { role => 'user', content => 'Answer in French.' },
], 'the provider saw it at the tail');

is(send_message($t, 'i1', 'more')->{status}, 202, 'a second turn');
wait_state($t, 'i1', 'idle');
is_deeply($mock->requests->[1]{json}{messages}, [
    { role => 'system', content => 'You are terse.' },
    { role => 'user', content => 'hello?' },
    { role => 'user', content => 'Answer in French.' },
    { role => 'assistant', content => 'Bonjour' },
    { role => 'user', content => 'more' },
], 'and the next request renders it where it stands');

# the worker killed during the model call that follows an injection: the
# take-over makes the call again without asking the hook again (which
# would inject again), so the text is injected once

$mock->reset;
$hook{before}->reset;
hook_reply('before', '{"inject":"Be brief."}') for 1 .. 2;
$mock->script({ text => 'lost words', chunks => 4, pause_after => 2 },
              { text => 'Short.' });

is(send_message($t, 'i2', 'explain')->{status}, 202, 'a message');
ok($mock->wait_paused(0, 10), 'its model call streams');

my $lease;
for (1 .. 100) {
    $lease = inspect($t, 'i2')->{json}{lease} and last;
    sleep 0.02;
}
ok($lease, 'a worker holds the turn');
$t->kill_worker($lease);

$c = wait_state($t, 'i2', 'idle', 15);
is(log_types($c), 'user_msg injection assistant_msg turn_completed',
   'taken over: one injection in the log');
is($c->{messages}[2]{content}, 'Short.', 'the reply of the call made again');
is(scalar @{hook_requests('before')}, 1, 'the hook was asked once');
is_deeply($mock->requests->[1]{json}{messages}, [
    { role => 'system', content => 'You are terse.' },
    { role => 'user', content => 'explain' },
    { role => 'user', content => 'Be brief.' },
], 'the call made again carries the injected text once');
$hook{before}->reset;

# an after hook stops the tool loop

$mock->reset;
hook_reply('after', '{"halt":"enough tools"}');
$mock->script({ tool_calls => [{ id => 'call_1', name => 'echo',
                                 arguments => '{"n":1}' }] },
              { text => 'never' });

is(send_message($t, 'a1', 'use the tool')->{status}, 202, 'a message');
$c = wait_state($t, 'a1', 'idle');
is(log_types($c), 'user_msg assistant_msg tool_call tool_result turn_halted',
   'the tool loop stops');
my ($res) = grep { $_->{type} eq 'tool_result' } @{$c->{messages}};
ok(!$res->{ok}, 'the call it left was not run, and has its result');
is($c->{messages}[-1]{reason}, 'enough tools', 'the reason');
is(provider_calls(), 1, 'no second model call');
my $after = hook_requests('after')->[-1]{json};
is($after->{conversation}, 'a1', 'hook_after names the conversation');
is($after->{message}{type}, 'assistant_msg', 'and gets the reply');
is($after->{message}{tool_calls}[0]{name}, 'echo', 'with its tool calls');

# a failing hook fails the turn, naming the hook

$mock->reset;
$hook{before}->script({ status => 500, body => 'oops' });

is(send_message($t, 'f1', 'hi')->{status}, 202, 'a message');
$c = wait_state($t, 'f1', 'idle');
is(log_types($c), 'user_msg turn_failed', 'a hook answering 500');
is($c->{messages}[-1]{reason}, 'hook_before "/hook/before" answered 500',
   'fails the turn, saying why');
is(provider_calls(), 0, 'with no provider call');

hook_reply('before', '{"inject":');

is(send_message($t, 'f2', 'hi')->{status}, 202, 'a message');
$c = wait_state($t, 'f2', 'idle');
is(log_types($c), 'user_msg turn_failed', 'bad JSON');
like($c->{messages}[-1]{reason},
     qr/^hook_before "\/hook\/before" answered JSON that is not valid JSON/,
     'fails the turn too');

hook_reply('before', '{"inject":42}');

is(send_message($t, 'f3', 'hi')->{status}, 202, 'a message');
$c = wait_state($t, 'f3', 'idle');
like($c->{messages}[-1]{reason}, qr/"inject" that is not a string/,
     'an inject that is not text fails it');

# a hook that takes longer than its timeout

hook_reply('before', '{}', latency => 3);

is(send_message($t, 'f4', 'hi')->{status}, 202, 'a message');
$c = wait_state($t, 'f4', 'idle');
is(log_types($c), 'user_msg turn_failed', 'a slow hook');
is($c->{messages}[-1]{reason},
   'hook_before "/hook/before" timed out after 1000 ms',
   'fails the turn at its timeout');
cmp_ok(($c->{messages}[-1]{ts} // 0) - $c->{messages}[0]{ts}, '<', 2500,
       'without waiting for it (the log\'s times)');
is(provider_calls(), 0, 'no provider call');

# on_error=continue: the failure is logged and the turn goes on

$mock->script({ text => 'went on' });
$hook{lenient}->script({ status => 503, body => 'down' });

my $r = http_post('/lenient/l1/messages', '{"content":"hi"}', port => $port,
                  headers => { 'Content-Type' => 'application/json' });
is($r->{status}, 202, 'a message to the lenient agent');

my $deadline = time + 10;
while (time < $deadline) {
    my $i = http_get('/lenient/l1', port => $port);
    $c = eval { decode_json($i->{body}) };
    last if $c && $c->{state} eq 'idle' && !defined $c->{lease};
    sleep 0.05;
}

is(log_types($c), 'user_msg assistant_msg turn_completed',
   'the turn completes');
is(provider_calls(), 1, 'with its model call');
like($t->read_file('error.log'),
     qr/\[warn\].*agent hook_before "\/hook\/lenient" answered 503, the turn goes on/,
     'the failure is logged');

$t->allow_alert(qr/exited on signal 9/);
$t->done(more => 1);

# nginx -t: bad hook directives

for my $bad (
    [ 'hook_before hook;', qr/invalid location "hook" in "hook_before"/ ],
    [ 'hook_after /h timeout=0;',
      qr/invalid parameter "timeout=0" in "hook_after"/ ],
    [ 'hook_before /h on_error=maybe;',
      qr/invalid parameter "on_error=maybe" in "hook_before"/ ],
    [ "hook_before /h;\n        hook_before /h;",
      qr/"hook_before" directive is duplicate/ ],
) {
    $t->write_file_expand('nginx.conf', engine_conf($mock, agent => $bad->[0]));
    my ($rc, $out) = $t->test_config;
    isnt($rc, 0, "nginx -t fails: $bad->[0]");
    like($out, $bad->[1], 'and says why') or diag($out);
}

$t->write_file_expand('nginx.conf', engine_conf($mock,
    agent => 'hook_before /h timeout=2s on_error=continue; hook_after /a;'));
my ($rc, $out) = $t->test_config;
is($rc, 0, 'good hook directives pass') or diag($out);

$mock->stop;
$_->stop for values %hook;
done_testing;
