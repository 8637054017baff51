#!/usr/bin/perl

# With agent_store, a message whose answer is the stream of its turn
# (agent_aisdk, agent_agui) is acknowledged as agent_message's 202 is:
# the response begins only once the user_msg is written.  While another
# process holds the database's write lock nothing is answered; once it
# lets go, the stream comes whole, and an AG-UI run whose turn waits for
# a frontend tool by then ends with the call pending.

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
    my ($cid) = @_;
    return $store->sql("SELECT count(*) FROM events WHERE conversation"
                       . " = '$cid' AND type = 'user_msg'");
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

    ok($store->lock, "$name: another process holds the write lock");

    my $s = post_raw($uri, $body);
    my $sel = IO::Select->new($s);

    ok(!$sel->can_read(1.5),
       "$name: nothing is answered while the user_msg cannot be written");
    is(stored($cid), 0, "$name: (it is not written)");

    $store->unlock;

    my $got = read_all($s, 10);

    like($got, qr{^HTTP/1\.1 200}, "$name: answered once it is written");
    like($got, qr/Hi from $name/, "$name: the turn's stream, whole");
    is(stored($cid), 1, "$name: the user_msg is in the store");
}

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

$t->stop;

unlike($t->read_file('error.log'), qr/\[(alert|crit)\]/,
       'no alert in error.log');

done_testing;
