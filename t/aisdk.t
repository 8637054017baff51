#!/usr/bin/perl

# agent_aisdk: the AI SDK's own chat client (the "ai" package 5, 6 and 7,
# pinned in t/js/package-lock.json, unmodified) against nginx.  Its
# transport checks every chunk against the package's UI message stream
# schema; the messages it builds must be what the log holds.  Every
# lifecycle: text, thinking, a server tool, a streaming tool, a
# provider-executed tool, approval (approve and deny), a client tool, a
# person's answer, a cancel, an error mid-stream, a resume mid-reply
# (useChat's GET .../ID/stream), and a model call made again after its
# worker died.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $js = "$FindBin::Bin/js";

plan(skip_all => 'no node 18 or later (apt-get install nodejs npm)')
    unless (`node --version 2>/dev/null` // '') =~ /^v(\d+)/ && $1 >= 18;

Test::Agent->npm_ci($js, 'ai', 'ai6', 'ai7')
    or plan(skip_all => 'npm ci failed in t/js');

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mport = $mock->port;

my $tools = $ECHO_TOOL . <<'END';
    agent_tool send_note {
        description "Sends a note";
        location /tools/echo;
        approval requires_approval;
    }

    agent_tool browser_timezone {
        description "The browser's time zone";
        executor client;
    }

    agent_tool ask_user {
        description "Asks the user";
        executor human;
    }

    agent_tool build {
        description "Builds, reporting progress";
        location /tools/build;
        streaming on;
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
END

# the configuration of docs/protocols.md, as it is there

my $readme = do {
    open my $fh, '<', "$FindBin::Bin/../docs/protocols.md" or die $!;
    local $/;
    <$fh>;
};
my ($readme_conf) = $readme =~ /^## With the AI SDK\n.*?```nginx\n(.*?)```/ms;
$readme_conf //= '';
$readme_conf =~ s/^/        /mg;

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $tools,
    agent => 'tools echo send_note browser_timezone ask_user build;',
    # 8081: reuseport, so that the kernel spreads clients over workers
    server => "listen 127.0.0.1:%%PORT_8081%% reuseport;\n"
        . $ECHO_LOCATION . $readme_conf . <<"END"));
        add_header X-Worker \$pid always;

        location = /tools/build {
            internal;
            default_type application/x-ndjson;
            return 200 '{"progress":{"step":1}}\n{"result":{"built":true}}\n';
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
my @all = qw(ai ai6 ai7);

like($readme_conf, qr/agent_aisdk/, 'the docs\' configuration is used');

# the chat client: node aisdk.mjs, with the package and options in %env

sub chat {
    my ($api, $id, $env, @args) = @_;

    my $vars = join ' ', map { "$_=" . quote($env->{$_}) } sort keys %$env;
    my $out = `cd $js && env $vars node aisdk.mjs $base$api $id @args`;
    my ($last) = (split /\n/, $out)[-1];
    my $chat = eval { decode_json($last // '') };
    diag("node: $out") unless $chat;
    return $chat || { messages => [] };
}

sub quote {
    my ($s) = @_;
    $s =~ s/'/'\\''/g;
    return "'$s'";
}

# a resume by the chat client, its output read as it comes: the
# answering worker's pid first (the answer's X-Worker), then the chat

sub resumed {
    my ($pkg, $id, %env) = @_;

    my $vars = join ' ', map { "$_=" . quote($env{$_}) } sort keys %env;
    my $url = $env{AISDK_URL} // "$base/api/chat";

    delete $env{AISDK_URL};
    $vars = join ' ', map { "$_=" . quote($env{$_}) } sort keys %env;

    my $pid = open(my $fh, '-|', "cd $js && env $vars AISDK_PKG=$pkg "
                   . "AISDK_WORKER=1 node aisdk.mjs $url $id resume")
        or die "node: $!";
    my $line = <$fh> // '';
    my $worker = eval { decode_json($line)->{worker} } // 0;

    return ($fh, $worker, $pid);
}

sub read_chat {
    my ($fh) = @_;

    my $out = join '', <$fh>;
    close $fh;
    my $chat = eval { decode_json((split /\n/, $out)[-1] // '') };
    diag("node: $out") unless $chat;
    return $chat || { messages => [], errors => [$out] };
}

sub assistant {
    my ($chat) = @_;
    return (grep { $_->{role} eq 'assistant' } @{$chat->{messages} || []})
        [-1] || { parts => [] };
}

sub log_of {
    my ($id) = @_;
    return $id =~ /^s/
        ? decode_json(http_get("/s/$id", port => $t->port(8080))->{body})
        : inspect($t, $id)->{json};
}

# the client's last turn against the log: the user's text, then the
# assistant's message, part by part as the log has it (a text and a
# reasoning part per reply that has them, a step per model call, a tool
# part per call with its input and what became of it); the differences

sub differences {
    my ($chat, $id) = @_;

    my $c = log_of($id);
    my @ev = @{$c->{messages} || []};
    my @user = grep { $_->{type} eq 'user_msg' } @ev;
    my $turn = $user[-1]{turn};
    @ev = grep { ($_->{turn} // 0) == $turn } @ev;

    my @msgs = @{$chat->{messages} || []};
    my $a = $msgs[-1] || { parts => [] };
    my $u = $msgs[-2] || { parts => [] };
    my @d;

    push @d, "user text" unless join('', map { $_->{text} }
        grep { $_->{type} eq 'text' } @{$u->{parts}})
        eq $user[-1]{content};
    push @d, "message id $a->{id}" unless ($a->{id} // '') eq "msg_$turn";

    my @parts = @{$a->{parts}};
    my @replies = grep { $_->{type} eq 'assistant_msg' } @ev;

    for my $f ([text => 'content'], [reasoning => 'thinking']) {
        my @got = map { $_->{text} } grep { $_->{type} eq $f->[0] } @parts;
        my @want = grep { $_ ne '' } map { $_->{$f->[1]} // '' } @replies;
        push @d, "$f->[0]: [@got] != [@want]" unless "@got" eq "@want";
    }

    my $steps = grep { $_->{type} eq 'step-start' } @parts;
    push @d, "steps $steps != " . scalar @replies
        unless $steps == @replies;

    my %result = map { $_->{tool_call_id} => $_ }
                 grep { $_->{type} eq 'tool_result' } @ev;
    my %denied = map { $_->{tool_call_id} => 1 }
                 grep { $_->{type} eq 'resolution'
                        && ($_->{decision} // '') eq 'reject' } @ev;
    my @calls = grep { $_->{type} eq 'tool_call' } @ev;
    my @tools = grep { $_->{type} =~ /^tool-/ } @parts;

    push @d, "tool parts " . scalar(@tools) . " != " . scalar @calls
        unless @tools == @calls;

    for my $call (@calls) {
        my $id = $call->{tool_call_id};
        my ($p) = grep { $_->{toolCallId} eq $id } @tools;
        my $r = $result{$id};

        if (!$p) {
            push @d, "no part for $id";
            next;
        }

        push @d, "$id type $p->{type}" unless $p->{type} eq "tool-$call->{name}";
        push @d, "$id input" unless JSON::PP->new->canonical->encode(
            { i => $p->{input} }) eq JSON::PP->new->canonical->encode(
            { i => decode_json($call->{arguments}) });

        my $state = !$r ? undef
                  : $denied{$id} ? 'output-denied'
                  : $r->{ok} ? 'output-available' : 'output-error';

        if (!defined $state) {
            next;
        }

        push @d, "$id state $p->{state} != $state"
            unless $p->{state} eq $state;

        if ($state eq 'output-available') {
            push @d, "$id output" unless JSON::PP->new->canonical->encode(
                { o => $p->{output} }) eq JSON::PP->new->canonical->encode(
                { o => $r->{result} });
        }

        if ($state eq 'output-error') {
            push @d, "$id error" unless $p->{errorText} eq $r->{error};
        }
    }

    return \@d;
}

sub checks {
    my ($what, $chat, $id, %opts) = @_;

    is_deeply($chat->{errors}, [], "$what: no validation error")
        unless $opts{error};
    is_deeply(differences($chat, $id), [],
              "$what: the client's messages are the log's");
}

my $n = 0;

for my $pkg (@all) {

    # text and reasoning, a server tool, over two model calls; the tool's
    # input as it streams

    $mock->script(
        { reasoning => 'Let me think', text => 'Calling echo', chunks => 3,
          delay => 0.05,
          tool_calls => [{ id => "call_1$pkg", name => 'echo',
                           arguments => '{"n":1}', chunks => 3 }] },
        { text => 'The echo said 1', chunks => 4 });

    my $id = 'a' . ++$n;
    my $chat = chat('/api/chat', $id, { AISDK_PKG => $pkg }, 'send', 'hello');

    is($chat->{status}, 'ready', "$pkg: ready after the reply");
    checks("$pkg: text, thinking, a server tool", $chat, $id);
    my @t = @{$chat->{types}};
    ok((grep { $_ eq 'tool-input-delta' } @t) >= 2,
       "$pkg: the call's input as it streamed");
    is((grep { /^tool-input-(start|delta)$/ } @t)[0], 'tool-input-start',
       "$pkg: after its start");

    ok((grep { $_->{type} eq 'data-tool-progress' } @{$chat->{data}}) == 0,
       "$pkg: no progress for a plain tool");

    # plain text

    $mock->script({ text => 'Just words', chunks => 3 });
    $id = 'a' . ++$n;
    $chat = chat('/api/chat', $id, { AISDK_PKG => $pkg }, 'send', 'hi');
    checks("$pkg: plain text", $chat, $id);

    # a streaming tool: its progress as transient data parts

    $mock->script(
        { tool_calls => [{ id => "call_b$pkg", name => 'build',
                           arguments => '{}' }] },
        { text => 'Built' });
    $id = 'a' . ++$n;
    $chat = chat('/api/chat', $id, { AISDK_PKG => $pkg }, 'send', 'build');
    checks("$pkg: a streaming tool", $chat, $id);
    is_deeply([map { $_->{data} } grep { $_->{type} eq 'data-tool-progress' }
               @{$chat->{data}}], [{ step => 1 }],
              "$pkg: its progress, as data");

    # a provider-executed tool

    $mock->script({ thinking => 'Searching', text => 'Found it',
                    web_search => { query => 'nginx', results => [
                        { url => 'https://nginx.org', title => 'nginx' }] } });
    $id = 's' . ++$n;
    $chat = chat('/api/search', $id, { AISDK_PKG => $pkg }, 'send', 'find');
    checks("$pkg: a provider tool", $chat, $id);
    my ($tool) = grep { $_->{type} eq 'tool-web_search' }
                 @{assistant($chat)->{parts}};
    ok($tool && $tool->{providerExecuted},
       "$pkg: the hosted call is providerExecuted");

    # a client tool: the client runs it, its output resolves the call

    $mock->script(
        { tool_calls => [{ id => "call_c$pkg", name => 'browser_timezone',
                           arguments => '{}' }] },
        { text => 'You are in UTC' });
    $id = 'a' . ++$n;
    $chat = chat('/api/chat', $id, { AISDK_PKG => $pkg, AISDK_TOOLS =>
                 '{"browser_timezone":{"time_zone":"UTC"}}' }, 'send', 'tz');
    is($chat->{status}, 'ready', "$pkg: client tool: ready");
    checks("$pkg: a client tool", $chat, $id);
    my @res = grep { $_->{type} eq 'resolution' }
              @{inspect($t, $id)->{json}{messages}};
    is_deeply([map { [$_->{kind}, $_->{source}] } @res],
              [['client_exec', 'client']],
              "$pkg: resolved as a client's result");

    # a person's answer, given the same way

    $mock->script(
        { tool_calls => [{ id => "call_h$pkg", name => 'ask_user',
                           arguments => '{"question":"Which?"}' }] },
        { text => 'Blue it is' });
    $id = 'a' . ++$n;
    $chat = chat('/api/chat', $id, { AISDK_PKG => $pkg, AISDK_TOOLS =>
                 '{"ask_user":"blue"}' }, 'send', 'ask me');
    checks("$pkg: a person's answer", $chat, $id);
    is(inspect($t, $id)->{json}{state}, 'idle', "$pkg: the turn ended");

    # a cancel: the app POSTs to agent_cancel, the stream ends

    $mock->script({ text => join('', map { "word$_ " } 1 .. 40),
                    chunks => 40, delay => 0.05 });
    $id = 'a' . ++$n;
    $chat = chat('/api/chat', $id, { AISDK_PKG => $pkg,
                 AISDK_CANCEL => "$base/api/chat/$id/cancel" }, 'send', 'story');
    is($chat->{cancel}, 200, "$pkg: cancelled");
    checks("$pkg: a cancel", $chat, $id);
    my @types = map { $_->{type} } @{inspect($t, $id)->{json}{messages}};
    is($types[-1], 'cancelled', "$pkg: the log ends cancelled");

    # an error mid-stream: an error chunk, the reply so far kept

    $mock->script({ text => 'Partial reply', chunks => 3, error_after => 3 });
    $id = 'a' . ++$n;
    $chat = chat('/api/chat', $id, { AISDK_PKG => $pkg }, 'send', 'fail');
    like($chat->{error} // '', qr/error mid-stream/,
         "$pkg: the error chunk is the chat's error");
    is($chat->{status}, 'error', "$pkg: the chat is in error");
    checks("$pkg: an error mid-stream", $chat, $id, error => 1);

    # resume: the running turn from its start, then live (the reply
    # waits until the client's GET is answered)

    $mock->reset;
    $mock->script({ text => join('', map { "word$_ " } 1 .. 30),
                    chunks => 30, delay => 0.02, pause_after => 10 });
    $id = 'a' . ++$n;
    send_message($t, $id, 'a long one');
    $mock->wait_paused(0, 15);

    my ($fh) = resumed($pkg, $id);
    $mock->release;
    $chat = read_chat($fh);

    is(scalar @{$chat->{messages}}, 1, "$pkg: resumed, the reply")
        or diag(explain([$chat->{error}, $chat->{errors},
                         inspect($t, $id)->{json}{state}]));

    # the client holds only the assistant's message: the user's is the log's
    unshift @{$chat->{messages}}, { role => 'user', parts => [
        { type => 'text', text => 'a long one' }] };
    checks("$pkg: resumed mid-reply", $chat, $id);
}

# approval: ai 6 and 7 (ai 5 has no approval parts)

for my $pkg (qw(ai6 ai7)) {
    for my $answer ('yes', 'no:not now') {
        $mock->script(
            { tool_calls => [{ id => "call_n$pkg" . ($answer eq 'yes'),
                               name => 'send_note',
                               arguments => '{"n":7}' }] },
            { text => $answer eq 'yes' ? 'Sent' : 'Not sent' });
        my $id = 'a' . ++$n;
        my $chat = chat('/api/chat', $id, { AISDK_PKG => $pkg,
                        AISDK_APPROVE => $answer }, 'send', 'note');
        is($chat->{status}, 'ready', "$pkg: approval $answer: ready");
        checks("$pkg: approval $answer", $chat, $id);

        ok((grep { $_ eq 'tool-approval-request' } @{$chat->{types}}),
           "$pkg: approval $answer: an approval request");
        is(scalar(grep { $_ eq 'tool-output-denied' } @{$chat->{types}}),
           $answer eq 'yes' ? 0 : 1, "$pkg: approval $answer: denied or not");

        my ($res) = grep { $_->{type} eq 'resolution' }
                    @{inspect($t, $id)->{json}{messages}};
        is($res && $res->{decision}, $answer eq 'yes' ? 'approve' : 'reject',
           "$pkg: approval $answer: the resolution");
        is($res && $res->{reason}, $answer eq 'yes' ? undef : 'not now',
           "$pkg: approval $answer: its reason");
    }
}

# the model call made again after its worker died, under a client that
# streams from the other worker: the reply, shown once

for my $again (['same', 'The whole reply, said once'],
               ['other', 'Another reply altogether, and a longer one '
                         . 'than the first was'])
{
    $mock->reset;
    $mock->script({ text => 'The whole reply, said once', chunks => 6,
                    pause_after => 4 },
                  { text => $again->[1], chunks => 12, delay => 0.25 });

    my $id = 'k' . ++$n;
    send_message($t, $id, 'again');
    $mock->wait_paused(0, 15);

    my $lease = inspect($t, $id)->{json}{lease};
    my ($fh, $worker, $pid);

    for (1 .. 20) {
        ($fh, $worker, $pid) = resumed('ai6', $id,
            AISDK_RESUME_ON_ERROR => 1,
            AISDK_URL => 'http://127.0.0.1:' . $t->port(8081) . '/api/chat');
        last if $worker && $worker != $lease;
        kill 'TERM', $pid;
        close $fh;
        undef $fh;
    }

    ok($fh, "$again->[0]: a client on the other worker");
    sleep 0.3;

    $t->kill_worker($lease);

    my $chat = $fh ? read_chat($fh) : { messages => [], errors => [] };
    unshift @{$chat->{messages}}, { role => 'user', parts => [
        { type => 'text', text => 'again' }] };

    is_deeply(differences($chat, $id), [],
              "$again->[0] reply made again: the client shows the log's")
        or diag(explain([$lease, $worker, $chat->{error}, $chat->{errors},
                         $chat->{types}]));

    if ($again->[0] eq 'same') {
        is_deeply($chat->{errors}, [], 'the same reply: no error');
    } else {
        like($chat->{errors}[0] // '', qr/made again/,
             'another reply: an error, then a resume shows it');
    }
}

$t->allow_alert(qr/worker process \d+ exited on signal 9/);

# what useChat does not send: a clear error, nothing taken

my $r = http_post('/api/chat', encode_json({ id => 'x1', messages => [
                      { id => 'm1', role => 'system',
                        parts => [{ type => 'text', text => 'hi' }] }] }),
                  port => $t->port(8080),
                  headers => { 'Content-Type' => 'application/json' });
is($r->{status}, 400, 'a last message of another role: 400');

$r = http_post('/api/chat', encode_json({ id => 'a1', messages => [
                   { id => 'm1', role => 'assistant',
                     parts => [{ type => 'text', text => 'hi' }] }] }),
               port => $t->port(8080),
               headers => { 'Content-Type' => 'application/json' });
is($r->{status}, 409, 'an assistant\'s message that answers nothing: 409');

$r = http_post('/api/chat', '{"id":', port => $t->port(8080),
               headers => { 'Content-Type' => 'application/json' });
is($r->{status}, 400, 'malformed JSON: 400');

$r = http_get('/api/chat/a1/stream', port => $t->port(8080));
is($r->{status}, 204, 'resume with no turn running: 204');

$t->done;
