#!/usr/bin/perl

# The SQLite store: the events per second it writes behind under a
# tool-heavy load, the latency of an acknowledged input (written before
# its 202) against no store, the latency of a revival after a restart,
# and the zone's bytes per idle conversation as conversations grow.
#
#   perl bench/store.pl [conversations]     (make first; TEST_NGINX_* as in t/)
#
# With "throughput": the store's ceiling, and the latency of an input
# acknowledged at that load (see throughput() below).
#
#   perl bench/store.pl throughput [seconds] [turns at a time] [calls]
#                          [acknowledged messages a second] [backlog]
#
# STORE_FLUSH="off 10ms" (the default) names the flush= of each run under
# load (empty: none, the writer alone only); STORE_TURNS, turns started a
# second at most (a load below the machine's; default: as fast as it
# goes); STORE_SYNC the store's sync= (default: none, i.e. full);
# STORE_COMMIT_DELAY its commit_delay= (default: none); STORE_WORKERS
# nginx's workers (default 2); NODE the node binary.  STORE_RT=1: nginx's
# workers (every thread: the event loop and the store's pool) and the
# process that times the acknowledged messages run SCHED_FIFO (chrt: root
# or CAP_SYS_NICE), the load generator and the mock as they are: what the
# machine's other work costs the store is then apart from what the store
# costs.

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
use Test::Agent::Store;

if (@ARGV && $ARGV[0] eq 'throughput') {
    shift @ARGV;
    throughput(@ARGV);
    exit 0;
}

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
        http => $store ? "agent_store $db"
                         . ($ENV{STORE_SYNC} ? " sync=$ENV{STORE_SYNC}" : '')
                         . ($ENV{STORE_COMMIT_DELAY}
                            ? " commit_delay=$ENV{STORE_COMMIT_DELAY}" : '')
                         . ';' : ''));
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


# Throughput: a Node process (store-load.mjs) is the provider and the
# clients.  Each turn's first model call asks for CALLS calls of a tool
# location that answers at once, its second answers: 2 * CALLS + 4
# events a turn, a new conversation per turn, CONVS turns at a time on
# 2 workers, no turn started while more than BACKLOG events wait for the
# store.  Meanwhile a second client sends ACKS messages a second to new
# conversations and times each to its 202.  Once without flush=, once
# with flush=10ms.

sub throughput {
    my ($seconds, $convs, $calls, $acks, $backlog) = @_;

    $seconds //= 20;
    $convs //= 32;
    $calls //= 64;
    $acks //= 50;
    $backlog //= 20000;

    printf "%d s after 5 s of warm-up, %d turns at a time, %d tool calls"
        . " a turn (%d events), %d acknowledged messages a second, no"
        . " turn started while %d events wait%s%s\n",
        $seconds, $convs, $calls, 2 * $calls + 4, $acks, $backlog,
        $ENV{STORE_TURNS} ? ", at most $ENV{STORE_TURNS} turns a second"
                          : '',
        ($ENV{STORE_RT} // '') eq '1'
            ? '; the workers and the acknowledging client SCHED_FIFO' : '';

    # STORE_FLUSH="off 10ms": the flush= of each run
    for my $flush (map { $_ eq 'off' ? '' : "flush=$_" }
                   split ' ', $ENV{STORE_FLUSH} // 'off 10ms')
    {
        my ($t, $mport) = throughput_nginx($flush);

        my @workers = $t->worker_pids;

        if (($ENV{STORE_RT} // '') eq '1') {
            for my $pid (@workers) {
                system("chrt -f -a -p 10 $pid") == 0 or die "chrt\n";
            }
        }

        my %cpu0 = map { $_ => cpu($_) } @workers;
        my $load0 = loadavg();
        my $start = time;

        my $r = node('load', $t->port(8080), $mport, $seconds, $convs,
                     $calls, $acks, 5, $backlog, $ENV{STORE_TURNS} // 0);

        my $wall = time - $start;
        my $load1 = loadavg();
        my %cpu1 = map { $_ => cpu($_) } @workers;
        my $rows = count($t->testdir . '/agent.db');
        my %times = map { $_ => histogram($t->port(8080), $_) }
            qw(agent_store_write_seconds agent_store_ack_seconds);

        $t->stop;

        my $a = $r->{ack} // {};

        printf "\nagent_store %s\n", $flush || '(no flush=)';
        printf "  events written: %d in %.1f s, %d a second (each second:"
            . " %s); %d turns, %d batches, %.0f events a batch\n",
            $r->{written}, $r->{seconds}, $r->{per_second},
            join(' ', @{$r->{written_each_second}}), $r->{turns},
            $r->{batches}, $r->{batches} ? $r->{written} / $r->{batches}
                                         : 0;
        printf "  events not yet written, each second: %s; the rest"
            . " written %d ms after the load stopped; %d rows in"
            . " SQLite; store errors %d; refused %s\n",
            join(' ', @{$r->{lag}}), $r->{drained_ms}, $rows,
            $r->{errors} // 0, encode_json($r->{refused});
        printf "  acknowledged messages: %d of %d sent, 202 in p50 %.1f ms"
            . " p90 %.1f ms p99 %.1f ms max %.1f ms (refused %s)\n",
            $a->{acked} // 0, $a->{sent} // 0, $a->{p50} // 0,
            $a->{p90} // 0, $a->{p99} // 0, $a->{max} // 0,
            encode_json($a->{refused} // {});

        for my $name (sort keys %times) {
            my $h = $times{$name};

            printf "  %s (warm-up and load): %d, mean %.1f ms, within"
                . " 1 / 2.5 / 5 / 10 / 25 ms: %s\n", $name, $h->{count},
                $h->{count} ? 1000 * $h->{sum} / $h->{count} : 0,
                join(' / ', map { sprintf '%.1f%%', $h->{count}
                                  ? 100 * $h->{le}{$_} / $h->{count} : 0 }
                            qw(0.001 0.0025 0.005 0.01 0.025));
        }

        for my $w (@workers) {
            my ($m, $th) = map { $cpu1{$w}[$_] - $cpu0{$w}[$_] } 0, 1;
            printf "  worker %d: event loop %.0f%% of a core, pool"
                . " threads %.0f%%, over the %.1f s\n", $w, $m / $wall,
                $th / $wall, $wall;
        }

        printf "  load average before %s, after %s\n", $load0, $load1;
    }

    drain($convs, $calls);
}

# The writer alone: turns run for 4 s while another process holds the
# database locked (up to 60,000 events wait), then the lock goes and
# nothing else runs: the time until no event waits.

sub drain {
    my ($convs, $calls) = @_;

    my ($t, $mport) = throughput_nginx('');
    my $db = Test::Agent::Store->new($t->testdir . '/agent.db');
    my $port = $t->port(8080);

    $db->lock or die "the database could not be locked\n";

    my $r = node('fill', $port, $mport, 4, $convs, $calls, 60000);

    # the batch waiting for the lock is written at once
    $db->unlock;

    my $start = time;
    my $load0 = loadavg();
    my $lag = $r->{lag};

    sleep 0.005 while metric($t, 'agent_store_lag_events') > 0
                      && time < $start + 60;

    my $secs = time - $start;

    $t->stop;

    printf "\nthe writer alone: %d events waiting (%d turns), written in"
        . " %.2f s, %.0f a second; load average %s\n", $lag, $r->{turns},
        $secs, $lag / $secs, $load0;
}

# nginx with the store for the throughput runs, and the mock's port

sub throughput_nginx {
    my ($flush) = @_;

    my $t = Test::Agent->new;
    my $db = $t->testdir . '/agent.db';
    my $mport = $t->port('mock');
    my $provider = bless { port => $mport }, 'StoreBench::Provider';

    $t->write_file_expand('nginx.conf', engine_conf($provider,
        workers => $ENV{STORE_WORKERS} || 2, zone => '256m',
        agent => 'tools echo;',
        tools => "agent_tool echo {\n        location /tools/echo;\n"
                 . "    }",
        http => "agent_store $db $flush"
                . ($ENV{STORE_SYNC} ? " sync=$ENV{STORE_SYNC}" : '')
                . ($ENV{STORE_COMMIT_DELAY}
                   ? " commit_delay=$ENV{STORE_COMMIT_DELAY}" : '') . ';',
        server => <<'EOF'));
        location = /tools/echo {
            internal;
            return 200 '{"ok":true}';
        }

        location = /metrics {
            agent_metrics;
        }
EOF
    $t->run;

    return ($t, $mport);
}

# store-load.mjs, its line of JSON

sub node {
    my $cmd = join ' ', $ENV{NODE} // 'node', "$FindBin::Bin/store-load.mjs",
                   @_;
    my $out = `$cmd`;

    die "store-load.mjs failed\n" if $? || $out eq '';

    return decode_json($out);
}

# a histogram of agent_metrics: its buckets by le, its sum and count

sub histogram {
    my ($port, $name) = @_;
    my $r = http_get('/metrics', port => $port);
    my $body = $r ? $r->{body} : '';
    my %le = $body =~ /^${name}_bucket\{le="([^"]+)"\} (\d+)$/mg;
    my ($sum) = $body =~ /^${name}_sum (\S+)$/m;
    my ($count) = $body =~ /^${name}_count (\d+)$/m;

    return { le => \%le, sum => $sum // 0, count => $count // 0 };
}

# a worker's CPU, the event loop and the pool's threads apart, in ticks
# of 10 ms

sub cpu {
    my ($pid) = @_;
    my ($main, $threads) = (0, 0);

    opendir my $dh, "/proc/$pid/task" or return [0, 0];

    for my $tid (grep { /^\d+$/ } readdir $dh) {
        open my $fh, '<', "/proc/$pid/task/$tid/stat" or next;
        my ($rest) = <$fh> =~ /\)\s+(.*)/;
        my @f = split ' ', $rest;

        if ($tid == $pid) {
            $main += $f[11] + $f[12];
        } else {
            $threads += $f[11] + $f[12];
        }
    }

    return [$main, $threads];
}

sub loadavg {
    open my $fh, '<', '/proc/loadavg' or return '';
    return join ' ', (split ' ', <$fh>)[0 .. 2];
}

package StoreBench::Provider;

sub port { $_[0]{port} }
