#!/usr/bin/perl

# Two nginx nodes (agent_node) on one PostgreSQL, and what the fence and
# the ownership cover besides a batch's events:
#
# - a conversation evicted at rest is let go (node NULL): the other node
#   takes a message for it at once, without waiting for a ttl;
# - a message queued (agent_busy queue) by a node that lost the
#   conversation is refused (421: its lease lapsed, or "ownership
#   lost"), nothing of it written; so are that node's audit rows of the
#   conversation;
# - queue ids come from the conversation's durable count, advanced as a
#   message is queued: after a take-over of a killed node, the new owner
#   goes on from it and no id repeats;
# - a call waiting for approval keeps its deadline across a take-over of
#   a killed node, and expires once, at it.

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

my $tools = <<'EOF';
    agent_tool ask_user {
        executor human;
        timeout 8s;
    }
EOF

# the receiver of notifications of waiting calls

my $recv = Test::Agent::MockProvider->new(default => sub {
    return { text => 'noted' };
});
my $rport = $recv->port;

sub notified {
    my ($cid) = @_;
    return scalar grep { ($_->{headers}{'x-agent-conversation'} // '')
                         eq $cid } @{$recv->requests};
}

# created ids, and conversations read and written as an owner (X-User),
# and where notifications go

my $owned = <<"EOF";
        location = /notify {
            internal;
            proxy_pass http://127.0.0.1:$rport/ok/v1/chat/completions;
        }

        location = /conversations {
            agent chat;
            agent_owner \$http_x_user;
            agent_create;
        }

        location ~ ^/o/(?<cid>[^/]+)\$ {
            agent chat;
            agent_owner \$http_x_user;
            agent_conversation \$cid;
            agent_inspect;
        }

        location ~ ^/o/(?<cid>[^/]+)/messages\$ {
            agent chat;
            agent_owner \$http_x_user;
            agent_conversation \$cid;
            agent_message;
        }
EOF

sub node {
    my ($id, $idle) = @_;

    my $t = Test::Agent->new;
    my $addr = '127.0.0.1:' . $t->port(8080);

    $t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
        tools => $tools, agent => 'tools ask_user;', server => $owned,
        http => "agent_store \"$conninfo\";\n"
                . "    agent_node id=$id addr=$addr heartbeat=500ms"
                . " ttl=2s;\n"
                . "    agent_busy queue; agent_evict_idle $idle;"
                . " agent_evict_unused 4s; agent_notify /notify;"));
    $t->run;
    return ($t, $addr);
}

sub types {
    my ($cid) = @_;
    return "SELECT string_agg(type, ' ' ORDER BY seq) FROM events"
           . " WHERE conversation = '$cid'";
}

sub node_pids {
    my ($t) = @_;
    return ($t->master_pid, $t->worker_pids);
}

sub logged {
    my ($t, $re) = @_;
    return $t->wait_log($re);
}

# a random source that repeats itself, once: the next 16 bytes drawn
# in either node are 0xab while the file "repeat" exists (a shim of
# getrandom(2) preloaded into nginx; not with sanitizers, whose runtime
# must come first)

my $aux = Test::Agent->new;
my $repeat = $aux->testdir . '/repeat';
my $shim = shim($aux->testdir, $repeat);
local $ENV{LD_PRELOAD} = join ' ', grep { defined && length }
    $ENV{LD_PRELOAD}, $shim if $shim;

sub shim {
    my ($dir, $file) = @_;

    return undef if Test::Agent->sanitized;

    open my $fh, '>', "$dir/repeat.c" or return undef;
    print $fh <<"EOF";
#define _GNU_SOURCE
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/types.h>

ssize_t
getrandom(void *buf, size_t len, unsigned int flags)
{
    if (len == 16 && unlink("$file") == 0) {
        memset(buf, 0xab, len);
        return len;
    }

    return syscall(SYS_getrandom, buf, len, flags);
}
EOF
    close $fh;

    system("cc -shared -fPIC -o $dir/repeat.so $dir/repeat.c 2>/dev/null") == 0
        or return undef;
    return "$dir/repeat.so";
}

# n1 lets a conversation at rest go after 1 s, as (a) needs; n2 keeps
# what it took over in (b) while n1 is asked for it, however slow the
# machine (let go, it would be any node's, and n1's again once asked)

my ($n1, $addr1) = node('n1', '1s');
my ($n2, $addr2) = node('n2', '1m');

# (a) evicted at rest, all of it written: no node's, so the other node
# claims it at once

is(send_message($n1, 'e1', 'hello')->{status}, 202, 'a message to n1');
wait_state($n1, 'e1', 'idle');
is($pg->sql("SELECT node FROM conversations WHERE id = 'e1'"), 'n1',
   'n1 owns it');

is($pg->wait_sql("SELECT coalesce(node, 'none') FROM conversations"
                 . " WHERE id = 'e1'", qr/^none$/, 10), 'none',
   'evicted from n1\'s zone: let go');

my $r = send_message($n2, 'e1', 'to the other node');
is($r->{status}, 202, 'n2 takes a message for it at once, n1 alive');
wait_state($n2, 'e1', 'idle');
is($pg->sql("SELECT node, epoch FROM conversations WHERE id = 'e1'"),
   'n2|1', 'n2 owns it, at a new epoch');
is($pg->sql(types('e1')), join(' ', ('user_msg assistant_msg turn_completed')
   x 2), 'the log goes on');

# an id drawn on both nodes is the store's once: the second node's
# create is refused by the key and draws another

SKIP: {
    skip 'no getrandom shim (sanitizers, or no cc)', 6 unless $shim;

    my $same = 'ab' x 16;

    open my $fh, '>', $repeat or die "$repeat: $!";
    close $fh;
    $r = owner_request($n1, 'alice', 'POST', '/conversations', '');
    is($r->{json}{conversation}, $same, 'n1 drew the repeated id');

    open $fh, '>', $repeat or die "$repeat: $!";
    close $fh;
    $n2->allow_alert(qr/agent create: id "$same" is the store's already/);
    $r = owner_request($n2, 'bob', 'POST', '/conversations', '');
    is($r->{status}, 201, 'n2 drew it too: created all the same');
    my $other = $r->{json}{conversation} // '';
    ok($other ne $same && $other =~ /^[0-9a-f]{32}$/,
       'under another id, drawn again');
    ok(!-e $repeat, 'after the repeated one was drawn');
    like($n2->read_file('error.log'),
         qr/agent create: id "$same" is the store's already/,
         'the clash logged');
    is($pg->sql("SELECT owner, node FROM conversations WHERE id = '$same'"),
       'alice|n1', 'the id stays n1\'s and alice\'s');
}

# (b) n1 paused in a turn past its ttl: n2's sweep takes the turn over;
# n1, once it runs again, drops its zone (its lease lapsed) or, if a
# message came first, its queueing is refused by the fence

$mock->script({ text => 'stale words', chunks => 3, pause_after => 1 },
              { text => 'the new owner\'s answer' });
my $first = scalar @{$mock->requests};

is(send_message($n1, 'd1', 'a turn to pause')->{status}, 202,
   'a turn on n1');
ok($mock->wait_paused($first, 5), 'it streams');

my @paused = node_pids($n1);
kill 'STOP', @paused;

is($pg->wait_sql(types('d1'), qr/turn_completed/, 15),
   'user_msg assistant_msg turn_completed',
   'n1 paused in a turn: n2 took it over and completed it');
is($pg->sql("SELECT node, epoch FROM conversations WHERE id = 'd1'"),
   'n2|1', 'n2 owns it');

kill 'CONT', @paused;

$r = send_message($n1, 'd1', 'queued on the stale node', timeout => 15);
is($r->{status}, 421, 'a message queued on n1: 421');
is($r->{json}{error}{code}, 'owned_elsewhere', 'owned_elsewhere');
ok(logged($n1, qr/"d1": ownership lost|lease lapsed/),
   'n1 logged its lease lapsed, or "ownership lost"');

is($pg->sql("SELECT count(*) FROM queued WHERE conversation = 'd1'"), 0,
   'nothing queued in the store');
unlike($pg->sql("SELECT string_agg(data, ' ') FROM events"
                . " WHERE conversation = 'd1'"),
       qr/queued on the stale node/, 'nor in the log');
is($pg->sql("SELECT queue_id FROM conversations WHERE id = 'd1'"), 0,
   'the queue\'s count not advanced');
is(inspect($n1, 'd1')->{status}, 421,
   'n1 dropped it: a read there is sent to n2');

# n1's model call ends: its audit row's end is refused as its events

$mock->release($first);

ok(logged($n1, qr/model call rows dropped, another node owns it/),
   'n1\'s audit rows of d1 refused');
sleep 0.5;

is($pg->sql("SELECT string_agg(node || ':' || status, ' ' ORDER BY call)"
            . " FROM model_calls WHERE conversation = 'd1'"
            . " AND status <> 'lost'"), 'n2:ok',
   'the audit: n2\'s call ok, with its node; n1\'s, if written, lost');
is($pg->sql(types('d1')), 'user_msg assistant_msg turn_completed',
   'the log has the new owner\'s turn only');

sleep 0.6;

# (c) on n1: a call waiting for approval, and a turn with a message
# queued behind it; then n1 is killed

$mock->reset;
$mock->script({ tool_calls => [{ id => 'k1', name => 'ask_user',
                                 arguments => '{}' }] });

is(send_message($n1, 'w1', 'ask me')->{status}, 202, 'a turn on n1');
my $c = wait_state($n1, 'w1', 'awaiting_input');
my ($pending) = @{$c->{pending} // []};
ok($pending && $pending->{deadline}, 'a call waits, with a deadline');
my $deadline = $pending ? $pending->{deadline} / 1000 : 0;

for (1 .. 50) {
    last if notified('w1');
    sleep 0.1;
}
is(notified('w1'), 1, 'its notification sent by n1');
is($pg->wait_sql("SELECT count(*) FROM notified WHERE conversation = 'w1'",
                 qr/^1$/, 5), 1, 'and recorded as delivered in the store');

$mock->script({ text => 'one', chunks => 2, pause_after => 1 });
$first = scalar @{$mock->requests};

is(send_message($n1, 'q1', 'one')->{status}, 202, 'a turn on n1');
ok($mock->wait_paused($first, 5), 'it streams');
$r = send_message($n1, 'q1', 'two');
is($r->{status}, 202, 'a message queued behind it');
ok($r->{json}{queued}, 'said queued');

is($pg->sql("SELECT queue_id FROM conversations WHERE id = 'q1'"), 1,
   'the queue\'s count in the store is the id given');

# (d) an id created on n1 is the store's at once, bound to its agent and
# owner, and n1's

$r = owner_request($n1, 'alice', 'POST', '/conversations', '');
is($r->{status}, 201, 'created on n1');
my $made = $r->{json}{conversation} // '';
like($made, qr/^[0-9a-f]{32}$/, 'an id');
is($pg->sql("SELECT agent, owner, node, last_seq FROM conversations"
            . " WHERE id = '$made'"), 'chat|alice|n1|0',
   'its row written at once: bound, n1\'s, with no event');
is(owner_request($n2, 'alice', 'GET', "/o/$made")->{status}, 421,
   'n2 refuses it while n1 lives');
is($pg->sql("SELECT count(*) FROM conversations WHERE id = '$made'"
            . " AND node = 'n2'"), 0, 'and does not take it');

kill 'KILL', node_pids($n1);
my $killed = time;
$mock->release($first);

# the id created on n1, once n1 is taken for dead: n2 has it, bound as
# it was made

sleep 2.5;

is(owner_request($n2, 'bob', 'GET', "/o/$made")->{status}, 404,
   'n1 dead: on n2 another owner finds no such conversation');
is(owner_request($n2, 'bob', 'POST', "/o/$made/messages",
                 '{"content":"mine now"}')->{status}, 404,
   'nor can take it with a message');
$r = owner_request($n2, 'alice', 'GET', "/o/$made");
is($r->{status}, 200, 'its owner does');
is_deeply($r->{json}{messages}, [], 'with nothing in it');
is($pg->sql("SELECT agent, owner, node FROM conversations"
            . " WHERE id = '$made'"), 'chat|alice|n2',
   'n2 owns it now, still bound');

# the waiting call, read on n2 once n1 is taken for dead: its deadline
# as it was

$c = inspect($n2, 'w1')->{json} // {};
my $claimed = time;
($pending) = @{$c->{pending} // []};
is($pending && $pending->{deadline}, $deadline * 1000,
   'n2 took the waiting call over with its deadline');
is($pg->sql("SELECT node FROM conversations WHERE id = 'w1'"), 'n2',
   'n2 owns it');
sleep 1;
is(notified('w1'), 1, 'n2 does not notify of it again');

$c = wait_state($n2, 'w1', 'idle', 15);
my $expired = time;
cmp_ok($expired, '>=', $deadline - 0.3, 'expired not before its deadline');
cmp_ok($expired, '<', $deadline + 1.5, 'and soon after it');
diag(sprintf 'killed %.1f s before the deadline, claimed %.1f s after'
     . ' the kill, expired %.1f s after the deadline',
     $deadline - $killed, $claimed - $killed, $expired - $deadline);
is(scalar(grep { $_->{type} eq 'tool_result' } @{$c->{messages} // []}), 1,
   'expired once');
is(scalar(grep { $_->{type} eq 'resolution' && $_->{expired} }
          @{$c->{messages} // []}), 1, 'one resolution, expired');

# the queued message: n2's sweep takes the turn over, the message runs;
# n2 queues the next one past the store's count

like($pg->wait_sql("SELECT count(*) FROM events WHERE conversation = 'q1'"
                   . " AND type = 'turn_completed'", qr/^2$/, 15), qr/^2$/,
     'n2 took q1 over: its turn and the queued one ran');
cmp_ok($pg->sql("SELECT epoch FROM conversations WHERE id = 'q1'"), '>=', 1,
       'claimed by n2, at a new epoch');

$mock->script({ text => 'three', chunks => 2, pause_after => 1 });
$first = scalar @{$mock->requests};

is(send_message($n2, 'q1', 'three')->{status}, 202, 'a turn on n2');
ok($mock->wait_paused($first, 5), 'it streams');
$r = send_message($n2, 'q1', 'four');
is($r->{status}, 202, 'another message queued');
is($pg->sql("SELECT id FROM queued WHERE conversation = 'q1'"), 2,
   'with the next id');
$mock->release($first);

like($pg->wait_sql("SELECT count(*) FROM events WHERE conversation = 'q1'"
                   . " AND type = 'turn_completed'", qr/^4$/, 15), qr/^4$/,
     'all four turns ran');
is($pg->sql("SELECT string_agg(coalesce(data::json->>'queue_id', '-'), ' '"
            . " ORDER BY seq) FROM events WHERE conversation = 'q1'"
            . " AND type = 'user_msg'"), '- 1 - 2',
   'each queued message with its own id');
is($pg->sql("SELECT queue_id FROM conversations WHERE id = 'q1'"), 2,
   'the count at the last');

# the id created on n1 and never used: freed on n2 after
# agent_evict_unused, its row with it

is($pg->wait_sql("SELECT count(*) FROM conversations WHERE id = '$made'",
                 qr/^0$/, 15), 0,
   'a created id never used: its row goes with its record');
is(owner_request($n2, 'bob', 'POST', "/o/$made/messages",
                 '{"content":"a new one"}')->{status}, 202,
   'the id is free again: a message starts a new conversation under it');

$mock->stop;
$recv->stop;
$n2->stop;

done_testing;
