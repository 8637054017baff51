#!/usr/bin/perl

# Scale-out: three nginx nodes on one PostgreSQL behind a front nginx
# that routes by conversation (hash $conversation consistent, a 421
# followed to the owner it names), under load and faults.
#
# Load: TEST_AGENT_SCALE conversations (300; 100 with the sanitizers,
# TEST_NGINX_SANITIZED), three turns each, driven
# by t/js/cluster_load.mjs through the front: per turn a server tool
# (lookup), an approval (approve_slow, answered a while later; for every
# third conversation approve_quick, 3 s, never answered) and a reply
# streamed by the mock; one subscriber per conversation through the
# front, reconnecting with Last-Event-ID.  Faults, one per turn: (1)
# kill -9 of node n2 (master and workers) while its turns stream and
# wait; (2) SIGSTOP of node n3 for three times its ttl, then SIGCONT;
# (3) none, then messages sent straight to a node that does not own the
# conversation.
#
# What must hold, from PostgreSQL's rows, the clients' records and the
# tool locations' logs: every log gapless from seq 1, every tool_call
# with exactly one tool_result, every acknowledged message in the log
# once (by source_id) and every answered resolution once, every turn
# completed once; waiting calls keep their deadlines across the
# take-over, the short ones expire once and not long after theirs; no
# event of an older epoch after one of a newer (the fence), nothing
# written by n3 after its conversations were taken; a tool call runs at
# most twice and then with the same Idempotency-Key (the count is
# reported); every subscriber got every event in order, none twice, and
# only events of the log (a node sends canonical events once written);
# n3 running again after its pause serves nothing of what its zone held
# (its lease lapsed): a read of a conversation taken from it is 421; a
# non-owner answers 421 with the owner's address and changes nothing;
# no alert in any log.  Take-over times are reported.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IPC::Open2;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::Cluster;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::Postgres;

plan(skip_all => Test::Agent::Postgres->missing)
    if Test::Agent::Postgres->missing;
plan(skip_all => 'no node command (apt-get install nodejs)')
    unless `node --version 2>&1` =~ /^v\d+/;

# under the sanitizers nginx is some times slower: 100 unless told
my $N = $ENV{TEST_AGENT_SCALE} // (Test::Agent->sanitized ? 100 : 300);

my $TURNS = 3;
my $started = time;

my $pg = Test::Agent::Postgres->new;

# The model: "scale CID TURN" gets the two calls, ids made of the
# conversation and the turn (a step asked for again would log them
# twice); tool results get a streamed reply.  The tool locations proxy
# here too: a request with an Idempotency-Key is a tool run.

my $mock = Test::Agent::Cluster::mock(0.2, sub {
    my ($last) = @_;

    return { text => 'both tools have answered and this reply streams'
                     . ' word by word to every subscriber',
             chunks => 8, delay => 0.15 }
        if ($last->{role} // '') eq 'tool';

    my ($cid, $k, $turn) = ($last->{content} // '')
        =~ /^scale (c(\d+)) (\d+)$/
        or return { text => 'I did not understand.' };

    my $approval = $k % 3 ? 'approve_slow' : 'approve_quick';

    return { tool_calls => [
                 { id => "L-$cid-$turn", name => 'lookup',
                   arguments => '{}' },
                 { id => "A-$cid-$turn", name => $approval,
                   arguments => '{}' } ],
             chunks => 2 };
});

my $mport = $mock->port;

my $tools = <<'EOF';
    agent_tool lookup {
        description "Looks something up";
        location /tools/lookup;
    }
EOF

for (['slow', '60s'], ['quick', '3s']) {
    $tools .= <<"EOF";

    agent_tool approve_$_->[0] {
        description "Deploys once a person approves, within $_->[1]";
        approval requires_approval;
        location /tools/deploy;
        timeout $_->[1];
    }
EOF
}

# each run of a tool logged with the conversation, the tool, the key and
# the node; the mock answers it

my $server = <<"EOF";
        location ~ ^/tools/(lookup|deploy)\$ {
            internal;
            log_subrequest on;
            access_log %%TESTDIR%%/tools.log tools;
            rewrite ^ /v1/chat/completions break;
            proxy_pass http://127.0.0.1:$mport;
        }
EOF

my $c = Test::Agent::Cluster->new(pg => $pg, mock => $mock, nodes => 3,
    tools => $tools, agent => 'tools lookup approve_slow approve_quick;',
    server => $server, zone => '128m',
    http => "log_format tools '\$http_x_agent_conversation"
            . " \$http_x_agent_tool \$http_idempotency_key %%NODE%%"
            . " \$status \$msec \$request_time';");

is($pg->sql("SELECT string_agg(id, ' ' ORDER BY id) FROM nodes"),
   'n1 n2 n3', 'three nodes, each with its row');

# the clients

my $out = $c->front->testdir . '/clients.json';
my $pid = open2(my $from, my $to, 'node', "$FindBin::Bin/js/cluster_load.mjs",
                $c->front_port, $N, $TURNS, $out);
$to->autoflush(1);

my %status;

# reads the clients' lines until $until->() holds; false at the timeout

sub clients_until {
    my ($until, $timeout) = @_;

    my $deadline = time + $timeout;

    while (time < $deadline) {
        my $line = <$from> // return 0;
        if ($line =~ /^status (\d+) (\d+) (\d+) (\d+)/) {
            @status{qw(turn acked suspended ended)} = ($1, $2, $3, $4);
        } elsif ($line =~ /^turn (\d+) done ([\d.]+)/) {
            $status{done}{$1} = $2;
            diag("turn $1: $N conversations in $2 s");
        }
        return 1 if $until->();
    }

    return 0;
}

sub owned {
    my ($node) = @_;
    my %o;
    for (split /\n/, $pg->sql("SELECT id, epoch, last_seq, state FROM"
                              . " conversations WHERE node = '$node'")) {
        my ($id, $epoch, $last, $state) = split /\|/;
        $o{$id} = { epoch => $epoch, last => $last, state => $state };
    }
    return \%o;
}

sub pct {
    my ($v, $p) = @_;
    my @s = sort { $a <=> $b } @$v;
    return @s ? $s[int($p / 100 * $#s + 0.5)] : 0;
}

# the first event under a new epoch after the fault, per conversation
# taken: ms from the fault

sub takeover_times {
    my ($was, $fault) = @_;
    my @ms;

    for my $cid (sort keys %$was) {
        my $ts = $pg->sql("SELECT min((data::json->>'ts')::bigint) FROM"
                          . " events WHERE conversation = '$cid'"
                          . " AND epoch > $was->{$cid}{epoch}");
        push @ms, $ts - $fault * 1000 if $ts ne '';
    }

    return @ms;
}

sub report {
    my ($what, @ms) = @_;
    diag(sprintf '%s: %d conversations, first event of the new owner'
         . ' after %d ms p50, %d ms p99, %d ms max', $what, scalar @ms,
         pct(\@ms, 50), pct(\@ms, 99), pct(\@ms, 100));
}

# conversations at rest, for the pause: those n3 owns are read on n1
# while n3 is paused, then on n3 once it runs again

my @rest = map { "s$_" } 1 .. 12;
is(send_message($c->front, $_, 'hello')->{status}, 202, "$_: a message")
    for @rest;
wait_state($c->front, $_, 'idle') for @rest;

# turn 1: kill -9 of n2 with turns streaming and waiting

print $to "go 1\n";
ok(clients_until(sub { ($status{acked} // 0) == $N
                       && $status{suspended} >= $N / 2 }, 60),
   "turn 1: $N messages acknowledged, half of them waiting for approval");

my $n2 = owned('n2');
my $kill = time;
$c->kill_node(2, 'KILL');
diag(sprintf 'kill -9 of n2, which owned %d conversations (%d running)',
     scalar keys %$n2, scalar grep { $_->{state} eq 'running' }
                                   values %$n2);

ok(clients_until(sub { $status{done}{1} }, 150), 'turn 1 ended everywhere');

is($pg->sql("SELECT count(*) FROM conversations WHERE node = 'n2'"
            . " AND id LIKE 'c%'"), 0,
   'n2 owns none of the conversations in turns now');
report('kill -9', takeover_times($n2, $kill));

# turn 2: n3 paused past its ttl, then running again

print $to "go 2\n";
ok(clients_until(sub { ($status{turn} // 0) == 2 && $status{acked} == $N
                       && $status{suspended} >= $N / 2 }, 60),
   "turn 2: $N messages acknowledged, half of them waiting");

my @paused = $c->kill_node(3, 'STOP');
my $stop = time;
sleep 0.5;
my $n3 = owned('n3');
diag(sprintf 'SIGSTOP of n3, which owned %d conversations',
     scalar keys %$n3);

clients_until(sub { time > $stop + 3 }, 10);

my @asleep = grep { /^s/ } keys %$n3;
my $read = grep { inspect($c->node(1)->{t}, $_)->{status} == 200 } @asleep;
is($read, scalar @asleep, scalar(@asleep) . ' conversations at rest of n3'
   . ' read on n1 while n3 is paused');

clients_until(sub { time > $stop + 6 }, 10);
kill 'CONT', @paused;
sleep 1;

# n3's lease lapsed: it serves nothing of what its zone held, nor
# writes it

for my $cid (@asleep) {
    is(inspect($c->node(3)->{t}, $cid)->{status}, 421,
       "$cid: a read on n3 running again is sent to its new owner");
}

for my $cid (@asleep) {
    my $r = send_message($c->node(3)->{t}, $cid, 'to n3 running again');
    is($r->{status}, 421, "$cid: a message to n3 running again: 421");
}
is($pg->sql("SELECT count(*) FROM events WHERE conversation IN ("
            . join(',', map { "'$_'" } @asleep, 'none') . ")"),
   3 * @asleep, 'nothing written for them');

ok(clients_until(sub { $status{done}{2} }, 150), 'turn 2 ended everywhere');

my $taken = join ',', map { "'$_'" } grep {
    $pg->sql("SELECT epoch FROM conversations WHERE id = '$_'")
        > $n3->{$_}{epoch}
} keys %$n3;

ok($taken, 'conversations of n3 were taken while it was paused');
# (what it had sent before the pause may have been committed after the
# look above: nothing of its epoch may follow the new owner's first)
is($pg->sql("SELECT count(*) FROM events e JOIN (VALUES "
            . join(',', map { "('$_', $n3->{$_}{epoch})" } keys %$n3)
            . ") AS s(id, epoch) ON e.conversation = s.id"
            . " WHERE e.epoch <= s.epoch AND e.conversation IN ($taken)"
            . " AND e.seq > (SELECT min(seq) FROM events f"
            . " WHERE f.conversation = s.id AND f.epoch > s.epoch)"), 0,
   'n3 wrote nothing into them once they were taken');
report('SIGSTOP', takeover_times({ map { $_ => $n3->{$_} }
                                   grep { $taken =~ /'$_'/ } keys %$n3 },
                                 $stop));

# what n3 answers now for what was taken from it, straight to it

my %stale;
for my $cid ($taken =~ /'([^']+)'/g) {
    my $r = inspect($c->node(3)->{t}, $cid);
    $stale{$r->{status}}++;
}
is(join(' ', map { "$stale{$_} $_" } sort keys %stale),
   scalar(() = $taken =~ /'/g) / 2 . ' 421',
   'n3 running again: a read of a conversation taken from it is 421');

my $lost = () = $c->node(3)->{t}->read_file('error.log')
                =~ /ownership lost/g;
diag("n3 logged \"ownership lost\" $lost times");

# turn 3: no fault

print $to "go 3\n";
ok(clients_until(sub { $status{done}{3} }, 150), 'turn 3 ended everywhere');

# a message straight to a node that does not own the conversation

my $direct = 0;
my @direct = grep { $_ % 7 == 1 } 1 .. $N;
for my $k (@direct) {
    my $cid = "c$k";
    my ($owner, $epoch, $last) = split /\|/, $pg->sql(
        "SELECT n.addr, c.epoch, c.last_seq FROM conversations c"
        . " JOIN nodes n ON n.id = c.node WHERE c.id = '$cid'");
    my ($other) = grep { !$_->{dead} && $_->{addr} ne $owner } $c->nodes;

    my $r = send_message($other->{t}, $cid, 'to the wrong node');
    $direct++ if $r->{status} == 421
        && $r->{json}{error}{code} eq 'owned_elsewhere'
        && ($r->{headers}{'x-agent-owner'} // '') eq $owner
        && $pg->sql("SELECT epoch || '|' || last_seq FROM conversations"
                    . " WHERE id = '$cid'") eq "$epoch|$last";
}
is($direct, scalar @direct,
   'a non-owner answers 421 with the owner\'s address, and nothing'
   . ' changes');

# the front's log: messages that reached a node that did not own their
# conversation and were taken by the owner it named, their body sent
# again

my $retried = () = $c->front->read_file('front.log')
    =~ m{"POST /c/c\d+/messages HTTP/1.1" 202 "[^"]*" "421 : 202"}g;
ok($retried, "$retried messages answered 421 by a node and 202 by the"
   . ' owner it named, through the front');

print $to "end\n";
waitpid $pid, 0;

open my $fh, '<', $out or die "$out: $!\n";
my $clients = decode_json(do { local $/; <$fh> });
close $fh;

###############################################################################

# the logs, from PostgreSQL

my %log;
for (split /\n/, $pg->sql("SELECT conversation, seq, type, epoch, data"
                          . " FROM events ORDER BY conversation, seq")) {
    my ($cid, $seq, $type, $epoch, $data) = split /\|/, $_, 5;
    push @{$log{$cid}}, { seq => $seq, type => $type, epoch => $epoch,
                          data => decode_json($data) };
}

is(scalar(grep { /^c/ } keys %log), $N, "$N conversations logged");

my (@gaps, @fence, @calls, @inputs, @ends, @subs, @late, @deadlines);
my @too_late;
my (@subs_taken, @diffs, @deadlines_paused);
my %faulted = (%$n2, %$n3);
my %result;

for my $k (1 .. $N) {
    my $cid = "c$k";
    my $ev = $log{$cid} || [];
    my $cl = $clients->{$cid};

    push @gaps, $cid if grep { $ev->[$_]{seq} != $_ + 1 } 0 .. $#$ev;
    push @fence, $cid if grep { $ev->[$_]{epoch} < $ev->[$_ - 1]{epoch} }
                         1 .. $#$ev;

    my (%call, %res, %src, %resolution, %end);
    for my $e (@$ev) {
        my $d = $e->{data};
        $call{$d->{tool_call_id}}++ if $e->{type} eq 'tool_call';
        $res{$d->{tool_call_id}}++ if $e->{type} eq 'tool_result';
        $resolution{$d->{tool_call_id}}++ if $e->{type} eq 'resolution';
        $src{$d->{source_id}}++
            if $e->{type} eq 'user_msg' && defined $d->{source_id};
        $end{$d->{turn}}{$e->{type}}++
            if $e->{type} =~ /^(turn_completed|turn_failed|cancelled)$/;
        $result{$d->{tool_call_id}} = $d if $e->{type} eq 'tool_result';
    }

    push @calls, $cid
        if keys %call != 2 * $TURNS
           || grep { $call{$_} != 1 || ($res{$_} // 0) != 1 } keys %call
           or keys %res != keys %call;

    push @inputs, $cid
        if grep { ($src{"$cid-$_->{turn}"} // 0) != 1 }
               grep { $_->{status} >= 200 && $_->{status} < 300 }
                    @{$cl->{messages}}
        or grep { ($resolution{$_->{id}} // 0) != 1 }
               grep { $_->{status} == 200 } @{$cl->{resolves}}
        or grep { $_ > 1 } values %resolution, values %src;

    push @ends, $cid if grep { ($end{$_}{turn_completed} // 0) != 1
                               || keys %{$end{$_}} != 1 } 1 .. $TURNS;

    # the subscriber: every event, in order, none twice

    my @got = map { "$_->{seq} $_->{type}" } @{$cl->{events}};
    my @want = map { "$_->{seq} $_->{type}" } @$ev;
    if ("@got" ne "@want" || $cl->{duplicates} || @{$cl->{gaps}}) {
        push @{$faulted{$cid} ? \@subs_taken : \@subs}, $cid;
        my ($i) = grep { ($got[$_] // '') ne ($want[$_] // '') }
                  0 .. $#want;
        push @diffs, "$cid: " . (defined $i ? "got \"$got[$i]\", the log"
                                 . " \"$want[$i]\"" : 'more than the log')
                     . ", $cl->{duplicates} twice, "
                     . scalar(@{$cl->{gaps}}) . ' gaps';
    }

    # the deadline inspect gave, before the approval, is the one logged
    # (the one a subscriber was sent may be of a suspension not written)

    my %deadline = map { $_->{data}{tool_call_id} => $_->{data}{deadline} }
                   grep { $_->{type} eq 'suspension' } @$ev;
    push @{$n3->{$cid} ? \@deadlines_paused : \@deadlines},
        map { "$_->{id} $_->{seen} (logged $deadline{$_->{id}}, sent"
              . " $_->{logged})" }
        grep { $_->{seen} != $deadline{$_->{id}} } @{$cl->{deadlines}};

    # the short approvals: expired, not long after their deadline (a
    # fault adds its take-over)

    for my $e (grep { $_->{type} eq 'suspension' } @$ev) {
        next if $k % 3;
        my $r = $result{$e->{data}{tool_call_id}} or next;
        my $late = $r->{ts} - $e->{data}{deadline};
        push @late, $late;

        # on its node, within 3 s; a deadline that passed while its node
        # was dead or paused, once the call is taken over (the ttl, a
        # sweep, the take-over's work: at most the pause and 2 s)
        push @too_late, "$e->{data}{tool_call_id} $late ms"
            if $late < 0 || $late > ($faulted{$cid} ? 8000 : 3000);
    }
}

is("@gaps", '', 'every log is gapless from seq 1');
is("@fence", '', 'no event of an older epoch after one of a newer');
is("@calls", '', 'every tool_call has exactly one tool_result');
is("@inputs", '', 'every acknowledged message and resolution is in the'
   . ' log exactly once');
is("@ends", '', "every turn completed once");
is("@subs", '', 'every subscriber got every event, in order, none twice');
is("@subs_taken", '', 'so did those of conversations of n2 and n3');
diag(join "\n", 'subscribers that did not:', @diffs) if @diffs;
is(join(', ', @deadlines), '', 'waiting calls kept their deadlines');
is(join(', ', @deadlines_paused), '', 'so did those of n3\'s');
if (@deadlines || @deadlines_paused) {
    my ($cid) = ($deadlines[0] // $deadlines_paused[0]) =~ /^A-(c\d+)-/;
    diag("$cid: " . join(' ', map { "$_->{seq}:$_->{type}:$_->{epoch}"
                                    . ($_->{data}{deadline}
                                       ? ":$_->{data}{deadline}" : '') }
                         @{$log{$cid}}));
    diag($pg->sql("SELECT id, status, deadline FROM tool_calls"
                  . " WHERE conversation = '$cid'"));
}
my $looked = map { @{$_->{deadlines}} } values %$clients;
my $approved = grep { $_->{status} == 200 }
               map { @{$_->{resolves}} } values %$clients;
cmp_ok($looked, '>=', 0.9 * $approved, "$looked deadlines looked at"
       . " before $approved approvals");

is(scalar @late, $TURNS * int($N / 3), 'every short approval expired');
is("@too_late", '', 'none before its deadline, none late but for the'
   . ' take-over');
diag(sprintf 'short approvals expired %d ms after their deadline p50,'
     . ' %d ms max', pct(\@late, 50), pct(\@late, 100));

my %conflicts;
$conflicts{"$_->{status} " . ($_->{code} // '-')}++
    for grep { $_->{status} != 200 } map { @{$_->{resolves}} }
        values %$clients;
diag('approvals not 200, sent again: '
     . (join(', ', map { "$conflicts{$_} $_" } sort keys %conflicts)
        || 'none'));

my $reconnects = 0;
$reconnects += $_->{reconnects} for values %$clients;
my %retried;
$retried{"$_->{status} " . ($_->{code} // '-')}++
    for grep { $_->{status} < 200 || $_->{status} > 299 }
        map { @{$_->{messages}} } values %$clients;
diag("subscribers reconnected $reconnects times; message attempts not"
     . ' 2xx, sent again: '
     . (join(', ', map { "$retried{$_} $_" } sort keys %retried) || 'none'));

# the tools: at most twice, with the key of the call, and a result of
# the call's own run

my %runs;
for my $node ($c->nodes) {
    for (split /\n/, $node->{t}->read_file('tools.log')) {
        my ($cid, $tool, $key, $id, $status, $msec, $took) = split / /;
        push @{$runs{$key}}, [$msec - $took, $id];
    }
}

my @twice = grep { @{$runs{$_}} == 2 } keys %runs;
my %pairs;
$pairs{join ' then ', map { $_->[1] } sort { $a->[0] <=> $b->[0] }
        @{$runs{$_}}}++ for @twice;
is(join(' ', grep { @{$runs{$_}} > 2 } keys %runs), '',
   'no tool call ran more than twice');
my @missing = grep { !$runs{$_} } grep { /^L-/ || (/^A-c(\d+)-/ && $1 % 3) }
              keys %result;
is("@missing", '', 'every lookup and approved call ran');
is(join(' ', grep { /^A-c(\d+)-/ && !($1 % 3) } keys %runs), '',
   'no expired approval ran');
my @wrong = grep { encode_json([$result{$_}{result}]) !~ /ran \Q$_\E/ }
            grep { $runs{$_} } keys %result;
is("@wrong", '', 'every result is that of a run with the call\'s key');
diag(scalar(@twice) . ' tool calls of ' . scalar(keys %runs)
     . ' ran twice (with the same Idempotency-Key): '
     . join(', ', map { "$pairs{$_} on $_" } sort keys %pairs));

# the logs: nothing but the kill's and the pause's

$c->stop;
$mock->stop;

for my $node ($c->nodes) {
    my @bad = $node->{t}->log_problems;
    is(join("\n", @bad), '', "no alert in $node->{id}'s logs");
}
is(join("\n", $c->front->log_problems), '', 'nor in the front\'s');

diag(sprintf 'the whole test: %.0f s', time - $started);

done_testing;
