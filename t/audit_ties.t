#!/usr/bin/perl

# The audit's key for a model call is its conversation, start and worker:
# a call's end finds its row by them, and the calls are numbered in their
# order.  nginx's time is the event loop's, and with timer_resolution it
# stands still for a whole period: a tool answered at once, and a turn
# that starts right after another, start calls at the same millisecond.
# Each call starts after the conversation's last one, if only by a
# millisecond: every row written, numbered in order, with its own end.

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

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

my $db = $t->testdir . '/agent.db';
my $store = Test::Agent::Store->new($db);

my $conf = engine_conf($mock,
    http => "agent_store $db;",
    tools => 'agent_tool echo { location /tools/echo; }',
    agent => 'tools echo;',
    server => 'location = /tools/echo {
            internal;
            default_type application/json;
            return 200 \'{"echo":$request_body}\';
        }');

# the time stands still for a second: calls in it start at the same ms
$conf =~ s/^(worker_processes)/timer_resolution 1s;\n\n$1/m
    or die 'no worker_processes in the configuration';

$t->write_file_expand('nginx.conf', $conf);
$t->run;

# three turns, each a tool call answered at once and a reply

my $usage = 10;

sub usage { { prompt_tokens => 5, completion_tokens => ++$usage } }

for my $n (1 .. 3) {
    $mock->script({ tool_calls => [{ id => "c$n", name => 'echo',
                                     arguments => "{\"n\":$n}" }],
                    usage => usage() },
                  { text => "reply $n", usage => usage() });
    send_message($t, 'a1', "turn $n");
    wait_state($t, 'a1', 'idle');
}

my $rows = "SELECT call, turn, status, output_tokens FROM model_calls"
           . " WHERE conversation = 'a1' ORDER BY call";

is($store->wait_sql($rows, qr/^6\|3\|ok\|16$/m),
   join("\n", map { join('|', $_, int(($_ + 1) / 2), 'ok', 10 + $_) }
                  1 .. 6),
   'six calls: each a row, numbered in order, ended with its own usage');

is($store->sql("SELECT count(*) FROM model_calls a JOIN model_calls b"
               . " ON b.conversation = a.conversation AND b.call = a.call + 1"
               . " WHERE b.started <= a.started"), 0,
   'each call starts after the one before');

cmp_ok($store->sql("SELECT count(*) FROM model_calls a JOIN model_calls b"
                   . " ON b.conversation = a.conversation"
                   . " AND b.call = a.call + 1"
                   . " WHERE b.started = a.started + 1"), '>', 0,
       'calls of the same tick are a millisecond apart');

unlike($t->read_file('error.log'), qr/could not write|\[error\]/,
       'the store wrote every row');

is($store->sql("SELECT count(*) FROM model_calls"), 6, 'no other row');

done_testing();
