#!/usr/bin/perl

# A long conversation: 1,000 turns of one conversation with agent_store
# and a context_budget.  Every turn completes; the model call of the last
# turn sends a request as small as those of the first turns (the system
# prompt, a summary, the turns since); the log keeps everything; after a
# restart of nginx the conversation goes on from the store, its request
# again the summary and the turns since.  The figures (CPU per model
# call) are bench/context.pl's.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

plan(skip_all => 'no sqlite3 command') unless `sqlite3 -version 2>&1` =~ /^3/;

my $TURNS = 1000;
my $prompt = 'Sum up the conversation so far.';
my $user = 'Tell me about the next step. ' x 4;
my $reply = 'Here is the next step, with what matters. ' x 6;
my $summary = 'The user and the assistant went through a plan. ' x 8;

# a reply for every request, the summary's included; the tokens reported
# are the request's size, as a provider would count them

my $mock = Test::Agent::MockProvider->new(default => sub {
    my ($req) = @_;
    my $msgs = $req->{json}{messages} || [];
    my $last = @$msgs ? $msgs->[-1]{content} // '' : '';

    return { text => $last eq $prompt ? $summary : $reply,
             usage => { prompt_tokens => int(length($req->{body}) / 4),
                        completion_tokens => 60 } };
});

my $t = Test::Agent->new;
my $db = $t->testdir . '/agent.db';

$t->write_file_expand('nginx.conf', engine_conf($mock, zone => '4m',
    agent => "context_budget 1000; summary_prompt \"$prompt\";",
    http => "agent_store $db;"));
$t->run;

sub turn {
    my ($n) = @_;

    my $r = send_message($t, 'long', "$n: $user");
    return "message $n: $r->{status}" unless $r->{status} == 202;

    my $deadline = time + 30;

    while (time < $deadline) {
        my $c = inspect($t, 'long', 'after=999999999&limit=1')->{json};
        return undef if $c && $c->{state} eq 'idle' && !defined $c->{lease};
        sleep 0.005;
    }

    return "turn $n did not end";
}

# the request of turn $n's model call, as the provider got it

sub request_of {
    my ($n) = @_;
    my ($req) = grep { index($_->{body}, "\"$n: ") >= 0
                       && $_->{json}{messages}[-1]{content} ne $prompt }
                reverse @{$mock->requests};
    return $req;
}

my @failed;

for my $n (1 .. $TURNS) {
    my $err = turn($n);
    push @failed, $err if $err;
    last if @failed > 3;
}

is(join('; ', @failed), '', "$TURNS turns, each completed");

my ($first, $last) = (request_of(10), request_of($TURNS));
my $summaries = grep { $_->{json}{messages}[-1]{content} eq $prompt }
                @{$mock->requests};

ok($summaries > 10, "older turns summed up ($summaries summaries)");
ok($last && length($last->{body}) < 3 * length($first->{body}),
   'the last turn\'s request is about the size of the tenth\'s: '
   . length($last->{body}) . ' and ' . length($first->{body}) . ' bytes');
like($last->{json}{messages}[1]{content} // '',
     qr/^Summary of the conversation so far:/,
     'it starts with the summary');

# the log keeps everything: each turn's message, reply and end

$t->stop;

my $q = "SELECT type || ' ' || count(*) FROM events"
        . " WHERE conversation = 'long' AND type <> 'summary'"
        . " GROUP BY type ORDER BY type";
my $types = `sqlite3 '$db' "$q"`;
is($types, "assistant_msg $TURNS\nturn_completed $TURNS\nuser_msg $TURNS\n",
   'the store holds every turn whole');

# after a restart, the conversation goes on from the store

$t->run;

is(turn($TURNS + 1), undef, 'after a restart, turn ' . ($TURNS + 1));

my $next = request_of($TURNS + 1);
my @roles = map { $_->{role} } @{$next->{json}{messages}};
is($roles[0], 'system', 'its request: the system prompt');
like($next->{json}{messages}[1]{content} // '',
     qr/^Summary of the conversation so far:/, 'the summary');
ok(@roles < 40, 'and the turns since (' . scalar(@roles) . ' messages)');

$mock->stop;
$t->done;
