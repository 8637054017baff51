#!/usr/bin/perl

# Notifications: agent_notify (or an agent's notify) POSTs the suspension
# event of a call that starts waiting for a person (approval,
# elicitation) to a location, with the conversation, the call and an
# Idempotency-Key in headers.  It never holds up or fails the turn: a
# failing location is tried a bounded number of times with backoff, a
# slow one does not delay the resolve or the rest of the turn.  A
# notification whose worker died while sending it is sent again by
# another (at least once, with the same Idempotency-Key).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;

my $mock = Test::Agent::MockProvider->new;

# the receiver of notifications: any path it does not know answers 404,
# paths ending in /v1/chat/completions 200; it records every request.
# The first request of each conversation to /slow/ is answered after 10 s.

my %slow;
my $recv = Test::Agent::MockProvider->new(default => sub {
    my ($req) = @_;
    return { text => 'noted', latency => 10 }
        if $req->{path} =~ m{^/slow/}
           && !$slow{$req->{headers}{'x-agent-conversation'} // ''}++;
    return { text => 'noted' };
});
my $rport = $recv->port;

my $tools = <<'EOF';
    agent_tool send {
        location /tools/echo;
        approval requires_approval;
        timeout 1h;
    }

    agent_tool ask_user {
        executor human;
        timeout 1h;
    }

    agent failing {
        provider openai_chat /internal/llm;
        model gpt-test;
        tools send;
        notify /notify-fail;
    }

    agent slow {
        provider openai_chat /internal/llm;
        model gpt-test;
        tools send;
        notify /notify-slow;
    }
EOF

# the locations of the other agents

my $per_agent = '';
for my $a (qw(failing slow)) {
    $per_agent .= <<"EOF";
        location ~ ^/$a/(?<aid>[^/]+)/messages\$ {
            agent $a;
            agent_conversation \$aid;
            agent_message;
        }

        location ~ ^/$a/(?<aid>[^/]+)/calls/(?<atc>.+)\$ {
            agent $a;
            agent_conversation \$aid;
            agent_tool_call \$atc;
            agent_resolve;
        }

        location ~ ^/$a/(?<aid>[^/]+)\$ {
            agent $a;
            agent_conversation \$aid;
            agent_inspect;
        }
EOF
}

my $server = <<"EOF";
$ECHO_LOCATION
$per_agent
        location = /notify {
            internal;
            proxy_pass http://127.0.0.1:$rport/ok/v1/chat/completions;
        }

        location = /notify-fail {
            internal;
            proxy_pass http://127.0.0.1:$rport/fail;
        }

        location = /notify-slow {
            internal;
            proxy_pass http://127.0.0.1:$rport/slow/v1/chat/completions;
        }
EOF

my $t = Test::Agent->new;

my $conf = engine_conf($mock, workers => 2, tools => $tools,
    http => 'agent_notify /notify;', server => $server,
    agent => 'tools ask_user send;');

$t->write_file_expand('nginx.conf', $conf);
$t->run;

my $port = $t->port(8080);

sub post {
    my ($uri, $body) = @_;
    my $r = http_post($uri, encode_json($body), port => $port,
                      headers => { 'Content-Type' => 'application/json' });
    $r->{json} = eval { decode_json($r->{body}) };
    return $r;
}

sub get_json {
    my ($uri) = @_;
    my $r = http_get($uri, port => $port);
    return eval { decode_json($r->{body}) };
}

sub wait_for {
    my ($cond, $timeout) = @_;
    my $deadline = time + ($timeout // 10);
    while (time < $deadline) {
        return 1 if $cond->();
        sleep 0.05;
    }
    return 0;
}

sub notes {
    my ($prefix) = @_;
    return [ grep { $_->{path} =~ m{^\Q$prefix\E} } @{$recv->requests} ];
}

sub gated {
    my ($id) = @_;
    return { tool_calls => [{ id => $id, name => 'send',
                              arguments => '{"n":1}' }] };
}

# an approval: one notification with the suspension's JSON

$mock->script(gated('call_a'), { text => 'sent' });

is(send_message($t, 'n1', 'send it')->{status}, 202, 'a gated call');
is(wait_state($t, 'n1', 'awaiting_input')->{state}, 'awaiting_input',
   'waits for approval');

ok(wait_for(sub { @{notes('/ok/')} >= 1 }), 'a notification arrives');

my $n = notes('/ok/')->[0];
is($n->{method}, 'POST', 'as a POST');
is($n->{json}{type}, 'suspension', 'of the suspension event');
is($n->{json}{tool_call_id}, 'call_a', 'for the call');
is($n->{json}{kind}, 'approval', 'waiting for approval');
is($n->{json}{name}, 'send', 'naming the tool');
is_deeply($n->{json}{arguments}, { n => 1 }, 'with its arguments');
ok($n->{json}{deadline} > time * 1000, 'and its deadline');
is($n->{headers}{'x-agent-conversation'}, 'n1', 'X-Agent-Conversation');
is($n->{headers}{'x-agent-agent'}, 'chat', 'X-Agent-Agent');
is($n->{headers}{'idempotency-key'}, 'n1:call_a:approval',
   'Idempotency-Key names the conversation, the call and the wait');

my $c = inspect($t, 'n1')->{json};
my ($susp) = grep { $_->{type} eq 'suspension' } @{$c->{messages}};
is_deeply($n->{json}, $susp, 'the body is the logged event');

sleep 1;
is(scalar @{notes('/ok/')}, 1, 'sent once');

is(resolve($t, 'n1', 'call_a', { decision => 'approve' })->{status}, 200,
   'approved');
is(log_types(wait_state($t, 'n1', 'idle')),
   'user_msg assistant_msg tool_call suspension resolution tool_result '
   . 'assistant_msg turn_completed', 'the turn goes on');
sleep 0.5;
is(scalar @{notes('/ok/')}, 1, 'and nothing more is sent');

# an elicitation

$mock->script({ tool_calls => [{ id => 'q1', name => 'ask_user',
                                 arguments => '{"question":"Which?"}' }] },
              { text => 'thanks' });

send_message($t, 'n2', 'ask me');
ok(wait_for(sub { grep { $_->{json}{tool_call_id} eq 'q1' }
                  @{notes('/ok/')} }), 'a question is notified');
($n) = grep { $_->{json}{tool_call_id} eq 'q1' } @{notes('/ok/')};
is($n->{json}{kind}, 'elicitation', 'as an elicitation');
is($n->{headers}{'idempotency-key'}, 'n2:q1:elicitation', 'its key');
is(resolve($t, 'n2', 'q1', { result => 'this one' })->{status}, 200,
   'answered');
is(wait_state($t, 'n2', 'idle')->{messages}[-1]{type}, 'turn_completed',
   'and the turn completes');

# a failing location: the turn does not notice; tried 6 times, then not

$mock->script(gated('call_f'), { text => 'sent' });

is(post('/failing/f1/messages', { content => 'go' })->{status}, 202,
   'a gated call of an agent whose notify fails');
ok(wait_for(sub { @{notes('/fail')} >= 1 }), 'its location is called');
ok(wait_for(sub { (get_json('/failing/f1') // {})->{state}
                  eq 'awaiting_input' }), 'the call waits all the same');

my $r = post('/failing/f1/calls/call_f', { decision => 'approve' });
is($r->{status}, 200, 'and is approved');
ok(wait_for(sub { (get_json('/failing/f1') // {})->{state} eq 'idle' }),
   'the turn ends');
is((get_json('/failing/f1') // {})->{messages}[-1]{type}, 'turn_completed',
   'completed');

# the approval came before the retries ran out: they stop with it

my $before = @{notes('/fail')};
sleep 1.5;
ok(@{notes('/fail')} <= $before + 1, 'a resolved call is not retried on');

# one that nobody resolves is tried a bounded number of times

$mock->script(gated('call_g'));
post('/failing/f2/messages', { content => 'go' });
ok(wait_for(sub { (get_json('/failing/f2') // {})->{state}
                  eq 'awaiting_input' }), 'another call waits');
ok(wait_for(sub { 6 <= grep { $_->{headers}{'idempotency-key'}
                              eq 'f2:call_g:approval' } @{notes('/fail')} },
            15), 'six attempts');
my @f2 = grep { $_->{headers}{'idempotency-key'} eq 'f2:call_g:approval' }
    @{notes('/fail')};
my @gaps = map { $f2[$_]{received_at} - $f2[$_ - 1]{received_at} } 1 .. $#f2;
ok($gaps[-1] > $gaps[0] * 2, sprintf('with a growing backoff (%.2f s to '
   . '%.2f s)', $gaps[0], $gaps[-1]));
sleep 3;
is(scalar(grep { $_->{headers}{'idempotency-key'} eq 'f2:call_g:approval' }
          @{notes('/fail')}), 6, 'then given up');
is((get_json('/failing/f2') // {})->{state}, 'awaiting_input',
   'the call still waits');

# a slow location holds up nothing; a worker killed while sending: sent
# again by another, under the same key

$mock->script(gated('call_s'), { text => 'sent' });
post('/slow/s1/messages', { content => 'go' });
ok(wait_for(sub { @{notes('/slow/')} >= 1 }), 'a slow location is called');

$r = post('/slow/s1/calls/call_s', { decision => 'approve' });
is($r->{status}, 200, 'the call is approved while it answers');
ok(wait_for(sub { (get_json('/slow/s1') // {})->{state} eq 'idle' }),
   'the turn ends');
ok(!notes('/slow/')->[0]{finished}, 'before the notification is answered');

$mock->script(gated('call_k'), { text => 'sent' });
$recv->reset;
post('/slow/s2/messages', { content => 'go' });
ok(wait_for(sub { @{notes('/slow/')} >= 1 }), 'a notification is sent');

$t->kill_worker($_) for $t->worker_pids;
$t->wait_workers(2);

ok(wait_for(sub { @{notes('/slow/')} >= 2 }, 5),
   'a worker that died sending it: another sends it again');
my @k = @{notes('/slow/')};
is($k[1]{headers}{'idempotency-key'}, $k[0]{headers}{'idempotency-key'},
   'under the same key');
is($k[1]{headers}{'idempotency-key'}, 's2:call_k:approval', 'its own');
sleep 1;
is(scalar @{notes('/slow/')}, 2, 'once delivered, not again');
is((get_json('/slow/s2') // {})->{state}, 'awaiting_input',
   'the call still waits');

$t->allow_alert(qr/exited on signal 9/);
$t->done;
