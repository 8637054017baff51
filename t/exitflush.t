#!/usr/bin/perl

# A worker that exits writes what it still has to write: events recorded
# while a batch was on the store's thread pool are in SQLite after
# nginx -s stop, -s quit and a reload's old worker exiting.  The database
# is locked by another process while the turn runs, so that the turn's
# events wait behind a batch that cannot be written, then unlocked once
# the worker was told to exit.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $path = $t->testdir . '/agent.db';
my $db = Test::Agent::Store->new($path);

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 1,
    http => "agent_store $path;", tools => $ECHO_TOOL,
    agent => 'tools echo;', server => $ECHO_LOCATION));
$t->run;

sub stored {
    my ($cid) = @_;
    return $db->sql("SELECT seq, type, json_extract(data, '\$.content')"
                    . " FROM events WHERE conversation = '$cid'"
                    . " ORDER BY seq");
}

sub zone_log {
    my ($c) = @_;
    return join "\n", map { "$_->{seq}|$_->{type}|"
                            . ($_->{content} // '') } @{$c->{messages}};
}

# A turn of two model calls (a call of echo, then the answer) whose
# events after the user_msg are recorded while the database is locked:
# the first of them goes on the thread pool, stuck, and the others wait
# behind it.  Then the signal, then the lock goes: the stuck batch is
# written as the pool's thread ends; the rest only if the worker writes
# it on its way out.  Returns the log as the zone held it; the database
# stays locked.

sub turn_behind_lock {
    my ($cid, $n) = @_;

    my $index = scalar @{$mock->requests};

    $mock->script(
        { tool_calls => [{ id => "call_$cid", name => 'echo',
                           arguments => "{\"n\":$n}" }],
          pause_after => 1 },
        { text => "answer $cid" });

    my $r = send_message($t, $cid, "question $cid");
    is($r->{status}, 202, "$cid: message acknowledged");
    ok($mock->wait_paused($index, 5), "$cid: the reply is paused");

    ok($db->lock, "$cid: the database is locked by another process");

    $mock->release($index);

    my $c = wait_state($t, $cid, 'idle');
    is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
                      . 'assistant_msg turn_completed',
       "$cid: the turn completed");
    is(scalar @{$mock->requests}, $index + 2, "$cid: two model calls");

    is(stored($cid), "1|user_msg|question $cid",
       "$cid: only the acknowledged message is written yet");

    return $c;
}

sub restart_check {
    my ($cid, $c, $what) = @_;

    my $calls = scalar @{$mock->requests};

    is(stored($cid), zone_log($c), "$cid: every event in SQLite after $what");

    # the batch that was in flight is written twice: the second changes
    # nothing, and what the log derives is as after one write

    is($db->sql("SELECT state, last_seq FROM conversations"
                . " WHERE id = '$cid'"), 'idle|6', "$cid: at rest, in SQLite");
    is($db->sql("SELECT id, status, ok FROM tool_calls"
                . " WHERE conversation = '$cid'"), "call_$cid|done|1",
       "$cid: the call done, once");

    $t->run;

    my $r = inspect($t, $cid);
    is($r->{status}, 200, "$cid: revived after $what");
    is_deeply($r->{json}{messages}, $c->{messages}, "$cid: the same log");
    is($r->{json}{state}, 'idle', "$cid: at rest");

    # a log cut off after the user_msg would run the model again

    sleep 1.5;
    is(scalar @{$mock->requests}, $calls, "$cid: no model call again");
}

# nginx -s stop, and -s quit, each a few times

my $n = 0;

for my $signal (('TERM') x 3, ('QUIT') x 3) {
    my $cid = lc($signal) . ++$n;
    my $c = turn_behind_lock($cid, $n);

    kill $signal, $t->master_pid;
    sleep 0.3;
    $db->unlock;

    $t->stop($signal);
    is($t->{unclean}, undef, "$cid: nginx exited cleanly");

    restart_check($cid, $c, $signal);
}

# a reload: the old worker exits, the zone stays and nothing else would
# write the conversation until its next event

for my $i (1 .. 3) {
    my $cid = 'hup' . ++$n;
    my $c = turn_behind_lock($cid, $n);
    my @old = $t->worker_pids;

    ok($t->reload, "$cid: reloaded");
    sleep 0.3;
    $db->unlock;

    my $deadline = time + 10;
    sleep 0.05 while time < $deadline && kill 0, @old;
    ok(!kill(0, @old), "$cid: the old worker exited");

    is($db->wait_sql("SELECT count(*) FROM events WHERE conversation"
                     . " = '$cid'", qr/^6$/, 3),
       6, "$cid: every event written, nginx running");
    is(stored($cid), zone_log($c), "$cid: as logged");
}

# a store that cannot be written: the worker gives up, says so and exits
# (the thread's write and its own each wait out the busy timeout)

my $cid = 'locked' . ++$n;
my $c = turn_behind_lock($cid, $n);

my $start = time;
$t->stop('QUIT');
my $took = time - $start;

is($t->{unclean}, undef, "$cid: nginx exited cleanly");
cmp_ok($took, '<', 20, "$cid: within the busy timeouts ($took s)");
like($t->read_file('error.log'),
     qr/agent store could not write 5 events as the worker exits/,
     "$cid: the events not written are named in the error log");

$db->unlock;
is(stored($cid), "1|user_msg|question $cid",
   "$cid: what was acknowledged is written, the rest was lost");

$mock->stop;
$t->done;
