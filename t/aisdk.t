#!/usr/bin/perl

# agent_aisdk: the AI SDK's own chat client (the "ai" package, pinned in
# t/js/package-lock.json, unmodified) against nginx.  Its transport checks
# every chunk against the package's UI message stream schema; the
# message it builds must be what the log holds.  Text and reasoning, a
# server tool, a provider-executed tool, an error mid-stream, and a
# resume mid-reply (useChat's GET .../ID/stream), 204 when no turn runs.

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

unless (-d "$js/node_modules/ai") {
    system("cd $js && npm ci --no-audit --no-fund --loglevel=error >&2")
        == 0 or plan(skip_all => 'npm ci failed in t/js');
}

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mport = $mock->port;

my $search = <<'END';
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
END

$t->write_file_expand('nginx.conf', engine_conf($mock,
    tools => $ECHO_TOOL . $search,
    agent => 'tools echo;',
    server => $ECHO_LOCATION . <<"END"));
        location /api/chat {
            agent chat;
            agent_aisdk;
        }

        location /api/search {
            agent search;
            agent_aisdk;
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
END
$t->run;

my $base = 'http://127.0.0.1:' . $t->port(8080);

sub chat {
    my ($api, $id, @args) = @_;

    my $out = `cd $js && node aisdk.mjs $base$api $id @args`;
    my $chat = eval { decode_json($out) };
    diag("node: $out") unless $chat;
    return $chat || {};
}

sub assistant {
    my ($chat) = @_;
    return (grep { $_->{role} eq 'assistant' } @{$chat->{messages} || []})
        [-1] || { parts => [] };
}

sub parts {
    my ($chat, $type) = @_;
    return [ map { $_->{text} } grep { $_->{type} eq $type }
             @{assistant($chat)->{parts}} ];
}

sub logged {
    my ($id, $type, $field) = @_;
    my $c = $id =~ /^s/
        ? decode_json(http_get("/s/$id", port => $t->port(8080))->{body})
        : inspect($t, $id)->{json};
    return [ map { $_->{$field} }
             grep { $_->{type} eq $type && defined $_->{$field}
                    && $_->{$field} ne '' } @{$c->{messages}} ];
}

# text, reasoning and a server tool, over two model calls

$mock->script(
    { reasoning => 'Let me think', text => 'Calling echo', chunks => 3,
      tool_calls => [{ id => 'call_1', name => 'echo',
                       arguments => '{"n":1}' }] },
    { text => 'The echo said 1', chunks => 4 });

my $chat = chat('/api/chat', 'a1', 'send', 'hello');

is($chat->{error}, undef, 'no validation error');
is($chat->{status}, 'ready', 'the chat is ready after the reply');
is_deeply(parts($chat, 'text'), logged('a1', 'assistant_msg', 'content'),
          'text parts are the logged replies');
is_deeply(parts($chat, 'reasoning'),
          logged('a1', 'assistant_msg', 'thinking'),
          'reasoning parts are the logged thinking');
is(scalar(grep { $_->{type} eq 'step-start' }
          @{assistant($chat)->{parts}}), 2, 'a step per model call');

my ($tool) = grep { $_->{type} eq 'tool-echo' } @{assistant($chat)->{parts}};
is($tool->{state}, 'output-available', 'the server tool has its output');
is_deeply($tool->{input}, { n => 1 }, 'its input');
is_deeply($tool->{output}, logged('a1', 'tool_result', 'result')->[0],
          'its output is the logged result');
is(inspect($t, 'a1')->{json}{messages}[0]{content}, 'hello',
   'the user message is the conversation\'s');

# a provider-executed tool

$mock->script({ thinking => 'Searching', text => 'Found it',
                web_search => { query => 'nginx', results => [
                    { url => 'https://nginx.org', title => 'nginx' }] } });

$chat = chat('/api/search', 's1', 'send', 'find nginx');

is($chat->{error}, undef, 'provider tool: no validation error');
($tool) = grep { $_->{type} eq 'tool-web_search' }
          @{assistant($chat)->{parts}};
ok($tool && $tool->{providerExecuted}, 'the hosted call is providerExecuted');
is($tool && $tool->{state}, 'output-available', 'with its output');
is_deeply(parts($chat, 'text'), logged('s1', 'assistant_msg', 'content'),
          'provider tool: text is the log\'s');

# an error mid-stream: an error chunk, the reply so far kept

my $r;

$mock->script({ text => 'Partial reply', chunks => 3, error_after => 3 });

$chat = chat('/api/chat', 'e1', 'send', 'fail please');

like($chat->{error} // '', qr/error mid-stream/,
     'the error chunk is the chat\'s error');
is($chat->{status}, 'error', 'the chat is in error');
is(join('', @{parts($chat, 'text')}),
   join('', @{logged('e1', 'assistant_msg', 'content')}),
   'the text so far is the logged partial reply');

# what useChat does not send: a clear 400, nothing taken

$r = http_post('/api/chat', encode_json({ id => 'x1', messages => [
                   { id => 'm1', role => 'assistant',
                     parts => [{ type => 'text', text => 'hi' }] }] }),
               port => $t->port(8080),
               headers => { 'Content-Type' => 'application/json' });
is($r->{status}, 400, 'a last message that is not the user\'s: 400');

$r = http_post('/api/chat', '{"id":', port => $t->port(8080),
               headers => { 'Content-Type' => 'application/json' });
is($r->{status}, 400, 'malformed JSON: 400');

# resume: 204 when no turn runs, the running turn from its start

$r = http_get('/api/chat/a1/stream', port => $t->port(8080));
is($r->{status}, 204, 'resume with no turn running: 204');

$mock->script({ text => join('', map { "word$_ " } 1 .. 30), chunks => 30,
                delay => 0.1 });

send_message($t, 'r1', 'a long one');
sleep 0.3;

$chat = chat('/api/chat', 'r1', 'resume');

is($chat->{error}, undef, 'resume: no validation error');
is_deeply(parts($chat, 'text'), logged('r1', 'assistant_msg', 'content'),
          'resumed mid-reply: the whole reply, once');

$t->done;
