#!/usr/bin/perl

# An MCP call whose location times out (proxy_read_timeout) in the
# middle of its SSE stream ends with an error result, and the server is
# sent notifications/cancelled for it, so that it can stop the work
# nobody waits for any more.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::MockMCP;
use Test::Agent::Calls;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mcp = Test::Agent::MockMCP->new;

$t->write_file_expand('nginx.conf', engine_conf($mock,
    tools => "    agent_mcp slow location=/mcp/slow tools=hang;\n",
    agent => 'tools slow;',
    server => Test::Agent::MockMCP::location('/mcp/slow', $mcp->port,
                                             'proxy_read_timeout 1s;')));
$t->run;

$mock->script({ tool_calls => [tool_call('h1', 'hang', '{}')] },
              { text => 'Gave up.' });

send_message($t, 't1', 'hang');
my $c = wait_state($t, 't1', 'idle', 15);

is(tool_results($c)->{h1}{error}, 'the MCP server\'s answer was cut off',
   'the call timed out');

my @cn = $mcp->wait_calls('notifications/cancelled');

is_deeply($cn[0] && $cn[0]{message}{params},
          { requestId => 'h1', reason => 'the answer was cut off' },
          'the server was told, with the call\'s id');
my ($call) = $mcp->calls('tools/call');
is($cn[0] && $cn[0]{session}, $call->{session}, 'in the call\'s session');
is(scalar @cn, 1, 'once');

$t->done;
