#!/usr/bin/perl

# Regenerate and edit with the chat clients' own packages: the AI SDK's
# chat client (the "ai" package
# 5, 6 and 7, pinned in t/js/package-lock.json, unmodified) against
# agent_aisdk: regenerate(), regenerate({ messageId }) of an earlier
# reply, setMessages(messages.slice(0, k)) then sendMessage, and
# sendMessage({ text, messageId }).  After each, the model's request holds
# the current branch only (the discarded one absent), and the client's
# messages are the log's current branch; the log keeps every branch.
# With a store, the chat goes on after a restart of nginx.  AG-UI's
# HttpAgent (@ag-ui/client) whose messages leave turns out or edit a
# user message: the run goes after a rewind, and its MESSAGES_SNAPSHOT
# is the current branch.

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
use Test::Agent::Store;

my $js = "$FindBin::Bin/js";

plan(skip_all => 'no node 18 or later (apt-get install nodejs npm)')
    unless (`node --version 2>/dev/null` // '') =~ /^v(\d+)/ && $1 >= 18;
plan(skip_all => Test::Agent::Store->missing) if Test::Agent::Store->missing;

Test::Agent->npm_ci($js, 'ai', 'ai6', 'ai7')
    or plan(skip_all => 'npm ci failed in t/js');

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $store = Test::Agent::Store->for_test($t);
my $db = $store->directive;

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store $db;", server => <<'END'));
        location /api/chat {
            agent chat;
            agent_aisdk;
        }

        location /agui {
            agent chat;
            agent_agui;
        }
END
$t->run;

my $base = 'http://127.0.0.1:' . $t->port(8080);

sub quote {
    my ($s) = @_;
    $s =~ s/'/'\\''/g;
    return "'$s'";
}

# the chat client through its steps: its messages after each, and the
# bodies it sent

sub chat {
    my ($pkg, $id, $steps, $messages) = @_;

    my $env = "AISDK_PKG=$pkg";
    $env .= ' AISDK_MESSAGES=' . quote(encode_json($messages)) if $messages;

    my $cmd = "cd $js && env $env node aisdk_branches.mjs $base/api/chat $id "
              . quote(encode_json($steps));
    my $out = `$cmd`;
    my $chat = eval { decode_json((split /\n/, $out)[-1] // '') };
    diag("node: $out") unless $chat;
    return $chat || { steps => [], bodies => [] };
}

# a request's messages as "role: text" lines

sub lines {
    my ($req) = @_;
    return join "\n", map { "$_->{role}: " . ($_->{content} // '') }
        @{$req->{json}{messages}};
}

# the client's messages, the same way

sub client {
    my ($messages) = @_;
    return join "\n", map {
        my $m = $_;
        "$m->{role}: " . join '', map { $_->{text} }
            grep { $_->{type} eq 'text' } @{$m->{parts}};
    } @$messages;
}

# the log's current branch: an event is superseded when a later rewind
# goes to before it; its user and assistant messages as "role: text"

sub branch {
    my ($id) = @_;
    my @ev = @{inspect($t, $id)->{json}{messages} || []};
    my ($to, @keep) = (1e18);

    for my $e (reverse @ev) {
        next if $e->{seq} > $to;
        unshift @keep, $e;
        $to = $e->{to_seq} if $e->{type} eq 'rewind' && $e->{to_seq} < $to;
    }

    return join "\n",
        map { $_->{type} eq 'user_msg' ? "user: $_->{content}"
                                       : "assistant: $_->{content}" }
        grep { $_->{type} eq 'user_msg'
               || ($_->{type} eq 'assistant_msg' && length $_->{content}) }
        @keep;
}

my $system = 'system: You are terse.';

for my $pkg (qw(ai ai6 ai7)) {
    my $id = "b-$pkg";
    my $n = scalar @{$mock->requests};

    $mock->script(map { { text => $_ } }
                  'A1', 'A2', 'A2b', 'A1b', 'A3', 'Aalt', 'Aalt2', 'Auno');

    my $chat = chat($pkg, $id, [
        { send => 'one' }, { send => 'two' },
        { regenerate => JSON::PP::true },
        { regenerate => 1 },
        { send => 'three' },
        { keep => 2, send => 'alt' },
        { edit => 2, text => 'alt2' },
        { edit => 0, text => 'uno' },
    ]);

    my @s = @{$chat->{steps}};
    my $reqs = $mock->wait_requests($n + 8, 10);
    my @r = @$reqs[$n .. $#$reqs];

    is(scalar @r, 8, "$pkg: one model call a step");
    is($_->{status}, 'ready', "$pkg: the chat is ready") for @s;

    is(lines($r[2]), "$system\nuser: one\nassistant: A1\nuser: two",
       "$pkg: regenerate(): the same context, the old reply absent");
    is(client($s[2]{messages}),
       "user: one\nassistant: A1\nuser: two\nassistant: A2b",
       "$pkg: regenerate(): the new reply replaces the old");

    is(lines($r[3]), "$system\nuser: one",
       "$pkg: regenerate({ messageId }) of the first reply: its context");
    is(client($s[3]{messages}), "user: one\nassistant: A1b",
       "$pkg: regenerate({ messageId }): the later turns gone");

    is(lines($r[4]), "$system\nuser: one\nassistant: A1b\nuser: three",
       "$pkg: the next message follows the branch");

    is(lines($r[5]), "$system\nuser: one\nassistant: A1b\nuser: alt",
       "$pkg: setMessages + sendMessage: the turns left out are absent");
    is(client($s[5]{messages}),
       "user: one\nassistant: A1b\nuser: alt\nassistant: Aalt",
       "$pkg: setMessages + sendMessage: the chat");

    is(lines($r[6]), "$system\nuser: one\nassistant: A1b\nuser: alt2",
       "$pkg: sendMessage({ messageId }): the new text, not the old");
    is(client($s[6]{messages}),
       "user: one\nassistant: A1b\nuser: alt2\nassistant: Aalt2",
       "$pkg: sendMessage({ messageId }): the chat");

    is(lines($r[7]), "$system\nuser: uno",
       "$pkg: an edit of the first message: nothing before it");

    is(branch($id), client($s[7]{messages}),
       "$pkg: the client's messages are the log's current branch");

    my @types = map { $_->{type} } @{inspect($t, $id)->{json}{messages}};
    is(scalar(grep { $_ eq 'rewind' } @types), 5, "$pkg: five rewinds");
    is(scalar(grep { $_ eq 'user_msg' } @types), 8,
       "$pkg: the log keeps every branch");
}

# a message sent again as it was is still taken once

{
    my $id = 'again';
    $mock->script({ text => 'R1' });
    my $chat = chat('ai7', $id, [{ send => 'hello' }]);
    my $n = scalar @{$mock->requests};
    my $body = $chat->{bodies}[0];
    my $r = http_post('/api/chat', encode_json($body),
                      port => $t->port(8080),
                      headers => { 'Content-Type' => 'application/json' });
    is($r->{status}, 200, 'a request sent again: answered');
    like($r->{body}, qr/R1/, 'with the turn it started');
    is(scalar @{$mock->requests}, $n, 'no model call for it');
}

# a chat that sends its new message alone (a server keeps the history):
# a new message follows the last turn, a regenerate or an edit names its
# message by id

{
    my $id = 'alone';
    my $post = sub {
        my ($mid, $text, %o) = @_;
        return http_post('/api/chat', encode_json({
            id => $id, trigger => $o{trigger} // 'submit-message',
            $o{messageId} ? (messageId => $o{messageId}) : (),
            messages => [{ id => $mid, role => 'user',
                           parts => [{ type => 'text', text => $text }] }],
        }), port => $t->port(8080),
            headers => { 'Content-Type' => 'application/json' });
    };
    my $n = scalar @{$mock->requests};
    $mock->script(map { { text => $_ } } 'L1', 'L2', 'L2b', 'L2c');

    $post->('u1', 'first');
    $post->('u2', 'second');
    is(lines($mock->wait_requests($n + 2, 10)->[$n + 1]),
       "$system\nuser: first\nassistant: L1\nuser: second",
       'alone: a new message follows the last turn');
    my $r = $post->('u2', 'second');
    like($r->{body}, qr/L2/, 'alone: sent again, answered with its turn');
    is(scalar @{$mock->requests}, $n + 2, 'alone: and taken once');
    $post->('u2', 'second', trigger => 'regenerate-message');
    is(lines($mock->wait_requests($n + 3, 10)->[$n + 2]),
       "$system\nuser: first\nassistant: L1\nuser: second",
       'alone: regenerate: the old reply absent');
    $post->('u2', 'second, edited', messageId => 'u2');
    is(lines($mock->wait_requests($n + 4, 10)->[$n + 3]),
       "$system\nuser: first\nassistant: L1\nuser: second, edited",
       'alone: an edit by messageId');
}

# a chat whose history is not the conversation's: 409

{
    my $r = http_post('/api/chat', encode_json({
        id => 'again', trigger => 'submit-message',
        messages => [
            { id => 'x1', role => 'user',
              parts => [{ type => 'text', text => 'hi' }] },
            { id => 'msg_99', role => 'assistant',
              parts => [{ type => 'text', text => 'no' }] },
            { id => 'x2', role => 'user',
              parts => [{ type => 'text', text => 'then' }] },
        ] }), port => $t->port(8080),
        headers => { 'Content-Type' => 'application/json' });
    is($r->{status}, 409, 'a history not on the branch: 409');
    like($r->{body}, qr/not_on_branch/, 'with its reason');
}

# after a restart: regenerate and edit of a chat the client kept

{
    my $id = 'restart';
    $mock->script(map { { text => $_ } } 'B1', 'B2');
    my $chat = chat('ai7', $id, [{ send => 'one' }, { send => 'two' }]);
    my $messages = $chat->{steps}[-1]{messages};

    $t->stop;
    $t->run;

    my $n = scalar @{$mock->requests};
    $mock->script(map { { text => $_ } } 'B2b', 'B1b');
    $chat = chat('ai7', $id, [{ regenerate => JSON::PP::true },
                              { edit => 0, text => 'uno' }], $messages);
    my $reqs = $mock->wait_requests($n + 2, 10);

    is(lines($reqs->[$n]), "$system\nuser: one\nassistant: B1\nuser: two",
       'after a restart: regenerate() has the context read back');
    is(lines($reqs->[$n + 1]), "$system\nuser: uno",
       'after a restart: the edit');
    is(branch($id), client($chat->{steps}[-1]{messages}),
       'after a restart: the client\'s messages are the branch');

    # the next message after another restart: the conversation comes
    # back from the store, and the message follows its last turn

    $messages = $chat->{steps}[-1]{messages};
    $t->stop;
    $t->run;

    $n = scalar @{$mock->requests};
    $mock->script({ text => 'B3' });
    $chat = chat('ai7', $id, [{ send => 'three' }], $messages);
    $reqs = $mock->wait_requests($n + 1, 10);
    is(lines($reqs->[$n]), "$system\nuser: uno\nassistant: B1b\nuser: three",
       'a message after a restart follows the branch');
    is(branch($id), client($chat->{steps}[-1]{messages}),
       'and the client\'s messages are the branch');
}

# AG-UI: a thread whose messages leave turns out, then an edit

{
    my $id = 'agui';
    my $n = scalar @{$mock->requests};
    $mock->script(map { { text => $_ } } 'G1', 'G2', 'G1b', 'G1c');

    my $spec = encode_json({ url => "$base/agui", threadId => $id,
        steps => [{ send => 'one' }, { send => 'two' },
                  { keep => 2, send => 'other' },
                  { edit => 2, text => 'another' }] });
    my $out = `cd $js && node agui.mjs @{[quote($spec)]}`;
    my $res = eval { decode_json($out) } // {};
    diag("node: $out") unless $res->{runs};

    my $reqs = $mock->wait_requests($n + 4, 10);

    is(scalar(grep { $_->{error} || $_->{runError} } @{$res->{runs}}), 0,
       'AG-UI: every run ends well');
    is(lines($reqs->[$n + 2]),
       "$system
user: one
assistant: G1
user: other",
       'AG-UI: messages that leave a turn out: it is not in the context');
    is(lines($reqs->[$n + 3]),
       "$system
user: one
assistant: G1
user: another",
       'AG-UI: a user message edited: its new text, the old absent');

    my $m = join "\n", map { "$_->{role}: $_->{content}" }
        grep { $_->{role} eq 'user' || $_->{role} eq 'assistant' }
        @{$res->{messages} || []};
    is($m, branch($id),
       'AG-UI: the messages snapshot is the log\'s current branch');
}

$t->stop;
$mock->stop;

unlike($t->read_file('error.log'), qr/\[(alert|emerg|crit)\]/, 'no alert');

done_testing;
