#!/usr/bin/perl

# SIGKILL of a turn's worker after it recorded the turn's final reply
# and before the turn completed (here while hook_after, POSTed the
# reply, had not answered): the worker that takes the turn over finds
# the reply in the log and completes the turn; the model is not called
# again and the log holds the reply once.  So too after a crash of the
# whole server at that moment: the next start takes the turn over from
# the store and completes it.  A reply with tool calls, or one the
# provider paused, still goes on from the log as before (t/recovery.t).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $mock = Test::Agent::MockProvider->new;

# the hook's backend: it answers {}, once told to

my $hook = Test::Agent::MockProvider->new(default => sub {
    return { status => 200, body => '{}' };
});
my $hport = $hook->port;

my $server = <<"EOF_SERVER";
        location = /hook/after {
            internal;
            proxy_pass http://127.0.0.1:$hport/v1/chat/completions;
        }
EOF_SERVER

my $t = Test::Agent->new;
my $db = $t->testdir . '/agent.db';
my $store = Test::Agent::Store->new($db);

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    server => $server, http => "agent_store $db;",
    agent => 'hook_after /hook/after timeout=1h;'));
$t->run;

$mock->script({ text => 'the answer' }, { text => 'asked twice' });
$hook->script({ stall_head => 1 });

is(send_message($t, 'f1', 'hello')->{status}, 202, 'a message');
ok($hook->wait_requests(1, 10), 'hook_after got the final reply');

my $c = inspect($t, 'f1')->{json};
is(log_types($c), 'user_msg assistant_msg', 'the reply is in the log');

my $pid = lease_of($t, 'f1');
ok($pid, 'a worker holds the turn');
$t->kill_worker($pid);

$c = wait_state($t, 'f1', 'idle', 10);
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'taken over: the turn completed with its one reply');
is($c->{messages}[1]{content}, 'the answer', 'the reply recorded');
is(join(' ', map { $_->{seq} } @{$c->{messages}}), '1 2 3', 'seq gapless');
is(scalar @{$mock->requests}, 1, 'the model was called once');
like($t->read_file('error.log'),
     qr/final reply was recorded before its worker died/,
     'the take-over is logged');

# the conversation goes on

$mock->script({ text => 'next' });

is(send_message($t, 'f1', 'again')->{status}, 202, 'the next message');
$c = wait_state($t, 'f1', 'idle', 10);
is(log_types($c), 'user_msg assistant_msg turn_completed user_msg '
   . 'assistant_msg turn_completed', 'runs to completion');

# the whole server crashes once the final reply is written

$mock->reset;
$hook->reset;
$mock->script({ text => 'before the crash' }, { text => 'asked twice' });
$hook->script({ stall_head => 1 });

is(send_message($t, 'f2', 'hello')->{status}, 202, 'a message');
ok($hook->wait_requests(1, 10), 'hook_after got the final reply');

is($store->wait_sql("SELECT group_concat(type, ' ') FROM (SELECT type"
                    . " FROM events WHERE conversation = 'f2' ORDER BY seq)",
                    qr/assistant_msg/, 10),
   'user_msg assistant_msg', 'the reply is in the store');

$t->crash;

$t->run;

is($store->wait_sql("SELECT group_concat(type, ' ') FROM (SELECT type"
                    . " FROM events WHERE conversation = 'f2' ORDER BY seq)",
                    qr/turn_/, 15),
   'user_msg assistant_msg turn_completed',
   'the next start completed the turn, without a request');
is(scalar @{$mock->requests}, 1, 'the model was called once');

$c = wait_state($t, 'f2', 'idle', 10);
is($c->{messages}[1]{content}, 'before the crash', 'the reply recorded');

$t->allow_alert(qr/worker process \d+ exited on signal 9/);
$mock->stop;
$hook->stop;
$t->done;
