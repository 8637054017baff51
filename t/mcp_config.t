#!/usr/bin/perl

# agent_mcp declarations nginx -t refuses, each with its message and the
# file and line of the offending directive (marked "#!"); and one it
# takes.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Test::Agent;

my @cases = (
    {
        name => 'no location',
        conf => "    agent_mcp files tools=all;  #!\n",
        error => 'agent_mcp "files" has no "location="',
    },
    {
        name => 'a location that is no URI',
        conf => "    agent_mcp files location=mcp;  #!\n",
        error => 'agent_mcp "files": invalid parameter "location=mcp"',
    },
    {
        name => 'an unknown parameter',
        conf => "    agent_mcp files location=/mcp sessions=on;  #!\n",
        error => 'agent_mcp "files": invalid parameter "sessions=on"',
    },
    {
        name => 'an invalid name',
        conf => "    agent_mcp fi.les location=/mcp;  #!\n",
        error => 'invalid agent_mcp name "fi.les", it must be 1 to 64 '
            . 'letters, digits, "_" or "-"',
    },
    {
        name => 'an invalid tool name',
        conf => "    agent_mcp files location=/mcp tools=read,,write;  #!\n",
        error => 'agent_mcp: invalid tool name "" in "read,,write"',
    },
    {
        name => 'approval of a tool left out',
        conf => "    agent_mcp files location=/mcp tools=read "
            . "approval=write;  #!\n",
        error => 'agent_mcp "files": "approval=" names "write", which '
            . '"tools=" leaves out',
    },
    {
        name => 'a bad timeout',
        conf => "    agent_mcp files location=/mcp timeout=soon;  #!\n",
        error => 'agent_mcp "files": invalid parameter "timeout=soon"',
    },
    {
        name => 'a bad rpc_timeout',
        conf => "    agent_mcp files location=/mcp rpc_timeout=0;  #!\n",
        error => 'agent_mcp "files": invalid parameter "rpc_timeout=0"',
    },
    {
        name => 'twice',
        conf => "    agent_mcp files location=/mcp;\n"
            . "    agent_mcp files location=/mcp2;  #!\n",
        error => 'duplicate agent_mcp "files"',
    },
    {
        name => 'the name of a tool too',
        conf => "    agent_tool files { location /t; }\n"
            . "    agent_mcp files location=/mcp;\n",
        agent => "tools files;  #!",
        error => 'agent "a": "files" is both an agent_tool and an agent_mcp',
    },
);

for my $c (@cases) {
    my $t = Test::Agent->new;

    $t->write_file_expand('nginx.conf',
                          conf($c->{conf}, $c->{agent} // 'tools files;'));

    my $line = marked_line($t->read_file('nginx.conf'));
    my $where = $t->testdir . "/nginx.conf:$line";
    my ($rc, $out) = $t->test_config;

    isnt($rc, 0, "$c->{name}: nginx -t fails");
    like($out, qr/\[emerg\] \Q$c->{error}\E in \Q$where\E$/m,
         "$c->{name}: message and line") or diag($out);
}

# a legal one

my $t = Test::Agent->new;

$t->write_file_expand('nginx.conf', conf(
    "    agent_mcp files location=/mcp/files tools=read,write "
    . "approval=write\n              timeout=30s refresh=1m "
    . "rpc_timeout=20s;\n"
    . "    agent_mcp other location=/mcp/other;\n",
    'tools files other;'));

my ($rc, $out) = $t->test_config;
is($rc, 0, 'a legal declaration passes nginx -t') or diag($out);

# each configuration of "MCP servers" in docs/protocols.md, as it is
# there, with what any nginx.conf has around it

open my $fh, '<', "$FindBin::Bin/../docs/protocols.md"
    or die "docs/protocols.md: $!\n";
my $readme = do { local $/; <$fh> };
close $fh;

my ($section) = $readme =~ /^## MCP servers\n(.*?)(?:^## |\z)/ms;
my @snippets = ($section // '') =~ /^```nginx\n(.*?)^```$/msg;

ok(@snippets, 'the docs show MCP configurations');

for my $i (0 .. $#snippets) {
    my $r = Test::Agent->new;
    my $conf = $snippets[$i];

    $conf =~ s/^http \{$/http {\n    %%TEST_GLOBALS_HTTP%%/m;
    $conf =~ s/\blisten 8080;/listen 127.0.0.1:%%PORT_8080%%;/;

    $r->write_file_expand('nginx.conf',
                          "%%TEST_GLOBALS%%\n\nevents {\n}\n\n$conf");

    my ($rc, $out) = $r->test_config;
    is($rc, 0, "the docs' MCP configuration $i passes nginx -t")
        or diag($out);
}

$t->done;

sub conf {
    my ($decl, $agent) = @_;

    return <<"END";
%%TEST_GLOBALS%%

events {
}

http {
    %%TEST_GLOBALS_HTTP%%

    agent_zone zone=agents:1m;
$decl
    agent a {
        provider openai_chat /internal/llm;
        model m;
        $agent
    }
}
END
}

sub marked_line {
    my ($text) = @_;

    my @lines = split /\n/, $text;
    for my $i (0 .. $#lines) {
        return $i + 1 if $lines[$i] =~ /#!/;
    }

    die "no line marked #!\n";
}
