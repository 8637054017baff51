#!/usr/bin/perl

# A batch the thread pool refuses writes nothing, and nothing is taken
# for written.  One thread and no queue (max_queue=0): a task is taken
# only while the thread waits idle, so some batches are refused (the
# thread not yet waiting, or busy with the one before).  Every message's
# 202 still comes only once its user_msg is in the database.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $n = 20;

my $mock = Test::Agent::MockProvider->new(
    default => sub { { text => 'hello' } });

my $t = Test::Agent->new;
my $path = $t->testdir . '/agent.db';
my $db = Test::Agent::Store->new($path);

$t->write_file_expand('nginx.conf', engine_conf($mock, zone => '4m',
    main => 'thread_pool refusing threads=1 max_queue=0;',
    http => "agent_store $path thread_pool=refusing;"));
$t->run;

my @missing;

for my $i (1 .. $n) {
    my $r = send_message($t, "p$i", 'hi');

    if ($r->{status} != 202) {
        push @missing, "p$i: $r->{status}";
        next;
    }

    my $type = $db->sql("SELECT type FROM events WHERE conversation ="
                        . " 'p$i' AND seq = 1");
    push @missing, "p$i: not written" unless $type eq 'user_msg';
}

is(join(', ', @missing), '', "each of $n messages written before its 202");

my $log = $t->read_file('error.log');
my $refused = () = $log =~ /queue overflow/g;

ok($refused > 0, "the pool refused batches ($refused)");
like($log, qr/agent store could not write \d+ events, they are tried again/,
     'and they were tried again');

wait_state($t, "p$_", 'idle') for 1 .. $n;

$t->stop;

is($db->sql("SELECT count(*) FROM events WHERE type = 'turn_completed'"),
   $n, 'every turn written whole in the end');

$mock->stop;
$t->done;
