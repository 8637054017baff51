#!/usr/bin/perl

# With agent_store, the canonical log is written behind to SQLite (WAL)
# on a thread pool: every event, in order, whatever worker ran the turn.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

plan(skip_all => 'no sqlite3 command') unless `sqlite3 -version 2>&1` =~ /^3/;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'stored reply', chunks => 3 };
});

my $db = $t->testdir . '/agent.db';

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store $db;"));

my ($rc, $out) = $t->test_config;
is($rc, 0, 'nginx -t with a store');

$t->run;

sub sql {
    my ($q) = @_;
    my $r = `sqlite3 -separator '|' '$db' "$q" 2>&1`;
    chomp $r;
    return $r;
}

like(sql('PRAGMA journal_mode'), qr/^wal$/, 'WAL mode');
is(sql("SELECT value FROM meta WHERE key = 'schema_version'"), '1',
   'schema versioned');

# conversations side by side, some turns each

for my $round (1 .. 3) {
    send_message($t, "s$_", "round $round") for 1 .. 4;
    wait_state($t, "s$_", 'idle') for 1 .. 4;
}

for my $i (1 .. 4) {
    my $c = inspect($t, "s$i")->{json};
    my $want = join "\n", map { "$_->{seq}|$_->{type}" } @{$c->{messages}};

    my $got;
    for (1 .. 100) {
        $got = sql("SELECT seq, type FROM events WHERE conversation = 's$i'"
                   . " ORDER BY seq");
        last if $got eq $want;
        sleep 0.05;
    }

    is($got, $want, "conversation $i: the whole log, in order");
}

my $row = sql("SELECT data FROM events WHERE conversation = 's1' AND seq = 1");
like($row, qr/"type":"user_msg","seq":1,.*"content":"round 1"/,
     'events stored as logged');
is(sql("SELECT agent, last_seq FROM conversations WHERE id = 's1'"),
   'chat|9', 'conversation row');

$mock->stop;
$t->done;
