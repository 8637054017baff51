#!/usr/bin/perl

# The zone holds the working set, SQLite the history.  A conversation the
# zone does not hold (after a full stop and start, or evicted at rest) is
# revived from the store by the first request that names it, with its
# waiting calls and their original deadlines; a deadline that passed while
# nginx was stopped is applied at the next start, and a turn cut off by
# a crash of the whole server is taken over, without any request.  History
# before the current turn leaves the zone once written, so the zone's
# bytes per conversation stay flat however long it grows.  A subscriber
# whose worker was killed does not keep a conversation in the zone.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::SSE;
use Test::Agent::MockProvider;
use Test::Agent::Store;
use JSON::PP;

plan(skip_all => Test::Agent::Store->missing) if Test::Agent::Store->missing;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'default reply', chunks => 2 };
});

my $store = Test::Agent::Store->for_test($t);
my $db = $store->directive;

my $tools = <<'EOF';
    agent_tool ask_user {
        executor human;
        timeout 1h;
    }

    agent_tool ask_soon {
        executor human;
        timeout 2s;
    }
EOF

my $status = <<'EOF';
        location = /zone {
            agent_zone_status;
        }
EOF

sub conf {
    my ($http, $zone) = @_;
    return engine_conf($mock, workers => 2, zone => $zone // '4m',
        tools => $tools,
        agent => 'tools ask_user ask_soon;', server => $status,
        http => "agent_store $db; agent_busy queue; $http");
}

$t->write_file_expand('nginx.conf', conf(''));
$t->run;

sub sql { $store->sql(@_) }

# polls the database (not nginx: a request would revive the conversation)

sub wait_sql { $store->wait_sql(@_) }

sub zone {
    my $r = http_get('/zone', port => $t->port(8080));
    return decode_json($r->{body});
}

sub revivals {
    my @l = $t->read_file('error.log') =~ /revived from the store/g;
    return scalar @l;
}

sub call {
    my ($id, $name) = @_;
    return { tool_calls => [{ id => $id, name => $name,
                              arguments => '{"q":"?"}' }] };
}

sub restart {
    $t->stop;
    is($t->{unclean}, undef, 'stopped cleanly');
    $t->run;
}

# a conversation of three turns, then a full stop and start

for my $i (1 .. 3) {
    $mock->script({ text => "answer $i" });
    is(send_message($t, 'h1', "question $i")->{status}, 202, "message $i");
    wait_state($t, 'h1', 'idle');
}

my $before = inspect($t, 'h1')->{json};
is(scalar @{$before->{messages}}, 9, 'three turns logged');

restart();

is(zone()->{conversations}, 0, 'a new zone holds nothing');

my $r = inspect($t, 'h1');
is($r->{status}, 200, 'revived by a request');
is_deeply($r->{json}{messages}, $before->{messages},
          'the whole log, as it was');
is($r->{json}{state}, 'idle', 'at rest');
is(revivals(), 1, 'revival logged');

is(inspect($t, 'nosuch')->{status}, 404, 'unknown everywhere: 404');

$mock->reset;
$mock->script({ text => 'answer 4' });
is(send_message($t, 'h1', 'question 4')->{status}, 202, 'next message');
my $c = wait_state($t, 'h1', 'idle');
is($c->{messages}[-1]{seq}, 12, 'seq goes on from the store');

my @sent = map { $_->{content} } @{$mock->requests->[0]{json}{messages}};
is_deeply([ grep { defined && /question|answer/ } @sent ],
          [ 'question 1', 'answer 1', 'question 2', 'answer 2',
            'question 3', 'answer 3', 'question 4' ],
          'the model got the history from the store');

# older pages and the event stream read what the zone gave up

my $page = inspect($t, 'h1', 'after=1&limit=3')->{json};
is_deeply([ map { $_->{seq} } @{$page->{messages}} ], [ 2, 3, 4 ],
          'a page of history');
is($page->{messages}[0]{content}, 'answer 1', 'as logged');

my $sse = Test::Agent::SSE->new(http_stream(events_request('h1'),
                                            port => $t->port(8080)));
my @ev = $sse->events_until(sub { ($_[0]{id} // 0) == 12 }, 5);
is(join(',', map { $_->{id} } grep { defined $_->{id} } @ev),
   join(',', 1 .. 12), 'subscribe: every event from seq 1, in order');
$sse->stream->close;

# a flat footprint: the zone keeps the current turn only

$mock->reset;
my $long = 'x' x 2000;
my @used;

for my $i (1 .. 24) {
    $mock->script({ text => "$long $i" });
    send_message($t, 'f1', "long $i");
    wait_state($t, 'f1', 'idle');
    push @used, zone()->{used} if $i == 4 || $i == 24;
}

# the last turn's flush lets the earlier ones go: a moment

for (1 .. 100) {
    $used[1] = zone()->{used};
    last if $used[1] - $used[0] <= 8192;
    sleep 0.05;
}

cmp_ok($used[1] - $used[0], '<=', 8192,
       "zone bytes flat: after 4 turns $used[0], after 24 turns $used[1]");

my $f1 = inspect($t, 'f1')->{json};
is(scalar @{$f1->{messages}}, 72, 'yet all 72 events are served');
is($f1->{messages}[1]{content}, "$long 1", 'the oldest from the store');

# bytes per idle conversation

my $base = zone();
for my $i (1 .. 20) {
    $mock->script({ text => "short $i" });
    send_message($t, "z$i", "hello $i");
}
wait_state($t, "z$_", 'idle') for 1 .. 20;

# once written, each lets its events go: a moment

my $per;
for (1 .. 100) {
    $per = (zone()->{used} - $base->{used}) / 20;
    last if $per <= 4096;
    sleep 0.05;
}
diag("zone bytes per idle conversation: $per");
cmp_ok($per, '<=', 4096,
       'an idle conversation, once written, keeps its record only');

# waiting calls survive a restart with their deadlines; one passes while
# nginx is stopped

$mock->reset;
$mock->script(call('w1', 'ask_user'), call('w2', 'ask_soon'));

send_message($t, 'p1', 'ask me');
$c = wait_state($t, 'p1', 'awaiting_input');
my $deadline = $c->{pending}[0]{deadline};
ok($deadline, 'a deadline');

send_message($t, 'p2', 'ask me soon');
wait_state($t, 'p2', 'awaiting_input');

# the suspension is written behind the state the zone shows

is(wait_sql("SELECT status, kind, executor FROM tool_calls"
            . " WHERE conversation = 'p1'", qr/^suspended\|/),
   'suspended|elicitation|human', 'tool call persisted as suspended')
    or diag(sql("SELECT * FROM tool_calls"));
is(wait_sql("SELECT state FROM conversations WHERE id = 'p1'",
            qr/^awaiting_input$/), 'awaiting_input', 'persisted state');

$t->stop;
sleep 2.5;

$mock->reset;
$mock->script({ text => 'nobody answered' });
$t->run;

# no request names p2: the sweep finds its due call

like(wait_sql("SELECT type FROM events WHERE conversation = 'p2'"
              . " ORDER BY seq DESC LIMIT 1", qr/turn_completed/),
     qr/^turn_completed$/, 'the passed deadline applied at the start');
like(sql("SELECT data FROM events WHERE conversation = 'p2'"
         . " AND type = 'resolution'"), qr/"expired":true/,
     'resolution marked expired');
like($mock->requests->[0]{json}{messages}[-1]{content}, qr/did not respond/,
     'the model got the expiry');
is(sql("SELECT status, ok FROM tool_calls WHERE conversation = 'p2'"),
   'done|0', 'tool call done, failed');

$c = inspect($t, 'p1')->{json};
is($c->{state}, 'awaiting_input', 'the other one still waits');
is($c->{pending}[0]{tool_call_id}, 'w1', 'its call');
is($c->{pending}[0]{deadline}, $deadline, 'with its original deadline');

$mock->script({ text => 'thanks' });
is(resolve($t, 'p1', 'w1', { result => 'yes' })->{status}, 200,
   'resolvable after the restart');
$c = wait_state($t, 'p1', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'its turn went on');
is(resolve($t, 'p1', 'w1', { result => 'yes' })->{status}, 409,
   'once');

# a crash of the whole server mid-turn: the next start takes it over, and
# the message queued behind it runs after it

$mock->reset;
$mock->script({ text => 'cut off', chunks => 6, pause_after => 2 },
              { text => 'recovered' }, { text => 'queued one done' });

is(send_message($t, 'm1', 'hold on')->{status}, 202, 'message taken');
ok($mock->wait_paused(0), 'streaming');

$r = send_message($t, 'm1', 'and then this');
is($r->{status}, 202, 'a message queued behind the turn');
ok($r->{json}{queued}, 'said queued');
like(sql("SELECT data FROM queued WHERE conversation = 'm1'"),
     qr/"content":"and then this".*"queue_id":1/,
     'written before it was acknowledged');

$t->crash;
$mock->release;

$t->run;

like(wait_sql("SELECT group_concat(type, ' ') FROM"
              . " (SELECT type FROM events WHERE conversation = 'm1'"
              . " ORDER BY seq) e", qr/turn_completed.*turn_completed/),
     qr/^(user_msg assistant_msg turn_completed ?){2}$/,
     'the cut-off turn ran again after the start, without a request, then'
     . ' the queued message');
like(sql("SELECT data FROM events WHERE conversation = 'm1' AND seq = 4"),
     qr/"content":"and then this"/, 'the queued message, once');
is(sql("SELECT count(*) FROM queued"), 0, 'no longer queued');
is($mock->requests->[1]{json}{messages}[-1]{content}, 'hold on',
   'the model call was made again');
like(sql("SELECT data FROM events WHERE conversation = 'm1' AND seq = 2"),
     qr/"content":"recovered"/, 'with the new reply');

$mock->stop;
$t->allow_alert(qr/lost its worker|cut off|revived/);
$t->done(more => 1);

# evicted at rest, revived on demand

$mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'default reply', chunks => 2 };
});

$t->write_file_expand('nginx.conf',
    conf('agent_evict_idle 1s; agent_evict_awaiting 2s;'));
$t->run;

my $n = revivals();

send_message($t, 'v1', 'hello');
$before = wait_state($t, 'v1', 'idle');

$mock->script(call('x1', 'ask_user'));
send_message($t, 'v2', 'ask');
wait_state($t, 'v2', 'awaiting_input');

my $zc;
for (1 .. 60) {
    $zc = zone()->{conversations};
    last if $zc == 0;
    sleep 0.1;
}
is($zc, 0, 'idle and awaiting conversations left the zone');

$c = inspect($t, 'v1')->{json};
is_deeply($c->{messages}, $before->{messages}, 'revived as it was');
is(revivals(), $n + 1, 'by a revival');

$c = inspect($t, 'v2')->{json};
is($c->{state}, 'awaiting_input', 'an evicted waiting call');
is($c->{pending}[0]{tool_call_id}, 'x1', 'is still waiting');

$mock->script({ text => 'done' });
is(resolve($t, 'v2', 'x1', { result => 'no' })->{status}, 200,
   'and resolvable');
is(wait_state($t, 'v2', 'idle')->{messages}[-1]{type}, 'turn_completed',
   'the turn finished');

# a message to an evicted conversation revives it first: seq goes on

for (1 .. 100) {
    $zc = zone()->{conversations};
    last if $zc == 0;
    sleep 0.1;
}
is($zc, 0, 'evicted again');
is(send_message($t, 'v1', 'again')->{json}{seq}, 4,
   'message to an evicted conversation appends');

# a subscriber's worker is killed: the slot it had in the record does not
# keep the conversation in the zone for ever (nor its live events)

wait_state($t, 'v1', 'idle');

my $watch = Test::Agent::SSE->new(http_stream(events_request('v1'),
                                              port => $t->port(8080)));
my @seen = $watch->events_until(
    sub { ($_[0]{event} // '') eq 'turn_completed' }, 5);
ok(@seen, 'a subscriber of v1');

sleep 1.5;
is(zone()->{conversations}, 1, 'the subscriber keeps v1 in the zone');

$t->kill_worker($_) for $t->worker_pids;

for (1 .. 50) {
    $zc = zone()->{conversations};
    last if $zc == 0;
    sleep 0.1;
}
is($zc, 0, 'its worker killed, v1 leaves the zone');
$watch->stream->close;
$t->allow_alert(qr/exited on signal 9/);

$t->done(more => 1);

# a zone too small for every conversation: those at rest make room

$t->write_file_expand('nginx.conf', conf('', '128k'));
$t->run;

# a conversation at rest holds a 1 KB record: 160 of them do not fit
my @codes;
for my $i (1 .. 160) {
    push @codes, send_message($t, "s$i", "hello $i")->{status};
    wait_state($t, "s$i", 'idle');
}
is(join(' ', grep { $_ != 202 } @codes), '', '160 conversations in 128k');
cmp_ok(zone()->{conversations}, '<', 160, 'not all of them in the zone');
is(inspect($t, 's1')->{json}{messages}[0]{content}, 'hello 1',
   'the first one comes back');
unlike($t->read_file('error.log'), qr/is full/, 'the zone was never full');

$mock->stop;
$t->done;
