#!/usr/bin/perl

# The zone's bytes per conversation at rest: idle after a turn, and
# suspended on a call that waits for a person (one waiting call, the
# common case, and four), with and without agent_store, from
# agent_zone_status's used bytes before and after.
#
#   perl bench/zone.pl [conversations]     (make first; TEST_NGINX_* as in t/)

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

my $n = shift // 200;

# "ask N": the model asks N calls of a tool a person answers; otherwise
# it answers with a short text

my $mock = Test::Agent::MockProvider->new(default => sub {
    my ($req) = @_;
    my $msgs = $req->{json}{messages} || [];
    my $last = @$msgs ? $msgs->[-1] : {};
    my ($k) = ($last->{role} // '') eq 'user'
              ? ($last->{content} // '') =~ /^ask (\d+)/ : ();

    return { text => 'A short answer of a few words.' } unless $k;
    return { tool_calls => [ map { { id => "call_$_", name => 'ask_user',
                                     arguments => '{"question":"ok?"}' } }
                             1 .. $k ] };
});

my $tools = <<'EOF';
    agent_tool ask_user {
        executor human;
        timeout 1h;
    }
EOF

my $server = <<'EOF';
        location = /zone {
            agent_zone_status;
        }
EOF

sub used {
    my ($t) = @_;
    return decode_json(http_get('/zone', port => $t->port(8080))->{body})
           ->{used};
}

sub settle {
    my ($t, $prefix, $state) = @_;

    for my $i (1 .. $n) {
        my $c = wait_state($t, "$prefix$i", $state, 20);
        die "$prefix$i: not $state\n"
            unless $c && $c->{state} eq $state;
    }

    # the store's writes behind, then the trim of what was written
    sleep 1;
}

my @rows;

for my $store (0, 1) {
    my $t = Test::Agent->new;
    my $db = $t->testdir . '/agent.db';

    $t->write_file_expand('nginx.conf', engine_conf($mock, zone => '64m',
        tools => $tools, agent => 'tools ask_user;', server => $server,
        http => $store ? "agent_store $db;" : ''));
    $t->run;

    my %per;

    for my $case ([ 'idle', 'hello', 'idle' ],
                  [ 'one waiting call', 'ask 1', 'awaiting_input' ],
                  [ 'four waiting calls', 'ask 4', 'awaiting_input' ])
    {
        my ($name, $text, $state) = @$case;
        my $prefix = substr($text, 0, 1) . ($text =~ /(\d)/ ? $1 : '') . '_';
        my $before = used($t);

        for my $i (1 .. $n) {
            my $r = send_message($t, "$prefix$i", $text);
            die "message: $r->{status}\n" unless $r->{status} == 202;
        }

        settle($t, $prefix, $state);

        $per{$name} = (used($t) - $before) / $n;
    }

    push @rows, [ $store ? 'with agent_store' : 'zone only', \%per ];
    $t->stop;
}

printf "%d conversations each\n", $n;

for my $row (@rows) {
    my ($what, $per) = @$row;
    printf "%-17s idle %6.0f  one waiting call %6.0f  four %6.0f"
           . " bytes per conversation\n",
           $what, $per->{idle}, $per->{'one waiting call'},
           $per->{'four waiting calls'};
}
