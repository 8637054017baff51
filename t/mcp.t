#!/usr/bin/perl

# Tools of an MCP server reached through an nginx location (agent_mcp),
# against a mock server speaking Streamable HTTP: the tool list fetched
# (two pages) and given to the model with the declared tools, a name
# both have prefixed with the server's name; calls answered by JSON and
# by an SSE stream with progress; isError and JSON-RPC errors; a tool
# that waits for approval; a server that forgot its session; a worker
# killed mid-call, whose call is sent again with the same id.  A server
# that asks a question during a call (elicitation): answered, declined,
# expired, cancelled (notifications/cancelled), and its worker killed
# while it waits (the call sent again, the server asking again).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::MockMCP;
use Test::Agent::Calls;
use Test::Agent::SSE;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mcp = Test::Agent::MockMCP->new;
my $mcp_port = $mcp->port;
my $ask = Test::Agent::MockMCP->new;
my $ask_port = $ask->port;

my $tools = $ECHO_TOOL . <<'EOF';
    agent_mcp files location=/mcp/files
              tools=echo,add,count,fail,broken,remove,hang
              approval=remove timeout=1h;
    agent_mcp ask location=/mcp/ask tools=confirm timeout=3s;
EOF

my $server = $ECHO_LOCATION
    . Test::Agent::MockMCP::location('/mcp/files', $mcp_port,
                                     'proxy_read_timeout 90s;')
    . Test::Agent::MockMCP::location('/mcp/ask', $ask_port) . <<"EOF";

        location = /describe {
            agent chat;
            agent_describe;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $tools, agent => 'tools echo files ask;', server => $server));
$t->run;

my $port = $t->port(8080);

sub json_of { my $d = eval { decode_json($_[0]{data} // '') }; $d // {} }

# discovery: the first model call gets the server's tools

$mock->script({ text => 'Hello.' });

send_message($t, 'd1', 'hi');
my $c = wait_state($t, 'd1', 'idle');

is(log_types($c), 'user_msg assistant_msg turn_completed', 'a plain turn');

my $sent = $mock->requests->[0]{json}{tools} // [];
my %sent = map { $_->{function}{name} => $_->{function} } @$sent;

is_deeply([sort keys %sent],
          [sort qw(echo files_echo add count fail broken remove hang
                   confirm)],
          'declared and MCP tools, both pages, "secret" left out, '
          . 'the clashing name prefixed');
is_deeply($sent{add}{parameters},
          { type => 'object', properties => { a => { type => 'number' },
                                              b => { type => 'number' } } },
          'an MCP tool\'s schema as the server gave it');
is($sent{add}{description}, 'Adds two numbers', 'and its description');
is($sent{echo}{description}, 'Echoes what it got',
   'the declared tool keeps its name');

my @init = $mcp->calls('initialize');
my @list = $mcp->calls('tools/list');
is(scalar @init, 1, 'one initialize');
is($init[0]{message}{params}{protocolVersion}, '2025-06-18',
   'asking for revision 2025-06-18');
like($init[0]{accept}, qr{application/json.*text/event-stream},
     'accepting JSON and SSE');
is_deeply($init[0]{message}{params}{capabilities}, { elicitation => {} },
          'declaring the elicitation capability');
is(scalar $mcp->calls('notifications/initialized'), 1,
   'initialized notified');
is(scalar @list, 2, 'tools/list in two pages');
is($list[1]{message}{params}{cursor}, 'page-2', 'the second with the cursor');
ok($list[0]{session} && $list[0]{session} eq $list[1]{session},
   'in the session initialize gave');
is($list[0]{version}, '2025-06-18', 'with MCP-Protocol-Version');

my $d = http_get('/describe', port => $port);
my $desc = eval { decode_json($d->{body}) } // {};
my ($files) = grep { $_->{server} eq 'files' } @{$desc->{mcp} // []};
is($files && $files->{server}, 'files', 'describe: the server');
is_deeply([sort map { $_->{name} } @{$files->{tools} // []}],
          [sort qw(files_echo add count fail broken remove hang)],
          'describe: its tools');
my ($rm) = grep { $_->{name} eq 'remove' } @{$files->{tools} // []};
is($rm && $rm->{approval}, 'requires_approval', 'describe: approval');

# a second turn in the same minute: no new discovery

$mock->reset;
$mock->script({ text => 'Again.' });
send_message($t, 'd2', 'hi again');
wait_state($t, 'd2', 'idle');
is(scalar $mcp->calls('tools/list'), 2, 'the list is kept in the zone');
is(scalar @{$mock->requests->[0]{json}{tools} // []}, 9,
   'and given to the model');

# calls: JSON answers, the call id passed through

$mock->reset;
$mock->script({ tool_calls => [
                    tool_call('m1', 'add', '{"a":2,"b":3}'),
                    tool_call('m2', 'files_echo', '{"text":"hi"}'),
                    tool_call('m3', 'echo', '{"n":7}')] },
              { text => 'Done.' });

send_message($t, 'c1', 'add and echo');
$c = wait_state($t, 'c1', 'idle');

my $res = tool_results($c);
is(scalar keys %$res, 3, 'three results');
is_deeply($res->{m1}{result}, { sum => 5 }, 'structuredContent as result');
is_deeply($res->{m2}{result}{args}, { text => 'hi' },
          'the prefixed tool reached the server by its own name');
is($res->{m2}{result}{rpc_id}, 'm2', 'the JSON-RPC id is the call\'s id');
is($res->{m2}{result}{meta}{'agent/tool_call_id'}, 'm2', 'and in _meta');
is($res->{m2}{result}{meta}{progressToken}, 'm2', 'and the progress token');
is($res->{m2}{result}{key}, 'm2', 'Idempotency-Key');
is_deeply($res->{m3}{result}{args}, { n => 7 },
          'the declared echo went to its location');

my $back = { map { $_->{tool_call_id} => decode_json($_->{content}) }
             grep { $_->{role} eq 'tool' }
             @{$mock->requests->[1]{json}{messages}} };
is_deeply($back->{m1}, { ok => JSON::PP::true, result => { sum => 5 } },
          'the model got the result');

# a streamed call: progress notifications become tool_progress

# (live events are not replayed: the subscriber is there before the call,
# as its first event, the last of the turn before, shows)

$mock->reset;
$mock->script({ text => 'Ready.' },
              { tool_calls => [tool_call('p1', 'count', '{"n":3}')] },
              { text => 'Counted.' });

send_message($t, 's1', 'ready?');
my $ready = wait_state($t, 's1', 'idle');
my $last = $ready->{messages}[-1]{seq};

my $sse = Test::Agent::SSE->new(http_stream(
    events_request('s1', 'Last-Event-ID' => $last - 1), port => $port));
my $first = $sse->next_event(5);
is($first && $first->{id}, $last, 'subscribed');

send_message($t, 's1', 'count');

my @seen = grep { defined $_->{event} } $sse->events_until(
    sub { ($_[0]{event} // '') eq 'turn_completed' }, 15);
$sse->stream->close;

my @progress = grep { $_->{event} eq 'tool_progress' } @seen;
my ($result) = grep { $_->{event} eq 'tool_result' } @seen;

is(scalar @progress, 3, 'three progress events');
is_deeply([map { json_of($_)->{progress}{progress} } @progress], [1, 2, 3],
          'in order');
is(json_of($progress[0])->{progress}{message}, 'step 1 of 3',
   'with the server\'s message');
is(json_of($progress[0])->{tool_call_id}, 'p1', 'naming the call');
ok($result && $progress[0]{t} < $result->{t} - 0.4,
   'the first progress well before the result');
$c = wait_state($t, 's1', 'idle');
is(tool_results($c)->{p1}{result}, 'counted to 3', 'the streamed result');

# errors: isError, a JSON-RPC error, a tool the server does not list

$mock->reset;
$mock->script({ tool_calls => [tool_call('e1', 'fail', '{}'),
                               tool_call('e2', 'broken', '{}'),
                               tool_call('e3', 'secret', '{}')] },
              { text => 'Failed.' });

send_message($t, 'e1', 'fail');
$c = wait_state($t, 'e1', 'idle');
$res = tool_results($c);

is($res->{e1}{ok}, JSON::PP::false, 'isError: an error result');
is($res->{e1}{error}, 'disk full', 'with the tool\'s text');
is($res->{e2}{error}, 'the MCP server answered error -32000: '
   . 'backend exploded', 'a JSON-RPC error');
like($res->{e3}{error}, qr/unknown tool "secret"/,
     'a tool left out by tools= is unknown');
ok(!grep({ ($_->{message}{params}{name} // '') eq 'secret' }
         $mcp->calls('tools/call')), 'and never sent');

# approval: the call waits, and is sent once approved

$mock->reset;
$mock->script({ tool_calls => [
                    tool_call('a1', 'remove', '{"path":"/tmp/x"}')] },
              { text => 'Removed.' });

send_message($t, 'a1', 'remove it');
$c = wait_state($t, 'a1', 'awaiting_input');
is($c->{pending}[0]{kind}, 'approval', 'waiting for approval');
ok(!grep({ ($_->{message}{params}{name} // '') eq 'remove' }
         $mcp->calls('tools/call')), 'not sent yet');

is(resolve($t, 'a1', 'a1', { decision => 'approve' })->{status}, 200,
   'approved');
$c = wait_state($t, 'a1', 'idle');
is(tool_results($c)->{a1}{result}, 'removed /tmp/x', 'then sent');

# the server restarted: its sessions are gone (404), a new one is made

my $before = scalar $mcp->calls('initialize');
$mcp->restart;

$mock->reset;
$mock->script({ tool_calls => [
                    tool_call('r1', 'files_echo', '{"text":"back"}')] },
              { text => 'Back.' });

send_message($t, 'r1', 'after restart');
$c = wait_state($t, 'r1', 'idle');

is_deeply(tool_results($c)->{r1}{result}{args}, { text => 'back' },
          'the call went through');
is(scalar $mcp->calls('initialize'), $before + 1, 'after a new initialize');
my @echo = grep { ($_->{message}{params}{arguments}{text} // '') eq 'back' }
           $mcp->calls('tools/call');
is_deeply([map { $_->{status} } @echo], [404, 200],
          'the old session got 404, the new one the call');
isnt($echo[0]{session}, $echo[1]{session}, 'in a new session');

# elicitation: the server asks during the call, the call waits for a
# person as a suspension of kind elicitation, and the answer goes back

# until the server has sent its n-th question and the call waits
sub question {
    my ($cid, $n) = @_;
    return wait_pending($t, $cid, 'elicitation',
                        sub { $ask->calls('elicitation/create') >= $n });
}

# what the client answered to the server's question $id
sub answer_to {
    my ($id) = @_;
    my ($a) = grep { !defined $_->{message}{method}
                     && ($_->{message}{id} // '') eq ($id // '') }
              $ask->requests;
    return $a;
}

# a turn whose model calls confirm, until the server asks (its n-th time)
sub ask_turn {
    my ($cid, $path, $n) = @_;

    $mock->reset;
    $mock->script({ tool_calls => [tool_call($cid, 'confirm',
                                             qq({"path":"$path"}))] },
                  { text => 'Done.' });
    send_message($t, $cid, "remove $path, ask me");

    return question($cid, $n);
}

sub asked { ($ask->calls('elicitation/create'))[$_[0] - 1]{message}{id} }

my ($qc, $qp) = ask_turn('q1', '/tmp/q', 1);
ok($qp, 'the server\'s question waits');
is($qc->{state}, 'awaiting_input', 'the conversation awaits input');
is($qp && $qp->{tool_call_id}, 'q1', 'as the call');
is($qp && $qp->{executor}, 'server', 'of a server tool');

my ($susp) = grep { $_->{type} eq 'suspension' } @{$qc->{messages} // []};
is($susp->{kind}, 'elicitation', 'a suspension of kind elicitation');
is($susp->{message}, 'Remove /tmp/q?', 'with the server\'s message');
is_deeply($susp->{schema},
          { type => 'object',
            properties => { confirm => { type => 'boolean' } },
            required => ['confirm'] },
          'and its schema as the form');
is($susp->{during_call}, JSON::PP::true, 'marked as during the call');

my ($asked) = $ask->calls('elicitation/create');

is(resolve($t, 'q1', 'q1', { decision => 'approve' })->{status}, 400,
   'an approval is not an answer');
is(resolve($t, 'q1', 'q1', { result => 'yes' })->{status}, 400,
   'nor a result that is not an object');
is(resolve($t, 'q1', 'q1', { result => { confirm => JSON::PP::true } })
   ->{status}, 200, 'answered');

$c = wait_state($t, 'q1', 'idle');
is(tool_results($c)->{q1}{result}, 'confirmed: {"confirm":true}',
   'the server got the answer, and the call its result');
my $ans = answer_to(asked(1));
is_deeply($ans && $ans->{message}{result},
          { action => 'accept', content => { confirm => JSON::PP::true } },
          'accept, with the content');
is($ans && $ans->{session}, $asked->{session}, 'in the call\'s session');
is($ans && $ans->{status}, 202, 'taken');
is(log_types($c), 'user_msg assistant_msg tool_call suspension resolution '
   . 'tool_result assistant_msg turn_completed', 'one result in the log');
is(resolve($t, 'q1', 'q1', { result => { confirm => JSON::PP::true } })
   ->{status}, 409, 'answered once');

# declined

($qc, $qp) = ask_turn('q2', '/tmp/r', 2);
ok($qp, 'asked again');
is(resolve($t, 'q2', 'q2', { decision => 'reject', reason => 'no' })
   ->{status}, 200, 'rejected');
$c = wait_state($t, 'q2', 'idle');
is(tool_results($c)->{q2}{result}, 'declined', 'the server saw a decline');
$ans = answer_to(asked(2));
is_deeply($ans && $ans->{message}{result}, { action => 'decline' },
          'decline, without content');

# expired: the tool's server has timeout=3s

($qc, $qp) = ask_turn('q3', '/tmp/s', 3);
ok($qp && $qp->{deadline} - time * 1000 < 3500, 'a deadline of 3 s');
$c = wait_state($t, 'q3', 'idle', 15);
is(tool_results($c)->{q3}{result}, 'cancelled',
   'past its deadline the server got a cancel');
$ans = answer_to(asked(3));
is_deeply($ans && $ans->{message}{result}, { action => 'cancel' },
          'cancel');
my ($expired) = grep { $_->{type} eq 'resolution' } @{$c->{messages}};
ok($expired && $expired->{expired} && $expired->{during_call},
   'the resolution says it expired');
is(resolve($t, 'q3', 'q3', { result => { confirm => JSON::PP::true } })
   ->{status}, 409, 'an answer after it is stale');

# a cancel while the server waits for the answer: the answer cancel,
# and notifications/cancelled

($qc, $qp) = ask_turn('q4', '/tmp/t', 4);
ok($qp, 'waiting for the answer');
is(cancel($t, 'q4')->{status}, 200, 'cancelled');
$c = wait_state($t, 'q4', 'idle');
is(tool_results($c)->{q4}{error}, '[cancelled]', 'the call is cancelled');
is(log_types($c), 'user_msg assistant_msg tool_call suspension tool_result '
   . 'resolution cancelled', 'with one result');

my @cn = $ask->wait_calls('notifications/cancelled');

is(scalar @cn, 1, 'the server was told');
is_deeply($cn[0] && $cn[0]{message}{params},
          { requestId => 'q4', reason => 'cancelled by the user' },
          'notifications/cancelled for the call\'s request id');
is($cn[0] && $cn[0]{session}, $asked->{session}, 'in its session');
is($cn[0] && $cn[0]{version}, '2025-06-18', 'with its revision');

# the server's question is answered too, as the specification asks: it
# waits for that answer whatever becomes of the call

my $ans4;
my $deadline = time + 5;
sleep 0.05 until ($ans4 = answer_to(asked(4))) || time > $deadline;
is_deeply($ans4 && $ans4->{message}{result}, { action => 'cancel' },
          'the question is answered: cancel');
is($ans4 && $ans4->{session}, $asked->{session}, 'in its session');

# a running call without a question is cancelled the same way

$mock->reset;
$mock->script({ tool_calls => [tool_call('x1', 'count', '{"n":30}')] },
              { text => 'Never.' });

send_message($t, 'x1', 'count, cancel');
$deadline = time + 10;
sleep 0.05 while time < $deadline
                 && !grep { ($_->{message}{id} // '') eq 'x1' }
                          $mcp->calls('tools/call');
is(cancel($t, 'x1')->{status}, 200, 'a counting call cancelled');

@cn = $mcp->wait_calls('notifications/cancelled');
is_deeply($cn[0] && $cn[0]{message}{params},
          { requestId => 'x1', reason => 'cancelled by the user' },
          'its server was told');

# a worker killed while the server waits: the call is sent again with
# its id, and the server asks again

($qc, $qp) = ask_turn('q5', '/tmp/u', 5);
ok($qc->{lease}, 'the call waits in a worker');
$t->kill_worker($qc->{lease});

($qc, $qp) = question('q5', 6);
ok($qp, 'the server asked again');
my @q5 = grep { ($_->{message}{params}{arguments}{path} // '') eq '/tmp/u' }
         $ask->calls('tools/call');
is_deeply([map { $_->{message}{id} } @q5], ['q5', 'q5'],
          'the call was sent again, with its id');
is(resolve($t, 'q5', 'q5', { result => { confirm => JSON::PP::true } })
   ->{status}, 200, 'answered');
$c = wait_state($t, 'q5', 'idle', 15);
is(tool_results($c)->{q5}{result}, 'confirmed: {"confirm":true}',
   'the second question got the answer');
my @res = grep { $_->{type} eq 'resolution' } @{$c->{messages}};
is(scalar @res, 2, 'two resolutions');
is($res[0]{source}, 'takeover', 'the first for the dead worker');

# a worker killed mid-call: another sends the call again, with its id

$mock->reset;
$mock->script({ tool_calls => [tool_call('k1', 'hang', '{}')] },
              { text => 'Woke.' });

send_message($t, 'k1', 'hang');

$deadline = time + 10;
sleep 0.05 while time < $deadline
                 && !grep { ($_->{message}{params}{name} // '') eq 'hang' }
                          $mcp->calls('tools/call');

my $lease;
for (1 .. 100) {
    $lease = inspect($t, 'k1')->{json}{lease} and last;
    sleep 0.02;
}

ok($lease, 'the call runs');
$t->kill_worker($lease);

$c = wait_state($t, 'k1', 'idle', 15);
is(tool_results($c)->{k1}{result}, 'woke up', 'the call was sent again');
my @hang = grep { ($_->{message}{params}{name} // '') eq 'hang' }
           $mcp->calls('tools/call');
is(scalar @hang, 2, 'twice');
is_deeply([map { $_->{message}{id} } @hang], ['k1', 'k1'],
          'with the same id');
is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'one result in the log');

$t->allow_alert(qr/worker process \d+ exited on signal 9/);

$t->done;
