#!/usr/bin/perl

# The history a worker keeps (agent_store history=): a conversation's
# turns go back and forth between two workers, with tool calls, a call
# that waits for a person and is resolved on the other worker, and
# summaries.  Every request the provider gets is byte for byte the one
# it gets with history=0, where each turn reads its history from the
# store; the workers took the history they kept for some turns, and
# with history=0 for none.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

plan(skip_all => 'no sqlite3 command') unless `sqlite3 -version 2>&1` =~ /^3/;

my $PROMPT = 'Sum up the conversation so far.';

# the reply depends on the request only: the same requests, the same run

my $mock = Test::Agent::MockProvider->new(default => sub {
    my ($req) = @_;
    my $msgs = $req->{json}{messages} || [];
    my $last = $msgs->[-1] || {};
    my $content = $last->{content} // '';
    my $n = scalar @$msgs;
    my $usage = { prompt_tokens => int(length($req->{body}) / 4),
                  completion_tokens => 20 };

    return { text => "summary at $n", usage => $usage }
        if $content eq $PROMPT;

    # "twice N": a second tool call after the first one's result, so a
    # turn makes three model calls

    my @turn;
    for my $m (reverse @$msgs) {
        unshift @turn, $m;
        last if ($m->{role} // '') eq 'user';
    }

    if (($turn[0]{content} // '') =~ /^twice (\d+)/
        && 1 == grep { ($_->{role} // '') eq 'tool' } @turn)
    {
        return { tool_calls => [{ id => "d$1", chunks => 2, name => 'echo',
                                  arguments => "{\"again\":$1}" }],
                 usage => $usage };
    }

    if (($last->{role} // '') eq 'user'
        && $content =~ /^(tool|ask|twice) (\d+)/)
    {
        return { tool_calls => [{ id => "c$2", chunks => 3,
                                  name => $1 eq 'ask' ? 'ask_user' : 'echo',
                                  arguments => "{\"n\":$2}" }],
                 usage => $usage };
    }

    return { text => "reply $n: " . ('words ' x 20), chunks => 4,
             usage => $usage };
});

my $tools = $ECHO_TOOL . <<'EOF';
    agent_tool ask_user {
        executor human;
        timeout 1h;
    }
EOF

my $server = $ECHO_LOCATION . $WORKERS_SERVER . <<'EOF';
        location = /worker {
            return 204;
        }
EOF

my $t = Test::Agent->new;

sub start {
    my ($dir, $history) = @_;

    mkdir $t->testdir . "/$dir";

    $t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
        zone => '4m', tools => $tools, server => $server,
        agent => "tools echo ask_user; context_budget 300;"
                 . " summary_prompt \"$PROMPT\";",
        http => "agent_store " . $t->testdir . "/$dir/agent.db$history;"));
    $t->run;
}

# the request on a connection of the worker asked for (see
# worker_connection), its answer read until $until matches

sub on_worker {
    my ($pid, $method, $uri, $body, $until) = @_;

    my $s = worker_connection($t, $pid) or return { status => 0 };

    print $s http_request($method, $uri, $body,
        headers => { 'Content-Type' => 'application/json' });

    my $raw = '';
    my $sel = IO::Select->new($s);
    my $deadline = time + 10;

    while (time < $deadline && $sel->can_read($deadline - time)) {
        last unless sysread($s, my $buf, 65536);
        $raw .= $buf;
        last if $until && $raw =~ $until;
    }

    close $s;

    my $r = parse_response($raw);
    $r->{worker} = $pid;
    return $r;
}

sub idle {
    my ($cid) = @_;
    my $c = wait_state($t, $cid, 'idle');
    return $c && $c->{state} eq 'idle' && !defined $c->{lease};
}

# the summaries the workers recorded, as their log tells (a page of the
# log may read the store)

sub recorded {
    my @n = $t->read_file('error.log')
            =~ /agent summary of seq \d+ to \d+ recorded as seq/g;
    return scalar @n;
}

# after a turn: a summary it asked for is recorded before the next one
# (the summaries the mock was asked for since its reset, recorded since
# $before); an error when one is not

sub summed {
    my ($before) = @_;

    sleep 0.2;
    my $asked = grep { index($_->{body}, $PROMPT) >= 0 } @{$mock->requests};
    my $deadline = time + 10;

    sleep 0.05 while time < $deadline && recorded() - $before < $asked;

    return recorded() - $before >= $asked ? () : ('no summary');
}

sub reads {
    my $body = http_get('/metrics', port => $t->port(8081))->{body} // '';
    my %n = $body =~ /^agent_store_history_reads_total\{from="(\w+)"\} (\d+)/mg;
    return \%n;
}

# one run: the turns of two conversations, each on the worker its step
# names (0 or 1), then the requests the provider got

my @STEPS = (
    [0, 'msg 1'], [0, 'tool 2'], [1, 'msg 3'], [0, 'msg 4'],
    [0, 'ask 5'], [1, 'resolve c5'], [1, 'msg 6'], [1, 'tool 7'],
    [0, 'msg 8'], [0, 'msg 9'], [1, 'msg 10'], [1, 'msg 11'],
    [0, 'tool 12'], [0, 'msg 13'], [1, 'twice 14'], [1, 'twice 15'],
    [0, 'msg 16'],
);

sub run {
    my ($label) = @_;
    my @w = worker_pids($t);
    my ($before, @failed) = (recorded());

    is(scalar @w, 2, "$label: two workers");

    $mock->reset;

    for my $cid ('h1', 'h2') {
        for my $step (@STEPS) {
            my ($w, $what) = @$step;
            my $r;

            if ($what =~ /^resolve (\w+)/) {
                wait_pending($t, $cid, 'elicitation');
                $r = on_worker($w[$w], 'POST', "/c/$cid/calls/$1",
                               encode_json({ result => 'yes' }));
                push @failed, "$cid $what: $r->{status}"
                    unless $r->{status} == 200;

            } else {
                $r = on_worker($w[$w], 'POST', "/c/$cid/messages",
                               encode_json({ content => "$what of $cid" }));
                push @failed, "$cid $what: $r->{status}"
                    unless $r->{status} == 202;
            }

            next if $what =~ /^ask/;

            push @failed, "$cid $what: not idle" unless idle($cid);
            push @failed, map { "$cid $what: $_" } summed($before);
        }
    }

    is(join('; ', @failed), '', "$label: every turn ended");

    pages($label, @w);

    return [map { $_->{body} } @{$mock->requests}];
}

# A page of the history the zone gave up, and a subscriber's catch-up,
# each on the worker that ran the conversation's last turn and on the
# other: the same answers, taken from the worker's memory on the first
# (with history kept) and read from the store on the second.

sub pages {
    my ($label, @w) = @_;

    my $log = inspect($t, 'h2', 'limit=1000')->{json}{messages} // [];
    my ($last) = grep { $_->{type} eq 'user_msg' } reverse @$log;
    my $after = $last->{seq} - 1;
    my $end = $log->[-1]{seq};
    my (%page, %sse, %from);

    for my $i (1, 0) {
        my $before = reads();

        my $r = on_worker($w[$i], 'GET', "/c/h2?after=$after&limit=100");
        $page{$i} = $r->{status} == 200 ? $r->{body} : "status $r->{status}";

        $r = on_worker($w[$i], 'GET', "/c/h2/events?after=$after", undef,
                       qr/^id: $end\r?\n.*?\r?\n\r?\n/ms);
        $sse{$i} = join "\n", grep { /^(id|event|data):/ }
                               split /\r?\n/, $r->{body} // '';

        my $now = reads();
        $from{$i} = join ' ', map { ($now->{$_} // 0) - ($before->{$_} // 0)
                                    . " $_" } qw(store worker);
    }

    like($page{0}, qr/"seq":$end\b/, "$label: a page reaching back");
    is($page{0}, $page{1}, "$label: the same page from either worker");
    like($sse{0}, qr/^id: $end$/m, "$label: a catch-up reaching back");
    is($sse{0}, $sse{1}, "$label: the same catch-up from either worker");

    is($from{1}, '2 store 0 worker', "$label: the other worker read both");
    is($from{0}, $label eq 'kept' ? '0 store 2 worker' : '2 store 0 worker',
       "$label: the last turn's worker "
       . ($label eq 'kept' ? 'kept both' : 'read both'));
}

# a size that is not one

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => 'agent_store ' . $t->testdir . '/agent.db history=lots;'));
like($t->test_config, qr/invalid history size "history=lots"/,
     'history=lots refused');

# A conversation's turns on one worker, with tool calls: each turn goes
# on from the history it rendered for its first model call, and keeps
# it, so none reads the store, whenever the events before it are
# written and leave the zone.  With flush=1s a turn's last events are
# written with the next message, as that turn starts, and leave the
# zone in the middle of it.  (With history=0 the turns read them.)

sub one_worker {
    my ($label) = @_;
    my @w = worker_pids($t);
    my ($reads, $before, @failed) = (reads(), recorded());

    $mock->reset;

    for my $what ('tool 1', 'msg 2', 'twice 3', 'tool 4', 'twice 5',
                  'msg 6') {
        my $r = on_worker($w[0], 'POST', '/c/h3/messages',
                          encode_json({ content => "$what of h3" }));
        push @failed, "$what: $r->{status}" unless $r->{status} == 202;

        # its state only, no page of its log: a page may read the store

        my ($c, $deadline) = (undef, time + 10);

        while (time < $deadline) {
            $c = inspect($t, 'h3', 'after=1000000')->{json};
            last if $c && $c->{state} eq 'idle' && !defined $c->{lease};
            sleep 0.05;
        }

        push @failed, "$what: not idle"
            unless $c && $c->{state} eq 'idle' && !defined $c->{lease};
        push @failed, map { "$what: $_" } summed($before);
    }

    is(join('; ', @failed), '', "$label: one worker's turns ended");

    my $now = reads();
    return (($now->{store} // 0) - ($reads->{store} // 0),
            [map { $_->{body} } @{$mock->requests}]);
}

start('kept', '');
my $kept = run('kept');
my $n = reads();
$t->stop;

start('late', ' flush=1s');
my ($late, $late_asked) = one_worker('late');
is($late, 0, 'one worker\'s turns read nothing from the store');
$t->stop;

start('read', ' history=0');
my $read = run('read');
my $m = reads();
my ($alone, $alone_asked) = one_worker('read');
ok($alone > 0, "history=0: one worker's turns read the store ($alone)");
$t->stop;

my $summaries = grep { /\Q$PROMPT\E/ } @$kept;

ok($summaries >= 2, "summaries were made ($summaries)");
is(scalar @$kept, scalar @$read, 'as many requests either way ('
   . scalar @$kept . ')');

my $thrice = grep { /\\"again\\":1[45]\b/ } @$kept;
ok($thrice >= 2, "turns of three model calls ($thrice requests after the "
   . 'second tool call)');

is_deeply($late_asked, $alone_asked, 'one worker\'s turns: every request '
          . 'the one made from the store\'s history ('
          . scalar @$late_asked . ')');

my $late_summaries = grep { /\Q$PROMPT\E/ } @$late_asked;
ok($late_summaries >= 1, "one worker's turns: summaries between them "
   . "($late_summaries)");

my ($diff) = grep { $kept->[$_] ne ($read->[$_] // '') } 0 .. $#$kept;
is($diff, undef, 'every request is the one made from the store\'s history');

ok(($n->{worker} // 0) >= 6, 'reads from the history a worker kept ('
   . ($n->{worker} // 0) . '), the others read it ('
   . ($n->{store} // 0) . ')');
ok(($n->{store} // 0) >= 4, 'turns after the other worker\'s read it');
is($m->{worker} // 0, 0, 'history=0: none kept');
ok(($m->{store} // 0) > 0, 'history=0: every turn read the store ('
   . ($m->{store} // 0) . ')');

done_testing();
