#!/usr/bin/perl

# The store's times in agent_metrics: agent_store_write_seconds, a
# batch's write on the pool's thread, once per batch written;
# agent_store_ack_seconds, how long an input waited for its write, once
# per input answered.  Three messages are answered at once; a fourth
# comes while another process holds the database locked for 0.6 s: its
# wait, and its batch's write, are past 0.5 s, the others' are not.
# Each histogram's buckets grow to its count; promtool passes them.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempfile);
use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $promtool = `sh -c 'command -v promtool' 2>/dev/null`;
chomp $promtool;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'noted' };
});

my ($t, $db) = store_engine($mock);


my $h = histograms();

is($h->{agent_store_ack_seconds}{count}, 0, 'no input answered yet');

for my $c (qw(m1 m2 m3)) {
    is(send_message($t, $c, 'hello')->{status}, 202, "$c: acknowledged");
    wait_state($t, $c, 'idle', 10);
}

ok(written(), 'everything is written');

$h = histograms();

my $ack = $h->{agent_store_ack_seconds};
my $write = $h->{agent_store_write_seconds};

is($ack->{count}, 3, 'three inputs answered, three waits');
is($ack->{le}{'0.5'}, 3, 'none of them waited 0.5 s');
cmp_ok($ack->{sum}, '>', 0, 'their waits add up to more than nothing');

is($write->{count}, $h->{batches}, 'a write timed for each batch');
cmp_ok($write->{count}, '>=', 3, 'at least one batch a message');
is($write->{le}{'0.5'}, $write->{count}, 'no write took 0.5 s');

ok($db->lock, 'the database is locked by another process');

my $later = send_message_later($t, 'm4', 'hello');

# the lock held 0.6 s from when the message is in the zone
ok(wait_recorded($t, 'm4'), 'm4: in the zone');
sleep 0.6;

$db->unlock;

is(http_status($later, 10), 202, 'm4: acknowledged once written');

wait_state($t, 'm4', 'idle', 10);

ok(written(), 'everything is written again');

$h = histograms();
$ack = $h->{agent_store_ack_seconds};
$write = $h->{agent_store_write_seconds};

is($ack->{count}, 4, 'four waits');
is($ack->{le}{'0.5'}, 3, 'the fourth waited past 0.5 s');
cmp_ok($ack->{sum}, '>=', 0.6, 'the waits add up to the lock\'s 0.6 s');

is($write->{count} - $write->{le}{'0.5'}, 1,
   'one batch took past 0.5 s, waiting for the lock');

is($write->{count}, $h->{batches}, 'still a write timed for each batch');

SKIP: {
    skip 'promtool is not installed', 1 unless $promtool;

    my $body = http_get('/metrics', port => $t->port(8080))->{body};
    my ($fh, $file) = tempfile(UNLINK => 1);
    print $fh $body;
    close $fh;

    my $out = `'$promtool' check metrics < '$file' 2>&1`;
    ok($? == 0, 'promtool check metrics passes') or diag $out;
}

$t->stop;
$mock->stop;

unlike($t->read_file('error.log'), qr/\[(alert|emerg)\]/,
       'no alert in error.log');

done_testing;

# no event waits for the store, within 5 s

sub written {
    for (1 .. 100) {
        return 1 if metric($t, 'agent_store_lag_events') == 0;
        sleep 0.05;
    }

    return 0;
}

# the store's time histograms: each one's buckets by le, its sum and its
# count; the buckets checked to be cumulative and to end at the count;
# and, in the same scrape, the count of batches written

sub histograms {
    my $r = http_get('/metrics', port => $t->port(8080));
    my %h;

    for my $name (qw(agent_store_ack_seconds agent_store_write_seconds)) {
        my $body = $r->{body} // '';
        my @le = $body =~ /^${name}_bucket\{le="([^"]+)"\} (\d+)$/mg;
        my ($sum) = $body =~ /^${name}_sum (\S+)$/m;
        my ($count) = $body =~ /^${name}_count (\d+)$/m;
        my ($prev, $ok) = (0, @le > 2);

        my %le;

        while (my ($bound, $n) = splice @le, 0, 2) {
            $ok = 0 if $n < $prev;
            $prev = $n;
            $le{$bound} = $n;
        }

        ok($ok && defined $count && $le{'+Inf'} == $count,
           "$name: cumulative buckets, the last one its count");

        $h{$name} = { le => \%le, sum => $sum // -1, count => $count // -1 };
    }

    ($h{batches}) = ($r->{body} // '')
        =~ /^agent_store_batch_events_count (\d+)$/m;

    return \%h;
}
