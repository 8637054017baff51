#!/usr/bin/perl

# MCP servers that misbehave, and what the agent's turns see of it: a
# tools/list or a tools/call answered by an SSE stream of keep-alive
# comments without end (rpc_timeout ends the exchange), a server that
# does the same to the notifications it is sent; a list that names a
# tool three times, or a tool whose name (prefixed) is another tool's;
# a server that gives its question up (its own request timeout) or ends
# the call while its question waits.  And what stays as it should: an
# MCP tool is counted and logged as the server tool it is, and a person
# may take longer than rpc_timeout to answer a question.

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
use Test::Agent::MockMCP;
use Test::Agent::Calls;

my $obj = { type => 'object' };

my $h = Test::Agent::MockMCP->new(tools => [
    { name => 'add', description => 'first', inputSchema => $obj },
    { name => 'add', description => 'second', inputSchema => $obj },
    { name => 'add', description => 'third', inputSchema => $obj },
    { name => 'echo', description => 'the server\'s echo',
      inputSchema => $obj },
    { name => 'h_echo', description => 'clashes once prefixed',
      inputSchema => $obj },
    map { { name => $_, inputSchema => $obj } }
        qw(stall giveup askend confirm),
]);
my $slow = Test::Agent::MockMCP->new(list => 'stall');
my $deaf = Test::Agent::MockMCP->new(notes => 'stall',
    tools => [{ name => 'hush', inputSchema => $obj }]);

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

my $tools = $ECHO_TOOL . <<'EOF';
    agent_mcp slow location=/mcp/slow rpc_timeout=2s;
    agent_mcp h location=/mcp/h rpc_timeout=2s timeout=6s;
    agent_mcp deaf location=/mcp/deaf rpc_timeout=1s;
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock,
    tools => $tools, agent => 'tools echo slow h deaf;',
    server => $ECHO_LOCATION . $METRICS_LOCATION
              . Test::Agent::MockMCP::location('/mcp/slow', $slow->port)
              . Test::Agent::MockMCP::location('/mcp/h', $h->port)
              . Test::Agent::MockMCP::location('/mcp/deaf', $deaf->port)));
$t->run;

my $port = $t->port(8080);

# a tools/list that streams comments only: the turn goes on without it

$mock->script({ text => 'Hello.' });

my $start = time;
send_message($t, 'l1', 'hi');
my $c = wait_state($t, 'l1', 'idle', 15);
my $took = time - $start;

is(log_types($c), 'user_msg assistant_msg turn_completed',
   'a stalled tools/list does not hold the turn');
ok($took < 8, "the turn ended after rpc_timeout, not the stream ($took s)");
like($t->read_file('error.log'),
     qr/agent mcp "slow": tools\/list took longer than rpc_timeout/,
     'the error log says why');

# one name, once: the first of a name the server repeats; a name that
# is a declared tool's is prefixed, and one that is then taken is left
# out: the provider never gets two functions of one name

my @fn = map { $_->{function} } @{$mock->requests->[0]{json}{tools} // []};
my %count;
$count{$_->{name}}++ for @fn;
my ($add) = grep { $_->{name} eq 'add' } @fn;

is_deeply([sort keys %count],
          [sort qw(echo add h_echo stall giveup askend confirm hush)],
          'the tools the model gets');
is_deeply([grep { $count{$_} > 1 } sort keys %count], [],
          'each name once');
is($add && $add->{description}, 'first', 'the first "add" is kept');
my ($he) = grep { $_->{name} eq 'h_echo' } @fn;
is($he && $he->{description}, 'the server\'s echo',
   'the server\'s echo, prefixed; its own h_echo left out');

my $log = $t->read_file('error.log');
my @dups = $log =~ /agent mcp "h" lists tool "add" more than once/g;
is(scalar @dups, 1, 'the repeated name is warned of once');
like($log, qr/tool "h_echo" is left out: the agent has another tool named/,
     'and the name taken');

# an MCP tool is a server tool: its tool_call and its metrics say so;
# the declared echo stays the declared one

$mock->reset;
$mock->script({ tool_calls => [tool_call('m1', 'add', '{}'),
                               tool_call('m2', 'echo', '{"n":1}')] },
              { text => 'Done.' });

send_message($t, 'm1', 'add');
$c = wait_state($t, 'm1', 'idle', 10);

my %exec = map { $_->{tool_call_id} => $_->{executor} }
           grep { $_->{type} eq 'tool_call' } @{$c->{messages}};
is($exec{m1}, 'server', 'the MCP call\'s tool_call: executor server');
is_deeply(tool_results($c)->{m2}{result}, { args => { n => 1 } },
          'the declared echo ran at its location');

my $metrics = http_get('/metrics', port => $port)->{body} // '';
like($metrics, qr/^agent_tool_calls_total\{gen_ai_tool_name="add",
                  executor="server",outcome="(ok|error)"\}\ 1$/mx,
     'counted by its name, as a server tool');
unlike($metrics, qr/^agent_tool_calls_total\{gen_ai_tool_name="_unknown"
                    [^}]*\}\ [1-9]/mx, 'nothing as unknown');

# a tools/call that streams comments only: an error result after
# rpc_timeout, and the server is told

$mock->reset;
$mock->script({ tool_calls => [tool_call('s1', 'stall', '{}')] },
              { text => 'Gave up.' });

$start = time;
send_message($t, 's1', 'stall');
$c = wait_state($t, 's1', 'idle', 15);
$took = time - $start;

is(tool_results($c)->{s1}{error},
   'the MCP server took longer than rpc_timeout', 'an error result');
ok($took < 8, "after rpc_timeout ($took s)");
my @cn = $h->wait_calls('notifications/cancelled');
is_deeply($cn[0] && $cn[0]{message}{params},
          { requestId => 's1', reason => 'the request timed out' },
          'notifications/cancelled for it');

# a server that stalls on what it is sent: the notification's request
# ends after rpc_timeout too

$mock->reset;
$mock->script({ tool_calls => [tool_call('n1', 'hush', '{}')] },
              { text => 'Hushed.' });

send_message($t, 'n1', 'hush');
$c = wait_state($t, 'n1', 'idle', 15);
ok($deaf->wait_calls('notifications/cancelled'), 'the deaf server was told');

my $deadline = time + 5;
sleep 0.1 while time < $deadline
    && $t->read_file('error.log') !~ m{"/mcp/deaf" did not answer in time};
like($t->read_file('error.log'), qr{"/mcp/deaf" did not answer in time},
     'and its endless answer was cut');

# a person may take longer than rpc_timeout: the clock stops while the
# server waits for the answer

sub asked {
    my ($cid, $call, $tool) = @_;

    $mock->reset;
    $mock->script({ tool_calls => [tool_call($call, $tool,
                                             '{"path":"/tmp/p"}')] },
                  { text => 'Done.' });
    send_message($t, $cid, $tool);

    return wait_pending($t, $cid, 'elicitation');
}

my ($qc, $qp) = asked('p1', 'p1', 'confirm');
ok($qp, 'the server asks');
sleep 3;
is(resolve($t, 'p1', 'p1', { result => { confirm => JSON::PP::true } })
   ->{status}, 200, 'answered after longer than rpc_timeout');
$c = wait_state($t, 'p1', 'idle', 10);
is(tool_results($c)->{p1}{result}, 'confirmed: {"confirm":true}',
   'the call went on and ended');

# the server gives its question up: the question is the server's, the
# call goes on, and a late answer is stale

sub resolution {
    my ($c) = @_;
    my ($r) = grep { $_->{type} eq 'resolution' } @{$c->{messages}};
    return $r // {};
}

($qc, $qp) = asked('g1', 'g1', 'giveup');
ok($qp, 'the server asks, then gives up');
$c = wait_state($t, 'g1', 'idle', 10);
is(tool_results($c)->{g1}{result}, 'gave up', 'the call went on');
is(resolution($c)->{source}, 'server', 'the question ended by the server');
ok(resolution($c)->{cancelled}, 'as cancelled');
is(resolve($t, 'g1', 'g1', { result => { go => JSON::PP::true } })
   ->{status}, 409, 'a late answer is stale');
my ($go) = grep { ($_->{message}{params}{message} // '') eq 'Go on?' }
           $h->calls('elicitation/create');
ok($go && !grep({ !defined $_->{message}{method}
                  && ($_->{message}{id} // '') eq $go->{message}{id} }
                $h->requests), 'and the server got no answer');

# the server ends the call while its question waits

($qc, $qp) = asked('e1', 'e1', 'askend');
ok($qp, 'the server asks, then ends the call');
$c = wait_state($t, 'e1', 'idle', 10);
is(tool_results($c)->{e1}{result}, 'ended', 'with its result');
is(resolution($c)->{source}, 'server', 'the question ended by the server');

$t->done;
