#!/usr/bin/perl

# agent_trace with agent_store: a turn that outlives its worker or nginx
# is still exported, whole and in its caller's trace.  A model call tried
# again after a 429 and a 500 is one chat span, its failed attempts as
# span events with the provider's status and error type.  A turn waiting
# for approval through a restart of nginx, approved after it; one that
# left the zone while it waited (agent_evict_awaiting), approved and
# revived; and a turn taken over after its worker was killed (kill -9)
# mid-reply.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::Otel;
use Test::Agent::Store;

plan(skip_all => Test::Agent::Store->missing) if Test::Agent::Store->missing;

Test::Agent::Otel->needs;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $otel = Test::Agent::Otel->start($t);
my $store = Test::Agent::Store->for_test($t);

ok($otel->{ready}, 'collector and tool backend up');

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    zone => '8m',
    tools => $TRACED_TOOLS,
    agent => 'tools lookup send_note;',
    http => 'agent_trace /otlp; agent_evict_awaiting 1s; agent_store '
            . $store->directive . ';',
    server => $otel->locations . <<"END"));

        location = /zone {
            agent_zone_status;
        }
END
$t->run;

# the spans of conversation $id: its turn's, and those under it

sub turn_spans { $otel->turn('nginx', $_[0]) }

sub of {
    my ($op, @spans) = @_;
    return grep { attrs($_)->{'gen_ai.operation.name'} eq $op } @spans;
}

sub tp {
    my ($n) = @_;
    return ("0af7651916cd43dd8448eb211c80319$n", "b7ad6b716920333$n");
}

# a model call tried again: a 429, a 500, then the reply

my ($trace, $span) = tp(1);

$mock->reset;
$mock->script(
    { status => 429, error => { message => 'Slow down.', type => 'requests',
                                code => 'rate_limit_exceeded' } },
    { status => 500, error => { message => 'Oops.', type => 'server_error' } },
    { text => 'At last.' });

send_message($t, 'r1', 'hi', headers => { traceparent => "00-$trace-$span-01" });
my $c = wait_state($t, 'r1', 'idle', 20);

is(log_types($c), 'user_msg assistant_msg turn_completed',
   'retried: one reply');
is(scalar @{$mock->requests}, 3, 'three attempts');

my ($reply) = grep { $_->{type} eq 'assistant_msg' } @{$c->{messages}};

is(join(' ', map { "$_->{status}:" . ($_->{error_type} // '') }
             @{$reply->{retries} || []}),
   '429:requests 500:server_error', 'the reply records its failed attempts');

my ($turn, @children) = turn_spans('r1');
my @chat = of('chat', @children);

is(scalar @chat, 1, 'retried: one chat span');
is($turn->{traceId}, $trace, 'in the caller\'s trace');

my $ch = $chat[0] || {};
my @retry = @{$ch->{events} || []};

is(attrs($ch)->{'agent.model.attempts'}, 3, 'its attempts');
is(join(' ', map { $_->{name} } @retry), 'agent.model.retry agent.model.retry',
   'a span event per failed attempt');
is(join(' ', map { attrs($_)->{'http.response.status_code'} } @retry),
   '429 500', '... with the provider\'s status');
is(join(' ', map { attrs($_)->{'error.type'} } @retry),
   'requests server_error', '... and its error type');
is(join(' ', map { attrs($_)->{'agent.model.attempt'} } @retry), '1 2',
   '... and the attempt\'s number');
is(join(' ', map { $_->{timeUnixNano} } @retry),
   join(' ', map { $_->{ended} . '000000' } @{$reply->{retries} || []}),
   '... at the attempt\'s end');
is($ch->{startTimeUnixNano},
   ($reply->{retries}[0]{started} // 0) . '000000',
   'the chat span starts with the first attempt');
ok(!$ch->{status}{code}, 'and ends well');
is(join(' ', map { $_->{headers}{traceparent} } @{$mock->requests}),
   join(' ', ("00-$trace-$ch->{spanId}-01") x 3),
   'every attempt carried the chat span\'s traceparent');

# a model call that fails the turn after its attempts: its chat span
# (an error) has the ones made again as events, the last as its status

($trace, $span) = tp(5);

$mock->reset;
$mock->script(map { { status => 500, error => { message => "Oops $_.",
                                                 type => 'server_error' } } }
              1 .. 3);

send_message($t, 'r5', 'hi', headers => { traceparent => "00-$trace-$span-01" });
$c = wait_state($t, 'r5', 'idle', 20);

is(log_types($c), 'user_msg turn_failed', 'retried in vain: the turn failed');
is(scalar @{$mock->requests}, 3, 'retried in vain: three attempts');

($turn, @children) = turn_spans('r5');
($ch) = of('chat', @children);
$ch //= {};

is($ch->{status}{code}, 2, 'retried in vain: the chat span failed');
is(attrs($ch)->{'http.response.status_code'}, 500, '... with the last status');
is(attrs($ch)->{'agent.model.attempts'}, 3, '... after three attempts');
is(join(' ', map { attrs($_)->{'http.response.status_code'} }
             @{$ch->{events} || []}),
   '500 500', '... the two made again as events');
is($ch->{startTimeUnixNano},
   ($c->{messages}[-1]{retries}[0]{started} // 0) . '000000',
   '... from the first attempt');

# a reply cut by the provider's error mid-stream: the interrupted
# assistant_msg is the call's one chat span, with the error

($trace, $span) = tp(6);

$mock->reset;
$mock->script({ text => 'A partial answer, then', chunks => 4,
                error_after => 3,
                error => { message => 'Overloaded.', type => 'server_error' } });

send_message($t, 'r6', 'hi', headers => { traceparent => "00-$trace-$span-01" });
$c = wait_state($t, 'r6', 'idle', 20);

is(log_types($c), 'user_msg assistant_msg turn_failed',
   'cut mid-stream: the partial reply, the failure');

($turn, @children) = turn_spans('r6');

is(scalar(of('chat', @children)), 1, 'cut mid-stream: one chat span');
is((of('chat', @children))[0]{status}{code}, 2, '... an error');
is($turn->{status}{code}, 2, 'cut mid-stream: the turn failed');

# a turn waiting for approval through a restart of nginx

($trace, $span) = tp(2);

$mock->reset;
$mock->script(
    { tool_calls => [{ id => 'call_r2', name => 'send_note',
                       arguments => '{"to":"x"}' }] },
    { text => 'Sent.' });

send_message($t, 'r2', 'note it',
             headers => { traceparent => "00-$trace-$span-01" });
wait_state($t, 'r2', 'awaiting_input');

is($store->wait_sql("SELECT state FROM conversations WHERE id = 'r2'",
                    qr/^awaiting_input$/),
   'awaiting_input', 'the wait is written');

$t->stop;
is($t->{unclean}, undef, 'nginx stopped');
$t->run;

is(resolve($t, 'r2', 'call_r2', { decision => 'approve' })->{status}, 200,
   'approved after the restart');
$c = wait_state($t, 'r2', 'idle');

like($t->read_file('error.log'), qr/revived from the store/,
     'the conversation came back from the store');

($turn, @children) = turn_spans('r2');

is($turn->{traceId}, $trace, 'restart: the turn in its caller\'s trace');
is($turn->{parentSpanId}, $span, 'restart: a child of the caller\'s span');
is($turn->{startTimeUnixNano}, $c->{messages}[0]{ts} . '000000',
   'restart: from its user_msg, before the restart');
is(scalar(of('chat', @children)), 2, 'restart: both model calls');

my ($tool) = of('execute_tool', @children);

is(join(' ', map { $_->{name} } @{$tool->{events} || []}),
   'agent.suspension agent.resolution',
   'restart: the wait and its approval');
is(scalar(grep { $_->{traceId} eq $trace
                 && $_->{parentSpanId} eq ($tool->{spanId} // '') }
          $otel->wait_spans('tool-backend', sub {
              grep { $_->{traceId} eq $trace } @_ })),
   1, 'restart: the tool run after it continues the trace');

# a turn that left the zone while it waited, revived by its approval

sub in_zone {
    return decode_json(http_get('/zone', port => $t->port(8080))->{body})
           ->{conversations};
}

sub revivals {
    my @l = $t->read_file('error.log') =~ /revived from the store/g;
    return scalar @l;
}

($trace, $span) = tp(4);

$mock->reset;
$mock->script(
    { tool_calls => [{ id => 'call_r4', name => 'send_note',
                       arguments => '{"to":"y"}' }] },
    { text => 'Sent later.' });

my $before = in_zone();

send_message($t, 'r4', 'note it later',
             headers => { traceparent => "00-$trace-$span-01" });
wait_state($t, 'r4', 'awaiting_input');

for (1 .. 100) {
    last if in_zone() < $before + 1;
    sleep 0.1;
}

is(in_zone(), $before, 'evicted: the waiting conversation left the zone');

my $revived = revivals();

is(resolve($t, 'r4', 'call_r4', { decision => 'approve' })->{status}, 200,
   'evicted: approved');
$c = wait_state($t, 'r4', 'idle');
is(revivals(), $revived + 1, 'evicted: revived by the approval');

($turn, @children) = turn_spans('r4');

is($turn->{traceId}, $trace, 'evicted: the turn in its caller\'s trace');
is($turn->{parentSpanId}, $span, 'evicted: a child of the caller\'s span');
is(join(' ', map { $_->{name} } map { @{$_->{events} || []} }
             of('execute_tool', @children)),
   'agent.suspension agent.resolution', 'evicted: the wait and its approval');
is(scalar(of('chat', @children)), 2, 'evicted: both model calls');

# a turn taken over after its worker was killed mid-reply

($trace, $span) = tp(3);

$mock->reset;
$mock->script({ text => 'The whole reply', chunks => 6, pause_after => 3 },
              { text => 'The whole reply' });

send_message($t, 'r3', 'go on',
             headers => { traceparent => "00-$trace-$span-01" });
ok($mock->wait_paused(0, 15), 'the reply under way');

my $lease = inspect($t, 'r3')->{json}{lease};
ok($lease, 'a worker holds the turn');

$t->kill_worker($lease);
$mock->release;

$c = wait_state($t, 'r3', 'idle', 20);

is($c->{messages}[-1]{type}, 'turn_completed', 'taken over: the turn ended');
is(scalar @{$mock->requests}, 2, 'the model call made again');

($turn, @children) = turn_spans('r3');

is($turn->{traceId}, $trace, 'taken over: the turn in its caller\'s trace');
is($turn->{parentSpanId}, $span, 'taken over: a child of the caller\'s span');
is(join(' ', sort map { $_->{endTimeUnixNano} } of('chat', @children)),
   join(' ', sort map { $_->{ts} . '000000' }
             grep { $_->{type} eq 'assistant_msg' } @{$c->{messages}}),
   'taken over: a chat span per reply logged');
is(($mock->requests->[1]{headers}{traceparent} // '') =~ /^00-$trace-/
   ? 1 : 0, 1, 'taken over: the call made again is in the trace');

$otel->stop;
$t->stop;
$mock->stop;

unlike($t->read_file('error.log') =~ s/^.*exited on signal 9\n//mgr,
       qr/\[(alert|emerg)\]/,
       'no alert in error.log');

done_testing;
