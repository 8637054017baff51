#!/usr/bin/perl

# agent_delta_interval: a turn's live deltas go out at most once an
# interval, joined, and the first of a model call goes at once.  The
# subscriber still gets every piece, in order, delta_seq gapless, the
# last delta before the assistant_msg; a delta held when the turn is
# cancelled goes out with the partial reply, not after it.  While a
# delta is held the provider's connection is not read: what it sends
# meanwhile is read when the delta goes, unless the turn is cancelled
# first; and never past the upstream's read timeout.  A kept-alive
# connection left unread serves the next model call.

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

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => 'agent_delta_interval 2s;'));
$t->run;

sub json_of { my $d = eval { decode_json($_[0]{data} // '') }; $d // {} }

sub chunk {
    my ($delta, $finish) = @_;

    return 'data: ' . encode_json({ id => 'chatcmpl-interval',
        object => 'chat.completion.chunk', created => 1, model => 'gpt-test',
        choices => [{ index => 0, delta => $delta,
                      finish_reason => $finish }] }) . "\n\n";
}

sub subscribe {
    my ($cid) = @_;
    return Test::Agent::SSE->new(http_stream(events_request($cid),
                                             port => $t->port(8080)));
}

sub next_of {
    my ($sse, $type, $timeout) = @_;
    my @ev = $sse->events_until(sub { $_[0]{event} eq $type }, $timeout);
    return @ev && $ev[-1]{event} eq $type ? (json_of($ev[-1]), @ev) : ();
}

my @words = map { "w$_ " } 1 .. 40;
my $text = join '', @words;

# the first $n words as a reply, $delay apart
sub words_reply {
    my ($n, $delay) = @_;
    return { raw => [chunk({ role => 'assistant', content => '' }),
                     (map { chunk({ content => $_ }) } @words[0 .. $n - 1]),
                     chunk({}, 'stop'), "data: [DONE]\n\n"],
             delay => $delay };
}

# a message to $t's conversation $cid, its events until the turn ends
sub turn_events {
    my ($tt, $cid, $text) = @_;
    my $status = send_message($tt, $cid, $text)->{status};
    my $s = Test::Agent::SSE->new(http_stream(events_request($cid),
                                              port => $tt->port(8080)));
    my @ev = $s->events_until(sub { $_[0]{event} eq 'turn_ended' }, 15);
    $s->stream->close;
    my ($msg) = map { json_of($_) } grep { $_->{event} eq 'assistant_msg' }
                @ev;
    return ($status, $msg, @ev);
}

###############################################################################

# the first piece, a pause, then 39 pieces 10 ms apart (about 0.4 s, less
# than the interval)

$mock->script({ raw => [chunk({ role => 'assistant', content => '' }),
                        (map { chunk({ content => $_ }) } @words),
                        chunk({}, 'stop'), "data: [DONE]\n\n"],
                delay => 0.01, pause_after => [2], latency => 0.5 });

is(send_message($t, 'one', 'go')->{status}, 202, 'message accepted');
my $sse = subscribe('one');

ok($mock->wait_paused(0, 5), 'the first piece sent, the reply paused');

my $start = time;
my ($first) = next_of($sse, 'text_delta', 1.5);

is($first && $first->{delta}, 'w1 ',
   'the first delta goes at once, not after the interval');
ok(time - $start < 1.5, 'within the interval');

$mock->release(0);

my @rest = $sse->events_until(sub { $_[0]{event} eq 'turn_ended' }, 10);
my @deltas = ($first, map { json_of($_) }
                      grep { $_->{event} eq 'text_delta' } @rest);

is(join('', map { $_->{delta} } @deltas), $text,
   'every piece reaches the subscriber');
is(join(' ', map { $_->{delta_seq} } @deltas),
   join(' ', 1 .. scalar @deltas), 'delta_seq gapless');
ok(@deltas <= 3, 'the 39 pieces after the first are joined ('
                 . scalar(@deltas) . ' deltas in all)');

my @order = map { $_->{event} } @rest;
my ($last_delta) = grep { $order[$_] eq 'text_delta' } reverse 0 .. $#order;
my ($msg) = grep { $order[$_] eq 'assistant_msg' } 0 .. $#order;

ok(defined $msg && defined $last_delta && $last_delta < $msg,
   'the held delta goes before the assistant_msg');
is(json_of($rest[$msg])->{content}, $text, 'the reply is logged whole')
    if defined $msg;

$sse->stream->close;

###############################################################################

# a cancel while a delta is held: it goes with the partial reply; the
# piece sent after the held one was not read, and is not in it

$mock->reset;
$mock->script({ raw => [chunk({ role => 'assistant', content => '' }),
                        (map { chunk({ content => $_ }) } @words[0 .. 4]),
                        chunk({}, 'stop'), "data: [DONE]\n\n"],
                delay => 0.3, pause_after => [4], latency => 0.5 });

is(send_message($t, 'two', 'go')->{status}, 202, 'second message accepted');
$sse = subscribe('two');
ok($mock->wait_paused(0, 5), 'three pieces sent, the reply paused');

($first) = next_of($sse, 'text_delta', 1.5);
like($first && $first->{delta}, qr/^w1 /, 'the first delta at once');

sleep 0.2;
my $c = cancel($t, 'two');
ok($c->{status} == 200 && $c->{json}{cancelled},
   'cancelled while a delta is held');

@rest = $sse->events_until(sub { $_[0]{event} eq 'cancelled' }, 10);

my $partial = join '', $first->{delta}, map { json_of($_)->{delta} }
                                        grep { $_->{event} eq 'text_delta' }
                                        @rest;
my ($kept) = map { json_of($_) } grep { $_->{event} eq 'assistant_msg' }
             @rest;

is($partial, 'w1 w2 ', 'the held piece reached the subscriber, the unread '
                      . 'one did not');
is($kept && $kept->{content}, $partial,
   'and are what the partial reply keeps');
is($kept && $kept->{status}, 'cancelled', 'the reply kept as cancelled');

$sse->stream->close;
$mock->release(0);

###############################################################################

# the worker goes on: a third turn streams whole

$mock->reset;
$mock->script({ text => 'still here' });

is(send_message($t, 'two', 'again')->{status}, 202, 'third message');
$sse = subscribe('two');
my ($done) = grep { $_->{event} eq 'assistant_msg'
                    && json_of($_)->{content} eq 'still here' }
             $sse->events_until(sub { $_[0]{event} eq 'assistant_msg'
                                      && $_[0]{data} =~ /still here/ }, 10);
ok($done, 'the next turn runs');

$sse->stream->close;

$t->stop;

unlike($t->read_file('error.log'), qr/\[(alert|crit|emerg)\]/,
       'no alert in error.log');

###############################################################################

# a read timeout shorter than the interval: the connection is read all
# along, and a provider that sends a piece every 0.4 s does not time out

my $t2 = Test::Agent->new;

$t2->write_file_expand('nginx.conf', engine_conf($mock,
    http => 'agent_delta_interval 2s;',
    provider => 'proxy_read_timeout 1s;'));
$t2->run;

$mock->reset;
$mock->script(words_reply(6, 0.4));

my $status;
($status, $kept) = turn_events($t2, 'slow', 'go');
is($status, 202, 'message accepted');
is($kept && $kept->{content}, join('', @words[0 .. 5]),
   'the reply is whole, the upstream did not time out');

$t2->stop;

unlike($t2->read_file('error.log'), qr/timed out|\[(alert|crit|emerg)\]/,
       'no timeout in error.log');

###############################################################################

# a kept-alive provider connection that was left unread goes back to the
# upstream's cache and serves the next model call

my $t3 = Test::Agent->new;
my $mport = $mock->port;
my $conf = engine_conf($mock, http => "agent_delta_interval 100ms;
    upstream llm {
        server 127.0.0.1:$mport;
        keepalive 2;
    }");

$conf =~ s{proxy_pass http://127\.0\.0\.1:$mport}{proxy_pass http://llm}
    or die 'no proxy_pass to the mock';
$t3->write_file_expand('nginx.conf', $conf);
$t3->run;

$mock->reset;

for my $n (1, 2) {
    $mock->script(words_reply(8, 0.03));

    my ($st, $msg, @ev) = turn_events($t3, 'kept', "go $n");
    my @held = grep { $_->{event} eq 'text_delta' } @ev;

    is($st, 202, "message $n");
    is($msg && $msg->{content}, join('', @words[0 .. 7]), "reply $n whole");
    ok(@held >= 1 && @held < 8, "reply $n: its 8 pieces in "
                                . scalar(@held) . ' deltas');
}

my @conns = map { $_->{connection} } @{ $mock->requests };
is(scalar(@conns), 2, 'two model calls');
is($conns[1], $conns[0], 'the second on the first one\'s connection');

$t3->stop;

unlike($t3->read_file('error.log'), qr/\[(alert|crit|emerg)\]/,
       'no alert in error.log');

done_testing;
