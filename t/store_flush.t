#!/usr/bin/perl

# agent_store ... flush=time: events no input waits for, and the audit's
# rows, wait up to that long before their batch is written, together;
# an input's event is written at once, so its answer does not wait for
# the flush time (rows queued by then go with it), and the batch after it
# does not take the events that wait for the flush time either.  A flush
# time that is not one is refused at configuration.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $db = $t->testdir . '/agent.db';
my $store = Test::Agent::Store->new($db);

# the flush time, in seconds
my $FLUSH = 3;

# a flush time that is not one

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => "agent_store $db flush=soon;"));

my $err = $t->test_config;
like($err, qr/invalid flush time "flush=soon"/, 'flush=soon refused');

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => "agent_store $db flush=${FLUSH}s;"));
$t->run;

# $q answers $want if it ran before the flush time after $since
# could have passed; a check that could not be made so is skipped, said

sub before_flush {
    my ($since, $q, $want, $name) = @_;

    my $got = $store->sql($q);
    my $at = time - $since;

    SKIP: {
        skip(sprintf('%s: read %.3f s after, past the flush time', $name,
                     $at), 1) if $at >= $FLUSH;
        is($got, $want, sprintf('%s (%.3f s)', $name, $at));
    }
}

sub types {
    my ($cid) = @_;
    return $store->sql("SELECT group_concat(type, ' ') FROM (SELECT type"
                       . " FROM events WHERE conversation = '$cid'"
                       . " ORDER BY seq)");
}

# the reply comes once the user_msg's batch is written

$mock->script({ text => 'Hello there', latency => 0.5 });

my $start = time;
my $r = send_message($t, 'one', 'hi');
my $took = time - $start;

is($r->{status}, 202, 'message accepted');
ok($took < 1.5, sprintf('answered without waiting for the flush time '
                        . '(%.3f s)', $took));
like(types('one'), qr/^user_msg/, 'its user_msg is written');

my $c = wait_state($t, 'one', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'the turn completed');

# the reply's events are in the zone, not yet in the file; the call's
# start may go with the user_msg's batch, its end waits.  Read in one
# query, and judged only if it ran before the flush time could have
# passed (nothing waited for it before the message was sent): a loaded
# machine may take longer than that to get here.

before_flush($start,
    "SELECT (SELECT count(*) FROM events WHERE conversation = 'one'"
    . " AND type = 'assistant_msg') || '|' || (SELECT count(*)"
    . " FROM model_calls WHERE conversation = 'one'"
    . " AND status <> 'running')", '0|0',
    'the reply waits for the flush time, and so does the end of the'
    . ' model call\'s audit row');

my $stored = $store->wait_sql("SELECT count(*) FROM events"
                              . " WHERE conversation = 'one'"
                              . " AND type = 'turn_completed'", qr/^1$/, 10);
is($stored, 1, 'and is written once it has passed');
is(types('one'), join(' ', map { $_->{type} } @{$c->{messages}}),
   'the file holds the log the zone holds');
is($store->wait_sql("SELECT status FROM model_calls"
                    . " WHERE conversation = 'one'", qr/^ok$/, 10),
   'ok', 'and the audit row, ended');

# an input's batch does not take the events that wait for the flush
# time after it: they wait for it still, and go together

$mock->script({ text => 'Second reply', latency => 0.3 });
$mock->script({ text => 'Third reply', latency => 0.5 });

$start = time;
$r = send_message($t, 'two', 'hi');
is($r->{status}, 202, 'a second conversation\'s message accepted');
wait_state($t, 'two', 'idle');

$r = send_message($t, 'three', 'hi');
is($r->{status}, 202, 'a third conversation\'s message accepted');
like(types('three'), qr/^user_msg/, 'its user_msg is written');

sleep(0.3);

before_flush($start, "SELECT count(*) FROM events WHERE conversation = 'two'"
                     . " AND type = 'assistant_msg'", 0,
             'the second reply still waits for the flush time after the'
             . ' third message\'s batch');

is($store->wait_sql("SELECT count(*) FROM events"
                    . " WHERE conversation = 'two'"
                    . " AND type = 'turn_completed'", qr/^1$/, 10),
   1, 'and is written once it has passed');
is($store->wait_sql("SELECT count(*) FROM events"
                    . " WHERE conversation = 'three'"
                    . " AND type = 'turn_completed'", qr/^1$/, 10),
   1, 'the third reply too');

# the events that wait for the flush time are written once it has passed,
# even while inputs keep coming: each input's batch holds its own events
# only, and does not put the flush time off

$mock->script({ text => 'Fourth reply', latency => 0.2 });
# inputs for longer than the flush time, however fast the machine
my $more = 24;
$mock->script({ text => "Reply $_", latency => 0.05 }) for 1 .. $more;

$r = send_message($t, 'four', 'hi');
is($r->{status}, 202, 'a fourth conversation\'s message accepted');
wait_state($t, 'four', 'idle');

# the last time the file was read without the reply: however slowly
# the loop goes round on a loaded machine, never past the flush time
# and its slack

my $idle = time;
my ($seen, $unseen, $accepted) = (undef, 0, 0);

for my $i (1 .. $more) {
    $r = send_message($t, "more$i", 'hi');
    $accepted++ if $r->{status} == 202;

    if (!defined $seen) {
        my $asked = time - $idle;

        if (types('four') =~ /turn_completed/) {
            $seen = time - $idle;
        } else {
            $unseen = $asked;
        }
    }

    sleep(0.2);
}

is($accepted, $more, "$more messages, 0.2 s apart, accepted");
ok(defined $seen && $unseen < $FLUSH + 0.8,
   sprintf('the fourth reply written once the flush time passed, while '
           . 'they came (not yet %.3f s after the turn ended, written'
           . ' %s s after)', $unseen,
           defined $seen ? sprintf('%.3f', $seen) : 'not'));
is($store->wait_sql("SELECT count(*) FROM events"
                    . " WHERE conversation LIKE 'more%'"
                    . " AND type = 'turn_completed'", qr/^$more$/, 10),
   $more, 'and their replies, once it passed after them');
is($store->wait_sql("SELECT count(*) FROM model_calls"
                    . " WHERE status = 'running'", qr/^0$/, 10),
   0, 'so are the audit\'s rows');

$t->stop;

unlike($t->read_file('error.log'), qr/\[(alert|crit)\]/,
       'no alert in error.log');

done_testing;
