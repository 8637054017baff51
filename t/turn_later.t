#!/usr/bin/perl

# A pass of the event loop that has run 1 ms leaves the turns' next steps
# to the passes after it.  Forty turns of 64 tool calls each run at once
# in one worker, their model calls answered together, so that passes
# come to many of them at once; some are cancelled while they run.
# Steps are left to later passes (agent_turn_steps_later_total), and
# every turn still ends: each log whole and in order in the store, the
# cancelled ones at rest too.  The event loop's lines go to a debug log
# (if nginx has it): the timer of the event that runs the steps left is
# logged as any other, and crashed the worker when it named nothing.

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

my $convs = 40;
my $calls = 64;

# held after their first event, then let go together
my $mock = Test::Agent::MockProvider->new(default => held_calls($calls));

my ($t, $db) = store_engine($mock, zone => '64m', debug => 'debug_event');


is(metric($t, 'agent_turn_steps_later_total'), 0, 'no step left yet');

my @sent = map { send_message_later($t, "w$_", "question $_") } 1 .. $convs;

is(http_status($_, 30), 202, 'a message acknowledged') for @sent;

ok($mock->wait_paused($convs - 1, 30), 'every model call under way');

$mock->release;

# cancelled while they run, wherever their steps are
my @cancelled = map { "w$_" } grep { $_ % 8 == 0 } 1 .. $convs;

is(cancel($t, $_)->{status}, 200, "$_: cancel answered") for @cancelled;

is(wait_state($t, "w$_", 'idle', 60)->{state}, 'idle', "w$_: at rest")
    for 1 .. $convs;

my $later = metric($t, 'agent_turn_steps_later_total');

cmp_ok($later, '>', 0,
       "steps were left to later passes ($later)");

my %cancelled = map { $_ => 1 } @cancelled;
my @whole = grep { !$cancelled{$_} } map { "w$_" } 1 .. $convs;
my $ids = join ',', map { "'$_'" } @whole;

$db->wait_sql('SELECT count(*) FROM conversations WHERE state = \'idle\'',
              qr/^$convs$/, 30);

is($db->sql("SELECT count(*) FROM events WHERE conversation IN ($ids)"),
   @whole * (2 * $calls + 4), 'the turns not cancelled: every event');

is($db->whole_logs, $convs,
   'each conversation\'s log from seq 1, with no gap');

# in each log: the calls, then their results, then the answer

my $order = $db->sql('SELECT count(*) FROM (SELECT conversation,'
    . " group_concat(type, ' ') AS types FROM (SELECT * FROM events"
    . " WHERE conversation IN ($ids) ORDER BY conversation, seq)"
    . ' GROUP BY conversation) WHERE types = '
    . "'user_msg assistant_msg" . (' tool_call' x $calls)
    . (' tool_result' x $calls) . " assistant_msg turn_completed'");

is($order, scalar @whole, 'each log in the order of its turn');

is($db->sql("SELECT count(*) FROM conversations WHERE state = 'idle'"),
   $convs, 'every conversation at rest in SQLite');

# A reload while steps wait: the old worker exits once it has no timer
# left, and posted events are not timers; it still runs its turns to
# their end, and the new worker takes none over.

my $first = @{$mock->requests};
my $steps = metric($t, 'agent_turn_steps_later_total');

@sent = map { send_message_later($t, "r$_", "again $_") } 1 .. $convs;

is(http_status($_, 30), 202, 'a message acknowledged') for @sent;

ok($mock->wait_paused($first + $convs - 1, 30),
   'every model call under way again');

$mock->release;

ok($t->reload, 'reloaded while the turns run');

is(wait_state($t, "r$_", 'idle', 60)->{state}, 'idle', "r$_: at rest")
    for 1 .. $convs;

cmp_ok(metric($t, 'agent_turn_steps_later_total'), '>', $steps,
       'steps were left to later passes again');

is(metric($t, 'agent_takeovers_total'), 0, 'no turn taken over');

$ids = join ',', map { "'r$_'" } 1 .. $convs;

is($db->wait_sql("SELECT count(*) FROM events WHERE conversation IN ($ids)",
                 qr/^@{[ $convs * (2 * $calls + 4) ]}$/, 30),
   $convs * (2 * $calls + 4), 'every turn whole');

$t->stop;
$mock->stop;

unlike($t->read_file('error.log'), qr/\[(alert|emerg|crit)\]/,
       'no alert in error.log');

done_testing;
