#!/usr/bin/perl

# The WAL's checkpoint, made beside the writer on another thread of the
# pool and finished by the writer (after a batch no input waits for):
# it comes, and the WAL starts again.  Sixty turns of 64 tool calls
# each write some 2,400 pages to the WAL; checkpointed at 1,000, the WAL
# stays under 2,000 pages and starts again from its beginning (how much
# of the log the database file holds then depends on when that was).
# Without a checkpoint the WAL holds it all (9.7 MB) and the database
# 60 KB; so it did when the checkpoint's connection had not read the
# file yet (it did not know the WAL).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $convs = 60;
my $calls = 64;

my $mock = Test::Agent::MockProvider->new(default => sub {
    my ($req) = @_;
    my $last = $req->{json}{messages}[-1] || {};

    return { text => 'done' } if $last->{role} eq 'tool';
    return { tool_calls => echo_calls($calls) };
});

my ($t, $db, $path) = store_engine($mock, zone => '64m');

for my $i (1 .. $convs) {
    is(send_message($t, "w$i", 'question')->{status}, 202,
       "w$i: acknowledged");
}

is(wait_state($t, "w$_", 'idle', 60)->{state}, 'idle', "w$_: at rest")
    for 1 .. $convs;

my $events = $convs * (2 * $calls + 4);

$db->wait_sql('SELECT count(*) FROM events', qr/^$events$/, 30);

is(metric($t, 'agent_store_lag_events'), 0, 'everything is written');

my $page = $db->sql('PRAGMA page_size');
my $wal = -s "$path-wal";

cmp_ok($wal, '<', 2000 * $page, "the WAL is under 2,000 pages ($wal bytes)");
# the WAL's header counts the times it started again after a checkpoint

open(my $fh, '<:raw', "$path-wal") or die "$path-wal: $!";
read($fh, my $header, 32) == 32 or die "$path-wal: short header";
close $fh;

my $restarts = unpack('N', substr($header, 12, 4));
cmp_ok($restarts, '>=', 1, 'the WAL was checkpointed and started again');

$t->stop;
$mock->stop;

unlike($t->read_file('error.log'), qr/\[(alert|emerg|crit)\]/,
       'no alert in error.log');

done_testing;
