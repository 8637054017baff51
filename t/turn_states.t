#!/usr/bin/perl

# The live plane of a turn: state_changed only on real transitions, in
# order, deltas with the message id and a per-message delta seq; a
# reload keeps every conversation, and a turn running across a reload
# completes in the old worker.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::SSE;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2));
$t->run;

my $port = $t->port(8080);

# the first turn creates the conversation; the second is watched live

$mock->script({ text => 'one' });
send_message($t, 's1', 'first');
wait_state($t, 's1', 'idle');

my $sse = Test::Agent::SSE->new(http_stream(events_request('s1',
    'Last-Event-ID' => 3), port => $port));

$mock->script({ text => 'alpha beta gamma', chunks => 3, delay => 0.05 });
send_message($t, 's1', 'second');

my @ev = $sse->events_until(sub { ($_[0]{event} // '') eq 'turn_ended' }, 10);
my @names = map { $_->{event} } @ev;

is($names[0], 'user_msg', 'resumed after seq 3 with the new user_msg');
is($ev[0]{id}, 4, 'its id is its seq');

my @states = map { my $d = decode_json($_->{data}); "$d->{from}>$d->{to}" }
    grep { $_->{event} eq 'state_changed' } @ev;
is_deeply(\@states, ['idle>preparing', 'preparing>streaming',
                     'streaming>idle'],
          'state_changed once per real transition');

my @deltas = map { decode_json($_->{data}) }
    grep { $_->{event} eq 'text_delta' } @ev;
is(join('', map { $_->{delta} } @deltas), 'alpha beta gamma',
   'deltas add up to the reply');
is_deeply([map { $_->{delta_seq} } @deltas], [1 .. @deltas],
          'delta seq per message');
is((grep { $_->{message_id} eq 'msg_2_1' } @deltas), scalar @deltas,
   'deltas carry the message id');

my ($assistant) = grep { $_->{event} eq 'assistant_msg' } @ev;
is(decode_json($assistant->{data})->{message_id}, 'msg_2_1',
   'the logged message has the deltas\' id');

is_deeply([grep { $_ ne 'text_delta' && $_ ne 'state_changed' } @names],
          [qw(user_msg turn_started assistant_msg turn_completed
              turn_ended)],
          'event order of a turn');

$sse->stream->close;

# a reload keeps the zone; a turn running across it completes

$mock->script({ text => 'slow reply', chunks => 2, pause_after => 2 });
send_message($t, 's2', 'during reload');
$mock->wait_paused(2, 5);

ok($t->reload, 'reloaded mid-turn');

$mock->release;

my $c = wait_state($t, 's2', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'the turn completed in the old worker');
is($c->{messages}[1]{content}, 'slow reply', 'whole reply');

$c = inspect($t, 's1')->{json};
is($c->{last_seq}, 6, 'conversations survive the reload');

$mock->script({ text => 'after' });
is(send_message($t, 's1', 'third')->{json}{seq}, 7,
   'seq goes on after the reload');
is(log_types(wait_state($t, 's1', 'idle'), ), 'user_msg assistant_msg '
   . 'turn_completed user_msg assistant_msg turn_completed user_msg '
   . 'assistant_msg turn_completed', 'log after the reload');

$mock->stop;
$t->done;
