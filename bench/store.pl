#!/usr/bin/perl

# The SQLite store: the events per second it writes behind under a
# tool-heavy load, the latency of an acknowledged input (written before
# its 202) against no store, the latency of a revival after a restart,
# and the zone's bytes per idle conversation as conversations grow.
#
#   perl bench/store.pl [conversations]     (make first; TEST_NGINX_* as in t/)

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../t/lib";

use JSON::PP;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $n = shift // 50;
my $calls = 16;

# a turn: the model asks for 16 calls of a tool that answers at once, then
# answers; 36 canonical events for two provider round trips

my $mock = Test::Agent::MockProvider->new(default => sub {
    my ($req) = @_;
    my $msgs = $req->{json}{messages} || [];
    return { text => 'done' } if @$msgs && $msgs->[-1]{role} eq 'tool';
    return { tool_calls => [ map { { id => "c$_", name => 'echo',
                                     arguments => '{}' } } 1 .. $calls ] };
});

my $tools = <<'EOF';
    agent_tool echo {
        location /tools/echo;
    }
EOF

my $server = <<'EOF';
        location = /tools/echo {
            internal;
            return 200 '{"ok":true}';
        }

        location = /zone {
            agent_zone_status;
        }
EOF

sub start {
    my ($store) = @_;
    my $t = Test::Agent->new;
    my $db = $t->testdir . '/agent.db';
    $t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
        zone => '64m', tools => $tools, agent => 'tools echo;',
        server => $server,
        http => $store ? "agent_store $db;" : ''));
    $t->run;
    return ($t, $db);
}

sub pct {
    my ($p, @v) = @_;
    @v = sort { $a <=> $b } @v;
    return $v[int($p * $#v + 0.5)];
}

sub ms { sprintf '%.1f', $_[0] * 1000 }

sub count {
    my ($db) = @_;
    my $c = `sqlite3 '$db' 'SELECT count(*) FROM events'`;
    chomp $c;
    return $c;
}

sub zone_used {
    my ($t) = @_;
    return decode_json(http_get('/zone', port => $t->port(8080))->{body});
}

# acknowledged input: POST to 202, one at a time, idle server

my %ack;

for my $store (0, 1) {
    my ($t) = start($store);
    my @lat;

    for my $i (1 .. 200) {
        my $s = time;
        my $r = send_message($t, "a$i", 'hi', body => '{"content":"hi"}');
        push @lat, time - $s;
        die "message: $r->{status}\n" unless $r->{status} == 202;
    }

    $ack{$store} = \@lat;
    $t->stop;
}

printf "acknowledged message, 200 runs: no store median %s ms p90 %s ms;"
    . " store median %s ms p90 %s ms\n",
    ms(pct(0.5, @{$ack{0}})), ms(pct(0.9, @{$ack{0}})),
    ms(pct(0.5, @{$ack{1}})), ms(pct(0.9, @{$ack{1}}));

# throughput: n conversations, 4 turns each, all at once

my ($t, $db) = start(1);
my $port = $t->port(8080);

my $z0 = zone_used($t);
my $start = time;

for my $round (1 .. 4) {
    send_message($t, "w$_", "round $round") for 1 .. $n;
    wait_state($t, "w$_", 'idle', 120) for 1 .. $n;
}

my $want = $n * 4 * (4 + 2 * $calls);
my $done = time;
sleep 0.01 while count($db) < $want && time < $done + 30;
my $flushed = time;

printf "store: %d events of %d conversations written in %.2f s:"
    . " %.0f events/s; the last written %s ms after the last turn ended\n",
    $want, $n, $flushed - $start, $want / ($flushed - $start),
    ms($flushed - $done);

# zone bytes per conversation: after 4 turns of 36 events, after 8

my $z4 = zone_used($t);

for my $round (5 .. 8) {
    send_message($t, "w$_", "round $round") for 1 .. $n;
    wait_state($t, "w$_", 'idle', 120) for 1 .. $n;
}
sleep 0.5;

my $z8 = zone_used($t);

printf "zone bytes per idle conversation: %.0f after 144 events,"
    . " %.0f after 288\n",
    ($z4->{used} - $z0->{used}) / $n, ($z8->{used} - $z0->{used}) / $n;

# revival: a full stop and start, then the first and the second request

$t->stop;
$t->run;

my (@first, @second);

for my $i (1 .. $n) {
    my $s = time;
    my $r = inspect($t, "w$i", 'limit=1');
    push @first, time - $s;
    die "inspect: $r->{status}\n" unless $r->{status} == 200;

    $s = time;
    inspect($t, "w$i", 'limit=1');
    push @second, time - $s;
}

printf "revival of a conversation of 288 events, %d runs: first request"
    . " median %s ms p90 %s ms; in the zone median %s ms\n",
    $n, ms(pct(0.5, @first)), ms(pct(0.9, @first)), ms(pct(0.5, @second));

$t->stop;
$mock->stop;
