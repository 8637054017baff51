#!/usr/bin/perl

# The store's thread pool refusing a task (its queue full), with one
# pool thread and max_queue=0: a task is taken only while the thread is
# idle.  The database is locked by another process, and a message
# queued behind a running turn (agent_busy queue) is written on the
# thread, where it waits in SQLite's busy wait and holds the thread.
# Meanwhile:
#
# - a read refused is answered 503 `unavailable` and changes nothing: a
#   message to a new conversation (whose store read comes first) and a
#   page of the audit of model calls; once the pool is free the refused
#   conversation does not exist, and a message to it runs;
# - a batch refused is not taken for written: a message to a
#   conversation at rest in the zone is answered only once its user_msg
#   is written, after the lock goes;
# - its turn's read of the history, refused too, waits for the pool
#   rather than failing the turn;
# - the refused batch is tried again every 50 ms, not at each poll of
#   its input.
#
# The store's sweep takes the thread for a moment every second (the first
# one as the worker starts): a read that is not itself the test's subject
# is asked again while the pool refuses it.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $mock = Test::Agent::MockProvider->new(default => sub { { text => 'hi' } });

my $t = Test::Agent->new;
my $path = $t->testdir . '/agent.db';
my $db = Test::Agent::Store->new($path);

my $conf = engine_conf($mock, workers => 1,
    http => "agent_store $path thread_pool=agent history=0;",
    server => <<'EOF');
        location = /metrics {
            agent_metrics;
        }

        location ~ ^/q/(?<cid>[^/]+)$ {
            agent chat;
            agent_conversation $cid;
            agent_busy queue;
            agent_message;
        }
EOF

$conf =~ s/^(%%TEST_GLOBALS%%)/$1\nthread_pool agent threads=1 max_queue=0;/m
    or die "no globals in the configuration\n";

$t->write_file_expand('nginx.conf', $conf);
$t->run;

my $port = $t->port(8080);

sub lag {
    my $r = http_get('/metrics', port => $port);
    return $r && $r->{body} =~ /^agent_store_lag_events (\d+)/m ? $1 : -1;
}

sub code_of {
    my ($r) = @_;
    my $j = eval { decode_json($r->{body}) } || {};
    return $j->{error}{code} // '';
}

# the thread is idle once everything recorded is written, the audit's
# rows (which may wait 10 ms for a batch) with it

sub wait_written {
    my $n = 0;
    sleep 0.05 until lag() == 0 || ++$n > 200;
    sleep 0.3;
}

# a read refused while the thread is held may still be refused a little
# while after the lock goes: the thread goes on with what waited

sub until_taken {
    my ($try) = @_;
    my $r;

    for (1 .. 100) {
        $r = $try->();
        last unless $r && $r->{status} == 503;
        sleep 0.05;
    }

    return $r;
}

is(until_taken(sub { send_message($t, 'a1', 'first') })->{status}, 202,
   'a message written');
wait_state($t, 'a1', 'idle');

# the turn's last batch may still hold the thread, and refuse the read
wait_written();

# a turn runs, its model's reply paused

$mock->script({ text => 'a long reply', chunks => 2, pause_after => 1 });

is(until_taken(sub {
       http_post('/q/q1', '{"content":"start"}', port => $port,
                 headers => { 'Content-Type' => 'application/json' })
   })->{status}, 202, 'a turn runs');
ok($mock->wait_paused(1, 10), 'its reply paused');
wait_written();

ok($db->lock, 'the database is locked by another process');

# a message queued behind the turn: its write holds the thread.  It is
# held once it has no answer and reads are refused (two, apart by more
# than a sweep takes); refused itself by a sweep, it is sent again

sub queue_later {
    my $s = Test::Agent::HTTP::connect_to($port);
    print $s http_request('POST', '/q/q1', '{"content":"later"}',
                          headers => { 'Content-Type' => 'application/json' });
    return $s;
}

sub refused {
    my $r = http_get('/c/a1?view=model_calls', port => $port);
    return $r && $r->{status} == 503;
}

my $queued = queue_later();
my $held = 0;

for (1 .. 200) {
    if (IO::Select->new($queued)->can_read(0.05)) {
        last unless http_status($queued, 1) == 503;
        $queued = queue_later();
        next;
    }

    next unless refused();
    sleep 0.2;
    $held = refused() && !IO::Select->new($queued)->can_read(0);
    last if $held;
}

ok($held, 'the queued message\'s write holds the thread');

my $r = send_message($t, 'c1', 'refused');
is($r->{status}, 503, 'a new conversation\'s read refused: 503');
is(code_of($r), 'unavailable', 'error code unavailable');

$r = http_get('/c/a1?view=model_calls', port => $port);
is($r->{status}, 503, 'the audit\'s read refused: 503');
is(code_of($r), 'unavailable', 'error code unavailable');

# a1 is at rest in the zone: no read, its batch is refused

my $second = send_message_later($t, 'a1', 'second');

is(http_status($second, 1.5), 0, 'no answer while its batch is refused');

$db->unlock;

is(http_status($second, 15), 202, 'answered once written');
is($db->sql("SELECT count(*) FROM events WHERE conversation = 'a1'"
            . " AND type = 'user_msg'"), 2, 'its user_msg is in the store');
is(http_status($queued, 15), 202, 'the queued message taken');

# its turn's history read (history=0: none kept) was refused too, and
# waited for the pool

wait_state($t, 'a1', 'idle');
is($db->wait_sql("SELECT group_concat(type, ' ') FROM (SELECT type"
                 . " FROM events WHERE conversation = 'a1' ORDER BY seq)",
                 qr/ turn_\w+$/, 10),
   'user_msg assistant_msg turn_completed user_msg assistant_msg'
   . ' turn_completed', 'its turn waited for the history, then completed');
like($t->read_file('error.log'),
     qr/waits for the store's thread pool to read the history/,
     'the wait is in the error log');

$mock->release;

is(until_taken(sub { inspect($t, 'c1') })->{status}, 404,
   'the refused message made nothing');
is($db->sql("SELECT count(*) FROM events WHERE conversation = 'c1'"), 0,
   'nothing of it in the store');

is(until_taken(sub { send_message($t, 'c1', 'again') })->{status}, 202,
   'the same message taken once the pool is free');
wait_state($t, 'c1', 'idle');

is($db->wait_sql("SELECT group_concat(type, ' ') FROM (SELECT type"
                 . " FROM events WHERE conversation = 'c1' ORDER BY seq)",
                 qr/turn_completed$/, 10),
   'user_msg assistant_msg turn_completed', 'and its turn written whole');

my $log = $t->read_file('error.log');

like($log, qr/queue overflow/, 'the refusals are in the error log');

# the refused batch was tried again every 50 ms while its input waited
# (about 2 s), not at each of the input's polls (every 2 ms)

my $tries = () = $log =~ /could not write 1 events/g;
cmp_ok($tries, '<', 200, "the refused batch tried $tries times");

done_testing();
