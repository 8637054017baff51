#!/usr/bin/perl

# agent_metrics: after a scripted workload through the mock provider the
# Prometheus exposition holds exactly the counts the workload made, in
# every worker, passes promtool's check, and keeps them across a worker's
# death and a reload.

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

my $promtool = promtool();

if (!$promtool && !$ENV{CI}) {
    plan skip_all => 'promtool is not installed (Debian package '
                     . 'prometheus; .ci/deps installs it)';
}

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

my $tools = $ECHO_TOOL . <<'EOF';
    agent_tool ask_user {
        executor human;
        timeout 1h;
    }

    agent_tool ask_soon {
        executor human;
        timeout 1s;
    }

    agent_tool send {
        approval requires_approval;
        location /tools/echo;
        timeout 1h;
    }
EOF

my $server = $ECHO_LOCATION . $WORKERS_SERVER;

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $tools, agent => 'tools echo ask_user ask_soon send;',
    server => $server));
$t->run;

sub call {
    my ($id, $name, $args) = @_;
    return { id => $id, name => $name, arguments => $args // '{}' };
}

# a scrape on a new connection: the worker that answered, the text, and
# each sample by its name and labels

sub scrape {
    my $r = http_get('/metrics', port => $t->port(8081));
    my %m;

    for (split /\n/, $r->{body} // '') {
        next if /^#/ || !length;
        my ($series, $value) = /^(\S+(?:\{.*\})?) (\S+)$/ or next;
        $m{$series} = $value;
    }

    return { worker => $r->{headers}{'x-worker'}, body => $r->{body} // '',
             type => $r->{headers}{'content-type'} // '', m => \%m };
}

# the sum of the samples of a name whose labels include these

sub value {
    my ($s, $name, %labels) = @_;
    my ($sum, $n) = (0, 0);

    for my $series (keys %{$s->{m}}) {
        my ($sname, $l) = $series =~ /^([^{]+)(?:\{(.*)\})?$/;
        next unless $sname eq $name;
        my %have = ($l // '') =~ /(\w+)="((?:[^"\\]|\\.)*)"/g;
        next if grep { ($have{$_} // "\0") ne $labels{$_} } keys %labels;
        $sum += $s->{m}{$series};
        $n++;
    }

    return $n ? $sum : undef;
}

my %chat = (gen_ai_agent_name => 'chat');

my $s = scrape();
is(value($s, 'agent_turns_total', %chat), 0, 'no turn yet');
is(value($s, 'agent_model_calls_total', %chat), 0, 'no model call yet');

# the workload, one conversation after the other

# m1: a reply with its usage
$mock->script({ text => 'hello', usage => { prompt_tokens => 42,
                completion_tokens => 7, cached_tokens => 3 } });
send_message($t, 'm1', 'hi');
is(wait_state($t, 'm1', 'idle')->{state}, 'idle', 'm1 done');

# m2: a 500 retried, a server tool, a reply
$mock->script({ status => 500 },
              { tool_calls => [call('e1', 'echo', '{"n":1}')] },
              { text => 'echoed' });
send_message($t, 'm2', 'echo');
is(log_types(wait_state($t, 'm2', 'idle')),
   'user_msg assistant_msg tool_call tool_result assistant_msg '
   . 'turn_completed', 'm2: retried, a tool, a reply');

# m3: a question answered
$mock->script({ tool_calls => [call('h1', 'ask_user', '{"q":"?"}')] },
              { text => 'thanks' });
send_message($t, 'm3', 'ask me');
is(wait_state($t, 'm3', 'awaiting_input')->{state}, 'awaiting_input',
   'm3 waits');
is(resolve($t, 'm3', 'h1', { result => 'yes' })->{status}, 200,
   'm3 answered');
is(wait_state($t, 'm3', 'idle')->{state}, 'idle', 'm3 done');

# m4: a gated call rejected
$mock->script({ tool_calls => [call('g1', 'send', '{"to":"x"}')] },
              { text => 'not sent' });
send_message($t, 'm4', 'send it');
wait_state($t, 'm4', 'awaiting_input');
is(resolve($t, 'm4', 'g1', { decision => 'reject', reason => 'no' })
   ->{status}, 200, 'm4 rejected');
is(wait_state($t, 'm4', 'idle')->{state}, 'idle', 'm4 done');

# m5: a 400 fails the turn
$mock->script({ status => 400, error => { message => 'bad request' } });
send_message($t, 'm5', 'fail');
is(log_types(wait_state($t, 'm5', 'idle')), 'user_msg turn_failed',
   'm5 failed');

# m6: cancelled while it streams
$mock->reset;
$mock->script({ text => 'a b c d', chunks => 4, pause_after => 3 });
send_message($t, 'm6', 'stop me');
ok($mock->wait_paused(0), 'm6 streams');
ok(cancel($t, 'm6')->{json}{cancelled}, 'm6 cancelled');
$mock->release;

# m7: a question nobody answers before its deadline
$mock->reset;
$mock->script({ tool_calls => [call('x1', 'ask_soon', '{}')] },
              { text => 'too late' });
send_message($t, 'm7', 'ask soon');
is(wait_state($t, 'm7', 'idle', 10)->{messages}[-2]{content}, 'too late',
   'm7: expired, and the turn went on');

my %want = (
    'agent_turns_total outcome=completed' => 5,
    'agent_turns_total outcome=failed' => 1,
    'agent_turns_total outcome=cancelled' => 1,
    'agent_model_calls_total status=ok' => 9,
    'agent_model_calls_total status=retry' => 1,
    'agent_model_calls_total status=error' => 1,
    'agent_model_calls_total status=cancelled' => 1,
    'agent_model_call_retries_total' => 1,
    'gen_ai_client_token_usage_sum gen_ai_token_type=input' => 122,
    'gen_ai_client_token_usage_sum gen_ai_token_type=output' => 47,
    'gen_ai_client_token_usage_sum gen_ai_token_type=cached_input' => 3,
    'gen_ai_client_token_usage_count gen_ai_token_type=input' => 9,
    'gen_ai_client_operation_duration_seconds_count' => 12,
    'gen_ai_client_operation_time_to_first_chunk_seconds_count' => 10,
    'agent_tool_calls_total gen_ai_tool_name=echo outcome=ok' => 1,
    'agent_tool_calls_total gen_ai_tool_name=ask_user outcome=ok' => 1,
    'agent_tool_calls_total gen_ai_tool_name=send outcome=error' => 1,
    'agent_tool_calls_total gen_ai_tool_name=ask_soon outcome=error' => 1,
    'agent_tool_calls_total outcome=ok' => 2,
    'agent_tool_calls_total outcome=error' => 2,
    'gen_ai_execute_tool_duration_seconds_count' => 4,
    'agent_suspensions_total kind=elicitation' => 2,
    'agent_suspensions_total kind=approval' => 1,
    'agent_suspensions_total kind=client_exec' => 0,
    'agent_resolutions_total decision=answered' => 1,
    'agent_resolutions_total decision=reject' => 1,
    'agent_resolutions_total decision=expired' => 1,
    'agent_resolutions_total decision=approve' => 0,
    'agent_expiries_total' => 1,
    'agent_takeovers_total' => 0,
    'agent_zone_conversations' => 7,
    'agent_subscribers' => 0,
);

sub check {
    my ($s, $what, %more) = @_;
    my %w = (%want, %more);

    for my $k (sort keys %w) {
        my ($name, @l) = split / /, $k;
        my %l = map { split /=/, $_, 2 } @l;
        %l = (%chat, %l) if $name =~ /^(agent_turns|agent_model|gen_ai_client)/;
        is(value($s, $name, %l), $w{$k}, "$what: $k");
    }
}

$s = scrape();
check($s, 'after the workload');

like($s->{type}, qr{^text/plain; version=0\.0\.4}, 'the exposition format');
like($s->{body}, qr/^agent_model_calls_total\{gen_ai_operation_name="chat",
    gen_ai_provider_name="openai",gen_ai_request_model="gpt-test",
    gen_ai_agent_name="chat",adapter="openai_chat",status="ok"\}\ 9$/xm,
    'the model call series, labelled as the GenAI conventions name them');
like($s->{body}, qr/^gen_ai_client_token_usage_bucket\{.*
    gen_ai_token_type="input",le="16"\}\ 8$/xm,
    'token buckets are cumulative: eight calls of 10 input tokens');
like($s->{body}, qr/^gen_ai_client_token_usage_bucket\{.*
    gen_ai_token_type="input",le="\+Inf"\}\ 9$/xm, 'and all nine');

my ($ok, $out) = promtool_ok($s->{body});
ok($ok, 'promtool check metrics passes') or diag $out;

# every worker answers the same: the counters are in the zone

my %seen;
for (1 .. 40) {
    my $w = scrape();
    $seen{$w->{worker}} //= $w;
    last if keys %seen == 2;
}
is(scalar keys %seen, 2, 'scraped from both workers');
my @w = values %seen;
for my $series (qw(agent_turns_total agent_model_calls_total
                   gen_ai_client_token_usage_sum agent_tool_calls_total))
{
    is(value($w[0], $series), value($w[1], $series),
       "$series: the same in both workers");
}

# a worker killed mid-turn: its turn taken over, nothing lost

$mock->reset;
$mock->script({ text => 'cut', chunks => 4, pause_after => 2 },
              { text => 'again' });
send_message($t, 'm8', 'kill me');
ok($mock->wait_paused(0), 'm8 streams');
my $lease = inspect($t, 'm8')->{json}{lease};
ok($lease, 'a worker holds m8');
$t->kill_worker($lease);
is(wait_state($t, 'm8', 'idle', 10)->{messages}[-2]{content}, 'again',
   'm8 taken over');

$s = scrape();
check($s, 'after a worker died',
      'agent_turns_total outcome=completed' => 6,
      'agent_model_calls_total status=ok' => 10,
      'gen_ai_client_token_usage_sum gen_ai_token_type=input' => 132,
      'gen_ai_client_token_usage_sum gen_ai_token_type=output' => 52,
      'gen_ai_client_token_usage_count gen_ai_token_type=input' => 10,
      'gen_ai_client_operation_duration_seconds_count' => 13,
      'gen_ai_client_operation_time_to_first_chunk_seconds_count' => 11,
      'agent_takeovers_total' => 1,
      'agent_zone_conversations' => 8);

# a reload keeps the zone, and the counts

ok($t->reload, 'reloaded');
$t->wait_workers(2);

my $after = scrape();
is($after->{body} =~ s/^agent_zone_used_bytes.*$//mr,
   $s->{body} =~ s/^agent_zone_used_bytes.*$//mr,
   'the same exposition after the reload');

$mock->script({ text => 'after the reload' });
send_message($t, 'm9', 'hi again');
wait_state($t, 'm9', 'idle');
is(value(scrape(), 'agent_turns_total', %chat, outcome => 'completed'), 7,
   'counting goes on from there');

# three calls in one turn, their results out of order: each timed from
# its own call (a question answered 0.5 s later, two echoes at once)

my $b = scrape();
my %asked = (gen_ai_tool_name => 'ask_user');
my %echo = (gen_ai_tool_name => 'echo');

$mock->script({ tool_calls => [call('e2', 'echo', '{"n":2}'),
                               call('h2', 'ask_user', '{"q":"?"}'),
                               call('e3', 'echo', '{"n":3}')] },
              { text => 'three' });
send_message($t, 'm10', 'three calls');
wait_state($t, 'm10', 'awaiting_input');
select undef, undef, undef, 0.5;
is(resolve($t, 'm10', 'h2', { result => 'yes' })->{status}, 200,
   'm10 answered');
is(wait_state($t, 'm10', 'idle')->{messages}[-2]{content}, 'three',
   'm10 done');

$s = scrape();

sub grew {
    my ($name, %l) = @_;
    return value($s, $name, %l) - (value($b, $name, %l) // 0);
}

is(grew('gen_ai_execute_tool_duration_seconds_count', %echo), 2,
   'm10: both echoes timed');
is(grew('gen_ai_execute_tool_duration_seconds_count', %asked), 1,
   'm10: the question timed');
cmp_ok(grew('gen_ai_execute_tool_duration_seconds_sum', %asked), '>=', 0.5,
       'm10: the question from its own call, past the wait');
cmp_ok(grew('gen_ai_execute_tool_duration_seconds_sum', %echo), '<', 0.5,
       'm10: the echoes from theirs, not past it');

($ok, $out) = promtool_ok(scrape()->{body});
ok($ok, 'promtool check metrics passes after the reload') or diag $out;

$mock->stop;
$t->allow_alert(qr/exited on signal 9|lost its worker|taken over/);
$t->done;
