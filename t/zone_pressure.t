#!/usr/bin/perl

# A turn the zone cannot hold ends cleanly: a call whose result found no
# room gets an error result instead, the turn a turn_failed, so that the
# log stays paired and the next model request is one a provider takes.
# A zone full to its last byte keeps a reserve for the events that end
# calls and turns.  A subscriber holds a conversation in the zone while
# it watches, and not once it goes, closed or with its worker killed.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new(default => sub {
    my ($req) = @_;

        # the work tool's own request: an answer a while later
    return { text => 'r' x 1500, latency => 3 }
        if defined $req->{headers}{'idempotency-key'};

    my $msgs = ($req->{json} || {})->{messages} || [];
    my $last = $msgs->[-1] || {};

    return { text => 'filled', latency => 4 }
        if ($last->{content} // '') =~ /^fill/;

    return { text => 'After the tool.' } if ($last->{role} // '') eq 'tool';

    my $n = scalar grep { $_->{role} eq 'user' } @$msgs;
    my $tool = ($last->{content} // '') =~ /big/ ? 'big' : 'work';

    return { tool_calls => [{ id => "call_${n}_" . int(rand 1e9),
                              name => $tool,
                              arguments => '{"pad":"' . ('p' x 1500)
                                           . '"}' }] };
});

# a result bigger than the whole zone: never recordable

$t->write_file('big.json', '{"blob":"' . ('b' x 200000) . '"}');

my $tools = <<'EOF';
    agent_tool work {
        location /tools/work;
    }

    agent_tool big {
        location /tools/big;
    }
EOF

(my $server = <<'EOF') =~ s/%%MOCK%%/$mock->port/e;
        location = /tools/work {
            internal;
            proxy_pass http://127.0.0.1:%%MOCK%%/v1/chat/completions;
        }

        location = /tools/big {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_8080%%/big.json;
            proxy_method GET;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
        }

        location = /big.json {
            root %%TESTDIR%%;
        }

        location ~ ^/q/(?<cid>[^/]+)/messages$ {
            agent chat;
            agent_conversation $cid;
            agent_message;
            agent_busy queue;
        }

        location = /zone {
            agent_zone_status;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock,
    zone => '128k keep_idle', tools => $tools, agent => 'tools work big;',
    server => $server,
    http => 'client_body_buffer_size 16k;'));
$t->run;

sub zone { decode_json(http_get('/zone', port => $t->port(8080))->{body}) }

sub pairs {
    my ($c) = @_;

    my (%calls, %results);

    for my $m (@{$c->{messages}}) {
        $calls{$_->{id}}++ for @{$m->{tool_calls} || []};
        $results{$m->{tool_call_id}}++ if $m->{type} eq 'tool_result';
    }

    my @bad = grep { ($results{$_} // 0) != 1 } keys %calls;
    push @bad, grep { !$calls{$_} } keys %results;

    return (scalar keys %calls, join ' ', sort @bad);
}

is(zone()->{reserve}, JSON::PP::true, 'the zone keeps its reserve');

# one call whose result cannot be recorded

send_message($t, 'b1', 'call the big tool');
my $c = wait_state($t, 'b1', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_result turn_failed',
   'the call is paired, then the turn fails');

my ($res) = grep { $_->{type} eq 'tool_result' } @{$c->{messages}};
is($res->{ok}, JSON::PP::false, 'with an error result');
like($res->{error}, qr/^\[failed\] the turn ended before the call had a/,
     'that says why');
is($c->{messages}[-1]{reason}, 'a tool result could not be recorded',
   'the turn_failed names the cause');
like($t->read_file('error.log'), qr/agent call "call_1_\d+" of "b1" had no/,
     'the error log names the call');

# the next turn's request: the call with its result, then the new message

my $before = scalar @{$mock->requests};
send_message($t, 'b1', 'now something small');
$c = wait_state($t, 'b1', 'idle');

my $next = 'turn_failed user_msg assistant_msg tool_call tool_result'
    . ' assistant_msg turn_completed';
like(log_types($c), qr/\Q$next\E$/, 'the next turn runs');

my $sent = $mock->requests->[$before]{json}{messages};
is_deeply([map { $_->{role} } @$sent], [qw(system user assistant tool user)],
          'the next request: the failed turn, paired, and the new message');
is($sent->[3]{tool_call_id}, $sent->[2]{tool_calls}[0]{id},
   'the result answers the call');
like(decode_json($sent->[3]{content})->{error}, qr/^\[failed\]/,
     'and the model sees it failed');

# a zone full to the last byte: a call running meanwhile comes back to
# a zone with no room even for its error result, and the reserve gives
# way so that its turn still ends paired

send_message($t, 'r1', 'one slow call');

for (1 .. 100) {
    last if log_types(inspect($t, 'r1')->{json}) =~ /tool_call$/;
    sleep 0.05;
}

# new conversations while they fit, then messages queued behind their
# turns, ever smaller, until not even a one-byte message does

my (@fill, $r);

for my $i (1 .. 100) {
    $r = send_message($t, "f$i", 'fill ' . ('q' x 3000));
    last if $r->{status} == 503;
    push @fill, "f$i";
}

my %refused;

for my $size (1000, 300, 50, 1) {
    for my $i (0 .. 15 * @fill) {
        $r = http_post("/q/$fill[$i % @fill]/messages",
                       encode_json({ content => 'q' x $size }),
                       port => $t->port(8080),
                       headers => { 'Content-Type' => 'application/json' });
        next if $r->{status} == 202;
        $refused{$size} = $r->{status};
        last;
    }
}

is(join(' ', map { $refused{$_} // 'none' } 1000, 300, 50, 1),
   '503 503 503 503', scalar(@fill) . ' conversations and their queues fill'
   . ' the zone to its last byte');

$c = wait_state($t, 'r1', 'idle', 10);

is(log_types($c), 'user_msg assistant_msg tool_call tool_result turn_failed',
   'the slow call is paired, then its turn fails');
($res) = grep { $_->{type} eq 'tool_result' } @{$c->{messages}};
like($res->{error} // '', qr/^\[failed\]/, 'with an error result');
like($t->read_file('error.log'), qr/agent zone "agents" gives up its reserve/,
     'recorded with the reserve');
is(zone()->{reserve}, JSON::PP::false, 'spent while the zone is full');

# whatever ended where in the full zone, no call is left without its
# one result

my @unpaired;

for my $id (@fill, 'r1', 'b1') {
    my ($n, $bad) = pairs(inspect($t, $id)->{json});
    push @unpaired, "$id: $bad" if $bad;
}

is(join('; ', @unpaired), '', 'every call has exactly one result');

$mock->stop;
$t->done(more => 1);

# a queued message that finds no room when its turn comes waits, and
# starts once room comes: here an idle conversation, held in the zone by
# its subscriber, may leave once the subscriber goes

$t = Test::Agent->new;
$mock = Test::Agent::MockProvider->new(default => sub {
    my ($req) = @_;

    my $msgs = ($req->{json} || {})->{messages} || [];
    my $last = $msgs->[-1]{content} // '';

    return { text => 'slow reply', latency => 2 } if $last =~ /^slow/;
    return { text => 'reply to ' . length $last };
});

my $db = $t->testdir . '/agent.db';

$t->write_file_expand('nginx.conf', engine_conf($mock, zone => '128k',
    server => $server =~ s/^\s*agent_tool.*//mr,
    http => "agent_store $db; client_body_buffer_size 64k;"));
$t->run;

# written, a conversation at rest keeps only its record in the zone,
# unless a subscriber (who may be catching up) is on it: a big idle
# conversation held so, then a big message queued behind a slow turn,
# with no room to start; returns the subscriber

sub held_and_queued {
    my ($held, $busy) = @_;

    send_message($t, $held, 'hello');
    wait_state($t, $held, 'idle');

    my $sse = Test::Agent::HTTP::http_stream(events_request($held),
                                             port => $t->port(8080));
    is($sse->status, 200, "$held: a subscriber holds a big idle conversation");

    send_message($t, $held, 'a' x 40000);
    wait_state($t, $held, 'idle');
    sleep 0.3;

    send_message($t, $busy, 'slow');

    my $r = http_post("/q/$busy/messages",
                      encode_json({ content => 'b' x 40000 }),
                      port => $t->port(8080),
                      headers => { 'Content-Type' => 'application/json' });
    is($r->{status}, 202, "$busy: a big message queued behind a slow turn");

    # the slow turn ends; its queued message has no room to start

    sleep 2.5;

    is(log_types(inspect($t, $busy)->{json}),
       'user_msg assistant_msg turn_completed',
       "$busy: the queued message waits");

    return $sse;
}

sub runs_then {
    my ($busy, $what) = @_;

    my $c = wait_state($t, $busy, 'idle', 10);
    for (1 .. 100) {
        last if log_types($c) =~ /user_msg .* user_msg/;
        sleep 0.1;
        $c = wait_state($t, $busy, 'idle', 10);
    }

    is(log_types($c), 'user_msg assistant_msg turn_completed '
       . 'user_msg assistant_msg turn_completed', "$busy: it runs $what");
    is($c->{messages}[-2]{content}, 'reply to 40000',
       "$busy: the whole message");
}

my $sse = held_and_queued('held', 'busy');
like($t->read_file('error.log'), qr/agent zone "agents" is full/,
     'for room');

$sse->close;
runs_then('busy', 'once the idle conversation has left the zone');

# the subscriber's worker killed instead: the slot it left in the record
# does not hold the conversation in the zone

$sse = held_and_queued('held2', 'busy2');
$t->kill_worker($_) for $t->worker_pids;
runs_then('busy2', 'once the subscriber\'s worker is gone');
$sse->close;

$mock->stop;
$t->allow_alert(qr/exited on signal 9/);
$t->done;
