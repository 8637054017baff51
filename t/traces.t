#!/usr/bin/perl

# agent_trace: every turn, model call and tool call as OpenTelemetry
# spans, posted as OTLP/HTTP JSON to a collector through a location.  A
# message's traceparent makes the turn a child of the caller's span; the
# provider and the tools get the traceparent of their own span, so a tool
# backend instrumented with OpenTelemetry's SDK (t/js/otel.mjs, the
# official packages pinned in t/js/package.json) continues the trace.  The
# spans are checked against the log (one per model call and per tool
# call, with its times, ids and usage), against the OTLP JSON mapping of
# trace.proto and against the official exporter's own payload.  A turn
# resumed after an approval stays in its trace.  A collector that answers
# 500 or is down costs dropped spans and a counter, nothing else.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::Otel;

Test::Agent::Otel->needs;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $otel = Test::Agent::Otel->start($t);
my $cport = $otel->{cport};
my $tport = $otel->{tport};

ok($otel->{ready}, 'collector and tool backend up');

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $TRACED_TOOLS,
    agent => 'tools lookup send_note;',
    http => 'agent_trace /otlp;',
    server => <<"END"));
        location = /otlp {
            internal;
            proxy_pass http://127.0.0.1:$cport/v1/traces;
            proxy_set_header Authorization "Bearer collector-token";
        }

        location = /tools/backend {
            internal;
            proxy_pass http://127.0.0.1:$tport/tool;
        }

        location ~ ^/approve/(?<cid>[^/]+)/(?<tcid>[^/]+)\$ {
            agent chat;
            agent_conversation \$cid;
            agent_tool_call \$tcid;
            agent_approver \$http_x_user;
            agent_resolve;
        }

        location = /metrics {
            agent_metrics;
        }
END
$t->run;

my $json = JSON::PP->new->canonical;

sub received { $otel->received }

sub spans { $otel->spans(@_) }

sub wait_spans {
    my ($cond) = @_;
    return $otel->wait_spans('nginx', $cond);
}

sub spans_metric {
    my ($outcome) = @_;
    my $body = http_get('/metrics', port => $t->port(8080))->{body} // '';
    return $body =~ /^agent_trace_spans_total\{outcome="$outcome"\} (\d+)/m
        ? $1 : undef;
}

my $caller_trace = '4bf92f3577b34da6a3ce929d0e0e4736';
my $caller_span = '00f067aa0ba902b7';
my $tp = "00-$caller_trace-$caller_span-01";

# a turn with a tool call: chat, execute_tool, chat

$mock->script(
    { tool_calls => [{ id => 'call_1', name => 'lookup',
                       arguments => '{"q":"x"}' }],
      id => 'chatcmpl-one', model => 'gpt-test-2024',
      usage => { prompt_tokens => 11, completion_tokens => 3 } },
    { text => 'Found it.', id => 'chatcmpl-two', model => 'gpt-"q"\\2',
      usage => { prompt_tokens => 20, completion_tokens => 4 } });

my $r = send_message($t, 't1', 'look it up',
                     headers => { traceparent => $tp,
                                  tracestate => 'vendor=abc' });
is($r->{status}, 202, 'message with a traceparent taken');

my $c = wait_state($t, 't1', 'idle');
is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'the turn ran');

my @spans = wait_spans(sub { grep { $_->{name} =~ /^invoke_agent/ } @_ });
my @ev = @{$c->{messages}};
my ($turn) = grep { $_->{name} eq 'invoke_agent chat' } @spans;

ok($turn, 'invoke_agent span');
is($turn->{traceId}, $caller_trace, 'the turn is in the caller\'s trace');
is($turn->{parentSpanId}, $caller_span, 'a child of the caller\'s span');
is($turn->{traceState}, 'vendor=abc', 'tracestate kept');
is(attrs($turn)->{'gen_ai.conversation.id'}, 't1', 'conversation id');
is(attrs($turn)->{'gen_ai.agent.name'}, 'chat', 'agent name');
is(attrs($turn)->{'gen_ai.operation.name'}, 'invoke_agent', 'operation');
is($turn->{startTimeUnixNano}, $ev[0]{ts} . '000000',
   'the turn starts at its user_msg');
is($turn->{endTimeUnixNano}, $ev[-1]{ts} . '000000',
   'and ends at its terminal event');
ok(!exists attrs($turn)->{'gen_ai.input.messages'},
   'no message content by default');

my @chat = grep { attrs($_)->{'gen_ai.operation.name'} eq 'chat' } @spans;
my @replies = grep { $_->{type} eq 'assistant_msg' } @ev;

is(scalar @chat, scalar @replies, 'a chat span per model call');

for my $i (0 .. $#replies) {
    my ($s) = grep { attrs($_)->{'gen_ai.response.id'}
                     eq ($i ? 'chatcmpl-two' : 'chatcmpl-one') } @chat;
    my $a = $s ? attrs($s) : {};

    ok($s, "chat span of model call " . ($i + 1));
    is($s->{parentSpanId}, $turn->{spanId}, '... a child of the turn');
    is($s->{traceId}, $caller_trace, '... in the trace');
    is($a->{'gen_ai.usage.input_tokens'},
       $replies[$i]{usage}{input_tokens}, '... input tokens as logged');
    is($a->{'gen_ai.usage.output_tokens'},
       $replies[$i]{usage}{output_tokens}, '... output tokens as logged');
    is($a->{'gen_ai.request.model'}, 'gpt-test', '... request model');
    is($s->{endTimeUnixNano}, $replies[$i]{ts} . '000000',
       '... ends when its reply was logged');
    is($s->{kind}, 3, '... a client span');
}

is(attrs($chat[0])->{'gen_ai.response.model'}, 'gpt-test-2024',
   'the provider\'s model');

my ($second) = grep { attrs($_)->{'gen_ai.response.id'} eq 'chatcmpl-two' }
               @chat;
is($second && attrs($second)->{'gen_ai.response.model'}, 'gpt-"q"\\2',
   'a model name with a quote and a backslash, as the provider gave it');

is(attrs($chat[0])->{'gen_ai.response.finish_reasons'}{arrayValue}{values}[0]
   {stringValue}, 'tool_calls', 'finish reasons');

# the provider got the traceparent of each chat span

my @preq = @{$mock->requests};
is(scalar @preq, 2, 'two model requests');

for my $i (0, 1) {
    my ($s) = grep { attrs($_)->{'gen_ai.response.id'}
                     eq ($i ? 'chatcmpl-two' : 'chatcmpl-one') } @chat;
    is($preq[$i]{headers}{traceparent},
       "00-$caller_trace-$s->{spanId}-01",
       "model request " . ($i + 1) . " carries its chat span");
    is($preq[$i]{headers}{tracestate}, 'vendor=abc', '... and tracestate');
}

# the tool call, and the backend's own span under it

my ($tool) = grep { attrs($_)->{'gen_ai.operation.name'} eq 'execute_tool' }
             @spans;
my ($call) = grep { $_->{type} eq 'tool_call' } @ev;
my ($result) = grep { $_->{type} eq 'tool_result' } @ev;

is(attrs($tool)->{'gen_ai.tool.call.id'}, 'call_1', 'execute_tool span');
is(attrs($tool)->{'gen_ai.tool.name'}, 'lookup', '... tool name');
is(attrs($tool)->{'agent.tool.executor'}, 'server', '... executor');
is($tool->{parentSpanId}, $turn->{spanId}, '... a child of the turn');
is($tool->{startTimeUnixNano}, $call->{ts} . '000000', '... from tool_call');
is($tool->{endTimeUnixNano}, $result->{ts} . '000000', '... to tool_result');
ok(!$tool->{status}{code}, '... no error');

my ($backend) = grep { $_->{name} eq 'lookup backend' } spans('tool-backend');

ok($backend, 'the backend exported its span (official SDK and exporter)');
is($backend->{traceId}, $caller_trace, '... in the same trace');
is($backend->{parentSpanId}, $tool->{spanId},
   '... a child of the execute_tool span');
like($json->encode($result->{result}),
     qr/"traceparent":"00-$caller_trace-$tool->{spanId}-01"/,
     'the tool got the traceparent of its span');

# the payload against trace.proto's JSON mapping (field names, id
# lengths, kinds, status codes, 64-bit integers as strings), and its
# span fields against those of the official exporter's payload

my %SPAN = map { $_ => 1 } qw(traceId spanId traceState parentSpanId flags
    name kind startTimeUnixNano endTimeUnixNano attributes
    droppedAttributesCount events droppedEventsCount links
    droppedLinksCount status);
my %EVENT = map { $_ => 1 } qw(timeUnixNano name attributes
    droppedAttributesCount);
my %VALUE = map { $_ => 1 } qw(stringValue boolValue intValue doubleValue
    arrayValue kvlistValue bytesValue);

sub proto_errors {
    my ($body) = @_;
    my @e;

    push @e, 'top' unless join(',', sort keys %$body) eq 'resourceSpans';

    for my $rs (@{$body->{resourceSpans}}) {
        push @e, 'resourceSpans keys'
            if grep { !/^(resource|scopeSpans|schemaUrl)$/ } keys %$rs;

        for my $ss (@{$rs->{scopeSpans}}) {
            push @e, 'scopeSpans keys'
                if grep { !/^(scope|spans|schemaUrl)$/ } keys %$ss;

            for my $s (@{$ss->{spans}}) {
                push @e, map { "span key $_" } grep { !$SPAN{$_} } keys %$s;
                push @e, "traceId $s->{traceId}"
                    unless $s->{traceId} =~ /^[0-9a-f]{32}$/;
                push @e, "spanId $s->{spanId}"
                    unless $s->{spanId} =~ /^[0-9a-f]{16}$/;
                push @e, "parentSpanId"
                    if exists $s->{parentSpanId}
                       && $s->{parentSpanId} !~ /^[0-9a-f]{16}$/;
                push @e, "kind $s->{kind}" unless $s->{kind} =~ /^[0-5]$/;
                push @e, "times"
                    unless $s->{startTimeUnixNano} =~ /^\d+$/
                        && $s->{endTimeUnixNano} =~ /^\d+$/
                        && $s->{endTimeUnixNano} >= $s->{startTimeUnixNano};
                push @e, "status"
                    if $s->{status}
                       && (grep { !/^(code|message)$/ } keys %{$s->{status}}
                           or ($s->{status}{code} // 0) !~ /^[0-2]$/);

                for my $a (@{$s->{attributes}},
                           map { @{$_->{attributes} || []} }
                           @{$s->{events} || []})
                {
                    push @e, "attribute $a->{key}"
                        unless join(',', sort keys %$a) eq 'key,value'
                            && keys %{$a->{value}} == 1
                            && $VALUE{(keys %{$a->{value}})[0]};
                    push @e, "intValue of $a->{key} not a string"
                        if exists $a->{value}{intValue}
                           && (ref \$a->{value}{intValue} ne 'SCALAR'
                               || $json->encode([$a->{value}{intValue}])
                                  !~ /^\["-?\d+"\]$/);
                }

                for my $ev (@{$s->{events} || []}) {
                    push @e, map { "event key $_" }
                             grep { !$EVENT{$_} } keys %$ev;
                }
            }
        }
    }

    return @e;
}

my @ours = grep { $_->{path} eq '/v1/traces'
                  && ($_->{headers}{authorization} // '') eq
                     'Bearer collector-token' } received();
ok(@ours, 'spans posted through the location, with its header');
is($ours[0]{headers}{'content-type'}, 'application/json', '... as JSON');
is(join(' ', map { proto_errors($_->{body}) } @ours), '',
   'the payload follows the OTLP JSON mapping');

my ($official) = grep { !$_->{headers}{authorization} } received();
my %theirs = map { %$_ } map { @{$_->{spans}} } map { @{$_->{scopeSpans}} }
             @{$official->{body}{resourceSpans}};
is(join(' ', grep { !exists $theirs{$_} && !/^(parentSpanId|traceState)$/ }
              map { keys %$_ } @spans),
   '', 'span fields as the official exporter names them');
is(join(' ', proto_errors($official->{body})), '',
   'the official payload passes the same check');

# an approval: the turn resumes from the resolve, in the same trace, with
# the suspension and its resolution (and who approved) as events

$mock->script(
    { tool_calls => [{ id => 'call_a', name => 'send_note',
                       arguments => '{"to":"x"}' }] },
    { text => 'Sent.' });

my $tp2 = "00-aaaabbbbccccddddeeeeffff00001111-1111222233334444-01";
send_message($t, 't2', 'send it', headers => { traceparent => $tp2 });
wait_state($t, 't2', 'awaiting_input');

is(scalar(grep { $_->{traceId} eq 'aaaabbbbccccddddeeeeffff00001111' }
          spans('nginx')), 0, 'no span while the turn waits');

$r = http_post('/approve/t2/call_a', '{"decision":"approve"}',
               port => $t->port(8080),
               headers => { 'Content-Type' => 'application/json',
                            'X-User' => 'alice',
                            traceparent => "00-$caller_trace-"
                                           . "0000000000000abc-01" });
is($r->{status}, 200, 'approved');

$c = wait_state($t, 't2', 'idle');
@spans = grep { $_->{traceId} eq 'aaaabbbbccccddddeeeeffff00001111' }
         wait_spans(sub { grep { $_->{traceId}
                          eq 'aaaabbbbccccddddeeeeffff00001111' } @_ });

my ($t2) = grep { $_->{name} =~ /^invoke_agent/ } @spans;
($tool) = grep { attrs($_)->{'gen_ai.operation.name'} eq 'execute_tool' }
          @spans;

is(scalar @spans, 4, 'the resumed turn: turn, two chats, one tool');
is($t2->{parentSpanId}, '1111222233334444', 'still under its caller');
is(join(' ', map { $_->{name} } @{$tool->{events} || []}),
   'agent.suspension agent.resolution', 'suspension and resolution events');

my ($res) = grep { $_->{name} eq 'agent.resolution' } @{$tool->{events}};
is(attrs($res)->{'agent.approver'}, 'alice', 'the approver');
is(attrs($res)->{'agent.decision'}, 'approve', 'the decision');

my ($resolution) = grep { $_->{type} eq 'resolution' } @{$c->{messages}};
is($res->{timeUnixNano}, $resolution->{ts} . '000000', 'at its time');

($backend) = grep { $_->{traceId} eq 'aaaabbbbccccddddeeeeffff00001111' }
             spans('tool-backend');
is($backend->{parentSpanId}, $tool->{spanId},
   'the tool run after the approval continues the trace');

# a message with no traceparent: a trace of its own, a root span

$mock->script({ text => 'Hi.' });
send_message($t, 't3', 'hello');
wait_state($t, 't3', 'idle');

@spans = wait_spans(sub { grep { (attrs($_)->{'gen_ai.conversation.id'}
                                  // '') eq 't3' } @_ });
($turn) = grep { (attrs($_)->{'gen_ai.conversation.id'} // '') eq 't3' }
          @spans;

ok($turn && !exists $turn->{parentSpanId}, 'no traceparent: a root span');
ok($turn && $turn->{traceId} ne $caller_trace, 'in a trace of its own');

# a failed model call: an error span with its type

$mock->script({ status => 400 });
send_message($t, 't4', 'fail', headers => { traceparent => $tp });
$c = wait_state($t, 't4', 'idle');

@spans = wait_spans(sub { grep { (attrs($_)->{'gen_ai.conversation.id'}
                                  // '') eq 't4' } @_ });
($turn) = grep { (attrs($_)->{'gen_ai.conversation.id'} // '') eq 't4' }
          @spans;
my ($failed) = grep { ($_->{parentSpanId} // '') eq ($turn->{spanId} // '-')
                      && attrs($_)->{'gen_ai.operation.name'} eq 'chat' }
               @spans;

is($turn->{status}{code}, 2, 'a failed turn: error status');
is($failed->{status}{code}, 2, 'its model call too');
is(attrs($failed)->{'http.response.status_code'}, 400, '... with its status');
ok(attrs($failed)->{'error.type'}, '... and an error type');

# a collector that answers 500, then one that is down: the turns run as
# ever, their spans are dropped and counted

my $exported = spans_metric('exported');
my $dropped = spans_metric('dropped');

ok($exported >= 9, "exported spans counted ($exported)");

$otel->status(500);

$mock->script({ tool_calls => [{ id => 'call_5', name => 'lookup',
                                 arguments => '{}' }] },
              { text => 'Done.' });
send_message($t, 't5', 'again', headers => { traceparent => $tp });
$c = wait_state($t, 't5', 'idle');
is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'collector answering 500: the turn ran');

for (1 .. 50) {
    last if spans_metric('dropped') >= $dropped + 4;
    sleep 0.1;
}

is(spans_metric('dropped') - $dropped, 4, 'its four spans dropped and counted');

$otel->stop;

$dropped = spans_metric('dropped');
my $t0 = time;

$mock->script({ text => 'Still here.' });
send_message($t, 't6', 'down', headers => { traceparent => $tp });
$c = wait_state($t, 't6', 'idle');

is(log_types($c), 'user_msg assistant_msg turn_completed',
   'collector down: the turn ran');
ok(time - $t0 < 5, 'without waiting for it');

for (1 .. 50) {
    last if spans_metric('dropped') >= $dropped + 2;
    sleep 0.1;
}

is(spans_metric('dropped') - $dropped, 2, 'its two spans dropped and counted');

# a collector that takes the connection and never answers: a turn's spans
# in flight, the next turn's queued behind them; a fast stop drops both
# and says so

my $hung = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $cport,
                                 Listen => 8, ReuseAddr => 1)
    or die "listen on $cport: $!\n";

for my $cid ('t7', 't8') {
    $mock->script({ text => 'Held.' });
    send_message($t, $cid, 'held', headers => { traceparent => $tp });
    wait_state($t, $cid, 'idle');
}

sleep 0.5;

$t->stop('TERM');
close $hung;

my $log = $t->read_file('error.log');
my $at_exit = 0;
$at_exit += $1
    while $log =~ /agent trace: (\d+) spans dropped as the worker exits/g;

is($at_exit, 4, 'a fast stop: the spans in flight and queued dropped, said');
unlike($log, qr/\[(alert|emerg|crit)\]/, 'no alert in error.log');

done_testing;
