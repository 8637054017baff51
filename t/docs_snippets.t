#!/usr/bin/perl

# Every ```nginx block of README.md and docs/*.md passes nginx -t as it
# stands, wrapped in no more than a fragment needs, decided by its first
# directive:
#
#   load_module   a whole nginx.conf: its path is the module under test
#   http          a whole nginx.conf but for the main context's globals
#   server, and   http content: in an http block
#   any other
#   http-level
#   directive
#   location, or  server content: in a server of an http block
#   a location's
#   directive
#
# A fragment (not a whole http block) gets what the configuration around
# it would hold: an agent_zone if it declares none, and each agent it
# serves and does not declare, with the mock provider as its provider.
# Every server listens on a free port of 127.0.0.1; a file a snippet
# reads (parameters_file, system_file) is written in the prefix.  A
# PostgreSQL store's conninfo is replaced by that of a server of the
# test's own (nginx -t connects to it), started for the first snippet
# that has one.  A snippet holds no literal "...".

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Test::Agent;
use Test::Agent::MockProvider;
use Test::Agent::Postgres;

my $root = "$FindBin::Bin/..";
my $mock = Test::Agent::MockProvider->new;
my $mport = $mock->port;

my @files = ("$root/README.md", sort glob("$root/docs/*.md"));
my @snippets;
my $pg;

for my $file (@files) {
    open my $fh, '<', $file or die "$file: $!\n";
    my $text = do { local $/; <$fh> };
    close $fh;

    (my $name = $file) =~ s{^\Q$root\E/}{};

    while ($text =~ /^```nginx\n(.*?)^```$/msg) {
        my $line = 1 + (substr($text, 0, $-[0]) =~ tr/\n//);
        push @snippets, { where => "$name:$line", conf => $1 };
    }
}

ok(@snippets >= 8, 'the docs show nginx configurations');

my %http = map { $_ => 1 } qw(agent_tool agent_mcp agent agent_zone
    agent_store agent_evict_idle agent_evict_awaiting agent_evict_unused
    agent_budget_zone agent_notify agent_client_grace agent_heartbeat
    agent_delta_interval agent_trace agent_trace_sample agent_trace_content
    agent_trace_buffer thread_pool upstream map);

for my $s (@snippets) {
    my $t = Test::Agent->new;
    my $conf = $s->{conf};
    my ($first) = $conf =~ /^\s*([a-z_]+)/m;

    unlike($conf, qr/\.\.\./, "$s->{where}: no literal ...");

    for my $path ($conf =~ /^\s*parameters_file\s+(\S+);/mg) {
        $t->write_file($path, '{"type":"object","properties":{}}');
    }

    for my $path ($conf =~ /^\s*system_file\s+(\S+);/mg) {
        $t->write_file($path, "You help.\n");
    }

    $conf = listens($conf);

    if ($conf =~ /^\s*agent_store\s+"?postgres(?:ql)?:/m) {
        my $why = Test::Agent::Postgres->missing;

        SKIP: {
            skip("$s->{where}: $why", 1) if $why;
        }
        next if $why;

        $pg //= Test::Agent::Postgres->new;
        my $store = $pg->directive;
        $conf =~ s/^(\s*agent_store\s+)(?:"[^"]*"|\S+)/$1$store/mg;
    }

    if ($first eq 'load_module') {
        $conf =~ s{^load_module \S+;}{'load_module ' . $t->module . ';'}me;
        (my $globals = $t->globals) =~ s/^load_module [^\n]*\n//;
        $conf = "$conf\n$globals\nevents {\n}\n";

    } elsif ($first eq 'http') {
        $conf =~ s/^http \{$/http {\n    %%TEST_GLOBALS_HTTP%%/m;
        $conf = "%%TEST_GLOBALS%%\n\nevents {\n}\n\n$conf";

    } else {
        if ($first ne 'server' && !$http{$first}) {
            $conf = "server {\n    listen 127.0.0.1:%%PORT_8090%%;\n\n"
                . $conf . "}\n";
        }

        $conf = "%%TEST_GLOBALS%%\n\nevents {\n}\n\nhttp {\n"
            . "%%TEST_GLOBALS_HTTP%%\n" . around($conf) . $conf . "}\n";
    }

    $t->write_file_expand('nginx.conf', $conf);

    my ($rc, $out) = $t->test_config;
    is($rc, 0, "$s->{where} passes nginx -t") or diag("$out\n$conf");
}

# the directives documented are the module's: every directive of its
# command tables has its syntax in docs/directives.md (a block's in the
# block's table), and every one documented is in a table

my %table = (
    http => commands('src/api/ngx_http_agent_module.c',
                     'ngx_http_agent_commands'),
    agent => commands('src/conf/ngx_http_agent_conf.c',
                      'ngx_http_agent_block_commands'),
    agent_tool => commands('src/conf/ngx_http_agent_conf_tool.c',
                           'ngx_http_agent_tool_commands'));

ok(keys %{ $table{$_} } >= 10, "the command table of $_")
    for sort keys %table;

open my $dh, '<', "$root/docs/directives.md" or die "directives.md: $!\n";
my $directives = do { local $/; <$dh> };
close $dh;

my %syntax;
for my $block ($directives =~ /^ {4}Syntax: (.*?)^ {4}Default:/msg) {
    $syntax{$1} = 1 while $block =~ /(?:^\s*|;\s*\|\s*)([a-z_]+)(?=[ ;])/mg;
}

is_deeply([sort grep { !$table{agent}{$_} } keys %syntax],
          [sort keys %{ $table{http} }],
          'docs/directives.md: the syntax of every http directive, '
          . 'and of no other');

for my $block (qw(agent agent_tool)) {
    my ($section) = $directives =~ /^## \Q$block\E\n(.*?)^## /ms;
    my %rows;

    for my $first (($section // '') =~ /^\| (.*?) \|/mg) {
        $rows{$1} = 1 while $first =~ /`([a-z_]+)[ ;]/g;
    }

    is_deeply([sort keys %rows], [sort keys %{ $table{$block} }],
              "docs/directives.md: the $block block's table, "
              . 'its directives all');
}

done_testing;

# the names of a command table of the module's source

sub commands {
    my ($file, $name) = @_;

    open my $fh, '<', "$root/$file" or die "$file: $!\n";
    my $src = do { local $/; <$fh> };
    close $fh;

    my ($body) = $src =~ /^static\s+ngx_command_t\s+\Q$name\E\[\]\s*=\s*\{
                          (.*?) ngx_null_command/msx;

    return { map { $_ => 1 }
             ($body // '') =~ /\{ ngx_string\("([a-z_]+)"\)/g };
}

# what the configuration around a fragment would declare

sub around {
    my ($conf) = @_;

    my %declared = map { $_ => 1 } $conf =~ /^\s*agent\s+(\S+)\s*\{/mg;
    my %served = map { $_ => 1 } $conf =~ /^\s*agent\s+(\S+)\s*;/mg;
    my $decl = '';

    $decl .= "agent_zone zone=docs:1m;\n" unless $conf =~ /\bagent_zone\b/;

    for my $name (sort grep { !$declared{$_} } keys %served) {
        $decl .= "agent $name {\n    provider openai_chat /docs/mock;\n"
            . "    model mock;\n}\n";
    }

    $decl .= "server {\n    listen 127.0.0.1:%%PORT_8091%%;\n"
        . "    location = /docs/mock {\n        internal;\n"
        . "        proxy_pass http://127.0.0.1:$mport/v1/chat/completions;\n"
        . "    }\n}\n" if %served;

    return $decl;
}

# every server on a free port: each listen replaced, or one added

sub listens {
    my ($conf) = @_;
    my $n = 8100;

    if ($conf =~ /^\s*listen\s/m) {
        $conf =~ s/^([ \t]*)listen\s+[^;]*;/$1 . 'listen 127.0.0.1:%%PORT_'
            . $n++ . '%%;'/meg;
        return $conf;
    }

    $conf =~ s/^([ \t]*)server \{\n/"$1server {\n$1    listen 127.0.0.1:%%PORT_"
        . $n++ . "%%;\n"/meg;

    return $conf;
}
