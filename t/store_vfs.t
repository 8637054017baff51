#!/usr/bin/perl

# The log's writer opens the store through the module's VFS, which
# writes a transaction's WAL frames together, not one write for each
# frame's header and one for its page; a commit's frames are in the file
# before the commit is made visible, and before its sync.  Small commits
# are read by another process as soon as they are acknowledged (with no
# sync in sync=normal, only the write at the commit's frame puts them
# there).  A message of 3 MB: its transaction is larger than the buffer
# (written in parts) and than the writer's page cache (which does not
# spill: the commit writes every frame).  Acknowledged, it is read at
# once by another process; with the server then killed, WAL and all,
# SQLite's recovery of the WAL (which checks every frame's checksum)
# finds it, byte for byte, with sync=full and with sync=normal.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Digest::MD5 qw(md5_hex);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

# 3 MB of text that does not repeat within a page
my $content = join('', map { sprintf('%07d ', $_ * 7919 % 1000003) }
                           1 .. 393216);

for my $sync (qw(full normal)) {
    my $db = $t->testdir . "/$sync.db";
    my $store = Test::Agent::Store->new($db);

    $t->write_file_expand('nginx.conf', engine_conf($mock, zone => '64m',
        http => "agent_store $db sync=$sync; client_max_body_size 8m;"
             . " client_body_buffer_size 8m;"));
    $t->run;

    $mock->reset;
    $mock->script(({ text => 'ok' }) x 4);

    # small commits, each visible to another process once acknowledged

    for my $n (1 .. 3) {
        my $r = send_message($t, "small$n", "small $n");
        is($r->{status}, 202, "$sync: message $n");
        is($store->sql("SELECT data LIKE '%small $n%' FROM events"
                       . " WHERE conversation = 'small$n' AND seq = 1"),
           1, "$sync: message $n read by another process at once");
        wait_state($t, "small$n", 'idle');
    }

    my $r = send_message($t, 'big', 'small first');
    is($r->{status}, 202, "$sync: a message");
    wait_state($t, 'big', 'idle');

    $mock->script({ text => 'read it', chunks => 4, pause_after => 1 });
    $r = send_message($t, 'big', $content);
    is($r->{status}, 202, "$sync: 3 MB taken");

    my $event = "SELECT length(data), instr(data, '0007919 0015838 ') > 0"
                . " FROM events WHERE conversation = 'big'"
                . " AND type = 'user_msg' AND seq > 1";

    like($store->sql($event), qr/^\d{7}\|1$/,
         "$sync: read by another process once acknowledged");

    # the turn streaming: the worker and the master killed, no checkpoint

    ok($mock->wait_paused(4, 20), "$sync: streaming");

    my $master = $t->master_pid;
    kill 'STOP', $master;
    kill 'KILL', $t->worker_pids;
    $t->stop('KILL');
    delete $t->{unclean};    # killed on purpose
    $mock->release;

    ok(-s "$db-wal" > 3_000_000, "$sync: the WAL holds it");

    is($store->sql('PRAGMA integrity_check'), 'ok',
       "$sync: recovered from the WAL, whole");

    my $data = $store->sql("SELECT data FROM events"
                           . " WHERE conversation = 'big'"
                           . " AND type = 'user_msg' AND seq > 1");
    my ($got) = $data =~ /"content":"([^"]*)"/;

    is(length($got // ''), length($content), "$sync: all of its bytes");
    is(md5_hex($got // ''), md5_hex($content), "$sync: byte for byte");

    is($store->sql("SELECT count(*) FROM events WHERE conversation = 'big'"
                   . " AND type = 'user_msg'"), 2,
       "$sync: both messages");

    $t->allow_alert(qr/lost its worker|cut off|revived/);
}

$mock->stop;
$t->done;
