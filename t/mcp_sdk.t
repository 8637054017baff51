#!/usr/bin/perl

# agent_mcp against a server made with the official MCP TypeScript SDK
# (@modelcontextprotocol/sdk, pinned in t/js/package-lock.json) over its
# Streamable HTTP transport, which answers every request by an SSE
# stream: discovery, a call, a call with progress, an error, a question
# of the server during a call (elicitation) answered, declined and
# expired, a cancel that ends the server's handler (the answer cancel
# and notifications/cancelled), the server's own request timeout giving
# the question up, and the server restarted (its sessions gone: the
# module initializes again).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Socket::INET;
use JSON::PP;
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::MockMCP;
use Test::Agent::Calls;

my $js = "$FindBin::Bin/js";

plan(skip_all => 'no node 18 or later (apt-get install nodejs npm)')
    unless (`node --version 2>/dev/null` // '') =~ /^v(\d+)/ && $1 >= 18;

Test::Agent->npm_ci($js, '@modelcontextprotocol/sdk')
    or plan(skip_all => 'npm ci failed in t/js');

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $sdk_port = $t->port('mcp');

$t->write_file_expand('nginx.conf', engine_conf($mock,
    tools => "    agent_mcp sdk location=/mcp/sdk approval=none timeout=3s;\n",
    agent => 'tools sdk;',
    server => Test::Agent::MockMCP::location('/mcp/sdk', $sdk_port)));
$t->run;

my $port = $t->port(8080);
my $notes = $t->testdir . '/sdk.notes';
my $node;

sub start_sdk {
    $node = fork // die "fork: $!";

    if ($node == 0) {
        open STDOUT, '>', '/dev/null';
        chdir $js;
        exec('node', 'mcp_server.mjs', $sdk_port, $notes)
            or POSIX::_exit(127);
    }

    my $deadline = time + 15;
    while (time < $deadline) {
        return 1 if IO::Socket::INET->new(PeerAddr => "127.0.0.1:$sdk_port");
        sleep 0.1;
    }

    return 0;
}

sub stop_sdk {
    return unless $node;
    kill 'TERM', $node;
    waitpid($node, 0);
    undef $node;
}

END { stop_sdk() }

ok(start_sdk(), 'the SDK server listens');

# discovery and a call in the first turn

$mock->script({ tool_calls => [tool_call('s1', 'add', '{"a":20,"b":22}'),
                               tool_call('s2', 'fail', '{}')] },
              { text => 'Done.' });

send_message($t, 'k1', 'add');
my $c = wait_state($t, 'k1', 'idle', 15);

my %sent = map { $_->{function}{name} => $_->{function} }
           @{$mock->requests->[0]{json}{tools} // []};

is_deeply([sort keys %sent], [qw(add confirm count fail)],
          'the SDK server\'s tools');
is_deeply($sent{add}{parameters},
          { type => 'object',
            properties => { a => { type => 'number' },
                            b => { type => 'number' } },
            required => ['a', 'b'] }, 'with their schemas');

my $res = tool_results($c);
is_deeply($res->{s1}{result}, { sum => 42 }, 'a call');
is($res->{s2}{ok}, JSON::PP::false, 'isError is an error result');
is($res->{s2}{error}, 'the disk is full', 'with the tool\'s text');

# progress

$mock->reset;
$mock->script({ tool_calls => [tool_call('p1', 'count', '{"n":3}')] },
              { text => 'Counted.' });

send_message($t, 'k2', 'count');

my @seen = turn_events($port, 'k2');

my @progress = map { decode_json($_->{data})->{progress} }
               grep { $_->{event} eq 'tool_progress' } @seen;

is_deeply([map { $_->{progress} } @progress], [1, 2, 3],
          'progress notifications as tool_progress');
is($progress[0]{message}, 'step 1', 'with their message');

$c = wait_state($t, 'k2', 'idle');
is(tool_results($c)->{p1}{result}, 'counted to 3', 'the streamed result');

# elicitation: the tool asks through the SDK's elicitInput on the call's
# stream; the call waits as a suspension until resolved

sub ask_turn {
    my ($cid, $id, $path) = @_;

    $mock->reset;
    $mock->script({ tool_calls => [tool_call($id, 'confirm',
                                             qq({"path":"$path"}))] },
                  { text => 'Done.' });
    send_message($t, $cid, "remove $path, ask me");

    return wait_pending($t, $cid, 'elicitation');
}

my ($qc, $qp) = ask_turn('e1', 'q1', '/tmp/a');
ok($qp, 'the SDK server\'s question waits');
my ($susp) = grep { $_->{type} eq 'suspension' } @{$qc->{messages} // []};
is($susp->{message}, 'Remove /tmp/a?', 'with its message');
is_deeply($susp->{schema}{properties}, { confirm => { type => 'boolean' } },
          'and its schema');
is(resolve($t, 'e1', 'q1', { result => { confirm => JSON::PP::true } })
   ->{status}, 200, 'answered');
$c = wait_state($t, 'e1', 'idle', 15);
is(tool_results($c)->{q1}{result}, 'confirmed: {"confirm":true}',
   'the SDK server took the answer');

($qc, $qp) = ask_turn('e2', 'q2', '/tmp/b');
ok($qp, 'asked again');
is(resolve($t, 'e2', 'q2', { decision => 'reject' })->{status}, 200,
   'rejected');
$c = wait_state($t, 'e2', 'idle', 15);
is(tool_results($c)->{q2}{result}, 'declined', 'declined');

($qc, $qp) = ask_turn('e3', 'q3', '/tmp/c');
ok($qp, 'asked, and nobody answers');
$c = wait_state($t, 'e3', 'idle', 15);
is(tool_results($c)->{q3}{result}, 'cancelled',
   'expired: the SDK server got a cancel');

# a cancel while the SDK server waits: notifications/cancelled aborts
# the tool's handler

($qc, $qp) = ask_turn('e4', 'q4', '/tmp/d');
ok($qp, 'asked, then cancelled');
is(cancel($t, 'e4')->{status}, 200, 'cancelled');

my $deadline = time + 10;
my $noted = '';
while (time < $deadline) {
    $noted = -e $notes ? $t->read_file('sdk.notes') : '';
    last if $noted =~ /(aborted|answered) q4/;
    sleep 0.05;
}

# the question is answered "cancel" alongside notifications/cancelled:
# the SDK's handler ends on whichever it reads first
like($noted, qr/^(aborted q4: cancelled by the user|answered q4: cancel)$/m,
     'the SDK server ended the call, for our cancel');
$c = wait_state($t, 'e4', 'idle');
is(tool_results($c)->{q4}{error}, '[cancelled]', 'with a cancelled result');

# the SDK server gives its question up (its request timeout, 1 s here,
# 60 s by default): it sends notifications/cancelled for it, and the
# question ends as the server's, not as a cancel of the user

$mock->reset;
$mock->script({ tool_calls => [tool_call('q5', 'confirm',
                                         '{"path":"/tmp/e","wait":1000}')] },
              { text => 'Done.' });
send_message($t, 'e5', 'remove /tmp/e, ask me');
($qc, $qp) = wait_pending($t, 'e5', 'elicitation');
ok($qp, 'asked, for a second');
$c = wait_state($t, 'e5', 'idle', 15);
my ($gone) = grep { $_->{type} eq 'resolution' } @{$c->{messages}};
is($gone && $gone->{source}, 'server', 'the SDK server ended the question');
like(tool_results($c)->{q5}{error} // '', qr/timed out/i,
     'the call ended with the SDK\'s error');
is(resolve($t, 'e5', 'q5', { result => { confirm => JSON::PP::true } })
   ->{status}, 409, 'a late answer is stale');

# the server restarted: the old session is unknown to it

stop_sdk();
ok(start_sdk(), 'the SDK server restarted');

$mock->reset;
$mock->script({ tool_calls => [tool_call('r1', 'add', '{"a":1,"b":2}')] },
              { text => 'Again.' });

send_message($t, 'k3', 'add again');
$c = wait_state($t, 'k3', 'idle', 15);
is_deeply(tool_results($c)->{r1}{result}, { sum => 3 },
          'a call after the restart');
like($t->read_file('error.log'), qr/agent mcp "sdk": session "[^"]+" is gone/,
     'in a new session');

stop_sdk();

$t->done;
