#!/usr/bin/perl

# With agent_store, a message whose answer is the stream of its turn
# (agent_aisdk, agent_agui) is acknowledged as agent_message's 202 is:
# the response begins only once the user_msg is written.  While another
# process holds the database's write lock nothing is answered; once it
# lets go, the stream comes whole, and an AG-UI run whose turn waits for
# a frontend tool by then ends with the call pending.  The same for
# resolutions whose answer is the rest of the turn (a client tool's
# output sent back to agent_aisdk, a tool message to agent_agui): the
# stream begins once the resolution is written, as agent_resolve's 200.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $db = $t->testdir . '/agent.db';
my $store = Test::Agent::Store->new($db);

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => "agent_store $db;",
    tools => <<'EOF',
    agent_tool browser_timezone {
        description "The browser's time zone";
        executor client;
    }
EOF
    agent => 'tools browser_timezone;',
    server => <<'EOF'));
        location = /api/chat {
            agent chat;
            agent_aisdk;
        }

        location = /agui {
            agent chat;
            agent_agui;
        }
EOF
$t->run;

sub post_raw {
    my ($uri, $body) = @_;

    my $s = Test::Agent::HTTP::connect_to($t->port(8080));
    print $s "POST $uri HTTP/1.1\r\nHost: localhost\r\n"
        . "Content-Type: application/json\r\nConnection: close\r\n"
        . 'Content-Length: ' . length($body) . "\r\n\r\n" . $body;
    return $s;
}

sub read_all {
    my ($s, $timeout) = @_;
    my $sel = IO::Select->new($s);
    my $deadline = time + $timeout;
    my $got = '';

    while (time < $deadline && $sel->can_read($deadline - time)) {
        my $n = sysread($s, my $buf, 65536) or last;
        $got .= $buf;
    }

    return $got;
}

sub stored {
    my ($cid, $type) = @_;
    return $store->sql("SELECT count(*) FROM events WHERE conversation"
                       . " = '$cid' AND type = '" . ($type // 'user_msg')
                       . "'");
}

# an input posted while the write lock is held: answered only once its
# event is written, the stream then whole

sub held {
    my ($name, $uri, $cid, $type, $body, $text) = @_;

    ok($store->lock, "$name: another process holds the write lock");

    my $s = post_raw($uri, $body);
    my $sel = IO::Select->new($s);

    ok(!$sel->can_read(1.5),
       "$name: nothing is answered while the $type cannot be written");
    is(stored($cid, $type), 0, "$name: (it is not written)");

    $store->unlock;

    my $got = read_all($s, 10);

    like($got, qr{^HTTP/1\.1 200}, "$name: answered once it is written");
    like($got, qr/\Q$text\E/, "$name: the turn's stream, whole");
    is(stored($cid, $type), 1, "$name: the $type is in the store");
}

for my $door ([ 'agent_aisdk', '/api/chat', 'chat1',
                encode_json({ id => 'chat1', messages => [{ id => 'u1',
                    role => 'user',
                    parts => [{ type => 'text', text => 'hello' }] }] }) ],
              [ 'agent_agui', '/agui', 'thread1',
                encode_json({ threadId => 'thread1', runId => 'run1',
                    messages => [{ id => 'u1', role => 'user',
                                   content => 'hello' }],
                    tools => [], context => [], state => {},
                    forwardedProps => {} }) ])
{
    my ($name, $uri, $cid, $body) = @$door;

    $mock->reset;
    $mock->script({ text => "Hi from $name" });

    held($name, $uri, $cid, 'user_msg', $body, "Hi from $name");
}

# a message without an id (nothing to know it again by), whose turn
# ends while it waits to be written: taken once, its stream whole

$mock->reset;
$mock->script({ text => 'Once only' });

ok($store->lock, 'no message id: the write lock held');

my $anon = post_raw('/api/chat', encode_json({ id => 'chat4',
    messages => [{ role => 'user',
                   parts => [{ type => 'text', text => 'hi' }] }] }));

ok($mock->wait_requests(1, 5), 'no message id: the turn runs meanwhile');
wait_state($t, 'chat4', 'idle');
$store->unlock;

my $once = read_all($anon, 10);

like($once, qr/Once only/, 'no message id: the turn\'s stream');
is(stored('chat4'), 1, 'no message id: one user_msg');
is(scalar(@{$mock->requests}), 1, 'no message id: one model call');

# the turn waits for a frontend tool before the stream begins: the run
# still ends, with the call pending

$mock->reset;
$mock->script({ tool_calls => [{ id => 'call_f1', name => 'get_location',
                                 arguments => '{"precision":"city"}' }] },
              { text => 'Found you' });

ok($store->lock, 'frontend tool: the write lock held');

my $s = post_raw('/agui', encode_json({ threadId => 'thread2',
    runId => 'run2', context => [], state => {}, forwardedProps => {},
    tools => [{ name => 'get_location', description => 'Where',
                parameters => { type => 'object', properties => {
                    precision => { type => 'string' } } } }],
    messages => [{ id => 'u2', role => 'user', content => 'where' }] }));

ok($mock->wait_requests(1, 5), 'frontend tool: the model is asked meanwhile');
is(wait_state($t, 'thread2', 'awaiting_input')->{pending}[0]{kind},
   'client_exec', 'frontend tool: the turn waits before the stream begins');

$store->unlock;

my $got = read_all($s, 10);

like($got, qr/"type":"RUN_FINISHED".*"pendingToolCallIds":\["call_f1"\]/s,
     'frontend tool: the run ends with the call pending');
like($got, qr/0\r\n\r\n$/, 'frontend tool: and the response ends');

# resolutions: nothing is answered until the resolution is written

$mock->reset;
$mock->script({ text => 'Here you are' });

held('agent_agui resume', '/agui', 'thread2', 'resolution', encode_json({
    threadId => 'thread2', runId => 'run3', context => [], state => {},
    forwardedProps => {},
    tools => [{ name => 'get_location', description => 'Where',
                parameters => { type => 'object', properties => {
                    precision => { type => 'string' } } } }],
    messages => [{ id => 'u2', role => 'user', content => 'where' },
                 { id => 'a2', role => 'assistant', content => '',
                   toolCalls => [{ id => 'call_f1', type => 'function',
                       function => { name => 'get_location',
                           arguments => '{"precision":"city"}' } }] },
                 { id => 't2', role => 'tool', toolCallId => 'call_f1',
                   content => '{"city":"Paris"}' }] }), 'Here you are');

$mock->reset;
$mock->script({ tool_calls => [{ id => 'call_z1', name => 'browser_timezone',
                                 arguments => '{}' }] },
              { text => 'It is Europe/Paris' });

my $chat = encode_json({ id => 'chat3', messages => [{ id => 'u3',
    role => 'user', parts => [{ type => 'text', text => 'zone?' }] }] });

$s = post_raw('/api/chat', $chat);
$got = read_all($s, 10);

like($got, qr/"toolCallId":"call_z1"/, 'agent_aisdk: the client tool asked');
is(wait_state($t, 'chat3', 'awaiting_input')->{pending}[0]{kind},
   'client_exec', 'agent_aisdk: the turn waits for its output');

held('agent_aisdk output', '/api/chat', 'chat3', 'resolution', encode_json({
    id => 'chat3', messages => [{ id => 'u3', role => 'user',
        parts => [{ type => 'text', text => 'zone?' }] },
        { id => 'a3', role => 'assistant', parts => [{
            type => 'tool-browser_timezone', toolCallId => 'call_z1',
            state => 'output-available', input => {},
            output => { zone => 'Europe/Paris' } }] }] }),
    'It is Europe/Paris');

$t->stop;

unlike($t->read_file('error.log'), qr/\[(alert|crit)\]/,
       'no alert in error.log');

done_testing;
