#!/usr/bin/perl

# Budgets: agent_budget_zone counts tokens (as the provider reports
# them) and model calls per key, per period.  A spent budget stops a turn
# before its next model call (turn_failed, error budget_exceeded, and
# the provider never sees the request) and answers a new message 429
# with Retry-After.  The counters are shared by the workers and kept
# across a reload.  (nginx -t's refusals are in t/config_errors.t.)

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $mock = Test::Agent::MockProvider->new;

my $http = <<'EOF';
    agent_budget_zone key=$http_x_user zone=budget:1m tokens=100/d
                      requests=4/d;
EOF

my $server = <<"EOF";
        agent_budget zone=budget;
$ECHO_LOCATION
EOF

my $t = Test::Agent->new;

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => $http, server => $server, tools => $ECHO_TOOL,
    agent => 'tools echo;'));
$t->run;

sub msg {
    my ($user, $cid, $text) = @_;
    return send_message($t, $cid, $text,
                        headers => { defined $user ? ('X-User' => $user)
                                                   : () });
}

sub calls { scalar @{$mock->requests} }

sub usage {
    my ($in, $out) = @_;
    return { prompt_tokens => $in, completion_tokens => $out };
}

# tokens: counted as reported, so two turns of 40 leave room for a third

$mock->script(map { { text => 'ok', usage => usage(30, 10) } } 1 .. 3);

for my $i (1 .. 3) {
    my $r = msg('dave', 'd1', "hello $i");
    is($r->{status}, 202, "dave's message $i is taken");
    is(wait_state($t, 'd1', 'idle')->{messages}[-1]{type}, 'turn_completed',
       "dave's turn $i completes");
}

is(calls(), 3, 'three model calls made');

my $r = msg('dave', 'd1', 'one more');
is($r->{status}, 429, '120 of 100 tokens: the next message answers 429');
is($r->{json}{error}{code}, 'budget_exceeded', 'with budget_exceeded');
like($r->{json}{error}{message}, qr/tokens/, 'naming the tokens budget');

my $ra = $r->{headers}{'retry-after'};
ok(defined $ra && $ra =~ /^\d+$/ && $ra > 0 && $ra <= 86400,
   "Retry-After is the rest of the day's window ($ra)");
is(calls(), 3, 'the refused message made no model call');

my $c = inspect($t, 'd1')->{json};
is(scalar(grep { $_->{type} eq 'user_msg' } @{$c->{messages}}), 3,
   'and changed nothing in the conversation');

# another key is not affected; an empty key is not counted

$mock->script({ text => 'ok', usage => usage(1, 1) },
              { text => 'ok', usage => usage(1, 1) });

is(msg('erin', 'e1', 'hi')->{status}, 202, 'another user is not limited');
wait_state($t, 'e1', 'idle');
is(msg(undef, 'n1', 'hi')->{status}, 202, 'an empty key is not limited');
wait_state($t, 'n1', 'idle');

# a turn whose budget is spent by its own model call stops before the next

$mock->script({ tool_calls => [{ id => 'call_1', name => 'echo',
                                 arguments => '{"n":1}' }],
                usage => usage(100, 20) },
              { text => 'never sent' });

my $before = calls();

$r = msg('alice', 'a1', 'use the tool');
is($r->{status}, 202, "alice's message is taken");

$c = wait_state($t, 'a1', 'idle');
my ($failed) = grep { $_->{type} eq 'turn_failed' } @{$c->{messages}};
ok($failed, 'the turn fails');
is($failed->{error}, 'budget_exceeded', 'with error budget_exceeded');
is($failed->{budget}, 'budget', 'naming the zone');
is($failed->{limit}, 'tokens', 'and the limit');
is(log_types($c), 'user_msg assistant_msg tool_call tool_result turn_failed',
   'after the tool ran, before a second model call');
is(calls(), $before + 1, 'the provider got one request, not two');
is($mock->pending, 1, 'the second reply was never asked for');

# requests: model calls per period, however few tokens

$mock->reset;
$mock->script(map { { text => 'ok', usage => usage(1, 0) } } 1 .. 4);

for my $i (1 .. 4) {
    is(msg('carol', "c$i", 'hi')->{status}, 202, "carol's message $i");
    wait_state($t, "c$i", 'idle');
}

is(calls(), 4, 'four model calls made');

$r = msg('carol', 'c5', 'hi');
is($r->{status}, 429, 'a fifth model call of the day: 429');
like($r->{json}{error}{message}, qr/requests/, 'naming the requests budget');
is(calls(), 4, 'no fifth');

# the counters are the zone's: a killed worker, all workers, a reload

my $again = 0;

for my $i (1 .. 6) {
    $again++ if msg('carol', "c$i", 'again')->{status} == 429;
}

is($again, 6, 'every worker refuses carol');

$t->kill_worker;
is(msg('carol', 'c6', 'hi')->{status}, 429, 'so does a new worker');

ok($t->reload, 'reloaded');
$r = msg('carol', 'c7', 'hi');
is($r->{status}, 429, 'the counters survive a reload');
is(msg('dave', 'd1', 'hi')->{status}, 429, 'the token counters too');
$mock->script({ text => 'ok', usage => usage(1, 1) });
is(msg('erin', 'e1', 'after the reload')->{status}, 202,
   'and the others still have theirs');
wait_state($t, 'e1', 'idle');
is(calls(), 5, 'no refused message reached the provider, erin\'s did');

$t->allow_alert(qr/exited on signal 9/);
$t->done(more => 1);


# a zone may be named before its declaration, as limit_req's may

$t = Test::Agent->new;

$t->write_file_expand('nginx.conf', <<'EOF');
%%TEST_GLOBALS%%

events {
}

http {
    %%TEST_GLOBALS_HTTP%%

    agent_budget zone=late;

    agent_budget_zone key=$remote_user zone=late:1m tokens=1000/12h
                      requests=10/m;
}
EOF

my ($rc, $out) = $t->test_config;
is($rc, 0, 'a zone used before its declaration is legal') or diag($out);

done_testing();
