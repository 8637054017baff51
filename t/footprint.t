#!/usr/bin/perl

# The zone's bytes per conversation at rest stay small (invariant 11).  A
# conversation at rest with no subscriber keeps none of its live events:
# its canonical events replace them.  With a store, an idle conversation
# keeps its record alone (1 KB) once written, and one that waits for a
# person its record, its waiting-call slots and its current turn, under
# 4 KB.  A subscriber that watches keeps the live events until it goes.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::SSE;
use Test::Agent::MockProvider;

my $n = 40;

# "ask": a call a person answers; otherwise a reply of 60 deltas

my $reply = join ' ', map { "word$_" } 1 .. 60;

my $mock = Test::Agent::MockProvider->new(default => sub {
    my ($req) = @_;
    my $msgs = $req->{json}{messages} || [];
    my $last = @$msgs ? $msgs->[-1] : {};

    return { tool_calls => [{ id => 'call_1', name => 'ask_user',
                              arguments => '{"question":"ok?"}' }] }
        if ($last->{role} // '') eq 'user'
           && ($last->{content} // '') =~ /^ask/;

    return { text => $reply, chunks => 60 };
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

sub start {
    my ($http) = @_;

    my $t = Test::Agent->new;
    my $db = $t->testdir . '/agent.db';

    $http =~ s/DB/$db/;

    $t->write_file_expand('nginx.conf', engine_conf($mock, zone => '16m',
        tools => $tools, agent => 'tools ask_user;', server => $server,
        http => $http));
    $t->run;

    return $t;
}

sub used {
    my ($t) = @_;
    return decode_json(http_get('/zone', port => $t->port(8080))->{body})
           ->{used};
}

# bytes per conversation over $n of them, each brought to $state

sub per {
    my ($t, $prefix, $text, $state) = @_;

    my $before = used($t);

    for my $i (1 .. $n) {
        is(send_message($t, "$prefix$i", $text)->{status}, 202,
           "$prefix$i sent") or return -1;
    }

    for my $i (1 .. $n) {
        my $c = wait_state($t, "$prefix$i", $state, 20);
        is($c && $c->{state}, $state, "$prefix$i $state") or return -1;
    }

    # the store's writes behind, and what leaves the zone then
    sleep 0.5;

    return (used($t) - $before) / $n;
}

# zone only: the log stays, the 60 deltas of each reply do not

my $t = start('');

my $per = per($t, 'z', 'hello', 'idle');
diag("zone only, idle: $per bytes per conversation");
cmp_ok($per, '<=', 4096, 'zone only: an idle conversation keeps its log, '
                         . 'not its deltas');

# a subscriber watching: the deltas stay while it does, go when it goes

is(send_message($t, 'w1', 'hello')->{status}, 202, 'first message');
wait_state($t, 'w1', 'idle');

my $sse = Test::Agent::SSE->new(http_stream(events_request('w1'),
                                            port => $t->port(8080)));
$sse->events_until(sub { ($_[0]{event} // '') eq 'turn_completed' }, 5);

# a long reply: its deltas fill pages of their own
my $long = join ' ', map { "longer$_" } 1 .. 400;
$mock->script({ text => $long, chunks => 400 });

my $before = used($t);
is(send_message($t, 'w1', 'again')->{status}, 202, 'watched message');

my @ev = $sse->events_until(
    sub { ($_[0]{event} // '') eq 'turn_completed' }, 10);
is(join('', map { decode_json($_->{data})->{delta} }
            grep { ($_->{event} // '') eq 'text_delta' } @ev), $long,
   'the subscriber got the deltas');
wait_state($t, 'w1', 'idle');

my $watched = used($t) - $before;
$sse->stream->close;

my $left;
for (1 .. 50) {
    sleep 0.1;
    $left = used($t) - $before;
    last if $left < $watched;
}

cmp_ok($left, '<', $watched,
       "the deltas leave with the subscriber ($watched, then $left bytes)");

$t->stop;

# with a store: the record alone; a waiting call's turn under 4 KB

$t = start('agent_store DB;');

$per = per($t, 'i', 'hello', 'idle');
diag("with a store, idle: $per bytes per conversation");
cmp_ok($per, '<=', 1024 + 256, 'idle: its record of 1 KB');

$per = per($t, 'a', 'ask', 'awaiting_input');
diag("with a store, one call waiting: $per bytes per conversation");
cmp_ok($per, '<=', 4096, 'one call waiting: under 4 KB');

# the turn is all there when the call is answered

is(resolve($t, 'a1', 'call_1', { result => 'yes' })->{status}, 200,
   'resolved');
my $c = wait_state($t, 'a1', 'idle');
is(join(' ', map { $_->{type} } @{$c->{messages}}),
   'user_msg assistant_msg tool_call suspension resolution tool_result '
   . 'assistant_msg turn_completed', 'the turn went on from the zone');
is($c->{messages}[-2]{content}, $reply, 'to its reply');

$t->stop;

done_testing();
