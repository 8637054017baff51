#!/usr/bin/perl

# A reply's tool calls are dispatched over as many passes of the event
# loop as they take: a batch of calls whose locations answer at once runs
# its subrequests to their ends in the pass that makes them, and once
# the pass has run its time the rest wait for the passes after it, so
# that a request that came meanwhile is not kept waiting for all of
# them.  Every call still runs once and gets one result, the model is
# called again with all of them, and a cancel that comes while the calls
# are dispatched runs none of those left: each call that ran has its
# result, each that did not is cancelled, none runs after its result.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $calls = 600;

my $t = Test::Agent->new;

# held after the first event of the reply with calls, until released
my $mock = Test::Agent::MockProvider->new(default => held_calls($calls));

my $log = $t->testdir . '/error.log';

# the location's regex, with rewrite_log, logs each call that runs, with
# the turn's conversation (a subrequest logs to its main request's log)
$t->write_file_expand('nginx.conf', engine_conf($mock, zone => '64m',
    tools => <<'EOF', agent => 'tools echo;', server => <<"EOF"));
    agent_tool echo {
        location /tools/stamp;
    }
EOF
        location = /tools/stamp {
            internal;
            rewrite_log on;
            default_type application/json;

            if (\$http_idempotency_key ~ "^c[0-9]+\$") {
                return 200 '{"msec":"\$msec"}';
            }

            return 400;
        }

$METRICS_LOCATION
EOF

$t->run;

# the conversation's tool results, every page of them

sub results {
    my ($cid) = @_;
    my ($after, @r) = (0);

    for (;;) {
        my $c = inspect($t, $cid, "after=$after&limit=1000")->{json} // {};
        my @m = @{$c->{messages} // []};

        last unless @m;

        push @r, grep { $_->{type} eq 'tool_result' } @m;
        $after = $c->{next_after} // last;
    }

    return \@r;
}

sub tool_requests {
    my ($cid) = @_;
    my %seen;

    open my $fh, '<', $log or return {};
    while (<$fh>) {
        $seen{$1}++ if /matches "(c\d+)", .* conversation: "$cid"/;
    }

    return \%seen;
}

# the whole batch: every call once, over more than one pass

is(send_message($t, 'd1', 'run them')->{status}, 202, 'message accepted');
ok($mock->wait_paused(0, 10), 'the reply with the calls under way');
$mock->release;

is(wait_state($t, 'd1', 'idle', 30)->{state}, 'idle', 'the turn ended');
my $r = results('d1');

is(scalar @$r, $calls, "$calls results");
is(join(',', map { $_->{tool_call_id} } @$r),
   join(',', map { "c$_" } 1 .. $calls),
   'one result a call, in the order of the calls');
is(scalar(grep { $_->{ok} && $_->{result}{msec} } @$r), $calls,
   'each the location\'s answer');

# nginx's cached time, as $msec reads it, moves only between passes
my %passes = map { $_->{ok} ? ($_->{result}{msec} => 1) : () } @$r;

cmp_ok(scalar keys %passes, '>', 1,
       'the calls ran over ' . (keys %passes) . ' passes of the event loop');

my $seen = tool_requests('d1');
is(scalar(grep { ($seen->{"c$_"} // 0) == 1 } 1 .. $calls), $calls,
   'each call\'s location requested once');

my $reqs = $mock->requests;
is(scalar @$reqs, 2, 'the model called again');

my @tool_msgs = grep { $_->{role} eq 'tool' }
                @{$reqs->[1]{json}{messages} // []};
is(scalar @tool_msgs, $calls, 'with every result');

cmp_ok(metric($t, 'agent_turn_steps_later_total'), '>', 0,
       'steps left to later passes');

# a cancel while the calls are dispatched

$mock->reset;

is(send_message($t, 'd2', 'run them')->{status}, 202, 'second message');
ok($mock->wait_paused(0, 10), 'its reply with the calls under way');
$mock->release;

# the reply's last event to the first results
my $deadline = time + 10;
sleep 0.001 while !%{tool_requests('d2')} && time < $deadline;

is(cancel($t, 'd2')->{status}, 200, 'cancel answered');

is(wait_state($t, 'd2', 'idle', 30)->{state}, 'idle', 'cancelled');
$r = results('d2');

is(scalar @$r, $calls, 'every call has its result');
is(join(',', sort map { $_->{tool_call_id} } @$r),
   join(',', sort map { "c$_" } 1 .. $calls), 'one a call');

$seen = tool_requests('d2');

my @ran = grep { $_->{ok} && $_->{result}{msec} } @$r;
my @cancelled = grep { !$_->{ok} && ($_->{error} // '') eq '[cancelled]' }
                @$r;

is(@ran + @cancelled, $calls, 'each result the answer or the cancel');
is(join(',', sort map { $_->{tool_call_id} } @ran),
   join(',', sort keys %$seen),
   'the calls that ran are those the location answered');
is(scalar(grep { $_ != 1 } values %$seen), 0, 'none requested twice');

diag(scalar(@ran) . " calls ran, " . scalar(@cancelled)
     . ' cancelled while dispatched');

sleep 0.3;
is(scalar(keys %{tool_requests('d2')}), scalar @ran,
   'no call ran after the cancel');

$t->stop;

done_testing;
