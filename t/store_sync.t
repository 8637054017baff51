#!/usr/bin/perl

# agent_store ... sync=full|normal: whether a commit waits until the disk
# has it.  The worker's threads are traced (strace) while messages are
# acknowledged one after the other, each once its commit is done: with
# the default and with sync=full each commit calls fdatasync(), with
# sync=normal none does (the WAL's header is, as the WAL starts).  Its commits are in the WAL file all the same:
# the worker killed once they are answered, every message is in SQLite.
# A sync that is neither is refused at configuration.

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
plan(skip_all => 'no strace') unless `strace -V 2>/dev/null` =~ /strace/;

my $messages = 8;

# refused

{
    my $t = Test::Agent->new;
    my $mock = Test::Agent::MockProvider->new;
    my $db = $t->testdir . '/agent.db';

    $t->write_file_expand('nginx.conf', engine_conf($mock,
        http => "agent_store $db sync=off;"));

    like($t->test_config,
         qr/invalid sync "sync=off", it must be "full" or "normal"/,
         'sync=off refused');

    $mock->stop;
}

# the worker's threads traced until stop(): the sync calls they made

sub trace {
    my ($t, $pid) = @_;

    my $out = $t->testdir . "/strace.$pid";

    my $strace = fork // die "fork: $!\n";

    if ($strace == 0) {
        open STDERR, '>', '/dev/null';
        exec 'strace', '-f', '-qq', '-e', 'trace=fsync,fdatasync',
             '-o', $out, '-p', $pid;
        exit 127;
    }

    # attached once every thread has a tracer

    my $deadline = time + 10;

    while (time < $deadline) {
        my @tasks = glob "/proc/$pid/task/*/status";
        my $traced = grep {
            open my $fh, '<', $_; local $/; <$fh> =~ /^TracerPid:\s*[1-9]/m
        } @tasks;

        last if @tasks && $traced == @tasks;
        sleep 0.05;
    }

    return sub {
        kill 'INT', $strace;
        waitpid $strace, 0;

        open my $fh, '<', $out or return undef;
        return scalar grep { /\b(fsync|fdatasync)\(/ } <$fh>;
    };
}

for my $sync (undef, 'full', 'normal') {
    my $name = $sync ? "sync=$sync" : 'the default';

    my $mock = Test::Agent::MockProvider->new;
    my ($t, $db) = store_engine($mock,
                                store => $sync ? "sync=$sync" : undef);

    my ($pid) = $t->wait_workers(1);

    my $stop = trace($t, $pid);

    # one after the other: each answered once its own commit is done

    is(send_message($t, "s$_", 'hello')->{status}, 202,
       "$name: message $_ acknowledged") for 1 .. $messages;

    my $syncs = $stop->();

    ok(defined $syncs, "$name: the worker was traced");

    wait_state($t, "s$_", 'idle', 15) for 1 .. $messages;

    is($db->wait_sql("SELECT count(*) FROM conversations"
                     . " WHERE state = 'idle'", qr/^$messages$/, 10),
       $messages, "$name: every turn written, at rest in SQLite");

    if (($sync // 'full') eq 'full') {
        cmp_ok($syncs, '>=', $messages,
               "$name: the commits waited for the disk ($syncs syncs)");

        store_stop($t, $mock);
        next;
    }

    # the WAL's header is synced as the WAL starts, never a commit

    cmp_ok($syncs, '<', $messages / 2,
           "$name: the commits did not wait for the disk ($syncs syncs)");

    # what was answered is in the WAL, whatever becomes of the worker

    $t->kill_worker($pid);

    is($db->sql("SELECT count(*) FROM events WHERE type = 'user_msg'"),
       $messages, "$name: every message in SQLite after the worker's kill");

    $t->allow_alert(qr/exited on signal 9/);
    $t->stop;
    $mock->stop;
}

done_testing;
