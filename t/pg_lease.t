#!/usr/bin/perl

# A node's lease (agent_node): n1, paused with SIGSTOP in a turn past
# its ttl, has its conversation taken by n2, whose sweep completes the
# turn; once n1 runs again (SIGCONT) it does not serve nor go on with
# what its zone held: the first request to it is answered 421 with its
# new owner (or 503 until its heartbeat is back), its subscriber's
# stream ends, the tool call its stale reply asked for is not started,
# no event of its epoch is written after the take-over, and a subscriber
# got no event that is not the log's.  n1 then serves its own again.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep time);
use JSON::PP;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::Postgres;

plan(skip_all => Test::Agent::Postgres->missing)
    if Test::Agent::Postgres->missing;

my $pg = Test::Agent::Postgres->new;
my $conninfo = $pg->conninfo;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'a reply', chunks => 2 };
});

# the echo tool, each call of it logged by the node that ran it

my $tool_location = <<'EOF';
        location = /tools/echo {
            internal;
            log_subrequest on;
            access_log tools.log tools;
            default_type application/json;
            return 200 '{"args":$request_body}';
        }
EOF

sub node {
    my ($id) = @_;
    return store_node($mock, $conninfo, $id, tools => $ECHO_TOOL,
                      agent => 'tools echo;', server => $tool_location,
                      http => "log_format tools '\$http_x_agent_conversation"
                              . " \$http_idempotency_key';");
}

sub types {
    my ($cid) = @_;
    return "SELECT string_agg(type, ' ' ORDER BY seq) FROM events"
           . " WHERE conversation = '$cid'";
}

sub tool_calls {
    my ($t) = @_;
    my $log = eval { $t->read_file('tools.log') } // '';
    return [ split /\n/, $log ];
}

my ($n1, $addr1) = node('n1');
my ($n2, $addr2) = node('n2');

is($pg->wait_sql("SELECT count(*) FROM nodes", qr/2/), 2, 'two nodes');

# L1 is n1's, a subscriber of it on n1

is(send_message($n1, 'L1', 'hello')->{status}, 202, 'a message to n1');
wait_state($n1, 'L1', 'idle');
is($pg->sql("SELECT node, epoch FROM conversations WHERE id = 'L1'"),
   'n1|0', 'n1 owns it');

my $sse = events_stream($n1, 'L1');

# a turn on n1 whose reply (a call of echo) is held by the provider

$mock->script({ tool_calls => [{ id => 'call_n1', name => 'echo',
                                 arguments => '{}' }],
                chunks => 3, pause_after => 1 },
              { tool_calls => [{ id => 'call_n2', name => 'echo',
                                 arguments => '{}' }] },
              { text => 'the new owner\'s answer' });
my $first = scalar @{$mock->requests};

is(send_message($n1, 'L1', 'use the tool')->{status}, 202, 'a turn on n1');
$mock->wait_paused($first, 5);

my @paused = ($n1->master_pid, $n1->worker_pids);
kill 'STOP', @paused;
my $stop = time;

is($pg->wait_sql(types('L1'), qr/turn_completed.*turn_completed/, 20),
   'user_msg assistant_msg turn_completed user_msg assistant_msg'
   . ' tool_call tool_result assistant_msg turn_completed',
   'n1 paused: n2 took the turn over and completed it');
is($pg->sql("SELECT node, epoch FROM conversations WHERE id = 'L1'"),
   'n2|1', 'n2 owns it, at a new epoch');
is_deeply(tool_calls($n2), ['L1 call_n2'], 'n2 ran its call of the tool');
diag(sprintf 'taken over %.1f s after the pause', time - $stop);

# n1 runs again: its lease lapsed, it serves nothing of its stale zone

kill 'CONT', @paused;

my $r = inspect($n1, 'L1');
my @statuses = ($r->{status});
while ($r->{status} == 503 && @statuses < 50) {
    like($r->{headers}{'retry-after'} // '', qr/^\d+$/,
         '503 with Retry-After') if @statuses == 1;
    sleep 0.1;
    $r = inspect($n1, 'L1');
    push @statuses, $r->{status};
}
is($r->{status}, 421, 'n1 running again: the first read is 421 ('
   . join(', ', @statuses) . ')');
is($r->{json}{error}{code}, 'owned_elsewhere', 'owned_elsewhere');
is($r->{headers}{'x-agent-owner'}, $addr2, 'naming n2');

# its stale reply comes: the call of echo in it is not started

$mock->release($first);
$mock->wait_closed($first, 5);
sleep 1;

is_deeply(tool_calls($n1), [], 'n1 started no tool call after SIGCONT');

# the subscriber of n1 ends; what it got is the log's

my @got;
while (my $e = $sse->next_event(5)) {
    push @got, $e unless $e->{comment};
}
ok($sse->stream->eof || $sse->stream->finished,
   'n1\'s subscriber\'s stream ended');

my %log = map { split / /, $_, 2 } split /\n/,
    $pg->sql("SELECT seq || ' ' || type FROM events"
             . " WHERE conversation = 'L1' ORDER BY seq");
my @wrong = grep { !defined $_->{id} || ($log{$_->{id}} // '') ne $_->{event} }
            grep { ($_->{id} // '') =~ /^\d+$/ } @got;
is(scalar @wrong, 0, 'every event the subscriber got is in the log')
    or diag(join "\n", map { "got $_->{id} $_->{event}, the log "
                             . ($log{$_->{id}} // 'none') } @wrong);

like($n1->read_file('error.log'), qr/lease lapsed/, 'n1 logged its lapse');

is($pg->sql("SELECT count(*) FROM events WHERE conversation = 'L1'"
            . " AND epoch = 0 AND seq > (SELECT min(seq) FROM events"
            . " WHERE conversation = 'L1' AND epoch = 1)"), 0,
   'no event of n1\'s epoch after the take-over');
is($pg->sql(types('L1')),
   'user_msg assistant_msg turn_completed user_msg assistant_msg'
   . ' tool_call tool_result assistant_msg turn_completed',
   'the log as n2 left it');

# n1's heartbeat is back: it serves and writes its own

is(send_message($n1, 'L2', 'hello again')->{status}, 202,
   'n1 takes a new conversation');
is(wait_state($n1, 'L2', 'idle')->{state}, 'idle', 'and completes its turn');
is(inspect($n1, 'L2')->{status}, 200, 'a read of it on n1 is 200');
is(send_message($n2, 'L2', 'to n2')->{status}, 421, 'n2 sends it to n1');

$n1->stop;
$n2->stop;

done_testing;
