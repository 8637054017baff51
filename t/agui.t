#!/usr/bin/perl

# agent_agui: the AG-UI client (@ag-ui/client's HttpAgent, pinned in
# t/js/package-lock.json, unmodified) against nginx.  The client checks
# every event against the protocol's schema and its event verifier; the
# messages it ends with must be the log's, and so must those it built
# from the events before the run's MESSAGES_SNAPSHOT.  Text and
# reasoning, a server tool, a streaming tool, a provider's hosted tool,
# an approval approved and denied, a frontend tool, a person's answer,
# a cancel, a provider error mid-stream and a second client connecting
# mid-reply.  RunAgentInput's tools: offered to the model (each adapter's
# request as the mock provider saw it), a call of one waiting for the
# browser, a worker killed mid-turn, a restart with agent_store while the
# call waits, and every bad list refused.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $js = "$FindBin::Bin/js";

plan(skip_all => 'no node 18 or later (apt-get install nodejs npm)')
    unless (`node --version 2>/dev/null` // '') =~ /^v(\d+)/ && $1 >= 18;

Test::Agent->npm_ci($js, 'ai', '@ag-ui/client')
    or plan(skip_all => 'npm ci failed in t/js');

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mport = $mock->port;

my $tools = $ECHO_TOOL . <<'END';
    agent_tool build {
        description "Builds the project, reporting progress";
        streaming on;
        location /tools/build;
    }

    agent_tool send_email {
        description "Sends an email";
        parameters '{"type":"object","properties":{"to":{"type":"string"}}}';
        approval requires_approval;
        location /tools/echo;
        timeout 1h;
    }

    agent_tool ask_user {
        description "Asks the user a question";
        executor human;
        timeout 1h;
    }

    agent_tool browser_time {
        description "The time zone of the user's browser";
        executor client;
        timeout 1h;
    }

    agent_tool web_search {
        executor provider;
        provider_definition anthropic_messages
            '{"type":"web_search_20250305","name":"web_search"}';
    }

    agent search {
        provider anthropic_messages /internal/anthropic;
        model claude-test;
        tools web_search;
    }

    agent resp {
        provider openai_responses /internal/responses;
        model gpt-test;
        tools echo;
    }
END

$t->write_file_expand('nginx.conf', engine_conf($mock,
    tools => $tools,
    agent => 'tools echo build send_email ask_user browser_time;',
    server => $ECHO_LOCATION . <<"END"));
        location = /tools/build {
            internal;
            default_type application/x-ndjson;
            return 200 '{"progress":{"step":1}}\n{"progress":{"step":2}}\n{"result":"built"}\n';
        }

        location /agui {
            agent chat;
            agent_agui;
            client_body_buffer_size 128k;
        }

        location /agui-off {
            agent chat;
            agent_agui client_tools=off;
        }

        location /agui-resp {
            agent resp;
            agent_agui;
        }

        location /agui-search {
            agent search;
            agent_agui;
        }

        location ~ ^/s/(?<sid>[^/]+)\$ {
            agent search;
            agent_conversation \$sid;
            agent_inspect;
        }

        location = /internal/anthropic {
            internal;
            proxy_pass http://127.0.0.1:$mport/v1/messages;
            proxy_http_version 1.1;
            proxy_buffering off;
        }

        location = /internal/responses {
            internal;
            proxy_pass http://127.0.0.1:$mport/v1/responses;
            proxy_http_version 1.1;
            proxy_buffering off;
        }
END
$t->run;

my $base = 'http://127.0.0.1:' . $t->port(8080);

# the frontend tools the runs offer (RunAgentInput's tools)
our $TOOLS = [];

sub spec {
    my ($path, $thread, @steps) = @_;
    return encode_json({ url => "$base$path", threadId => $thread,
                         state => { app => 'demo', notes => 'n' x 8000 },
                         tools => $TOOLS, steps => \@steps });
}

sub quote {
    my ($s) = @_;
    $s =~ s/'/'\\''/g;
    return "'$s'";
}

sub agui {
    my $out = `cd $js && node agui.mjs @{[quote(spec(@_))]}`;
    my $res = eval { decode_json($out) };
    diag("node: $out") unless $res;
    diag("node: $out") if $ENV{TEST_AGUI_VERBOSE};
    return $res || { runs => [], messages => [] };
}

# the log's conversation as AG-UI messages, built here from inspect

sub logged {
    my ($id) = @_;

    my $c = $id =~ /^s/
        ? decode_json(http_get("/s/$id?limit=1000",
                               port => $t->port(8080))->{body})
        : inspect($t, $id, 'limit=1000')->{json};
    my (@m, $open, %client);

    for my $e (@{$c->{messages}}) {
        $client{$e->{tool_call_id}} = $e->{source_id}
            if $e->{type} eq 'resolution' && $e->{source_id};

        if ($e->{type} eq 'user_msg') {
            push @m, { id => $e->{source_id}, role => 'user',
                       content => $e->{content} };
            undef $open;

        } elsif ($e->{type} eq 'assistant_msg') {
            push @m, { id => "$e->{message_id}_r", role => 'reasoning',
                       content => $e->{thinking} }
                if defined $e->{thinking} && $e->{thinking} ne '';
            $open = { id => $e->{message_id}, role => 'assistant' };
            $open->{content} = $e->{content}
                if defined $e->{content} && $e->{content} ne '';
            push @m, $open;

        } elsif ($e->{type} eq 'tool_call') {
            push @{$open->{toolCalls}}, { id => $e->{tool_call_id},
                type => 'function', function => {
                    name => $e->{name}, arguments => $e->{arguments} } };

        } elsif ($e->{type} eq 'tool_result') {
            my $content = !$e->{ok} ? $e->{error}
                : ref $e->{result} ? JSON::PP->new->canonical
                                         ->encode($e->{result})
                : $e->{result};
            push @m, { id => $client{$e->{tool_call_id}}
                             // "result_$e->{tool_call_id}", role => 'tool',
                       toolCallId => $e->{tool_call_id},
                       content => $content,
                       $e->{ok} ? () : (error => $e->{error}) };
            undef $open;
        }
    }

    return \@m;
}

# what a message list says, for lists whose ids and JSON spelling differ
# (the client's own messages, what the events built): roles, text, calls

sub said {
    my ($messages) = @_;
    return [ map {
        my $m = $_;
        join('|', $m->{role}, $m->{role} eq 'tool' ? $m->{toolCallId}
                              : $m->{content} // '',
             map { "$_->{id}:$_->{function}{name}:$_->{function}{arguments}" }
             @{$m->{toolCalls} || []})
    } @$messages ];
}

sub canonical {
    my ($messages) = @_;
    my $json = JSON::PP->new->canonical;
    return [ map {
        my %m = %$_;
        if ($m{role} eq 'tool' && $m{content} =~ /^[\[{]/) {
            $m{content} = $json->encode(decode_json($m{content}));
        }
        \%m;
    } @$messages ];
}

sub wait_streaming {
    my ($id) = @_;

    for (1 .. 100) {
        my $c = inspect($t, $id)->{json};
        return if $c && $c->{streaming_message};
        sleep 0.05;
    }
}

sub errors {
    my ($res) = @_;
    return [ grep { defined } map { $_->{error} } @{$res->{runs}} ];
}

sub events {
    my ($res, $i) = @_;
    return $res->{runs}[$i // -1]{events} || [];
}

sub has {
    my ($res, $type, $i) = @_;
    return scalar grep { $_ eq $type } @{events($res, $i)};
}

# text and reasoning, over a step

$mock->script({ reasoning => 'Let me think', text => 'Hello there',
                chunks => 3, delay => 0.05 });

my $res = agui('/agui', 'p1', { send => 'hello', id => 'u-p1' });

is_deeply(errors($res), [], 'text: the verifier took every event');
is(events($res)->[0], 'RUN_STARTED', 'RUN_STARTED first');
is(events($res)->[1], 'STATE_SNAPSHOT', 'then the state');
is_deeply($res->{runs}[0]{state}, { app => 'demo', notes => 'n' x 8000 },
          'the state the run started from');
is(events($res)->[-1], 'RUN_FINISHED', 'RUN_FINISHED last');
ok(has($res, 'STEP_STARTED') == 1 && has($res, 'STEP_FINISHED') == 1,
   'one step for one model call');
ok(has($res, 'TEXT_MESSAGE_CONTENT') >= 2, 'text as it streams');
ok(has($res, 'REASONING_MESSAGE_CONTENT') >= 2, 'reasoning as it streams');
ok(has($res, 'MESSAGES_SNAPSHOT'), 'a messages snapshot');
is($res->{runs}[0]{outcome}, 'success', 'outcome success');
is_deeply(canonical($res->{messages}), canonical(logged('p1')),
          'text: the client\'s messages are the log\'s');
is_deeply(said($res->{runs}[0]{before}), said(logged('p1')),
          'text: so are those the events built');

# a server tool over two model calls; a second message in a second run

$mock->script(
    { text => 'Calling echo', chunks => 2,
      tool_calls => [{ id => 'call_e1', name => 'echo',
                       arguments => '{"n":1}' }] },
    { text => 'The echo said 1', chunks => 2 },
    { text => 'Again', chunks => 1 });

$res = agui('/agui', 't1', { send => 'echo 1' }, { send => 'again' });

is_deeply(errors($res), [], 'server tool: no verifier error');
is(has($res, 'STEP_STARTED', 0), 2, 'a step per model call');
ok(has($res, 'TOOL_CALL_START', 0) && has($res, 'TOOL_CALL_ARGS', 0)
   && has($res, 'TOOL_CALL_END', 0), 'the call\'s start, arguments, end');
is(has($res, 'TOOL_CALL_RESULT', 0), 1, 'its result');
is_deeply(canonical($res->{messages}), canonical(logged('t1')),
          'server tool: the client\'s messages are the log\'s');
is_deeply(said($res->{runs}[1]{before}), said(logged('t1')),
          'over two runs: so are those the events built');

# a streaming tool: its progress as CUSTOM events

$mock->script(
    { tool_calls => [{ id => 'call_b1', name => 'build',
                       arguments => '{}' }] },
    { text => 'Built', chunks => 1 });

$res = agui('/agui', 'b1', { send => 'build it' });

is_deeply(errors($res), [], 'streaming tool: no verifier error');
ok(has($res, 'CUSTOM:tool_progress') >= 1, 'its progress');
is_deeply(canonical($res->{messages}), canonical(logged('b1')),
          'streaming tool: the client\'s messages are the log\'s');

# a provider's hosted tool

$mock->script({ thinking => 'Searching', text => 'Found it',
                web_search => { query => 'nginx', results => [
                    { url => 'https://nginx.org', title => 'nginx' }] } });

$res = agui('/agui-search', 's1', { send => 'find nginx' });

is_deeply(errors($res), [], 'hosted tool: no verifier error');
ok(has($res, 'TOOL_CALL_START') && has($res, 'TOOL_CALL_RESULT'),
   'the hosted call and its result');
is_deeply(canonical($res->{messages}), canonical(logged('s1')),
          'hosted tool: the client\'s messages are the log\'s');

# an approval: an interrupt, approved by the next run's resume

$mock->script(
    { tool_calls => [{ id => 'call_a1', name => 'send_email',
                       arguments => '{"to":"a@example.com"}' }] },
    { text => 'Sent', chunks => 1 });

$res = agui('/agui', 'a1', { send => 'mail a' }, { resume => {
    approved => JSON::PP::true } });

is_deeply(errors($res), [], 'approve: no verifier error');
is($res->{runs}[0]{outcome}, 'interrupt', 'the first run is interrupted');
is($res->{runs}[0]{interrupts}[0]{toolCallId}, 'call_a1',
   'for the call');
is($res->{runs}[0]{interrupts}[0]{reason}, 'tool_approval',
   'an approval');
is($res->{runs}[1]{outcome}, 'success', 'the resumed run completes');
ok(has($res, 'TOOL_CALL_RESULT', 1), 'with the tool\'s result');
my ($result) = grep { $_->{role} eq 'tool' } @{$res->{messages}};
like($result->{content} // '', qr/a\@example.com/, 'the tool ran');
is_deeply(canonical($res->{messages}), canonical(logged('a1')),
          'approve: the client\'s messages are the log\'s');

# denied

$mock->script(
    { tool_calls => [{ id => 'call_d1', name => 'send_email',
                       arguments => '{"to":"d@example.com"}' }] },
    { text => 'Not sent', chunks => 1 });

$res = agui('/agui', 'd1', { send => 'mail d' }, { resume => {
    approved => JSON::PP::false, reason => 'not now' } });

is_deeply(errors($res), [], 'deny: no verifier error');
($result) = grep { $_->{role} eq 'tool' } @{$res->{messages}};
is($result->{error}, 'denied by approver: not now', 'the denial');
is_deeply(canonical($res->{messages}), canonical(logged('d1')),
          'deny: the client\'s messages are the log\'s');

# an approval answered by a tool message, as a frontend tool is

$mock->script(
    { tool_calls => [{ id => 'call_a2', name => 'send_email',
                       arguments => '{"to":"b@example.com"}' }] },
    { text => 'Not sent either', chunks => 1 });

$res = agui('/agui', 'a2', { send => 'mail b' });
is($res->{runs}[0]{outcome}, 'interrupt', 'tool message: an interrupt');

my $rr = http_post('/agui', encode_json({ threadId => 'a2', runId => 'r2',
                       messages => [{ id => 't-a2', role => 'tool',
                           toolCallId => 'call_a2',
                           content => '{"approved":false,"reason":"no"}' }]
                   }), port => $t->port(8080),
                   headers => { 'Content-Type' => 'application/json' });
like($rr->{body}, qr/"RUN_FINISHED".*"type":"success"/s,
     'the run goes on to its end');
my ($denied) = grep { $_->{type} eq 'tool_result' }
               @{inspect($t, 'a2')->{json}{messages}};
is($denied->{error}, 'denied by approver: no', 'the tool message denied');

# a frontend tool: the run completes with the call pending, the next
# run's tool message is its result

$mock->script(
    { tool_calls => [{ id => 'call_f1', name => 'browser_time',
                       arguments => '{}' }] },
    { text => 'You are in UTC', chunks => 1 });

$res = agui('/agui', 'f1', { send => 'what time zone' },
            { tool => { tz => 'UTC' } });

is_deeply(errors($res), [], 'frontend tool: no verifier error');
is_deeply($res->{runs}[0]{pending}, ['call_f1'],
          'the first run leaves the call pending');
is(events($res, 0)->[-1], 'RUN_FINISHED', 'and ends');
ok(!has($res, 'TOOL_CALL_RESULT', 1),
   'the result is the client\'s, not sent back');
my $c = inspect($t, 'f1')->{json};
my ($tr) = grep { $_->{type} eq 'tool_result' } @{$c->{messages}};
is_deeply($tr->{result}, { tz => 'UTC' }, 'the logged result');
is($c->{state}, 'idle', 'the turn went on');
is_deeply(canonical($res->{messages}), canonical(logged('f1')),
          'frontend tool: the client\'s messages are the log\'s');

# a person's answer

$mock->script(
    { tool_calls => [{ id => 'call_h1', name => 'ask_user',
                       arguments => '{"question":"Colour?"}' }] },
    { text => 'Blue it is', chunks => 1 });

$res = agui('/agui', 'h1', { send => 'pick' },
            { resume => { answer => 'blue' } });

is_deeply(errors($res), [], 'answer: no verifier error');
is($res->{runs}[0]{interrupts}[0]{reason}, 'input_required',
   'a question is an interrupt');
$c = inspect($t, 'h1')->{json};
($tr) = grep { $_->{type} eq 'tool_result' } @{$c->{messages}};
is_deeply($tr->{result}, { answer => 'blue' }, 'the answer is the result');
is_deeply(canonical($res->{messages}), canonical(logged('h1')),
          'answer: the client\'s messages are the log\'s');

# a resume of a call that no longer waits: 409, nothing changes

my $last = inspect($t, 'h1')->{json}{last_seq};
my $r = http_post('/agui', encode_json({ threadId => 'h1', runId => 'x',
                      messages => [], resume => [{ interruptId => 'call_h1',
                      status => 'resolved', payload => 'red' }] }),
                  port => $t->port(8080),
                  headers => { 'Content-Type' => 'application/json' });
is($r->{status}, 409, 'a stale resume: 409');
like($r->{body}, qr/"stale"/, 'stale');
is(inspect($t, 'h1')->{json}{last_seq}, $last, 'nothing was logged');

# a provider error mid-stream: RUN_ERROR

$mock->script({ text => 'Partial reply', chunks => 3, error_after => 3 });

$res = agui('/agui', 'e1', { send => 'fail please' });

is(events($res)->[-1], 'RUN_ERROR', 'RUN_ERROR ends the run');
like($res->{runs}[0]{runError} // '', qr/error mid-stream/,
     'with the provider\'s error');
unlike($res->{runs}[0]{error} // '', qr/Cannot send|First event/,
       'the verifier took every event');
is($res->{runs}[0]{error}, undef,
   'runAgent() resolves: the application sees RUN_ERROR in its subscriber');
is_deeply(canonical($res->{messages}), canonical(logged('e1')),
          'error: the client\'s messages are the log\'s');

# cancel mid-reply: RUN_FINISHED, cancelled

$mock->script({ text => join('', map { "word$_ " } 1 .. 30), chunks => 30,
                delay => 0.1 });

my $pid = open(my $fh, '-|', "cd $js && node agui.mjs "
                             . quote(spec('/agui', 'k1', { send => 'long' })));
wait_streaming('k1');
cancel($t, 'k1');
my $out = join('', <$fh>);
diag("node: $out") if $ENV{TEST_AGUI_VERBOSE};
$res = eval { decode_json($out) } || { runs => [] };
close $fh;

is_deeply(errors($res), [], 'cancel: no verifier error');
is($res->{runs}[0]{outcome}, 'cancelled', 'the run is cancelled');
is_deeply(canonical($res->{messages}), canonical(logged('k1')),
          'cancel: the client\'s messages are the log\'s');

# a second client connects mid-reply: the whole reply, once

$mock->script({ text => join('', map { "part$_ " } 1 .. 30), chunks => 30,
                delay => 0.1 });

$pid = open($fh, '-|', "cd $js && node agui.mjs "
                       . quote(spec('/agui', 'r1', { send => 'long' })));
wait_streaming('r1');
sleep 0.5;
my $second = agui('/agui', 'r1', {});
$out = join('', <$fh>);
diag("node: $out") if $ENV{TEST_AGUI_VERBOSE};
my $first = eval { decode_json($out) } || { runs => [] };
close $fh;

is_deeply(errors($second), [], 'connect: no verifier error');
my ($reply) = grep { $_->{role} eq 'assistant' }
              @{$second->{runs}[0]{before} || []};
my ($whole) = grep { $_->{role} eq 'assistant' } @{logged('r1')};
is($reply->{content}, $whole->{content},
   'connected mid-reply: the whole reply, once');
is_deeply(canonical($second->{messages}), canonical(logged('r1')),
          'connect: the client\'s messages are the log\'s');
is_deeply(canonical($first->{messages}), canonical(logged('r1')),
          'and the first client\'s');

# frontend tools: RunAgentInput's tools are offered to the model after
# the agent's own, in the client's order, their schemas as given; a call
# of one waits for the browser as an "executor client" tool's does, and
# the next run's tool message is its result

my $front = [
    { name => 'get_location', description => 'The user\'s location',
      parameters => { type => 'object', required => ['precision'],
                      properties => { precision => {
                          type => 'string', enum => ['city', 'exact'] } },
                      additionalProperties => JSON::PP::false } },
    { name => 'show-card', description => 'Shows a card',
      parameters => { type => 'object',
                      properties => { title => { type => 'string' } } } },
];

my @declared = qw(echo build send_email ask_user browser_time);

sub offered {
    my ($req) = @_;
    return [ map { $_->{function}{name} } @{$req->{json}{tools} || []} ];
}

sub with_tools {
    my ($tools, @args) = @_;
    local $TOOLS = $tools;
    return agui(@args);
}

$mock->reset;
$mock->script(
    { tool_calls => [{ id => 'call_g1', name => 'get_location',
                       arguments => '{"precision":"city"}' }] },
    { text => 'You are in Paris', chunks => 1 });

$res = with_tools($front, '/agui', 'g1', { send => 'where am I' },
                  { tool => { city => 'Paris' } });

is_deeply(errors($res), [], 'frontend tools: no verifier error');
is_deeply($res->{runs}[0]{pending}, ['call_g1'],
          'a call of one leaves the run with the call pending');
is($res->{runs}[1]{outcome}, 'success', 'the next run completes');

my $reqs = $mock->requests;
is(scalar @$reqs, 2, 'two model calls');
is_deeply(offered($reqs->[0]), [@declared, 'get_location', 'show-card'],
          'offered: the agent\'s tools, then the client\'s, in its order');
is_deeply([@{$reqs->[0]{json}{tools}}[-2, -1]],
          [map { { type => 'function', function => $_ } } @$front],
          'each as the client gave it');
is_deeply($reqs->[1]{json}{tools}, $reqs->[0]{json}{tools},
          'and again to the model call after the browser\'s result');
my ($sent) = grep { $_->{role} eq 'tool' } @{$reqs->[1]{json}{messages}};
is($sent->{tool_call_id}, 'call_g1', 'which the model gets');
like($sent->{content}, qr/"city":"Paris"/, 'as the browser sent it');

$c = inspect($t, 'g1', 'limit=1000')->{json};
my ($um) = grep { $_->{type} eq 'user_msg' } @{$c->{messages}};
is_deeply($um->{client_tools}, $front, 'the user_msg keeps them');
my ($tc) = grep { $_->{type} eq 'tool_call' } @{$c->{messages}};
is($tc->{executor}, 'client', 'the call is the client\'s');
my ($su) = grep { $_->{type} eq 'suspension' } @{$c->{messages}};
is($su->{kind}, 'client_exec', 'it waited as client_exec');
($tr) = grep { $_->{type} eq 'tool_result' } @{$c->{messages}};
is_deeply($tr->{result}, { city => 'Paris' }, 'the logged result');
is($c->{state}, 'idle', 'the turn went on to its end');
is_deeply(canonical($res->{messages}), canonical(logged('g1')),
          'frontend tools: the client\'s messages are the log\'s');

# the tools are the turn's: the next message without them has none

$mock->reset;
$mock->script({ text => 'Plain', chunks => 1 });

$res = agui('/agui', 'g1', { send => 'again' });
is_deeply(errors($res), [], 'a turn without tools: no verifier error');
is_deeply(offered($mock->requests->[0]), \@declared,
          'its model call has the agent\'s tools only');

# Anthropic and OpenAI Responses render them too

$mock->reset;
$mock->script({ text => 'Nothing to do', chunks => 1 },
              { text => 'Nothing either', chunks => 1 });

$res = with_tools($front, '/agui-search', 'sg1', { send => 'hi' });
is_deeply(errors($res), [], 'anthropic: no verifier error');
is_deeply($mock->requests->[0]{json}{tools}, [
    { type => 'web_search_20250305', name => 'web_search' },
    map { { name => $_->{name}, description => $_->{description},
            input_schema => $_->{parameters} } } @$front ],
    'anthropic: its hosted tool, then the client\'s');

$res = with_tools($front, '/agui-resp', 'rg1', { send => 'hi' });
is_deeply(errors($res), [], 'responses: no verifier error');
is_deeply($mock->requests->[1]{json}{tools}, [
    { type => 'function', name => 'echo',
      description => 'Echoes what it got',
      parameters => { type => 'object',
                      properties => { n => { type => 'integer' } } } },
    map { { type => 'function', %$_ } } @$front ],
    'responses: its tool, then the client\'s');

# a location with client_tools=off offers none

$mock->reset;
$mock->script({ text => 'Off', chunks => 1 });

$res = with_tools($front, '/agui-off', 'o1', { send => 'hi' });
is_deeply(errors($res), [], 'client_tools=off: no verifier error');
is_deeply(offered($mock->requests->[0]), \@declared,
          'client_tools=off: the agent\'s tools only');
($um) = grep { $_->{type} eq 'user_msg' }
        @{inspect($t, 'o1')->{json}{messages}};
ok(!exists $um->{client_tools}, 'and the user_msg has none');

# 64 tools are taken

$mock->reset;
$mock->script({ text => 'Many', chunks => 1 });

$res = with_tools([map { { name => "t$_", description => "Tool $_" } } 1 .. 64],
                  '/agui', 'm1', { send => 'many' });
is_deeply(errors($res), [], '64 tools: no verifier error');
is_deeply(offered($mock->requests->[0]),
          [@declared, map { "t$_" } 1 .. 64], '64 tools: all offered');
is_deeply($mock->requests->[0]{json}{tools}[-1]{function},
          { name => 't64', description => 'Tool 64',
            parameters => { type => 'object', properties => {} } },
          'one without parameters takes no arguments');

# the worker dies mid-reply: the worker that takes the turn over offers
# the same tools, and the call of one waits for the browser

$mock->reset;
$mock->script(
    { text => 'Let me look', chunks => 2, pause_after => 2 },
    { tool_calls => [{ id => 'call_k9', name => 'show-card',
                       arguments => '{"title":"Hi"}' }] },
    { text => 'Shown', chunks => 1 });

{
    local $TOOLS = $front;
    # the client sees its stream cut: what it says of that is not read
    $pid = open($fh, '-|', "cd $js && node agui.mjs "
                           . quote(spec('/agui', 'g3',
                                        { send => 'show a card' }))
                           . ' 2>/dev/null');
}

ok($mock->wait_paused(0, 10), 'take-over: the reply is under way');
$t->allow_alert(qr/worker process \d+ exited on signal 9/);
$t->kill_worker;
$c = wait_state($t, 'g3', 'awaiting_input', 15);
$out = join('', <$fh>);
close $fh;

$reqs = $mock->requests;
is(scalar @$reqs, 2, 'take-over: the model is called again');
is_deeply($reqs->[1]{json}{tools}, $reqs->[0]{json}{tools},
          'with the same tools');
is_deeply(offered($reqs->[1]), [@declared, 'get_location', 'show-card'],
          'the client\'s among them');
is($c->{pending}[0]{tool_call_id}, 'call_k9', 'the call waits');
is($c->{pending}[0]{kind}, 'client_exec', 'for the browser');

$rr = http_post('/agui', encode_json({ threadId => 'g3', runId => 'rk',
                    tools => $front,
                    messages => [{ id => 't-g3', role => 'tool',
                                   toolCallId => 'call_k9',
                                   content => '{"shown":true}' }] }),
                port => $t->port(8080),
                headers => { 'Content-Type' => 'application/json' });
like($rr->{body}, qr/"RUN_FINISHED".*"type":"success"/s,
     'take-over: the tool message resolves it, the run goes on');
$c = wait_state($t, 'g3', 'idle');
($tr) = grep { $_->{type} eq 'tool_result' } @{$c->{messages}};
is_deeply($tr->{result}, { shown => JSON::PP::true }, 'the browser\'s result');
is($c->{messages}[-1]{type}, 'turn_completed', 'the turn completed');
is_deeply($mock->requests->[2]{json}{tools}, $reqs->[0]{json}{tools},
          'its last model call with the same tools');

# bad tools: 400, and nothing is taken

my $last_g1 = inspect($t, 'g1')->{json}{last_seq};

my @bad = (
    [ 'not an array', { name => 'a' } ],
    [ 'a tool not an object', ['a'] ],
    [ 'a tool without a name', [{ description => 'x' }] ],
    [ 'a name not a string', [{ name => 5 }] ],
    [ 'an empty name', [{ name => '' }] ],
    [ 'a name with a space', [{ name => 'get location' }] ],
    [ 'a name with a dot', [{ name => 'get.location' }] ],
    [ 'a name of 65 characters', [{ name => 'a' x 65 }] ],
    [ 'parameters an array', [{ name => 'a', parameters => [] }] ],
    [ 'parameters a string',
      [{ name => 'a', parameters => '{"type":"object"}' }] ],
    [ 'a description not a string', [{ name => 'a', description => {} }] ],
    [ 'two tools of one name', [{ name => 'a' }, { name => 'a' }] ],
    [ 'the name of a declared tool', [{ name => 'echo' }] ],
    [ 'the name of a declared client tool', [{ name => 'browser_time' }] ],
    [ 'more than 64 tools', [map { { name => "t$_" } } 1 .. 65] ],
    [ 'more than 32 KiB', [{ name => 'big', description => 'd' x 33000 }] ],
);

for my $b (@bad) {
    my ($what, $tools) = @$b;

    for my $thread ('g1', 'new1') {
        $r = http_post('/agui', encode_json({ threadId => $thread,
                           runId => 'bad', tools => $tools,
                           messages => [{ id => "u-bad-$thread",
                                          role => 'user',
                                          content => 'hello' }] }),
                       port => $t->port(8080),
                       headers => { 'Content-Type' => 'application/json' });
        is($r->{status}, 400, "$what ($thread): 400");
        like($r->{body}, qr/"code":"invalid_tools"/,
             "$what ($thread): invalid_tools");
    }

    is(inspect($t, 'g1')->{json}{last_seq}, $last_g1,
       "$what: nothing logged");
    is(inspect($t, 'new1')->{status}, 404, "$what: no conversation made");
}

is(scalar @{$mock->requests}, 3, 'no model call for a bad input');

# what RunAgentInput must have

$r = http_post('/agui', '{"threadId":', port => $t->port(8080),
                  headers => { 'Content-Type' => 'application/json' });
is($r->{status}, 400, 'malformed JSON: 400');

$r = http_post('/agui', encode_json({ threadId => 'x1', messages => [] }),
               port => $t->port(8080),
               headers => { 'Content-Type' => 'application/json' });
is($r->{status}, 400, 'no runId: 400');

$t->done(more => 1);

# with agent_store, nginx stopped while a frontend tool's call waits: the
# turn revived from the store offers the same tools

my $ts = Test::Agent->new;
my $db = $ts->testdir . '/agent.db';

$ts->write_file_expand('nginx.conf', engine_conf($mock,
    http => "agent_store $db;", tools => $ECHO_TOOL, agent => 'tools echo;',
    server => $ECHO_LOCATION . <<'END'));
        location /agui {
            agent chat;
            agent_agui;
        }
END
$ts->run;

$mock->reset;
$mock->script(
    { tool_calls => [{ id => 'call_v1', name => 'get_location',
                       arguments => '{"precision":"exact"}' }] },
    { text => 'Found you', chunks => 1 });

sub agui_post {
    my ($body) = @_;
    return http_post('/agui', encode_json($body), port => $ts->port(8080),
                     headers => { 'Content-Type' => 'application/json' });
}

$r = agui_post({ threadId => 'v1', runId => 'rv1', tools => $front,
                 messages => [{ id => 'u-v1', role => 'user',
                                content => 'where am I' }] });
like($r->{body}, qr/"pendingToolCallIds":\["call_v1"\]/,
     'store: the run ends with the frontend call pending');
is(wait_state($ts, 'v1', 'awaiting_input')->{pending}[0]{kind},
   'client_exec', 'it waits for the browser');

# a run with nothing new only looks: its turn waits, so it ends at once
# with the call pending (where the stream has caught up)

$r = agui_post({ threadId => 'v1', runId => 'rv1b', tools => $front,
                 messages => [] });
like($r->{body}, qr/"RUN_FINISHED".*"pendingToolCallIds":\["call_v1"\]/s,
     'store: a run that only looks ends with the call pending');

$ts->stop;
$ts->run;

$r = agui_post({ threadId => 'v1', runId => 'rv2', tools => [],
                 messages => [{ id => 't-v1', role => 'tool',
                                toolCallId => 'call_v1',
                                content => '{"city":"Lyon"}' }] });
like($r->{body}, qr/"RUN_FINISHED".*"type":"success"/s,
     'after a restart: the tool message resolves it, the run goes on');
is(wait_state($ts, 'v1', 'idle')->{messages}[-1]{type}, 'turn_completed',
   'the revived turn completed');

$reqs = $mock->requests;
is(scalar @$reqs, 2, 'store: two model calls');
is_deeply($reqs->[1]{json}{tools}, $reqs->[0]{json}{tools},
          'the revived turn offers the same tools');
is_deeply(offered($reqs->[1]), [qw(echo get_location show-card)],
          'the agent\'s, then the client\'s');

$ts->done;
