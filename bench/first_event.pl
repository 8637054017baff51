#!/usr/bin/perl

# What a subscriber waits for its canonical events on a node: one nginx
# with agent_node (canonical events sent once written) and one without
# (sent as they enter the zone), on one PostgreSQL (fsync on).  Per
# nginx FIRST_EVENT_TURNS (100) turns, each of a conversation with a
# subscriber already reading (agent_events): from the message's POST to
# its user_msg on the subscriber, and to the turn's turn_completed (a
# reply of two chunks by the mock).  The user_msg is an input, written
# at once; the turn's other events wait for the batch (agent_store's
# flush=, 10 ms here by default).
#
#   nice -n 10 perl bench/first_event.pl   (make first; TEST_NGINX_* as in t/)

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../t/lib";

use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::Postgres;

my $why = Test::Agent::Postgres->missing;
die "$why\n" if $why;

my $TURNS = $ENV{FIRST_EVENT_TURNS} // 100;

my $pg = Test::Agent::Postgres->new(fsync => 1);
my $conninfo = $pg->conninfo;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'a reply', chunks => 2 };
});

sub nginx {
    my ($node) = @_;

    my $t = Test::Agent->new;
    my $addr = '127.0.0.1:' . $t->port(8080);

    $t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
        http => "agent_store \"$conninfo\";\n"
                . ($node ? "    agent_node id=$node addr=$addr"
                           . " heartbeat=500ms ttl=2s;" : '')));
    $t->run;
    return $t;
}

sub pct {
    my ($v, $p) = @_;
    my @s = sort { $a <=> $b } @$v;
    return $s[int($p / 100 * $#s + 0.5)];
}

for my $case (['without agent_node', undef], ['with agent_node', 'n1']) {
    my $t = nginx($case->[1]);
    my (@first, @last);

    for my $i (1 .. $TURNS) {
        my $cid = ($case->[1] // 'one') . "-$i";

        send_message($t, $cid, 'hello')->{status} == 202 or die "no 202\n";
        wait_state($t, $cid, 'idle');

        my $sse = events_stream($t, $cid);
        $sse->events_until(sub { $_[0]{event} eq 'turn_completed' }, 5);

        # the POST's answer is read after: the stream is read meanwhile

        my $start = time;
        my $post = send_message_later($t, $cid, 'again');

        my ($user, $done);
        while (my $e = $sse->next_event(5)) {
            next if $e->{comment} || !defined $e->{id};
            $user //= $e->{t} if $e->{event} eq 'user_msg';
            if ($e->{event} eq 'turn_completed') {
                $done = $e->{t};
                last;
            }
        }
        die "no turn_completed\n" unless $done && $user;

        close $post;

        push @first, 1000 * ($user - $start);
        push @last, 1000 * ($done - $start);
        $sse->stream->close;
    }

    printf "%-20s user_msg p50 %.1f ms p99 %.1f ms;"
           . " turn_completed p50 %.1f ms p99 %.1f ms (%d turns)\n",
           $case->[0], pct(\@first, 50), pct(\@first, 99),
           pct(\@last, 50), pct(\@last, 99), $TURNS;

    $t->stop;
}
