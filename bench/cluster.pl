#!/usr/bin/perl

# Several nginx nodes on one PostgreSQL (fsync on), behind a front nginx
# that routes by conversation (Test::Agent::Cluster, as t/scaleout.t):
#
#   take-over   CLUSTER_CONVERSATIONS (150) turns at once, each a server
#               tool run by the mock in 1 s, then a reply streamed for
#               3 s; once every message is acknowledged, a fault: kill -9
#               of a node (master and workers; started again after), or
#               SIGSTOP of one for 3 x its ttl, then SIGCONT;
#               CLUSTER_ROUNDS (2) of each, on a different node each
#               time.  Per conversation the faulted node owned: the fault
#               to the first model call or tool run another node started
#               for it (the turn taken over: model_calls' started and
#               worker, the tool location's log), and to
#               the first event written under the new owner's epoch
#               (events' ts; nginx's clock, the same machine's).  Tool
#               calls run twice (the tool location's log) and model calls
#               made again (model_calls rows beyond two a turn).
#   throughput  one node, then three, on the same PostgreSQL: clients
#               (t/js/cluster_load.mjs bench) run turns back to back
#               through the front, CLUSTER_CLIENTS (48) at once, a new
#               conversation per turn of 16 calls of a tool answered by
#               nginx (36 events), for CLUSTER_SECONDS (20): events/s
#               written (PostgreSQL's rows), commits/s, the 202's p50 and
#               p99; PostgreSQL's connections per node (pg_stat_activity,
#               the most seen).
#
#   nice -n 10 perl bench/cluster.pl     (make first; TEST_NGINX_* as in t/)
#
# Heartbeat 500ms, ttl 2s, two workers a node.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../t/lib";

use IO::Select;
use JSON::PP;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Cluster;
use Test::Agent::Engine;
use Test::Agent::Postgres;

my $why = Test::Agent::Postgres->missing;
die "$why\n" if $why;

my $M = $ENV{CLUSTER_CONVERSATIONS} // 150;
my $ROUNDS = $ENV{CLUSTER_ROUNDS} // 2;
my $CLIENTS = $ENV{CLUSTER_CLIENTS} // 48;
my $SECONDS = $ENV{CLUSTER_SECONDS} // 20;

my $pg = Test::Agent::Postgres->new(fsync => 1);

my $mock = Test::Agent::Cluster::mock(1, sub {
    my ($last) = @_;

    if (($last->{role} // '') eq 'tool') {
        return { text => 'done' } if $last->{tool_call_id} =~ /^e/;
        return { text => join(' ', ('word') x 30), chunks => 30,
                 delay => 0.1 };
    }

    my $content = $last->{content} // '';

    return { tool_calls => [map { { id => "e$_", name => 'echo',
                                    arguments => '{}' } } 1 .. 16] }
        if $content eq 'bench';

    my ($cid, $round) = $content =~ /^take (\S+) (\d+)$/
        or return { text => 'no' };

    return { tool_calls => [{ id => "L-$cid-$round", name => 'lookup',
                              arguments => '{}' }] };
});

my $mport = $mock->port;

my $tools = $ECHO_TOOL . <<'EOF';
    agent_tool lookup {
        description "Looks something up";
        location /tools/lookup;
    }
EOF

my $server = $ECHO_LOCATION . <<"EOF";
        location = /tools/lookup {
            internal;
            log_subrequest on;
            access_log %%TESTDIR%%/tools.log tools;
            proxy_pass http://127.0.0.1:$mport/v1/chat/completions;
        }
EOF

my %conf = (pg => $pg, mock => $mock, tools => $tools,
            agent => 'tools echo lookup;', server => $server,
            http => "log_format tools '\$http_idempotency_key %%NODE%%"
                    . " \$msec \$request_time';");

sub pct {
    my ($v, $p) = @_;
    my @s = sort { $a <=> $b } @$v;
    return @s ? $s[int($p / 100 * $#s + 0.5)] : 0;
}

sub figures {
    my ($v) = @_;
    return sprintf 'p50 %d ms, p99 %d ms, max %d ms (%d conversations)',
        pct($v, 50), pct($v, 99), pct($v, 100), scalar @$v;
}

sub machine {
    open my $fh, '<', '/proc/loadavg';
    my $l = <$fh> // '';
    close $fh;
    return (split ' ', $l)[0];
}

printf "%s, %d cores, load %s at the start; PostgreSQL %s, fsync on\n",
    scalar gmtime, `nproc` + 0, machine(),
    $pg->sql('SHOW server_version');

###############################################################################

# take-over

my $c = Test::Agent::Cluster->new(%conf, nodes => 3);
my (%ms, %resumed);

# the tool runs: key => [[node, ms started], ...]

sub tool_runs {
    my %r;
    for my $node ($c->nodes) {
        for (split /\n/, $node->{t}->read_file('tools.log')) {
            my ($key, $id, $msec, $took) = split / /;
            push @{$r{$key}}, [$id, 1000 * ($msec - $took)];
        }
    }
    return \%r;
}
my $round = 0;

for my $fault (map { ('KILL', 'STOP') } 1 .. $ROUNDS) {
    $round++;
    my $k = 1 + $round % 3;

    for my $i (1 .. $M) {
        my $r = send_message($c->front, "t$i", "take t$i $round");
        die "take $i: $r->{status}\n" unless $r->{status} == 202;
    }

    my $node = $c->node($k)->{id};
    my %was = map { (split /\|/)[0] => (split /\|/)[1] }
              split /\n/, $pg->sql("SELECT id, epoch FROM conversations"
                                   . " WHERE node = '$node'");
    my $at = time;
    my @pids = $c->kill_node($k, $fault);

    if ($fault eq 'STOP') {
        sleep 6;
        kill 'CONT', @pids;
    }

    $pg->wait_sql("SELECT count(*) FROM events WHERE type = 'turn_completed'"
                  . " AND (data::json->>'turn')::int = $round",
                  qr/^$M$/, 60)
        or die "round $round: the turns did not all complete\n";

    my $runs = tool_runs();

    for my $cid (sort keys %was) {
        my $ts = $pg->sql("SELECT min((data::json->>'ts')::bigint) FROM"
                          . " events WHERE conversation = '$cid'"
                          . " AND epoch > $was{$cid}");
        push @{$ms{$fault}}, $ts - $at * 1000 if $ts ne '';

        my @t = grep { $_ ne '' } $pg->sql("SELECT min(started) FROM"
                       . " model_calls WHERE conversation = '$cid'"
                       . " AND turn = $round AND worker NOT IN ("
                       . join(',', @pids) . ')'),
                    map { $_->[1] } grep { $_->[0] ne $node }
                    @{$runs->{"L-$cid-$round"} || []};
        push @{$resumed{$fault}}, (sort { $a <=> $b } @t)[0] - $at * 1000
            if @t;
    }

    $c->start_node($k) if $fault eq 'KILL';
    sleep 1;
}


my $again = $pg->sql("SELECT count(*) - 2 * count(DISTINCT conversation"
                     . " || '/' || turn) FROM model_calls"
                     . " WHERE conversation LIKE 't%'");

for (['kill -9', 'KILL'], ['SIGSTOP', 'STOP']) {
    print "after $_->[0], the turn taken over (its first model call or"
        . " tool run on another node): " . figures($resumed{$_->[1]})
        . "\n";
    print "after $_->[0], the first event written by the new owner: "
        . figures($ms{$_->[1]}) . "\n";
}
my $runs = tool_runs();
printf "tool calls run twice: %d of %d; model calls made again: %d of"
    . " %d turns\n", scalar(grep { @$_ > 1 } values %$runs),
    scalar keys %$runs, $again, $M * $round;

$c->stop;

###############################################################################

# throughput: one node, then three

sub load {
    my ($n) = @_;

    my $cl = Test::Agent::Cluster->new(%conf, nodes => $n);
    my $events = $pg->sql('SELECT count(*) FROM events');
    my $commits = $pg->sql("SELECT xact_commit FROM pg_stat_database"
                           . " WHERE datname = 'agent'");
    my %conns;

    open my $fh, '-|', 'node', "$FindBin::Bin/../t/js/cluster_load.mjs",
        'bench', $cl->front_port, $SECONDS, $CLIENTS
        or die "node: $!\n";

    my $sel = IO::Select->new($fh);
    my $out = '';
    my $start = time;

    while (1) {
        if ($sel->can_read(0.5)) {
            my $got = sysread $fh, $out, 4096, length $out;
            last unless $got;
        }

        my $now = $cl->pg_connections;
        for (keys %$now) {
            $conns{$_} = $now->{$_} if $now->{$_} > ($conns{$_} // 0);
        }
    }

    close $fh;
    my $took = time - $start;

    # what was acknowledged is written; the rest of the backlog too
    sleep 2;

    my $r = decode_json($out);
    my $written = $pg->sql('SELECT count(*) FROM events') - $events;
    my $commit = $pg->sql("SELECT xact_commit FROM pg_stat_database"
                          . " WHERE datname = 'agent'") - $commits;

    printf "%d node%s: %d turns in %.0f s, %.0f events/s, %.0f commits/s;"
        . " 202 p50 %.1f ms, p99 %.1f ms; %d errors; PostgreSQL"
        . " connections, the most per node: %s\n",
        $n, $n > 1 ? 's' : '', $r->{turns}, $took, $written / $took,
        $commit / $took, $r->{ack_p50}, $r->{ack_p99}, $r->{errors},
        join(', ', map { "$_ $conns{$_}" } sort keys %conns);

    $cl->stop;
}

load(1);
load(3);

printf "load %s at the end\n", machine();

$mock->stop;
