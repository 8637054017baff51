#!/usr/bin/perl

# The reply so far: while a model call streams, agent_inspect shows it as
# streaming_message, and a subscriber that comes in mid-reply, on any
# worker and whatever its Last-Event-ID, gets it as a streaming_message
# live event after the canonical events it replays, then the deltas that
# follow it: none missing, none twice, so that the snapshot and the
# deltas after it make the reply that is logged.  The snapshot lives in
# the shared zone: it goes with the reply's assistant_msg, starts again
# when a take-over makes the model call again, and a reply larger than
# its bound, or one a full zone cannot hold, has none rather than a
# wrong one.

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
# workers; every answer names the worker that gave it.  /small/: event
# streams with the smallest buffer

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    zone => '4m',
    server => "listen 127.0.0.1:%%PORT_8081%% reuseport;\n"
        . "        add_header X-Worker \$pid always;\n"
        . '        location ~ ^/small/c/(?<cid>[^/]+)/events$ {
            agent chat;
            agent_conversation $cid;
            agent_events;
            agent_events_buffer 16k;
        }'));
$t->run;

my $spread = $t->port(8081);

sub json_of { my $d = eval { decode_json($_[0]{data} // '') }; $d // {} }

sub subscribe {
    my ($cid, %opts) = @_;

    my $req = events_request($cid, %{$opts{headers} || {}});
    $req =~ s{^GET }{GET /small} if $opts{small};

    return Test::Agent::SSE->new(http_stream($req,
        port => $opts{port} // $t->port(8080)));
}

# a subscriber served by a worker other than the one running the turn

sub subscribe_elsewhere {
    my ($cid, $pid, %headers) = @_;

    for (1 .. 50) {
        my $sse = subscribe($cid, headers => \%headers, port => $spread);
        return $sse if ($sse->stream->header('x-worker') // '') ne $pid;
        $sse->stream->close;
    }

    return undef;
}

# what a subscriber gets until the turn ends, heartbeats and the state
# changes left out

sub until_ended {
    my ($sse) = @_;

    return grep { $_->{event} !~ /^(state_changed|turn_started)$/ }
           $sse->events_until(sub { $_[0]{event} eq 'turn_ended' }, 10);
}

# polls inspect until the callback accepts the conversation

sub inspect_until {
    my ($cid, $cond, $timeout) = @_;

    my $deadline = time + ($timeout // 10);
    my $c;

    while (time < $deadline) {
        $c = inspect($t, $cid)->{json};
        return $c if $c && $cond->($c);
        sleep 0.02;
    }

    return $c;
}

# the reply so far holds this text (and these arguments of its calls):
# the pieces that reach the worker in one pass of its event loop are one
# delta, so their count is not known

sub streaming_with {
    my ($text, @args) = @_;

    return sub {
        my $sm = $_[0]{streaming_message} or return 0;
        return ($sm->{text} // '') eq $text
               && join('|', map { $_->{arguments} } @{$sm->{tool_calls} || []})
                  eq join('|', @args);
    };
}

sub chunk {
    my ($delta, $finish) = @_;

    return 'data: ' . encode_json({ id => 'chatcmpl-snap',
        object => 'chat.completion.chunk', created => 1, model => 'gpt-test',
        choices => [{ index => 0, delta => $delta,
                      finish_reason => $finish }] }) . "\n\n";
}

sub deltas_of {
    my ($type, @ev) = @_;
    return map { json_of($_) } grep { $_->{event} =~ /^($type)$/ } @ev;
}

# a reply of n pieces of 100 bytes, held after 10 of them, then after
# n - 1: the snapshot is there at first, gone at last; returns the text.
# The pieces come as fast as the mock sends them: paced, 2700 of them
# took more than 30 s on a loaded machine

sub given_up {
    my ($cid, $n, $what) = @_;

    my $text = join '', map { sprintf '%-99d|', $_ } 1 .. $n;

    $mock->reset;
    $mock->script({ text => $text, chunks => $n,
                    pause_after => [11, $n - 1] });

    send_message($t, $cid, 'a lot');
    ok($mock->wait_paused(0, 30), "$what: held early");

    my $c = inspect_until($cid, streaming_with(substr($text, 0, 1000)));
    is(length($c->{streaming_message}{text} // ''), 1000,
       "$what: the snapshot so far");

    $mock->release(0);
    ok($mock->wait_paused(0, 30), "$what: held late");

    $c = inspect_until($cid, sub { !exists $_[0]{streaming_message} });
    ok(!exists $c->{streaming_message}, "$what: no streaming_message");

    return $text;
}

sub consecutive {
    my ($from, @d) = @_;
    return join(' ', map { $_->{delta_seq} } @d)
           eq join(' ', $from .. $from + $#d);
}

###############################################################################

# text and thinking: the reply is held after four deltas (each its own
# write: deltas that arrive in one read are joined)

$mock->script({ raw => [
    chunk({ role => 'assistant', content => '' }),
    chunk({ reasoning_content => 'Let me ' }),
    chunk({ reasoning_content => 'think.' }),
    chunk({ content => "Hello \"big\"\n" }),
    chunk({ content => 'wor' }),
    chunk({ content => 'ld, ' }),
    chunk({ content => 'all!' }),
    chunk({}, 'stop'),
    "data: [DONE]\n\n",
], pause_after => [0, 5], delay => 0.02 });

is(send_message($t, 's1', 'hi')->{status}, 202, 'message sent');

# before the reply starts (held before its first piece until then)
my $early = subscribe('s1');
$early->events_until(sub { $_[0]{event} eq 'user_msg' }, 10);
ok($mock->wait_paused(0, 5), 'reply held before it starts');
$mock->release(0);
ok($mock->wait_paused(0, 5), 'reply held mid-stream');

my $c = inspect_until('s1', streaming_with("Hello \"big\"\nwor"));
my $sm = $c->{streaming_message};
my $held = $sm->{delta_seq} // 0;
is($c->{state}, 'streaming', 'streaming');
is($sm->{message_id}, 'msg_1_1', 'streaming_message: message_id');
ok($held >= 2 && $held <= 4, 'streaming_message: the last delta it holds');
is($sm->{text}, "Hello \"big\"\nwor", 'streaming_message: the text so far');
is($sm->{thinking}, 'Let me think.', 'streaming_message: the thinking');
ok(!exists $sm->{tool_calls}, 'no tool calls');

my $pid = $c->{lease};

my $other = subscribe_elsewhere('s1', $pid);
ok($other, 'a subscriber on the worker not running the turn');

my $resumed = subscribe_elsewhere('s1', $pid, 'Last-Event-ID' => 1);

$mock->release(0);

my @ev = until_ended($other);
my @canon = grep { defined $_->{id} } @ev;

is(join(' ', map { $_->{event} } @ev[0 .. 1]), 'user_msg streaming_message',
   'the log first, then the reply so far');
ok(!defined $ev[1]{id}, 'streaming_message is a live event: no id');

my $snap = json_of($ev[1]);
is($snap->{type}, 'streaming_message', 'type');
is($snap->{turn}, 1, 'turn');
is_deeply([@$snap{qw(message_id delta_seq text thinking)}],
          ['msg_1_1', $held, "Hello \"big\"\nwor", 'Let me think.'],
          'the same as inspect');

my @after = deltas_of('text_delta', @ev);
ok(consecutive($held + 1, @after), 'then the deltas after it, none missing, '
   . 'none twice');
ok(!(grep { $_->{message_id} ne 'msg_1_1' } @after), 'of the same message');

my ($reply) = grep { $_->{event} eq 'assistant_msg' } @canon;
is($snap->{text} . join('', map { $_->{delta} } @after),
   "Hello \"big\"\nworld, all!", 'snapshot and deltas make the reply');
is(json_of($reply)->{content}, "Hello \"big\"\nworld, all!",
   'as logged');

# resumed after the user_msg: the reply so far comes first

@ev = until_ended($resumed);
is($ev[0]{event}, 'streaming_message', 'Last-Event-ID 1: the reply so far '
   . 'first');
is(json_of($ev[0])->{text} . join('', map { $_->{delta} }
                                      deltas_of('text_delta', @ev)),
   "Hello \"big\"\nworld, all!", 'and with the deltas, the reply');

# a subscriber from before the reply started needs no snapshot: it got
# every delta

@ev = until_ended($early);
ok(!(grep { $_->{event} eq 'streaming_message' } @ev),
   'no streaming_message for a subscriber that saw the reply start');

my @all = deltas_of('thinking_delta|text_delta', @ev);
ok(consecutive(1, @all), 'it got every delta');
is(join('', map { $_->{delta} } grep { $_->{delta_seq} <= $held } @all),
   "Let me think.Hello \"big\"\nwor", 'the snapshot held the deltas it '
   . 'names');

$c = wait_state($t, 's1', 'idle');
ok(!exists $c->{streaming_message}, 'after the reply: no streaming_message');

$_->stream->close for $early, $other, $resumed;

###############################################################################

# tool call arguments so far; the next model call has nothing streamed
# before its first delta

$mock->reset;
$mock->script({ text => 'Checking.', chunks => 1,
                tool_calls => [
                    { id => 'call_a', name => 'lookup',
                      arguments => '{"city":"Paris"}', chunks => 2 },
                    { id => 'call_b', name => 'lookup',
                      arguments => '{"city":"Rome"}', chunks => 2 }],
                pause_after => 7, delay => 0.02 },
              { text => 'Sorry.', pause_after => 1 });

send_message($t, 's2', 'weather?');
ok($mock->wait_paused(0, 5), 'tool calls held mid-stream');

$c = inspect_until('s2', streaming_with('Checking.', '{"city":"Paris"}',
                                        '{"city":'));
$sm = $c->{streaming_message};
$held = $sm->{delta_seq} // 0;
is($sm->{text}, 'Checking.', 'text before the calls');
is_deeply($sm->{tool_calls}, [{ index => 0, arguments => '{"city":"Paris"}' },
                              { index => 1, arguments => '{"city":' }],
          'the arguments so far, by call');
ok(!exists $sm->{thinking}, 'no thinking');

$other = subscribe_elsewhere('s2', $c->{lease});
$mock->release(0);

ok($mock->wait_paused(1, 5), 'the next model call held before any delta');

$c = inspect_until('s2', sub { log_types($_[0]) =~ /tool_result/ });
is($c->{state}, 'streaming', 'the next model call streams');
ok(!exists $c->{streaming_message}, 'nothing of it yet: no '
   . 'streaming_message, nor the last one');

$mock->release(1);

@ev = until_ended($other);
$snap = json_of((grep { $_->{event} eq 'streaming_message' } @ev)[0]);
my @args = deltas_of('tool_call_delta', @ev);
my @calls = map { json_of($_) } grep { $_->{event} eq 'tool_call' } @ev;

is(scalar @calls, 2, 'two calls logged');
is($snap->{tool_calls}[1]{arguments}
   . join('', map { $_->{delta} } grep { $_->{index} == 1 } @args),
   $calls[1]{arguments}, 'snapshot and deltas make the arguments');
ok(!(grep { $_->{index} == 0 } @args), 'none of the first call again');
is($snap->{delta_seq}, $held, 'the snapshot as inspect showed it');
ok(consecutive($held + 1, grep { $_->{message_id} eq 'msg_1_1' } @args),
   'the deltas after the snapshot');

wait_state($t, 's2', 'idle');
$other->stream->close;

###############################################################################

# a reply larger than the bound (32 KiB) has no snapshot past it, and
# the deltas go on

my $big = given_up('s3', 2700, 'past the bound');

$other = subscribe('s3', headers => { 'Last-Event-ID' => 1 });
$mock->release(0);

@ev = until_ended($other);
ok(!(grep { $_->{event} eq 'streaming_message' } @ev),
   'a subscriber past the bound gets none');
ok(scalar(deltas_of('text_delta', @ev)) > 0, 'and the deltas');
is(json_of((grep { $_->{event} eq 'assistant_msg' } @ev)[0])->{content},
   $big, 'the reply is whole');
like($t->read_file('error.log'),
     qr/the reply so far of msg_1_1 is not kept, it is larger than/,
     'logged');

$other->stream->close;
wait_state($t, 's3', 'idle');

###############################################################################

# a log larger than the subscriber's buffer: the reply so far waits until
# the log is sent, and comes after it

$mock->reset;
$mock->script({ text => 'x' x 20000 },
              { text => 'second reply here', chunks => 3, pause_after => 3,
                delay => 0.02 });

send_message($t, 's5', 'long');
wait_state($t, 's5', 'idle');
send_message($t, 's5', 'and now');
ok($mock->wait_paused(1, 5), 'second reply held');
$c = inspect_until('s5', streaming_with('second reply'));
$held = $c->{streaming_message}{delta_seq} // 0;

# the reply held until the reply so far has come: the log is read at
# the test's pace, and what came meanwhile would be in it

$other = subscribe('s5', small => 1);
@ev = grep { $_->{event} !~ /^(state_changed|turn_started)$/ }
      $other->events_until(sub { $_[0]{event} eq 'streaming_message' }, 10);
$mock->release(1);

push @ev, until_ended($other);
is(join(' ', map { $_->{id} // $_->{event} } @ev[0 .. 4]),
   '1 2 3 4 streaming_message', 'the log first, held back by the buffer, '
   . 'then the reply so far');
$snap = json_of($ev[4]);
@after = deltas_of('text_delta', @ev);
is_deeply([@$snap{qw(delta_seq text)}], [$held, 'second reply'],
          'as it was when the log was sent');
ok(consecutive($held + 1, @after), 'then the deltas after it');
is($snap->{text} . join('', map { $_->{delta} } @after), 'second reply here',
   'they make the reply');

$other->stream->close;
wait_state($t, 's5', 'idle');

###############################################################################

# a take-over: the worker running the turn dies mid-reply, the model
# call is made again, and the snapshot starts again with it

$mock->reset;
$mock->script({ text => 'lost words here', chunks => 3, pause_after => 3 },
              { text => 'the answer', chunks => 2, pause_after => 2 });

send_message($t, 's4', 'hello');
ok($mock->wait_paused(0, 5), 'first call held');

$c = inspect_until('s4', streaming_with('lost words'));
is($c->{streaming_message}{text}, 'lost words', 'first call so far');

$t->kill_worker($c->{lease});

ok($mock->wait_paused(1, 10), 'the model called again, held');

$c = inspect_until('s4', sub { ($_[0]{streaming_message}{text} // '')
                               eq 'the a' });
is_deeply([@{$c->{streaming_message}}{qw(message_id delta_seq text)}],
          ['msg_1_1', 1, 'the a'], 'the snapshot started again');

$other = subscribe('s4', port => $spread);
$mock->release(1);

@ev = until_ended($other);
$snap = json_of($ev[1]);
is($ev[1]{event}, 'streaming_message', 'a new subscriber gets it');
is_deeply([@$snap{qw(delta_seq text)}], [1, 'the a'],
          'of the call made again');

@after = deltas_of('text_delta', @ev);
ok(consecutive(2, @after), 'then its deltas');
is($snap->{text} . join('', map { $_->{delta} } @after),
   json_of((grep { $_->{event} eq 'assistant_msg' } @ev)[0])->{content},
   'they make the reply');

$other->stream->close;
$c = wait_state($t, 's4', 'idle');
is($c->{messages}[1]{content}, 'the answer', 'the reply logged once');
ok(!exists $c->{streaming_message}, 'and nothing streams');

$t->allow_alert(qr/worker process \d+ exited on signal 9/);
$t->done(more => 1);

###############################################################################

# a zone that cannot hold the reply so far: it is given up, and the reply
# is not.  The smallest zone (8 pages: the reserve, the conversation's
# record and the events' slots leave about four) takes the snapshot up to
# 8k and a 9k assistant_msg, not a 16k snapshot.

$t = Test::Agent->new;
$t->write_file_expand('nginx.conf', engine_conf($mock, zone => '32k'));
$t->run;

my $text = given_up('p1', 90, 'no room');
like($t->read_file('error.log'),
     qr/\[info\].*"p1": the reply so far of msg_1_1 is not kept, the zone/,
     'logged at info');

$mock->release(0);
$c = wait_state($t, 'p1', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'the turn went on');
is($c->{messages}[1]{content}, $text, 'the reply whole');

$mock->stop;
$t->done;
