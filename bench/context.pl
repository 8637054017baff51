#!/usr/bin/perl

# Context assembly: what a model call costs as one conversation grows.
# With context_budget, the request a model call sends and the worker's CPU
# per model call stay flat at turn 10, 100 and 1,000 (older turns are in a
# summary), and the conversation goes on after a restart from the store;
# without it, both grow with the conversation (shown up to turn 100).
#
#   perl bench/context.pl [turns]           (make first; TEST_NGINX_* as in t/)
#
# CPU is the worker's (schedstat, ns) over the ten turns up to each mark,
# per model call of those turns (the summaries' calls included), in its
# event loop and in its store's threads apart; request bytes are the body
# of the mark's turn's model call as the provider got it.

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

my $turns = shift // 1000;
my $budget = 1500;
my $prompt = 'Sum up the conversation so far.';

my $user = 'Tell me more about the next step of the plan. ' x 6;
my $reply = 'Here is the next step, with the details that matter. ' x 11;
my $summary = 'The user and the assistant went through a plan. ' x 16;

# a reply for every request, whatever the order; the tokens it reports
# are the request's size, as a provider would count them

my $mock = Test::Agent::MockProvider->new(default => sub {
    my ($req) = @_;
    my $msgs = $req->{json}{messages} || [];
    my $last = @$msgs ? $msgs->[-1]{content} // '' : '';
    my $tokens = int(length($req->{body}) / 4);

    return { text => $last eq $prompt ? $summary : $reply,
             usage => { prompt_tokens => $tokens, completion_tokens => 150 } };
});

sub start {
    my ($agent, $t) = @_;
    $t //= Test::Agent->new;
    my $db = $t->testdir . '/agent.db';
    $t->write_file_expand('nginx.conf', engine_conf($mock, zone => '16m',
        agent => $agent, http => "agent_store $db;"));
    $t->run;
    return $t;
}

# the worker's CPU time so far, ns: its event loop's, and its store's
# threads' (SQLite: the log, the audit of model calls)

sub cpu {
    my ($t) = @_;
    my ($loop, $threads) = (0, 0);
    for my $pid ($t->worker_pids) {
        for my $task (glob "/proc/$pid/task/*/schedstat") {
            open my $fh, '<', $task or next;
            my ($run) = split ' ', scalar <$fh>;
            if ($task eq "/proc/$pid/task/$pid/schedstat") {
                $loop += $run;
            } else {
                $threads += $run;
            }
        }
    }
    return [$loop, $threads];
}

sub turn {
    my ($t, $cid, $n) = @_;

    my $r = send_message($t, $cid, "$n: $user");
    die "message $n: $r->{status}" unless $r->{status} == 202;

    my $deadline = time + 30;
    while (time < $deadline) {
        my $c = inspect($t, $cid, 'after=999999999&limit=1')->{json};
        return if $c && $c->{state} eq 'idle' && !defined $c->{lease};
        sleep 0.005;
    }
    die "turn $n did not end";
}

# the figures at each mark: request bytes of the mark's turn, CPU per
# model call of the ten turns up to it

sub run {
    my ($label, $agent, $last, @marks) = @_;

    my $t = start($agent);
    my %mark = map { $_ => 1 } @marks;
    my ($cpu0, $calls0) = (cpu($t), 0);
    my @rows;

    for my $n (1 .. $last) {
        if ($mark{$n + 9}) {
            $cpu0 = cpu($t);
            $calls0 = scalar @{$mock->requests};
        }

        turn($t, 'bench', $n);

        next unless $mark{$n};

        my $reqs = $mock->requests;
        my ($mine) = grep { index($_->{body}, "\"$n: ") >= 0 } @$reqs;
        sleep 0.2;    # a summary the turn started
        my $calls = scalar(@{$mock->requests}) - $calls0;

        my $cpu = cpu($t);
        push @rows, sprintf "%-10s turn %5d: request %7d bytes, CPU per "
            . "model call %6.3f ms event loop, %6.3f ms store threads "
            . "(%d calls)", $label, $n, length $mine->{body},
            ($cpu->[0] - $cpu0->[0]) / 1e6 / $calls,
            ($cpu->[1] - $cpu0->[1]) / 1e6 / $calls, $calls;
        print "$rows[-1]\n";
    }

    return $t;
}

$mock->reset;
my $t = run('budget', "context_budget $budget; summary_prompt \"$prompt\";",
            $turns, grep { $_ <= $turns } 10, 100, 1000);

my $n = grep { index($_->{body}, $prompt) >= 0 } @{$mock->requests};
print "budget     $n summaries over $turns turns\n";

# a restart: the conversation goes on from the store, its summary first

$t->stop;
$mock->reset;
$t->run;

turn($t, 'bench', $turns + 1);

my $r = $mock->requests->[0];
printf "budget     after a restart, turn %d: request %d bytes, %s\n",
    $turns + 1, length $r->{body},
    index($r->{body}, 'Summary of the conversation so far') >= 0
    ? 'system + summary + tail' : 'NO SUMMARY';
$t->stop;

$mock->reset;
$t = run('no budget', '', 100, 10, 100);
$t->stop;
