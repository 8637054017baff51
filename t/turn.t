#!/usr/bin/perl

# A turn: the message is taken at once, the turn runs on its own request,
# streams from the provider and records the reply in the log.  One turn
# at a time per conversation; provider failures end the turn with the
# reason; bad input changes nothing.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => 'client_body_buffer_size 4k; client_max_body_size 1m;'
        . ' lingering_timeout 300ms;',
    provider => 'proxy_read_timeout 1s;'));
$t->run;

# a plain turn; the reply held after its first piece until the message
# is answered

$mock->script({ text => 'Hello there, friend.', chunks => 4, delay => 0.05,
                usage => { prompt_tokens => 12, completion_tokens => 4 },
                pause_after => 2 });

my $r = send_message($t, 'c1', 'hi');

is($r->{status}, 202, 'message accepted');
is_deeply($r->{json}, { conversation => 'c1', turn => 1, seq => 1 },
          'answer names the conversation, turn and seq');
ok(!($mock->requests->[0] // {})->{finished},
   'answered before the provider finished');
ok($mock->wait_paused(0, 10), 'the reply held');
$mock->release(0);

my $c = wait_state($t, 'c1', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed', 'log of a turn');
is_deeply([map { $_->{seq} } @{$c->{messages}}], [1, 2, 3], 'gapless seq');

my ($user, $assistant) = @{$c->{messages}};
is($user->{content}, 'hi', 'user message logged');
cmp_ok(abs($user->{ts} / 1000 - time), '<', 60, 'ts in epoch ms');
is($assistant->{content}, 'Hello there, friend.', 'reply assembled');
is($assistant->{status}, 'complete', 'reply complete');
is($assistant->{finish_reason}, 'stop', 'finish reason');
is_deeply($assistant->{usage}, { input_tokens => 12, output_tokens => 4 },
          'usage recorded');
is($c->{turn}, 1, 'one turn');

my $req = $mock->requests->[0];
is($req->{method}, 'POST', 'provider got a POST');
is($req->{headers}{'content-type'}, 'application/json', 'JSON body');
is($req->{json}{model}, 'gpt-test', 'model');
ok($req->{json}{stream}, 'streaming asked for');
ok($req->{json}{stream_options}{include_usage}, 'usage asked for');
is_deeply($req->{json}{messages},
          [{ role => 'system', content => 'You are terse.' },
           { role => 'user', content => 'hi' }],
          'system prompt and the user message');

# the second turn carries the first in its context

$mock->script({ text => 'Again.' });
is(send_message($t, 'c1', 'more')->{json}{seq}, 4, 'second message seq');
$c = wait_state($t, 'c1', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed user_msg '
   . 'assistant_msg turn_completed', 'second turn logged');
is_deeply([map { $_->{role} } @{$mock->requests->[1]{json}{messages}}],
          [qw(system user assistant user)], 'history sent to the provider');

# one turn at a time: 409 with the state, and nothing changes

$mock->script({ text => 'slow', chunks => 2, pause_after => 1 });
is(send_message($t, 'c2', 'first')->{status}, 202, 'turn started');
$mock->wait_paused(2, 5);

$r = send_message($t, 'c2', 'second');
is($r->{status}, 409, 'busy conversation answers 409');
is($r->{json}{error}{code}, 'busy', 'error code');
is($r->{json}{error}{state}, 'streaming', 'current state given');

$mock->release;
$c = wait_state($t, 'c2', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'the refused message left no trace');

# a repeated source_id is taken once

$mock->script({ text => 'once' });
$r = send_message($t, 'c3', 'x', source_id => 'client-1');
is($r->{status}, 202, 'first send');
wait_state($t, 'c3', 'idle');
$r = send_message($t, 'c3', 'x', source_id => 'client-1');
is($r->{status}, 200, 'resend answered 200');
ok($r->{json}{duplicate}, 'resend marked duplicate');
is($r->{json}{seq}, 1, 'resend names the original seq');
is(scalar @{inspect($t, 'c3')->{json}{messages}}, 3,
   'resend changed nothing');

# the sender goes away: the turn goes on

$mock->script({ text => 'a b c d', chunks => 4, delay => 0.2 });

my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                              PeerPort => $t->port(8080));
print $s http_request('POST', '/c/c4/messages', '{"content":"bye"}',
                      headers => { 'Content-Type' => 'application/json' });
close $s;

$c = wait_state($t, 'c4', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'turn completed after its sender left');
is($c->{messages}[1]{content}, 'a b c d', 'whole reply');

# a reply that takes longer than lingering_timeout, which nginx arms on
# the turn's connection when the provider subrequest starts

$mock->script({ text => 'slow but sure', chunks => 4, delay => 0.25 });
my $calls = @{$mock->requests};
send_message($t, 'c5', 'take your time');
$c = wait_state($t, 'c5', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'a long reply completes');
is($c->{messages}[1]{content}, 'slow but sure', 'in one model call');
is(scalar @{$mock->requests}, $calls + 1, 'the worker did not die with it');

# provider failures

$mock->reset;
$mock->script({ status => 500 }, { text => 'recovered' });
send_message($t, 'f1', 'x');
$c = wait_state($t, 'f1', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed',
   '500 before the first token is retried');
is($c->{messages}[1]{content}, 'recovered', 'retried reply');
is(scalar @{$mock->requests}, 2, 'two provider calls');

$mock->reset;
$mock->script({ status => 429, retry_after => 1 }, { text => 'later' });
my $start = time;
send_message($t, 'f2', 'x');
$c = wait_state($t, 'f2', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed', '429 retried');
my $gap = $mock->requests->[1]{received_at} - $mock->requests->[0]{received_at};
cmp_ok($gap, '>=', 0.15, 'retry waited (Retry-After, up to the cap)');

$mock->reset;
$mock->script({ status => 400, error => { message => 'bad model' } });
send_message($t, 'f3', 'x');
$c = wait_state($t, 'f3', 'idle');
is(log_types($c), 'user_msg turn_failed', '400 ends the turn');
is($c->{messages}[1]{status}, 400, 'status in turn_failed');
like($c->{messages}[1]{error}, qr/bad model/, 'provider error kept');
is(scalar @{$mock->requests}, 1, '400 not retried');

$mock->reset;
$mock->script({ text => 'partial answer here', chunks => 6, error_after => 4 });
send_message($t, 'f4', 'x');
$c = wait_state($t, 'f4', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_failed',
   'error mid-stream ends the turn');
is($c->{messages}[1]{status}, 'interrupted', 'partial kept, interrupted');
ok(length $c->{messages}[1]{content}, 'partial text kept');
like($c->{messages}[2]{reason}, qr/mid-stream/, 'reason given');
is(scalar @{$mock->requests}, 1, 'not retried after the first token');

$mock->reset;
$mock->script({ text => 'stalls now', chunks => 4, stall_after => 3 });
$start = time;
send_message($t, 'f5', 'x');
$c = wait_state($t, 'f5', 'idle', 10);
is(log_types($c), 'user_msg assistant_msg turn_failed', 'stall fails');
like($c->{messages}[2]{reason}, qr/timed out/, 'reason');
cmp_ok($c->{messages}[2]{ts} / 1000 - $start, '>=', 0.9,
       'after proxy_read_timeout');
ok($mock->wait_closed(0, 5), 'provider connection closed');

# bad input: a clear 4xx, nothing changes

$r = send_message($t, 'b1', undef, body => '{"content":');
is($r->{status}, 400, 'malformed JSON');
is($r->{json}{error}{code}, 'invalid_message', 'error code');

$r = send_message($t, 'b1', undef, body => '{"text":"x"}');
is($r->{status}, 400, 'missing content');

$r = send_message($t, 'b1', undef, body => '["x"]');
is($r->{status}, 400, 'not an object');

$r = send_message($t, 'b1', undef,
                  body => encode_json({ content => 'x' x 8000 }));
is($r->{status}, 413, 'oversized body');
is($r->{json}{error}{code}, 'too_large', 'too large error');

is(inspect($t, 'b1')->{status}, 404, 'no conversation was created');

$r = http_get('/c/c1/messages', port => $t->port(8080));
is($r->{status}, 405, 'GET on the message location');
is($r->{headers}{allow}, 'POST', 'Allow header');

$r = send_message($t, 'bad%20id', 'x');
is($r->{status}, 400, 'invalid conversation id');

is(inspect($t, 'nope')->{status}, 404, 'unknown conversation');
is(inspect($t, 'c1', 'after=3&limit=2')->{json}{messages}[0]{seq}, 4,
   'inspect pages by seq');

$mock->stop;
$t->done;
