#!/usr/bin/perl

# Two nginx nodes (agent_node) on one PostgreSQL: a conversation is
# owned by the node that wrote it, and a request to the other node is
# answered 421 with the owner's address while the owner lives; a node
# paused past its ttl has its conversation taken by the other, and once
# it runs again its lease has lapsed: it drops its zone and its claim is
# refused (or its write, by the fence), nothing of it in the log after
# the take-over, also when it was paused in a turn that the other node's
# sweep took over; a node killed in a
# turn has the turn taken over by the other node's sweep, and completed
# once.  A front tier follows a 421 to the owner.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep time);
use JSON::PP;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::Postgres;

plan(skip_all => Test::Agent::Postgres->missing)
    if Test::Agent::Postgres->missing;

my $pg = Test::Agent::Postgres->new;
my $conninfo = $pg->conninfo;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'a reply', chunks => 2 };
});

sub node {
    my ($id) = @_;
    return store_node($mock, $conninfo, $id);
}

sub types {
    my ($cid) = @_;
    return "SELECT group_concat(type, ' ') FROM (SELECT type FROM events"
           . " WHERE conversation = '$cid' ORDER BY seq) e";
}

sub gapless {
    my ($cid) = @_;
    return $pg->sql("SELECT count(*) = max(seq) AND min(seq) = 1"
                    . " FROM events WHERE conversation = '$cid'") eq 't';
}

sub node_pids {
    my ($t) = @_;
    return ($t->master_pid, $t->worker_pids);
}

# a node needs a PostgreSQL store, and an id

for my $case (['agent_store store.db; agent_node id=n0;',
               qr/needs an "agent_store" on PostgreSQL/, 'SQLite\'s store'],
              ["agent_store \"$conninfo\"; agent_node addr=127.0.0.1:1;",
               qr/needs "id="/, 'no id'],
              ["agent_store \"$conninfo\"; agent_node id=n0 ttl=1s"
               . ' heartbeat=2s;', qr/ttl must be longer/, 'a short ttl'])
{
    my $bad = Test::Agent->new;
    $bad->write_file_expand('nginx.conf',
                            engine_conf($mock, http => $case->[0]));
    my ($rc, $out) = $bad->test_config;
    ok($rc != 0 && $out =~ $case->[1], "agent_node refused: $case->[2]")
        or diag($out);
}

my ($n1, $addr1) = node('n1');
my ($n2, $addr2) = node('n2');

is($pg->wait_sql("SELECT string_agg(id || '=' || addr, ' ' ORDER BY id)"
                 . " FROM nodes", qr/n2/),
   "n1=$addr1 n2=$addr2", 'each node has its row');

# (a) a conversation n1 wrote is n1's: n2 refuses it, naming n1

is(send_message($n1, 'a1', 'hello')->{status}, 202, 'a message to n1');
wait_state($n1, 'a1', 'idle');

is($pg->sql("SELECT node, epoch FROM conversations WHERE id = 'a1'"),
   'n1|0', 'n1 owns it');

my $r = send_message($n2, 'a1', 'to the other node');
is($r->{status}, 421, 'a message to n2: 421');
is($r->{json}{error}{code}, 'owned_elsewhere', 'owned_elsewhere');
is($r->{headers}{'x-agent-owner'}, $addr1, 'with the owner\'s address');

is(inspect($n2, 'a1')->{status}, 421, 'a read on n2 too');

# a front tier that sends everything to n2 (a ring that changed): the
# 421 is taken up and the request goes to the owner it names

my $front = Test::Agent->new;
$front->write_file_expand('nginx.conf', <<"EOF");
%%TEST_GLOBALS%%

events {
}

http {
    %%TEST_GLOBALS_HTTP%%

    upstream agents {
        server $addr2;
    }

    server {
        listen 127.0.0.1:%%PORT_8080%%;

        location /c/ {
            proxy_pass http://agents;
            proxy_intercept_errors on;
            error_page 421 = \@owner;
        }

        location \@owner {
            set \$owner \$upstream_http_x_agent_owner;
            proxy_pass http://\$owner;
        }
    }
}
EOF
$front->run;

$r = send_message($front, 'a1', 'through the front');
is($r->{status}, 202, 'through a front tier: 421 retried at the owner');
wait_state($n1, 'a1', 'idle');
$front->stop;

# (b) n1 paused past its ttl: n2 takes the conversation over; n1, once
# it runs again, cannot write it

my @paused = node_pids($n1);
kill 'STOP', @paused;

sleep 2.5;

my $start = time;
$r = send_message($n2, 'a1', 'n1 is late');
is($r->{status}, 202, 'n1 paused past its ttl: n2 takes the message');
wait_state($n2, 'a1', 'idle');

is($pg->sql("SELECT node, epoch FROM conversations WHERE id = 'a1'"),
   'n2|1', 'n2 owns it now, at a new epoch');
is($pg->sql(types('a1')), join(' ', ('user_msg assistant_msg turn_completed')
   x 3), 'the log goes on');
ok(gapless('a1'), 'without a gap');

kill 'CONT', @paused;

$r = send_message($n1, 'a1', 'n1 is back', timeout => 15);
is($r->{status}, 421, 'n1 back: its claim is refused, 421');
is($r->{headers}{'x-agent-owner'}, $addr2, 'naming n2');

# its lease lapsed: it dropped its zone before it took the message (its
# write would have been refused by the fence)

my $lost;
for (1 .. 50) {
    $lost = $n1->read_file('error.log') =~ /lease lapsed/;
    last if $lost;
    sleep 0.1;
}
ok($lost, 'n1 logged its lease lapsed');

is(inspect($n1, 'a1')->{status}, 421,
   'n1 dropped it: a read there is sent to n2');

is($pg->sql("SELECT count(*) FROM events WHERE conversation = 'a1'"
            . " AND seq > 6 AND epoch <> 1"), 0,
   'no event of n1\'s after the take-over');
ok(gapless('a1'), 'the log still without a gap');
is($pg->sql(types('a1')), join(' ', ('user_msg assistant_msg turn_completed')
   x 3), 'and nothing of n1 in it');

# n1 lives again: its heartbeat is fresh, and n2 gets 421 for what n1
# owns

is(send_message($n1, 'b1', 'hello')->{status}, 202, 'n1 writes its own');
wait_state($n1, 'b1', 'idle');
sleep 0.6;
is(send_message($n2, 'b1', 'to n2')->{status}, 421,
   'n1 alive again: n2 refuses its conversation');

# n1 paused in a turn past its ttl: n2's sweep takes the turn over;
# n1, once it runs again, finishes its reply but cannot write it

$mock->script({ text => 'stale words', chunks => 3, pause_after => 1 },
              { text => 'the new owner\'s answer' });
my $first = scalar @{$mock->requests};

is(send_message($n1, 'd1', 'a turn to pause')->{status}, 202,
   'a turn on n1');
$mock->wait_paused($first, 5);

@paused = node_pids($n1);
kill 'STOP', @paused;

is($pg->wait_sql(types('d1'), qr/turn_completed/, 15),
   'user_msg assistant_msg turn_completed',
   'n1 paused in a turn: n2 took it over and completed it');
is($pg->sql("SELECT node, epoch FROM conversations WHERE id = 'd1'"),
   'n2|1', 'n2 owns it');

kill 'CONT', @paused;
$mock->release($first);

# n1's reply is not written: its lease lapsed (the turn stops at its
# next step), or the fence refuses what it had sent before the pause

$lost = 0;
for (1 .. 50) {
    $lost = $n1->read_file('error.log')
            =~ /"d1": ownership lost|"d1" stops: the node's lease lapsed/;
    last if $lost;
    sleep 0.1;
}
ok($lost, 'n1\'s reply refused, or its turn stopped');

is($pg->sql(types('d1')), 'user_msg assistant_msg turn_completed',
   'the log has the new owner\'s reply only');
unlike($pg->sql("SELECT data FROM events WHERE conversation = 'd1'"),
       qr/stale words/, 'no word of n1\'s');
is($pg->sql("SELECT count(*) FROM events WHERE conversation = 'd1'"
            . " AND seq > 1 AND epoch <> 1"), 0,
   'every event after the take-over of the new epoch');
ok(gapless('d1'), 'without a gap');

sleep 0.6;

# (c) n1 killed in a turn: n2's sweep takes the turn over, and it ends
# once

$mock->script({ text => 'cut words', chunks => 2, pause_after => 1 },
              { text => 'the answer' });
my $before = scalar @{$mock->requests};

is(send_message($n1, 'c1', 'a long one')->{status}, 202, 'a turn on n1');
$mock->wait_paused($before, 5);

kill 'KILL', node_pids($n1);
$start = time;

my $done = $pg->wait_sql(types('c1'), qr/turn_completed/, 15);
my $took = time - $start;
is($done, 'user_msg assistant_msg turn_completed',
   'n1 killed in a turn: n2 took it over, one reply');
cmp_ok($took, '<', 2 + 1 + 3, 'within the ttl and a sweep round');
diag(sprintf 'taken over in %.1f s after kill -9', $took);

is($pg->sql("SELECT node, epoch FROM conversations WHERE id = 'c1'"),
   'n2|1', 'n2 owns it, claimed by its sweep');
is(scalar @{$mock->requests} - $before, 2,
   'the model asked twice: the cut call and the take-over\'s');
ok(gapless('c1'), 'its log without a gap');

$mock->stop;
$n2->stop;

done_testing;
