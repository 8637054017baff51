#!/usr/bin/perl

# agent_delta_interval unset: a worker that streams one reply sends each
# of its pieces as its own live delta, at once; one that streams many at
# once (more pieces of replies than it can take one by one) joins each
# turn's pieces over a short interval.  Either way every piece reaches
# the subscriber, in order, delta_seq gapless, the last delta before the
# assistant_msg, and the reply is logged whole.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::SSE;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

$t->write_file_expand('nginx.conf', engine_conf($mock));
$t->run;

sub json_of { my $d = eval { decode_json($_[0]{data} // '') }; $d // {} }

sub chunk {
    my ($delta, $finish) = @_;

    return 'data: ' . encode_json({ id => 'chatcmpl-auto',
        object => 'chat.completion.chunk', created => 1, model => 'gpt-test',
        choices => [{ index => 0, delta => $delta,
                      finish_reason => $finish }] }) . "\n\n";
}

# $n words, $delay apart, after $latency
sub words_reply {
    my ($n, $delay, $latency) = @_;
    return { raw => [chunk({ role => 'assistant', content => '' }),
                     (map { chunk({ content => "w$_ " }) } 1 .. $n),
                     chunk({}, 'stop'), "data: [DONE]\n\n"],
             delay => $delay, latency => $latency };
}

# the turns of @cids, each subscribed to before its reply starts, run at
# once; their text_deltas and assistant_msgs, by conversation
sub run_turns {
    my (@cids) = @_;
    my (%sse, %deltas, %order, %msg);

    for my $cid (@cids) {
        is(send_message($t, $cid, 'go')->{status}, 202, "$cid: accepted");
        $sse{$cid} = Test::Agent::SSE->new(http_stream(events_request($cid),
                                           port => $t->port(8080)));
    }

    for my $cid (@cids) {
        my @ev = $sse{$cid}->events_until(
            sub { $_[0]{event} eq 'turn_ended' }, 20);

        $sse{$cid}->stream->close;

        $deltas{$cid} = [map { json_of($_) }
                         grep { $_->{event} eq 'text_delta' } @ev];
        $order{$cid} = [map { $_->{event} } @ev];
        ($msg{$cid}) = map { json_of($_) }
                       grep { $_->{event} eq 'assistant_msg' } @ev;
    }

    return (\%deltas, \%order, \%msg);
}

# every piece, in order, gapless, before the assistant_msg
sub whole {
    my ($cid, $n, $deltas, $order, $msg) = @_;
    my $text = join '', map { "w$_ " } 1 .. $n;
    my @d = @{ $deltas->{$cid} };
    my @o = @{ $order->{$cid} };
    my ($last) = grep { $o[$_] eq 'text_delta' } reverse 0 .. $#o;
    my ($m) = grep { $o[$_] eq 'assistant_msg' } 0 .. $#o;

    is(join('', map { $_->{delta} } @d), $text,
       "$cid: every piece reaches the subscriber, in order");
    is(join(' ', map { $_->{delta_seq} } @d), join(' ', 1 .. scalar @d),
       "$cid: delta_seq gapless");
    ok(defined $m && defined $last && $last < $m,
       "$cid: the last delta before the assistant_msg");
    is($msg->{$cid} && $msg->{$cid}{content}, $text,
       "$cid: the reply is logged whole");
}

###############################################################################

# one reply alone in the worker, its 40 pieces 3 ms apart: each its own
# delta (a pass of the event loop longer than 3 ms may join two)

$mock->script(words_reply(40, 0.003, 0.5));

my ($deltas, $order, $msg) = run_turns('alone');

whole('alone', 40, $deltas, $order, $msg);

my $alone = scalar @{ $deltas->{alone} };

ok($alone >= 30, "one reply: its 40 pieces in $alone deltas, not joined");

###############################################################################

# eight replies at once, each of 200 pieces 1 ms apart: the worker takes
# in some eight pieces a millisecond, and joins each reply's pieces

my @many = map { "many$_" } 1 .. 8;

$mock->reset;
$mock->script(map { words_reply(200, 0.001, 0.5) } @many);

($deltas, $order, $msg) = run_turns(@many);

my $total = 0;

for my $cid (@many) {
    whole($cid, 200, $deltas, $order, $msg);
    $total += @{ $deltas->{$cid} };
}

ok($total < 8 * 200 / 2, "eight replies at once: their 1600 pieces in "
                         . "$total deltas, joined");

###############################################################################

# alone again: the worker is idle, each piece goes at once again

$mock->reset;
$mock->script(words_reply(40, 0.003, 0.5));

($deltas, $order, $msg) = run_turns('after');

whole('after', 40, $deltas, $order, $msg);

my $after = scalar @{ $deltas->{after} };

ok($after >= 30, "alone again: 40 pieces in $after deltas, not joined");

$t->stop;

unlike($t->read_file('error.log'), qr/\[(alert|crit|emerg)\]/,
       'no alert in error.log');

done_testing;
