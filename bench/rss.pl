#!/usr/bin/perl

# Worker memory over many turns: conversations of four short turns one
# after another, the worker's resident set (VmRSS) every 1,000 turns.
# Without a store a small zone fills, and its least recently used idle
# conversations give way; with one ("store"), they leave it once written.
#
#   perl bench/rss.pl [turns] [store]    (make first; TEST_NGINX_* as in t/)

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../t/lib";

use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $turns = shift // 20000;
my $store = (shift // '') eq 'store';

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'A short reply of a few words.',
             usage => { prompt_tokens => 40, completion_tokens => 8 } };
});

my $t = Test::Agent->new;
my $db = $t->testdir . '/agent.db';

$t->write_file_expand('nginx.conf', engine_conf($mock, zone => '4m',
    http => $store ? "agent_store $db;" : ''));
$t->run;

sub rss {
    my $kb = 0;
    for my $pid ($t->worker_pids) {
        open my $fh, '<', "/proc/$pid/status" or next;
        while (<$fh>) {
            $kb += $1 if /^VmRSS:\s+(\d+)/;
        }
    }
    return $kb;
}

sub turn {
    my ($cid, $n) = @_;

    my $r = send_message($t, $cid, "message $n");
    die "message $n: $r->{status}\n" unless $r->{status} == 202;

    my $deadline = time + 30;
    while (time < $deadline) {
        my $c = inspect($t, $cid, 'after=999999999&limit=1')->{json};
        return if $c && $c->{state} eq 'idle' && !defined $c->{lease};
        sleep 0.002;
    }
    die "turn $n did not end\n";
}

my $start = time;

printf "%s, %d turns, 4 a conversation, a 4 MB zone\n",
    $store ? 'with agent_store' : 'no store', $turns;
printf "turn %6d: worker RSS %6d KB\n", 0, rss();

for my $n (1 .. $turns) {
    turn('r' . int(($n - 1) / 4), $n);

    next if $n % 1000;

    $mock->reset;
    printf "turn %6d: worker RSS %6d KB (%.1f s)\n", $n, rss(),
        time - $start;
}

$t->stop;
$mock->stop;
