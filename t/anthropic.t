#!/usr/bin/perl

# The Anthropic Messages adapter: the conversation rendered the way the
# API wants it (system at the top, alternating roles, tool results as
# tool_result blocks of one user message), its stream assembled into the
# log (text, tool_use input from input_json_delta pieces, thinking with
# its signature, a hosted web search as a provider-executed pair), and
# what the API needs back (thinking, hosted tool blocks, citations, every
# field of a block, each thinking block's signature) sent back as it
# came; a reply the API paused (pause_turn) sent back for the API to go
# on with, in the same turn.  Errors: an error event mid-stream fails the
# turn, before the first token it is retried, like 429 and 529.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::SSE;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

my $tools = $ECHO_TOOL . <<'EOF';
    agent_tool web_search {
        executor provider;
        provider_definition anthropic_messages
            '{"type":"web_search_20250305","name":"web_search","max_uses":3}';
    }
EOF

my $server = $ECHO_LOCATION;

# the version, beta options and key are headers of the provider location

$t->write_file_expand('nginx.conf', engine_conf($mock,
    adapter => 'anthropic_messages', tools => $tools, server => $server,
    agent => 'tools echo web_search; max_model_calls 3;',
    provider => 'proxy_set_header anthropic-version 2023-06-01;
            proxy_set_header anthropic-beta interleaved-thinking-2025-05-14;
            proxy_set_header x-api-key sk-ant-test;
            proxy_read_timeout 2s;'));
$t->run;

my $port = $t->port(8080);

sub call {
    my ($id, $name, $args) = @_;
    return { id => $id, name => $name, arguments => $args };
}

sub of_type {
    my ($c, $type) = @_;
    return grep { $_->{type} eq $type } @{$c->{messages}};
}

sub messages { $mock->requests->[$_[0]]{json}{messages} }

sub json_of { my $d = eval { decode_json($_[0]{data} // '') }; $d // {} }

###############################################################################

# a plain turn, and the request as the API wants it

$mock->script({ text => 'Hello there, friend.', chunks => 4, delay => 0.05,
                usage => { input_tokens => 12, output_tokens => 4 } });

is(send_message($t, 'a1', 'hi')->{status}, 202, 'message accepted');

my $c = wait_state($t, 'a1', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed', 'log of a turn');

my $assistant = (of_type($c, 'assistant_msg'))[0];
is($assistant->{content}, 'Hello there, friend.', 'reply assembled');
is($assistant->{status}, 'complete', 'reply complete');
is($assistant->{finish_reason}, 'end_turn', 'stop reason');
is_deeply($assistant->{usage}, { input_tokens => 12, output_tokens => 4 },
          'usage recorded');
ok(!exists $assistant->{provider_content},
   'text alone needs no provider content');

my $req = $mock->requests->[0];
is($req->{api}, 'anthropic_messages', 'Messages API called');
is($req->{headers}{'anthropic-version'}, '2023-06-01',
   'anthropic-version from proxy_set_header');
is($req->{headers}{'anthropic-beta'}, 'interleaved-thinking-2025-05-14',
   'anthropic-beta from proxy_set_header');
is($req->{headers}{'x-api-key'}, 'sk-ant-test', 'key from proxy_set_header');
is($req->{json}{model}, 'gpt-test', 'model');
is($req->{json}{max_tokens}, 4096, 'max_tokens');
ok($req->{json}{stream}, 'streaming asked for');
is($req->{json}{system}, 'You are terse.', 'system prompt at the top');
is_deeply($req->{json}{messages}, [{ role => 'user', content => 'hi' }],
          'the user message');
is_deeply($req->{json}{tools}, [
    { name => 'echo', description => 'Echoes what it got',
      input_schema => { type => 'object',
                        properties => { n => { type => 'integer' } } } },
    { type => 'web_search_20250305', name => 'web_search', max_uses => 3 },
], 'tools: input_schema, and the hosted tool as declared');

$mock->script({ text => 'Again.' });
send_message($t, 'a1', 'more');
wait_state($t, 'a1', 'idle');

is_deeply(messages(1), [
    { role => 'user', content => 'hi' },
    { role => 'assistant',
      content => [{ type => 'text', text => 'Hello there, friend.' }] },
    { role => 'user', content => 'more' },
], 'history: the reply as a text block');

###############################################################################

# a tool round trip: input assembled from input_json_delta pieces, the
# results in one user message of tool_result blocks

$mock->reset;
$mock->script({ text => 'Checking.', chunks => 3,
                tool_calls => [call('toolu_1', 'echo', '{"n":1}'),
                               call('toolu_2', 'echo', '{"n":2}')] },
              { text => 'Both done.' });

send_message($t, 't1', 'run two');
$c = wait_state($t, 't1', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_call tool_result '
   . 'tool_result assistant_msg turn_completed', 'log of a tool round trip');

$assistant = (of_type($c, 'assistant_msg'))[0];
is($assistant->{finish_reason}, 'tool_use', 'stop reason tool_use');
is_deeply([map { [$_->{id}, $_->{name}, $_->{arguments}] }
           @{$assistant->{tool_calls}}],
          [['toolu_1', 'echo', '{"n":1}'], ['toolu_2', 'echo', '{"n":2}']],
          'calls with their input assembled');

my %res = map { $_->{tool_call_id} => $_ } of_type($c, 'tool_result');
is_deeply($res{toolu_2}{result}, { args => { n => 2 } }, 'the tool ran');

my $sent = messages(1);
is_deeply([map { $_->{role} } @$sent], [qw(user assistant user)],
          'roles alternate');
is_deeply($sent->[1]{content}, [
    { type => 'text', text => 'Checking.' },
    { type => 'tool_use', id => 'toolu_1', name => 'echo',
      input => { n => 1 } },
    { type => 'tool_use', id => 'toolu_2', name => 'echo',
      input => { n => 2 } },
], 'the assistant message with its tool_use blocks');
is_deeply([map { [$_->{type}, $_->{tool_use_id}, $_->{is_error}] }
           @{$sent->[2]{content}}],
          [['tool_result', 'toolu_1', JSON::PP::false],
           ['tool_result', 'toolu_2', JSON::PP::false]],
          'one user message of tool_result blocks, paired by id');
is_deeply(decode_json($sent->[2]{content}[0]{content}),
          { ok => JSON::PP::true, result => { args => { n => 1 } } },
          'the model sees {"ok":true,...}');

# results, then a failed model call, then a new message: one user message

$mock->reset;
$mock->script({ tool_calls => [call('toolu_3', 'echo', '{}')] },
              { status => 400, error => { message => 'bad request' } },
              { text => 'OK.' });

send_message($t, 't2', 'first');
$c = wait_state($t, 't2', 'idle');
is(log_types($c), 'user_msg assistant_msg tool_call tool_result turn_failed',
   'model call after the results failed');

send_message($t, 't2', 'again');
wait_state($t, 't2', 'idle');

$sent = messages(2);
is_deeply([map { $_->{role} } @$sent], [qw(user assistant user)],
          'results and the next message make one user message');
is_deeply([map { $_->{type} } @{$sent->[2]{content}}], ['tool_result', 'text'],
          'tool results first, then the text');
is($sent->[2]{content}[1]{text}, 'again', 'the new message');
is_deeply($sent->[1]{content},
          [{ type => 'tool_use', id => 'toolu_3', name => 'echo',
             input => {} }], 'input without pieces is {}');

###############################################################################

# a subscriber from before the reply starts: the first model call is held
# before its first event until the subscriber has the user's message

sub subscribe_before_reply {
    my ($cid) = @_;

    my $sse = Test::Agent::SSE->new(http_stream(events_request($cid),
                                                port => $port));
    $sse->events_until(sub { ($_[0]{event} // '') eq 'user_msg' }, 10);
    ok($mock->wait_paused(0, 10), "$cid: the reply held before it starts");
    $mock->release(0);

    return $sse;
}

# thinking: live to a subscriber, and sent back with its signature before
# the tool_use it led to

$mock->reset;
$mock->script({ thinking => 'The user wants n. Echo it.', signature => 'sig-1',
                tool_calls => [call('toolu_4', 'echo', '{"n":4}')],
                chunks => 3, delay => 0.05, pause_after => 0 },
              { text => 'Echoed.' });

send_message($t, 'k1', 'think');

my $sse = subscribe_before_reply('k1');
my @ev = $sse->events_until(sub { ($_[0]{event} // '') eq 'turn_ended' }, 10);

# pieces that reach the worker in one pass of its event loop are one
# delta: three pieces make one to three

my @thinking = grep { $_->{event} eq 'thinking_delta' } @ev;
ok(@thinking >= 1 && @thinking <= 3
   && join(' ', map { json_of($_)->{delta_seq} } @thinking)
      eq join(' ', 1 .. @thinking), 'thinking deltas live');
is(join('', map { json_of($_)->{delta} } @thinking),
   'The user wants n. Echo it.', 'thinking deltas make the thinking');
my @args = grep { $_->{event} eq 'tool_call_delta' } @ev;
is(join('', map { json_of($_)->{delta} } @args), '{"n":4}',
   'tool input deltas live');
ok(!grep({ json_of($_)->{index} } @args), 'tool input deltas of call 0');

$c = wait_state($t, 'k1', 'idle');
$assistant = (of_type($c, 'assistant_msg'))[0];
is($assistant->{thinking}, 'The user wants n. Echo it.', 'thinking logged');
is($assistant->{thinking_signature}, 'sig-1', 'with its signature');

my $blocks = [
    { type => 'thinking', thinking => 'The user wants n. Echo it.',
      signature => 'sig-1' },
    { type => 'tool_use', id => 'toolu_4', name => 'echo',
      input => { n => 4 } },
];
is_deeply($assistant->{provider_content}, $blocks,
          'blocks kept as the API returns them');
is_deeply(messages(1)->[1], { role => 'assistant', content => $blocks },
          'thinking sent back verbatim, before its tool_use');
is(messages(1)->[2]{content}[0]{tool_use_id}, 'toolu_4',
   'and the result after');

###############################################################################

# a hosted web search: logged as a provider-executed pair, never
# dispatched, and sent back as the API returned it, citations included

my $result = { url => 'https://example.com/paris', title => 'Paris weather' };

$mock->reset;
$mock->script({ web_search => { id => 'srvtoolu_1', query => 'paris weather',
                                before => 'Let me search. ',
                                results => [$result],
                                citations => [{ %$result,
                                                cited_text => 'Sunny, 21C' }]
                              },
                text => 'It is sunny.', chunks => 2 },
              { text => 'You are welcome.' });

send_message($t, 'w1', 'weather?');
$c = wait_state($t, 'w1', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'turn_completed', 'a hosted call and its result, in one reply');
is(scalar @{$mock->requests}, 1, 'no model call for a hosted result');

my ($tc) = of_type($c, 'tool_call');
my ($tr) = of_type($c, 'tool_result');
is_deeply([@$tc{qw(tool_call_id name executor)}],
          ['srvtoolu_1', 'web_search', 'provider'], 'hosted call');
ok($tc->{provider_executed} && $tr->{provider_executed},
   'both marked provider_executed');
is_deeply(decode_json($tc->{arguments}), { query => 'paris weather' },
          'hosted call input');
is($tr->{tool_call_id}, 'srvtoolu_1', 'result paired');
is($tr->{result}[0]{url}, $result->{url}, 'search results logged');

$assistant = (of_type($c, 'assistant_msg'))[0];
is($assistant->{content}, 'Let me search. It is sunny.', 'text of the reply');

my $content = $assistant->{provider_content};
is_deeply([map { $_->{type} } @$content],
          [qw(text server_tool_use web_search_tool_result text)],
          'the blocks in stream order');
is_deeply($content->[1]{input}, { query => 'paris weather' },
          'server_tool_use input');
is($content->[3]{citations}[0]{cited_text}, 'Sunny, 21C', 'citations kept');
ok($content->[3]{citations}[0]{encrypted_index}, 'as they came');

send_message($t, 'w1', 'thanks');
wait_state($t, 'w1', 'idle');

$sent = messages(1);
is_deeply([map { $_->{role} } @$sent], [qw(user assistant user)],
          'the hosted result is not a user message');
is_deeply($sent->[1]{content}, $content,
          'the search sent back as the API returned it');

###############################################################################

# a hosted search the API paused: its blocks as the API returns them

sub searched {
    my ($id, $text) = @_;

    return (
        { type => 'text', text => $text },
        { type => 'server_tool_use', id => $id, name => 'web_search',
          input => { query => 'paris weather' } },
        { type => 'web_search_tool_result', tool_use_id => $id,
          content => [{ type => 'web_search_result',
                        url => 'https://example.com/paris',
                        title => 'Paris weather',
                        encrypted_content => 'EqgfCioIARgB-' . $id,
                        page_age => undef }] },
    );
}

###############################################################################

# pause_turn: the paused reply is recorded, and sent back as it came as
# the last message, with no user message after it; the turn goes on with
# the next model call and completes

my @paused = searched('srvtoolu_p1', 'Let me search. ');

$mock->reset;
$mock->script({ content => \@paused, finish_reason => 'pause_turn',
                chunks => 2, pause_after => 0 },
              { text => 'It is sunny.' });

send_message($t, 'p1', 'weather?');

$sse = subscribe_before_reply('p1');
@ev = $sse->events_until(sub { ($_[0]{event} // '') eq 'turn_ended' }, 10);

$c = wait_state($t, 'p1', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'a paused turn goes on and completes');
is(scalar @{$mock->requests}, 2, 'the model was called again');

my @assistant = of_type($c, 'assistant_msg');
is_deeply([map { $_->{content} } @assistant],
          ['Let me search. ', 'It is sunny.'], 'the text of both calls');
is($assistant[0]{finish_reason}, 'pause_turn', 'the pause logged');
is_deeply([map { $_->{turn} } @assistant], [1, 1], 'in one turn');
isnt($assistant[0]{message_id}, $assistant[1]{message_id},
     'two messages, as model calls after tool results are');
is_deeply($assistant[0]{provider_content}, \@paused,
          'the paused blocks kept as the API returned them');

$sent = messages(1);
is_deeply([map { $_->{role} } @$sent], [qw(user assistant)],
          'the continuation ends with the assistant message');
is_deeply($sent->[-1], { role => 'assistant', content => \@paused },
          'the paused reply sent back verbatim');

is_deeply([map { $_->{event} }
           grep { $_->{event} =~ /^(assistant_msg|turn_(completed|ended))$/ }
           @ev], [qw(assistant_msg assistant_msg turn_completed turn_ended)],
          'subscribers see one turn of two messages');

my %seen;
is_deeply([grep { !$seen{$_}++ } map { json_of($_)->{message_id} }
           grep { $_->{event} eq 'text_delta' } @ev],
          [map { $_->{message_id} } @assistant],
          'the deltas of each, under its message_id');

# the next turn: both calls make one assistant message, in order

$mock->script({ text => 'You are welcome.' });
send_message($t, 'p1', 'thanks');
wait_state($t, 'p1', 'idle');

is_deeply(messages(2), [
    { role => 'user', content => 'weather?' },
    { role => 'assistant',
      content => [@paused, { type => 'text', text => 'It is sunny.' }] },
    { role => 'user', content => 'thanks' },
], 'history: the paused and the continued reply as one message');

# the worker killed during the continuation: the turn is taken over and
# goes on from the log, the paused reply still the request's last message

$mock->reset;
$mock->script({ content => [searched('srvtoolu_k1', 'Searching. ')],
                finish_reason => 'pause_turn' },
              { text => 'lost words', chunks => 2, pause_after => 2 },
              { text => 'Found.' });

send_message($t, 'p3', 'search');
$mock->wait_paused(1, 5);
$t->kill_worker;

$c = wait_state($t, 'p3', 'idle', 10);
is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'taken over: the paused turn goes on');
is($c->{messages}[-2]{content}, 'Found.', 'with the model called again');
is_deeply(messages(2)->[-1], { role => 'assistant',
                               content => [searched('srvtoolu_k1',
                                                    'Searching. ')] },
          'the paused reply sent back after the take-over');

$t->allow_alert(qr/worker process \d+ exited on signal 9/);

# pause_turn counts against max_model_calls (3 here)

$mock->reset;
$mock->script((map { { content => [searched("srvtoolu_m$_", "$_. ")],
                       finish_reason => 'pause_turn' } } 1 .. 3),
              { text => 'never' });

send_message($t, 'p2', 'search a lot');
$c = wait_state($t, 'p2', 'idle');

is(log_types($c), join(' ', 'user_msg',
                       ('assistant_msg tool_call tool_result') x 3,
                       'turn_failed'), 'paused three times: the turn fails');
is(scalar @{$mock->requests}, 3, 'no model call past max_model_calls');
is($c->{messages}[-1]{reason}, 'the turn reached max_model_calls',
   'as any turn that reaches max_model_calls');

###############################################################################

# a tool_use block with a field the module does not know goes back whole

my $caller = { type => 'code_execution_20250825',
               tool_id => 'srvtoolu_code1' };
my @used = (
    { type => 'text', text => 'Calling.' },
    { type => 'tool_use', id => 'toolu_c1', name => 'echo',
      input => { n => 7 }, caller => $caller },
);

$mock->reset;
$mock->script({ content => \@used, chunks => 3 }, { text => 'Done.' });

send_message($t, 'u1', 'call it');
$c = wait_state($t, 'u1', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'the call ran');
is_deeply((of_type($c, 'tool_result'))[0]{result}, { args => { n => 7 } },
          'with its input assembled from the deltas');
is_deeply(messages(1)->[1], { role => 'assistant', content => \@used },
          'the tool_use sent back with its caller');

###############################################################################

# several thinking blocks (interleaved thinking) and redacted thinking:
# each goes back with its own signature, or its data

my @thought = (
    { type => 'thinking', thinking => 'First, look it up.',
      signature => 'sig-first' },
    { type => 'redacted_thinking', data => 'EmwKAhgBEgy3va3pzix/LafPsn4a' },
    { type => 'text', text => 'Looking.' },
    { type => 'thinking', thinking => 'Then echo n.',
      signature => 'sig-second' },
    { type => 'tool_use', id => 'toolu_k1', name => 'echo',
      input => { n => 2 } },
);

$mock->reset;
$mock->script({ content => \@thought, chunks => 2 }, { text => 'Echoed.' });

send_message($t, 'i1', 'think twice');
$c = wait_state($t, 'i1', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'the turn with two thinking blocks');

$assistant = (of_type($c, 'assistant_msg'))[0];
is_deeply($assistant->{provider_content}, \@thought,
          'every block kept, each with its signature');
is_deeply(messages(1)->[1], { role => 'assistant', content => \@thought },
          'each signature sent back with its own thinking');

# a block whole in its start, signature included, with no deltas

$mock->reset;
$mock->script({ raw => [map { "event: $_->{type}\ndata: " . encode_json($_)
                              . "\n\n" } (
    { type => 'message_start',
      message => { id => 'msg_w', usage => { input_tokens => 3 } } },
    { type => 'content_block_start', index => 0,
      content_block => { type => 'thinking', thinking => 'Whole.',
                         signature => 'sig-whole' } },
    { type => 'content_block_stop', index => 0 },
    { type => 'content_block_start', index => 1,
      content_block => { type => 'text', text => 'Hi.' } },
    { type => 'content_block_stop', index => 1 },
    { type => 'message_delta', delta => { stop_reason => 'end_turn' },
      usage => { output_tokens => 2 } },
    { type => 'message_stop' },
)] }, { text => 'Again.' });

send_message($t, 'i2', 'x');
wait_state($t, 'i2', 'idle');
send_message($t, 'i2', 'y');
wait_state($t, 'i2', 'idle');

is_deeply(messages(1)->[1], { role => 'assistant', content => [
    { type => 'thinking', thinking => 'Whole.', signature => 'sig-whole' },
    { type => 'text', text => 'Hi.' },
] }, 'a signature in the block\'s start sent back');

###############################################################################

# events split anywhere, CRLF lines, and an event type the API may add

$mock->reset;
$mock->script({ raw => [
    "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":"
    . "{\"id\":\"msg_raw\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}"
    . "}\r\n\r\nevent: content_block_st",
    "art\r\ndata: {\"type\":\"content_block_start\",\"index\":0,"
    . "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\r\n\r\n"
    . "event: future_event\r\ndata: {\"type\":\"future_event\"}\r\n\r\n"
    . "event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\","
    . "\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"caf\xe9",
    "\"}}\r\n\r\nevent: content_block_stop\r\ndata: {\"type\":"
    . "\"content_block_stop\",\"index\":0}\r\n\r\nevent: message_delta\r\n"
    . "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
    . "\"end_turn\"},\"usage\":{\"output_tokens\":2}}\r\n\r\n"
    . "event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n",
] });

send_message($t, 'r1', 'x');
$c = wait_state($t, 'r1', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'split events parsed');
is($c->{messages}[1]{content}, "caf\xe9", 'text across pieces');
is_deeply($c->{messages}[1]{usage}, { input_tokens => 3, output_tokens => 2 },
          'usage from message_start and message_delta');

# a stream that cannot be parsed, before the first token: retried

$mock->reset;
$mock->script({ raw => ["event: content_block_delta\ndata: {\"type\":"
                        . "\"content_block_delta\",\"index\":0,\"delta\":"
                        . "{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n"] },
              { text => 'fine' });

send_message($t, 'r2', 'x');
$c = wait_state($t, 'r2', 'idle');
is($c->{messages}[1]{content}, 'fine', 'a delta of no block: retried');
is(scalar @{$mock->requests}, 2, 'two provider calls');

###############################################################################

# errors

# overloaded mid-stream, after text: the turn fails, the partial is kept

$mock->reset;
$mock->script({ text => 'partial answer here', chunks => 6,
                error_after => 6 });

send_message($t, 'e1', 'x');
$c = wait_state($t, 'e1', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_failed',
   'error event mid-stream ends the turn');
is($c->{messages}[1]{status}, 'interrupted', 'partial kept, interrupted');
is($c->{messages}[1]{content}, 'partial an', 'partial text');
like($c->{messages}[2]{reason}, qr/mid-stream/, 'reason given');
is($c->{messages}[2]{error}, 'Overloaded', 'the error message kept');
is(scalar @{$mock->requests}, 1, 'not retried after the first token');

$mock->script({ text => 'Going on.' });
send_message($t, 'e1', 'go on');
wait_state($t, 'e1', 'idle');
is_deeply(messages(1)->[1], { role => 'assistant', content => [
              { type => 'text', text => "partial an\n\n[interrupted]" }] },
          'the partial reply sent back marked');

# overloaded before the first token: retried

$mock->reset;
$mock->script({ text => 'never', error_after => 3 },
              { text => 'recovered' });

send_message($t, 'e2', 'x');
$c = wait_state($t, 'e2', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'error event before the first token is retried');
is($c->{messages}[1]{content}, 'recovered', 'retried reply');
is(scalar @{$mock->requests}, 2, 'two provider calls');

# 529 and 429 with retry-after: retried, after a wait

for my $status (529, 429) {
    $mock->reset;
    $mock->script({ status => $status, retry_after => 1 }, { text => 'later' });

    send_message($t, "e$status", 'x');
    $c = wait_state($t, "e$status", 'idle');
    is(log_types($c), 'user_msg assistant_msg turn_completed',
       "$status retried");

    my $r = $mock->requests;
    cmp_ok($r->[1]{received_at} - $r->[0]{received_at}, '>=', 0.15,
           "$status: retry waited (retry-after, up to the cap)");
}

# 400: not retried, the API's message kept

$mock->reset;
$mock->script({ status => 400, error => { message => 'max_tokens: too big' } });

send_message($t, 'e3', 'x');
$c = wait_state($t, 'e3', 'idle');
is(log_types($c), 'user_msg turn_failed', '400 ends the turn');
like($c->{messages}[1]{error}, qr/invalid_request_error.*too big/,
     'the error body kept');

$mock->script({ text => 'ok' });
send_message($t, 'e3', 'y');
wait_state($t, 'e3', 'idle');
is_deeply(messages(1), [{ role => 'user',
                          content => [{ type => 'text', text => 'x' },
                                      { type => 'text', text => 'y' }] }],
          'two user messages in a row make one');

# a stream without message_stop is not complete, even with its stop reason

$mock->reset;
$mock->script({ text => 'almost', cut_after => 6 });

send_message($t, 'e4', 'x');
$c = wait_state($t, 'e4', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_failed',
   'cut before message_stop fails the turn');
like($c->{messages}[2]{reason}, qr/ended early/, 'reason given');

$mock->stop;
$t->done;
