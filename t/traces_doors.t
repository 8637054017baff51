#!/usr/bin/perl

# agent_trace through the protocol doors: the AI SDK's own chat client
# (the "ai" package 6 and 7, its DefaultChatTransport with a traceparent
# header) against agent_aisdk, and AG-UI's HttpAgent (with its headers)
# against agent_agui, each with a server tool and a call approved in a second
# request that continues the same turn.  The spans the collector gets
# are checked against the log (agent_inspect): the turn a child of the
# caller's span, a chat span per model call (the provider got its
# traceparent), an execute_tool span per tool call, the approval as span
# events with its approver, the tool backend's span (OpenTelemetry's SDK,
# t/js/otel.mjs) a child of its execute_tool span.  An approval sent
# from another trace leaves the turn in its own, with a link to the
# resolver's span.  The spans' service.name is agent_trace's service=.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::Otel;

my $js = "$FindBin::Bin/js";

Test::Agent::Otel->needs('ai6', 'ai7', '@ag-ui/client');

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $otel = Test::Agent::Otel->start($t);

ok($otel->{ready}, 'collector and tool backend up');

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $TRACED_TOOLS,
    agent => 'tools lookup send_note;',
    http => 'agent_trace /otlp service=support-agents;',
    server => $otel->locations . <<"END"));

        location /api/chat {
            agent chat;
            agent_aisdk;
            agent_approver \$http_x_user;
        }

        location /agui {
            agent chat;
            agent_agui;
            agent_approver \$http_x_user;
        }
END
$t->run;

my $base = 'http://127.0.0.1:' . $t->port(8080);

sub quote {
    my ($s) = @_;
    $s =~ s/'/'\\''/g;
    return "'$s'";
}

# node's one JSON line, or an empty result

sub node_json {
    my ($out) = @_;
    my ($last) = (split /\n/, $out // '')[-1];
    my $res = eval { decode_json($last // '') };
    diag("node: $out") unless $res;
    return $res || {};
}

# a lookup, then a note that waits for approval, then the reply

sub script {
    my ($n) = @_;

    $mock->reset;
    $mock->script(
        { tool_calls => [{ id => "call_l$n", name => 'lookup',
                           arguments => '{"q":"x"}' }] },
        { tool_calls => [{ id => "call_n$n", name => 'send_note',
                           arguments => '{"to":"x"}' }] },
        { text => 'Done.' });
}

# the spans of one conversation's turns, once its invoke_agent is in

sub turn_spans { $otel->turn('support-agents', $_[0]) }

# the spans of conversation $id against its log, in the caller's trace

sub check_turn {
    my ($what, $id, $trace, $parent, $approver) = @_;

    my $log = wait_state($t, $id, 'idle', 20)->{messages} || [];
    my ($turn, @children) = turn_spans($id);

    is(join(' ', map { $_->{type} } @$log),
       'user_msg assistant_msg tool_call tool_result assistant_msg '
       . 'tool_call suspension resolution tool_result assistant_msg '
       . 'turn_completed', "$what: one turn, the approval in it");

    ok($turn, "$what: invoke_agent span");
    is($turn->{traceId}, $trace, "$what: in the caller's trace");
    is($turn->{parentSpanId}, $parent, "$what: a child of the caller's span");
    is($turn->{startTimeUnixNano}, $log->[0]{ts} . '000000',
       "$what: from the user_msg");
    is($turn->{endTimeUnixNano}, $log->[-1]{ts} . '000000',
       "$what: to the turn's end");

    # a chat span per model call, the provider's request naming it

    my @replies = grep { $_->{type} eq 'assistant_msg' } @$log;
    my @chat = grep { attrs($_)->{'gen_ai.operation.name'} eq 'chat' }
               @children;

    is(join(' ', sort map { attrs($_)->{'agent.message.id'} } @chat),
       join(' ', sort map { $_->{message_id} } @replies),
       "$what: a chat span per assistant_msg");
    is(join(' ', sort map { $_->{endTimeUnixNano} } @chat),
       join(' ', sort map { $_->{ts} . '000000' } @replies),
       "$what: each ends at its reply");
    is(join(' ', sort map { $_->{headers}{traceparent} // '' }
                 @{$mock->requests}),
       join(' ', sort map { "00-$trace-$_->{spanId}-01" } @chat),
       "$what: each model request carried its chat span");

    # an execute_tool span per tool call; the backend's span under it

    my @calls = grep { $_->{type} eq 'tool_call' } @$log;
    my @tools = grep { attrs($_)->{'gen_ai.operation.name'} eq 'execute_tool' }
                @children;
    my %tool = map { attrs($_)->{'gen_ai.tool.call.id'} => $_ } @tools;

    is(join(' ', sort keys %tool),
       join(' ', sort map { $_->{tool_call_id} } @calls),
       "$what: an execute_tool span per tool call");

    my @backend = $otel->wait_spans('tool-backend', sub {
        2 == grep { $_->{traceId} eq $trace } @_ });

    for my $call (@calls) {
        my $s = $tool{$call->{tool_call_id}} || {};
        my $res = (grep { $_->{type} eq 'tool_result'
                          && $_->{tool_call_id} eq $call->{tool_call_id} }
                   @$log)[0];

        is($s->{startTimeUnixNano}, $call->{ts} . '000000',
           "$what: $call->{name} span from its tool_call");
        is($s->{endTimeUnixNano}, $res->{ts} . '000000',
           "$what: $call->{name} span to its tool_result");
        is(scalar(grep { $_->{traceId} eq $trace
                         && $_->{parentSpanId} eq ($s->{spanId} // '') }
                  @backend),
           1, "$what: $call->{name}: the backend's span is its child");
    }

    # the approval: suspension and resolution events, with the approver

    my $note = $tool{$calls[-1]{tool_call_id}} || {};
    my ($resolution) = grep { $_->{type} eq 'resolution' } @$log;
    my ($ev) = grep { $_->{name} eq 'agent.resolution' }
               @{$note->{events} || []};

    is(join(' ', map { $_->{name} } @{$note->{events} || []}),
       'agent.suspension agent.resolution',
       "$what: the approval as span events");
    is(attrs($ev || {})->{'agent.approver'}, $approver,
       "$what: the approver");
    is(attrs($ev || {})->{'agent.decision'}, 'approve', "$what: approved");
    is($ev->{timeUnixNano}, $resolution->{ts} . '000000',
       "$what: at the resolution's time");

    return ($turn, $note);
}

# the AI SDK: the message and, after the approval, the chat the client
# sends again both carry the app's traceparent

my $n = 0;

for my $pkg (qw(ai6 ai7)) {
    my $trace = "4bf92f3577b34da6a3ce929d0e0e473$n";
    my $span = "00f067aa0ba902b$n";
    my $what = "AI SDK ($pkg)";

    script(++$n);

    my $env = "AISDK_PKG=$pkg AISDK_APPROVE=yes AISDK_HEADERS="
        . quote(encode_json({ traceparent => "00-$trace-$span-01",
                              'X-User' => 'alice' }));
    my $chat = node_json(
        `cd $js && env $env node aisdk.mjs $base/api/chat s$n send 'note it'`);

    is($chat->{status}, 'ready', "$what: the chat is ready");
    is_deeply($chat->{errors}, [], "$what: no error");
    ok((grep { $_ eq 'tool-approval-request' } @{$chat->{types} || []}),
       "$what: an approval request, answered");

    check_turn($what, "s$n", $trace, $span, 'alice');
}

# AG-UI: the run, then its interrupt resumed by the next run

my $trace2 = 'aaaabbbbccccddddeeeeffff00001111';
my $span2 = '1111222233334444';

script(++$n);

my $res = node_json(`cd $js && node agui.mjs @{[quote(encode_json({
    url => "$base/agui", threadId => 'g1',
    headers => { traceparent => "00-$trace2-$span2-01", 'X-User' => 'bob' },
    steps => [{ send => 'note it' },
              { resume => { approved => JSON::PP::true } }] }))]}`);

is($res->{runs}[0]{outcome}, 'interrupt', 'AG-UI: the run is interrupted');
is($res->{runs}[1]{outcome}, 'success', 'AG-UI: the resumed run completes');

check_turn('AG-UI', 'g1', $trace2, $span2, 'bob');

# the approval from another trace: the turn stays in its own, and the
# call's span links to the resolver's

my $trace3 = '0123456789abcdef0123456789abcdef';
my $span3 = 'aaaaaaaaaaaaaaa1';
my $later = '99999999999999999999999999999999';
my $rspan = 'bbbbbbbbbbbbbbb2';

script(++$n);

$res = node_json(`cd $js && node agui.mjs @{[quote(encode_json({
    url => "$base/agui", threadId => 'g2',
    steps => [{ send => 'note it',
                headers => { traceparent => "00-$trace3-$span3-01",
                             'X-User' => 'bob' } },
              { resume => { approved => JSON::PP::true },
                headers => { traceparent => "00-$later-$rspan-01",
                             'X-User' => 'carol' } }] }))]}`);

is($res->{runs}[1]{outcome}, 'success', 'another trace: the run completes');

my ($turn, $note) = check_turn('another trace', 'g2', $trace3, $span3,
                               'carol');

is(scalar(grep { $_->{traceId} eq $later }
          $otel->spans('support-agents')),
   0, 'another trace: no span of the turn in the resolver\'s trace');
is_deeply([map { "$_->{traceId} $_->{spanId}" } @{$note->{links} || []}],
          ["$later $rspan"], 'another trace: a link to the resolver\'s span');
is(attrs($note->{links}[0] || {})->{'agent.approver'}, 'carol',
   'another trace: the link names the approver');

my ($resolution) = grep { $_->{type} eq 'resolution' }
                   @{inspect($t, 'g2')->{json}{messages}};
is($resolution->{traceparent}, "00-$later-$rspan-01",
   'the resolution records the resolver\'s traceparent');

# every span of the module under the configured service.name

ok(!$otel->spans('nginx'), 'no span under the default service.name');

$otel->stop;
$t->stop;

unlike($t->read_file('error.log'), qr/\[(alert|emerg|crit)\]/,
       'no alert in error.log');

done_testing;
