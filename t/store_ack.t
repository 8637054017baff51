#!/usr/bin/perl

# An input is written before the backlog: with thousands of events
# waiting for the store, a message's 202 comes once its user_msg is
# written, not once everything recorded before it is.  The database is
# locked by another process while 30 turns of 64 tool calls each run
# (3,960 events wait); a message to a new conversation comes last; the
# lock goes.  Its 202 comes while much of the backlog is still
# unwritten (written in order, it would come last), and then everything
# is written, each conversation's log whole and in order.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $convs = 30;
my $calls = 64;
my $events = $convs * (2 * $calls + 4);

my $mock = Test::Agent::MockProvider->new(default => sub {
    my ($req) = @_;
    my $msgs = $req->{json}{messages} || [];
    my $last = $msgs->[-1] || {};

    return { text => 'done' } if $last->{role} eq 'tool';
    return { text => 'noted' } if ($last->{content} // '') =~ /^urgent/;
    return { tool_calls => echo_calls($calls) };
});

my ($t, $db) = store_engine($mock);


ok($db->lock, 'the database is locked by another process');

my @load = map { send_message_later($t, "w$_", "question $_") }
    1 .. $convs;

wait_state($t, "w$_", 'idle', 60) for 1 .. $convs;

is(metric($t, 'agent_store_lag_events'), $events,
   "$events events of $convs turns wait for the store");

my $urgent = send_message_later($t, 'u1', 'urgent');

# its user_msg is in the zone, behind the others
sleep 0.3;

$db->unlock;

is(http_status($urgent, 15), 202, 'the last message is acknowledged');

my $lag = metric($t, 'agent_store_lag_events');

# written last, it would find none left; a quarter leaves room for a
# slow machine between the 202 and the count

cmp_ok($lag, '>', $events / 4,
       "before the backlog is written ($lag events still wait)");

is(http_status($_, 15), 202, 'a message of the backlog acknowledged')
    for @load;

my $all = $events + 3;

is($db->wait_sql('SELECT count(*) FROM events', qr/^$all$/, 30), $all,
   'then every event is written');

is($db->whole_logs, $convs + 1,
   'each conversation\'s log from seq 1, with no gap');

is($db->sql("SELECT group_concat(type, ' ') FROM (SELECT type FROM events"
            . " WHERE conversation = 'u1' ORDER BY seq)"),
   'user_msg assistant_msg turn_completed', 'the last message\'s turn');

is($db->sql("SELECT count(*) FROM conversations WHERE state = 'idle'"),
   $convs + 1, 'every conversation at rest in SQLite');

store_stop($t, $mock);

done_testing;
