#!/usr/bin/perl

# MCP tools after a full restart of nginx, with agent_store: the zone's
# tool lists are gone with it, and a turn that goes on from the store
# (an approval of an MCP call made before the restart) fetches them
# before it reads its batch, so that the approved call finds its tool
# and is sent.

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
my $mcp_port = $mcp->port;
my $db = $t->testdir . '/agent.db';

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store $db;",
    tools => "    agent_mcp files location=/mcp/files tools=echo,remove\n"
             . "              approval=remove timeout=1h;\n",
    agent => 'tools files;',
    server => Test::Agent::MockMCP::location('/mcp/files', $mcp_port)));
$t->run;

$mock->script({ tool_calls => [tool_call('a1', 'remove',
                                         '{"path":"/tmp/x"}')] },
              { text => 'Removed.' });

send_message($t, 'r1', 'remove it');
my $c = wait_state($t, 'r1', 'awaiting_input');
is($c->{pending}[0]{kind}, 'approval', 'the MCP call waits for approval');
is(scalar $mcp->calls('tools/list'), 2, 'the list was fetched');

$t->stop;
$t->run;

is(resolve($t, 'r1', 'a1', { decision => 'approve' })->{status}, 200,
   'approved after a restart');
$c = wait_state($t, 'r1', 'idle', 15);
is(tool_results($c)->{a1}{result}, 'removed /tmp/x',
   'the call was sent: its tool was found');
is(scalar $mcp->calls('tools/list'), 4, 'after the list was fetched again');
my @rm = grep { ($_->{message}{params}{name} // '') eq 'remove' }
         $mcp->calls('tools/call');
is(scalar @rm, 1, 'once');
is(scalar @{$mock->requests->[1]{json}{tools} // []}, 2,
   'the next model call had the tools');

$t->done;
