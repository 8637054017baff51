#!/usr/bin/perl

# A turn whose workers keep dying is taken over a bounded number of
# times, then fails, also when nginx itself dies between the take-overs:
# the count is kept with the conversation in the store, and a revival
# after a restart counts on from it.  A turn that gets on starts a
# count of its own.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::Hang;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan skip_all => 'sqlite3 is not installed' unless Test::Agent::Store->available;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $dir = $t->testdir;
my $store = Test::Agent::Store->for_test($t);
my $db = $store->directive;

my $hang = Test::Agent::Hang->new($dir);
my $hport = $hang->port;

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store $db;",
    tools => <<'EOF',
    agent_tool hang {
        location /tools/hang;
    }
EOF
    agent => 'tools hang;',
    server => <<"EOF"));
        location = /tools/hang {
            internal;
            proxy_pass http://127.0.0.1:$hport;
            proxy_read_timeout 1h;
        }
EOF

$t->allow_alert(qr/worker process \d+ exited on signal 9/);
$t->run;

sub hang_calls { $hang->calls }

# the whole server killed, as a machine's crash would, and started again

sub crash_and_restart {
    kill 'STOP', $t->master_pid;
    kill 'KILL', $t->worker_pids;
    $t->stop('KILL');
    delete $t->{unclean};    # killed on purpose
    $t->run;
}

# each time the call is sent, its worker dies: every other time the
# whole of nginx with it

$mock->script({ tool_calls => [{ id => 'call_hang', name => 'hang',
                                 arguments => '{}' }] },
              { text => 'never' });

my $r = send_message($t, 'k1', 'hang');
is($r && $r->{status}, 202, 'a message');

my ($kills, $crashes) = (0, 0);

for my $n (1 .. 10) {
    my $deadline = time + 30;
    sleep 0.05 while hang_calls() < $n && time < $deadline;
    last if hang_calls() < $n;

    if ($n % 2) {
        my $lease = inspect($t, 'k1')->{json}{lease} or last;
        $t->kill_worker($lease);
        $kills++;

    } else {
        crash_and_restart();
        $crashes++;
    }
}

my $c = wait_state($t, 'k1', 'idle', 30);
is($kills + $crashes, 6, 'the call ran after 5 take-overs, not after 6');
ok($crashes >= 2, "nginx itself died $crashes times among them");
is(hang_calls(), 6, 'the call was sent 6 times in all');
is($c->{messages}[-1]{type}, 'turn_failed', 'the turn failed');
like($c->{messages}[-1]{reason} // '', qr/died repeatedly/,
     'because its worker died repeatedly');

# the conversation goes on with a count of its own: a turn that gets on
# is taken over again after a restart

my $base = hang_calls();

$mock->reset;
$mock->script({ text => 'fine' });
$r = send_message($t, 'k1', 'again');
is($r && $r->{status}, 202, 'a message after that');
is(wait_state($t, 'k1', 'idle')->{messages}[-1]{type}, 'turn_completed',
   'its turn completed');

$mock->script({ tool_calls => [{ id => 'call_hang2', name => 'hang',
                                 arguments => '{}' }] },
              { text => 'never' });
send_message($t, 'k1', 'hang again');

my $deadline = time + 15;
sleep 0.05 while hang_calls() < $base + 1 && time < $deadline;

# the reply that called it written, or the restart makes it anew
$store->wait_sql("SELECT count(*) FROM events WHERE conversation = 'k1'"
                 . " AND type = 'tool_call'", qr/^2$/, 10);
crash_and_restart();

$deadline = time + 15;
sleep 0.05 while hang_calls() < $base + 2 && time < $deadline;
is(hang_calls(), $base + 2, 'a new turn is taken over after a restart');
is($store->sql("SELECT takeovers FROM conversations WHERE id = 'k1'"), 1,
   'and counted once');

is(cancel($t, 'k1')->{status}, 200, 'cancelled');
is(wait_state($t, 'k1', 'idle')->{messages}[-1]{type}, 'cancelled',
   'and at rest');

$t->done;
