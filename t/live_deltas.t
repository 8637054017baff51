#!/usr/bin/perl

# Live deltas reach every subscriber that keeps up, whatever the
# provider's writes: a reply whose pieces all come in one read, or in a
# few bursts, reaches a subscriber on the worker running the turn and one
# on another worker whole, in order, with delta_seq gapless from 1.  The
# pieces of one pass of the event loop are joined into a few deltas.  A
# subscriber that does not keep up (here its worker is stopped while the
# reply streams) misses deltas, never from the middle of a message: it
# gets the reply so far as a streaming_message, then the deltas after it.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::SSE;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

# 8081: reuseport, so that the kernel spreads subscribers over both
# workers; every answer names the worker that gave it

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    zone => '4m',
    server => "listen 127.0.0.1:%%PORT_8081%% reuseport;\n"
        . "        add_header X-Worker \$pid always;\n"));
$t->run;

my $spread = $t->port(8081);

sub json_of { my $d = eval { decode_json($_[0]{data} // '') }; $d // {} }

sub subscribe_on {
    my ($cid, $port) = @_;
    return Test::Agent::SSE->new(http_stream(events_request($cid),
                                             port => $port));
}

# a subscriber served by the worker wanted (or by any other, with '!')

sub subscribe_worker {
    my ($cid, $want) = @_;
    my ($not, $pid) = $want =~ /^(!?)(\d+)$/;

    for (1 .. 50) {
        my $sse = subscribe_on($cid, $spread);
        my $got = $sse->stream->header('x-worker') // '';
        return ($sse, $got) if $not ? $got ne $pid : $got eq $pid;
        $sse->stream->close;
    }

    return;
}

sub wait_lease {
    my ($cid) = @_;

    for (1 .. 250) {
        my $c = inspect($t, $cid)->{json};
        return $c->{lease} if $c && $c->{lease};
        sleep 0.02;
    }

    return 0;
}

sub until_ended {
    my ($sse) = @_;
    return $sse->events_until(sub { $_[0]{event} eq 'turn_ended' }, 15);
}

# the reply is held before its first piece until the subscribers have the
# log so far, then released

sub start_reply {
    my (@sses) = @_;

    $_->events_until(sub { $_[0]{event} eq 'user_msg' }, 10) for @sses;
    ok($mock->wait_paused(0, 10), 'the reply held before it starts');
    $mock->release(0);
}

sub chunk {
    my ($delta, $finish) = @_;

    return 'data: ' . encode_json({ id => 'chatcmpl-live',
        object => 'chat.completion.chunk', created => 1, model => 'gpt-test',
        choices => [{ index => 0, delta => $delta,
                      finish_reason => $finish }] }) . "\n\n";
}

# a reply of thinking then text, each piece its own SSE event

sub reply_events {
    my ($thinking, $text, $size) = @_;

    return (chunk({ role => 'assistant', content => '' }),
            (map { chunk({ reasoning_content => $_ }) }
                 $thinking =~ /(.{1,$size})/gs),
            (map { chunk({ content => $_ }) } $text =~ /(.{1,$size})/gs),
            chunk({}, 'stop'),
            "data: [DONE]\n\n");
}

# what a subscriber made of the message: the deltas in order, and
# whether their delta_seq runs from one on without a gap

sub deltas {
    my ($id, @ev) = @_;

    return map { json_of($_) }
           grep { $_->{event} =~ /^(text|thinking)_delta$/
                  && json_of($_)->{message_id} eq $id } @ev;
}

sub gapless {
    my ($from, @d) = @_;
    return @d && join(' ', map { $_->{delta_seq} } @d)
                 eq join(' ', $from .. $from + $#d);
}

sub text_of {
    my ($type, @ev) = @_;
    return join '', map { json_of($_)->{delta} }
                    grep { $_->{event} eq "${type}_delta" } @ev;
}

my $text = join ' ', map { "word$_" } 1 .. 130;         # 779 characters
my $thinking = join ' ', map { "step$_" } 1 .. 60;      # 359 characters

###############################################################################

# the whole reply in one write: 229 pieces in a single read

$mock->script({ raw => [reply_events($thinking, $text, 5)],
                pause_after => 0 });

send_message($t, 'one', 'go');

my $lease = wait_lease('one');
my ($same) = subscribe_worker('one', $lease);
my ($other) = subscribe_worker('one', "!$lease");

ok($same && $other, 'subscribers on both workers before the reply');
start_reply($same, $other);

my @same = until_ended($same);
my @other = until_ended($other);

my ($logged) = map { json_of($_) } grep { $_->{event} eq 'assistant_msg' }
               @same;

is($logged->{content}, $text, 'the reply is logged whole');

for ([ 'the worker running the turn', \@same ],
     [ 'another worker', \@other ])
{
    my ($who, $ev) = @$_;

    is(text_of('text', @$ev), $text, "$who: every text delta");
    is(text_of('thinking', @$ev), $thinking, "$who: every thinking delta");
    ok(gapless(1, deltas('msg_1_1', @$ev)), "$who: delta_seq gapless");
    ok(!(grep { $_->{event} eq 'streaming_message' } @$ev),
       "$who: kept up, no streaming_message");
}

# how many reads the pieces took depends on the machine's load; pieces
# that arrived together are joined

my $n = () = deltas('msg_1_1', @same);
ok($n < 229 / 2, "229 pieces written at once make fewer deltas ($n)");

$_->stream->close for $same, $other;

###############################################################################

# bursts: the reply comes in five writes of many pieces each

$mock->reset;
$mock->script({ raw => [reply_events($thinking, $text, 3)],
                pause_after => [0, 60, 140, 220, 300] });

send_message($t, 'bursts', 'go');

$lease = wait_lease('bursts');
($same) = subscribe_worker('bursts', $lease);
($other) = subscribe_worker('bursts', "!$lease");
start_reply($same, $other);

for my $i (1 .. 4) {
    ok($mock->wait_paused(0, 5), "burst $i held");
    sleep 0.1;
    $mock->release(0);
}

@same = until_ended($same);
@other = until_ended($other);

for ([ 'the worker running the turn', \@same ],
     [ 'another worker', \@other ])
{
    my ($who, $ev) = @$_;

    is(text_of('text', @$ev), $text, "bursts, $who: every text delta");
    is(text_of('thinking', @$ev), $thinking,
       "bursts, $who: every thinking delta");
    ok(gapless(1, deltas('msg_1_1', @$ev)), "bursts, $who: gapless");
}

$_->stream->close for $same, $other;

###############################################################################

# a subscriber that does not keep up: its worker is stopped while 180
# deltas of 400 bytes stream (more than the 64 KB of live events a
# conversation keeps), and runs again while the reply still streams

my $long = join '', map { sprintf '%-399d|', $_ } 1 .. 220;

$mock->reset;
$mock->script({ raw => [reply_events('', $long, 400)],
                delay => 0.005, pause_after => [0, 20, 200] });

send_message($t, 'slow', 'go');

$lease = wait_lease('slow');
my ($slow, $pid) = subscribe_worker('slow', "!$lease");
start_reply($slow);

ok($mock->wait_paused(0, 5), 'the reply started');
sleep 0.3;

ok(kill('STOP', $pid), 'the subscriber\'s worker stopped');
$mock->release(0);
sleep 0.2;
ok($mock->wait_paused(0, 10), '180 more deltas streamed meanwhile');
kill 'CONT', $pid;
sleep 0.5;
$mock->release(0);

my @slow = until_ended($slow);
my ($snap) = map { json_of($_) }
             grep { $_->{event} eq 'streaming_message' } @slow;

ok($snap, 'a streaming_message in place of the deltas it missed');

my @after;
my $seen = 0;

for (@slow) {
    $seen = 1, next if $_->{event} eq 'streaming_message';
    push @after, json_of($_) if $seen && $_->{event} eq 'text_delta';
}

is(($snap->{text} // '') . join('', map { $_->{delta} } @after), $long,
   'the reply so far and the deltas after it make the reply');
ok(@after && gapless(($snap->{delta_seq} // 0) + 1, @after),
   'the deltas after it go on from its delta_seq');

($logged) = map { json_of($_) } grep { $_->{event} eq 'assistant_msg' }
            @slow;
is($logged->{content}, $long, 'the slow subscriber gets the reply logged');

$slow->stream->close;

$t->stop;
unlike($t->read_file('error.log'), qr/\[(alert|crit|emerg)\]|Sanitizer/,
       'no alerts, crits or sanitizer reports');

done_testing;
