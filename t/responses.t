#!/usr/bin/perl

# The OpenAI Responses adapter: the same conversation shapes as the Chat
# Completions tests (a text turn, a tool round trip, errors before and
# after the first token), and what only this API has: reasoning summaries
# streamed as thinking, reasoning items sent back with their encrypted
# content, and a web search the provider runs itself.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::SSE;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

my $tools = $ECHO_TOOL . <<'EOF';
    agent_tool web_search {
        description "Search the web";
        executor provider;
        provider_definition openai_responses '{"type":"web_search"}';
    }
EOF

my $server = $ECHO_LOCATION;

$t->write_file_expand('nginx.conf', engine_conf($mock,
    adapter => 'openai_responses', tools => $tools, server => $server,
    agent => 'tools echo web_search; max_model_calls 3;'));
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

sub input {
    my ($i) = @_;
    return $mock->requests->[$i]{json}{input};
}

# a text turn, and the request it came from

$mock->script({ text => 'Hello there, friend.', chunks => 4, delay => 0.05,
                usage => { input_tokens => 12, output_tokens => 4 } });

is(send_message($t, 'c1', 'hi')->{status}, 202, 'message accepted');
my $c = wait_state($t, 'c1', 'idle');

is(log_types($c), 'user_msg assistant_msg turn_completed', 'log of a turn');
my ($assistant) = of_type($c, 'assistant_msg');
is($assistant->{content}, 'Hello there, friend.', 'reply assembled');
is($assistant->{status}, 'complete', 'reply complete');
is($assistant->{finish_reason}, 'completed', 'the response status');
is_deeply($assistant->{usage}, { input_tokens => 12, output_tokens => 4 },
          'usage from response.completed');
ok(!exists $assistant->{provider_content},
   'a text reply is logged as text alone');

my $req = $mock->requests->[0];
is($req->{path}, '/v1/responses', 'the Responses endpoint');
is($req->{json}{model}, 'gpt-test', 'model');
is($req->{json}{instructions}, 'You are terse.', 'system prompt');
ok($req->{json}{stream}, 'streaming asked for');
ok(exists $req->{json}{store} && !$req->{json}{store}, 'nothing stored');
ok(!exists $req->{json}{include},
   'no encrypted reasoning asked for without reasoning in the options');
ok(!exists $req->{json}{previous_response_id}, 'the whole context is sent');
is_deeply(input(0), [{ role => 'user', content => 'hi' }], 'input');
is_deeply($req->{json}{tools},
          [{ type => 'function', name => 'echo',
             description => 'Echoes what it got',
             parameters => { type => 'object',
                             properties => { n => { type => 'integer' } } }
           },
           { type => 'web_search' }],
          'function and hosted tools');

$mock->script({ text => 'Again.' });
send_message($t, 'c1', 'more');
wait_state($t, 'c1', 'idle');
is_deeply(input(1), [{ role => 'user', content => 'hi' },
                     { role => 'assistant',
                       content => 'Hello there, friend.' },
                     { role => 'user', content => 'more' }],
          'history sent as input');

# a tool round trip: arguments in pieces, results paired by call_id

$mock->reset;
$mock->script({ text => 'Let me check.', chunks => 3,
                tool_calls => [call('call_a', 'echo', '{"n":1}'),
                               call('call_b', 'echo', '{"n":2}')] },
              { text => 'Both done.' });

send_message($t, 't1', 'run two');
$c = wait_state($t, 't1', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_call tool_result '
   . 'tool_result assistant_msg turn_completed', 'log of a tool round trip');
is_deeply([map { [$_->{tool_call_id}, $_->{arguments}, $_->{executor}] }
           of_type($c, 'tool_call')],
          [['call_a', '{"n":1}', 'server'], ['call_b', '{"n":2}', 'server']],
          'calls by call_id, arguments reassembled');
is_deeply([map { $_->{result}{args}{n} } of_type($c, 'tool_result')],
          [1, 2], 'the server tool ran');

my @in = @{input(1)};
is_deeply([map { $_->{type} // $_->{role} } @in],
          [qw(user assistant function_call function_call
              function_call_output function_call_output)],
          'follow-up input: the calls, then their outputs');
is_deeply($in[1], { role => 'assistant', content => 'Let me check.' },
          'the text before the calls');
is_deeply($in[2], { type => 'function_call', call_id => 'call_a',
                    name => 'echo', arguments => '{"n":1}' },
          'a function_call item');
is_deeply([map { $_->{call_id} } @in[4, 5]], ['call_a', 'call_b'],
          'each output paired with its call');
is_deeply(decode_json($in[4]{output}),
          { ok => JSON::PP::true, result => { args => { n => 1 } } },
          'the output is {"ok":true,"result":...}');

# reasoning summary deltas reach a subscriber live, as thinking

$mock->reset;
$mock->script({ text => 'one' });
send_message($t, 'r1', 'first');
wait_state($t, 'r1', 'idle');

my $sse = Test::Agent::SSE->new(http_stream(events_request('r1',
    'Last-Event-ID' => 3), port => $port));

$mock->script({ reasoning => ['Weighing the options.', 'Picking one.'],
                text => 'The second.', chunks => 3, delay => 0.05 },
              { text => 'ok' });
send_message($t, 'r1', 'which?');

my @ev = $sse->events_until(sub { ($_[0]{event} // '') eq 'turn_ended' },
                            10);
$sse->stream->close;

my @thinking = grep { $_->{event} eq 'thinking_delta' } @ev;
my ($logged) = grep { $_->{event} eq 'assistant_msg' } @ev;

cmp_ok(scalar @thinking, '>=', 6, 'thinking deltas, piece by piece');
is(join('', map { decode_json($_->{data})->{delta} } @thinking),
   "Weighing the options.\n\nPicking one.",
   'they add up to the summary, its parts as paragraphs');
ok(@thinking && $logged && $thinking[0]{t} < $logged->{t} - 0.2,
   'the first arrived long before the reply was logged');
is(decode_json($logged->{data})->{thinking},
   "Weighing the options.\n\nPicking one.", 'thinking logged');

# without encrypted content a reasoning item cannot go back (nothing is
# stored): the message goes without the id that would name it

send_message($t, 'r1', 'why?');
wait_state($t, 'r1', 'idle');

@in = @{input(2)};
is_deeply([map { $_->{type} // $_->{role} } @in],
          [qw(user assistant user message user)],
          'a reasoning item without encrypted content is left out');
is_deeply($in[3], { type => 'message', role => 'assistant',
                    status => 'completed',
                    content => [{ type => 'output_text',
                                  annotations => [], logprobs => [],
                                  text => 'The second.' }] },
          'the message item as it came, but its id');

# with it, the reasoning item goes back as it came: the function call
# and its output follow it

$mock->reset;
$mock->script({ reasoning => { summary => 'Need the echo.',
                               encrypted_content => 'gAAAAABsecret==' },
                tool_calls => [call('call_e', 'echo', '{"n":5}')] },
              { text => 'Echoed.' });

send_message($t, 'r2', 'echo five');
$c = wait_state($t, 'r2', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'reasoning, a call, and its result');
($assistant) = of_type($c, 'assistant_msg');
is($assistant->{thinking}, 'Need the echo.', 'thinking of the call');

my $items = $assistant->{provider_content};
is_deeply([map { $_->{type} } @{$items || []}], ['reasoning', 'function_call'],
          'the output items are logged');

@in = @{input(1)};
is_deeply([map { $_->{type} // $_->{role} } @in],
          [qw(user reasoning function_call function_call_output)],
          'follow-up input');
is_deeply($in[1], $items->[0], 'the reasoning item verbatim');
is($in[1]{encrypted_content}, 'gAAAAABsecret==', 'with its encrypted content');
is_deeply($in[2], $items->[1], 'the function_call item verbatim, with its id');
like($in[2]{id}, qr/^fc_/, 'which it has');
is($in[3]{call_id}, 'call_e', 'the output names the call');

# a web search the provider runs: logged as a provider-executed pair,
# never dispatched, and sent back as it came

$mock->reset;
$mock->script({ web_search => { query => 'nginx release',
                                url => 'https://nginx.org/',
                                title => 'nginx news' },
                text => 'nginx 1.27 is out.', chunks => 2 },
              { text => 'You are welcome.' });

send_message($t, 'w1', 'news?');
$c = wait_state($t, 'w1', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'turn_completed', 'a hosted search: a call and its result, one turn');
is(scalar @{$mock->requests}, 1, 'the search was not dispatched');

my ($hcall) = of_type($c, 'tool_call');
my ($hres) = of_type($c, 'tool_result');

like($hcall->{tool_call_id}, qr/^ws_/, 'the call is the item');
is($hcall->{name}, 'web_search', 'named web_search');
is($hcall->{executor}, 'provider', 'executor provider');
ok($hcall->{provider_executed} && $hres->{provider_executed},
   'both marked provider_executed');
is_deeply(decode_json($hcall->{arguments}),
          { type => 'search', query => 'nginx release' },
          'its input is the search action');
is($hres->{tool_call_id}, $hcall->{tool_call_id}, 'the result pairs it');
ok($hres->{ok}, 'the result is ok');
is($hres->{result}{status}, 'completed', 'and is the item');

($assistant) = of_type($c, 'assistant_msg');
is($assistant->{content}, 'nginx 1.27 is out.', 'the text after it');
$items = $assistant->{provider_content};
is_deeply([map { $_->{type} } @{$items || []}],
          ['web_search_call', 'message'], 'the items are logged');
is($items->[1]{content}[0]{annotations}[0]{url}, 'https://nginx.org/',
   'the citation is kept');

send_message($t, 'w1', 'thanks');
wait_state($t, 'w1', 'idle');

@in = @{input(1)};
is_deeply([map { $_->{type} // $_->{role} } @in],
          [qw(user web_search_call message user)],
          'the next input: the items, no output of the hosted call');
is_deeply([@in[1, 2]], $items, 'both verbatim');

# errors: after the first token the turn fails with the partial reply,
# before it the call is retried; both event forms

# created, in_progress, item added, part added, then deltas
my $head = 4;

for my $form (['error', {}],
              ['response.failed', { event => 'response.failed',
                                    code => 'server_error',
                                    message => 'The model failed.' }])
{
    my ($name, $err) = @$form;

    $mock->reset;
    $mock->script({ text => 'partial answer here', chunks => 6,
                    error_after => $head + 3, error => $err });

    send_message($t, "e-$name", 'x');
    $c = wait_state($t, "e-$name", 'idle');

    is(log_types($c), 'user_msg assistant_msg turn_failed',
       "$name mid-stream ends the turn");
    ($assistant) = of_type($c, 'assistant_msg');
    is($assistant->{status}, 'interrupted', "$name: partial kept");
    is($assistant->{content}, 'partial an', "$name: the text so far");
    like($c->{messages}[-1]{reason}, qr/mid-stream/, "$name: reason");
    is(scalar @{$mock->requests}, 1, "$name: not retried");

    $mock->script({ text => 'x', error_after => 3, error => $err },
                  { text => 'recovered' });

    send_message($t, "e-$name", 'again');
    $c = wait_state($t, "e-$name", 'idle');

    is(log_types($c), 'user_msg assistant_msg turn_failed user_msg '
       . 'assistant_msg turn_completed',
       "$name before the first token is retried");
    is($c->{messages}[-2]{content}, 'recovered', "$name: the retried reply");
    is(scalar @{$mock->requests}, 3, "$name: two calls for the turn");
    is_deeply(input(2)->[1],
              { role => 'assistant', content => "partial an\n\n[interrupted]" },
              "$name: the partial reply goes back marked");
}

my ($failed) = of_type($c, 'turn_failed');
like($failed->{error}, qr/The model failed/,
     'the message of response.failed is kept');

# the documented form of the error event, fields at the top

$mock->reset;
$mock->script({ raw => ["event: response.created\ndata: {\"type\":"
                        . "\"response.created\",\"sequence_number\":0,"
                        . "\"response\":{\"id\":\"resp_1\"}}\n\n",
                        "event: response.output_text.delta\ndata: {\"type\":"
                        . "\"response.output_text.delta\",\"sequence_number\""
                        . ":1,\"output_index\":0,\"delta\":\"Hal\"}\n\n",
                        "event: error\ndata: {\"type\":\"error\","
                        . "\"sequence_number\":2,\"code\":\"ERR_SOMETHING\","
                        . "\"message\":\"Something went wrong\","
                        . "\"param\":null}\n\n"] });

send_message($t, 'e3', 'x');
$c = wait_state($t, 'e3', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_failed',
   'documented error event');
like($c->{messages}[-1]{error}, qr/Something went wrong/, 'its message');

# events split anywhere across reads, CRLF line ends, a comment between

$mock->reset;
$mock->script({ raw => [
    "event: response.created\r\ndata: {\"type\":\"response.created\","
    . "\"sequence_number\":0,\"response\":{\"id\":\"resp_2\"}}\r\n\r"
    . "\nevent: response.output_text.delta\r\ndata: {\"type\":\"respo",
    "nse.output_text.delta\",\"sequence_number\":1,\"output_index\":0,"
    . "\"delta\":\"Gr\\u00fc\\u00df \"}\r",
    "\n\r\n: keep-alive\n\nevent: response.output_text.delta\ndata: "
    . "{\"type\":\"response.output_text.delta\",\"sequence_number\":2,"
    . "\"output_index\":0,\"delta\":\"Gott\"}\n\nevent: response.comp",
    "leted\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,"
    . "\"response\":{\"id\":\"resp_2\",\"status\":\"completed\","
    . "\"usage\":{\"input_tokens\":3,\"output_tokens\":2}}}\n\n"] });

send_message($t, 's1', 'x');
$c = wait_state($t, 's1', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed', 'split events');
is($c->{messages}[1]{content}, "Gr\x{fc}\x{df} Gott", 'split events: text');
is_deeply($c->{messages}[1]{usage}, { input_tokens => 3, output_tokens => 2 },
          'split events: usage');

# an incomplete response is a complete stream with its reason

$mock->reset;
$mock->script({ text => 'cut short', finish_reason => 'max_output_tokens' });
send_message($t, 'i1', 'x');
$c = wait_state($t, 'i1', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'response.incomplete completes the turn');
is($c->{messages}[1]{finish_reason}, 'max_output_tokens', 'with its reason');

# an HTTP error in OpenAI's format

$mock->reset;
$mock->script({ status => 400, error => { message => 'bad input item' } });
send_message($t, 'h1', 'x');
$c = wait_state($t, 'h1', 'idle');
is(log_types($c), 'user_msg turn_failed', '400 ends the turn');
like($c->{messages}[-1]{error}, qr/bad input item/, 'provider error kept');

$t->done(more => 1);

# with reasoning in the agent's options, the encrypted content that lets
# a reasoning item go back without "store" is asked for, and the item
# goes back with it; options that set "include" have the last word

for my $case (['{"reasoning":{"effort":"low","summary":"auto"}}',
               ['reasoning.encrypted_content']],
              ['{"reasoning":{"effort":"low"},"include":[]}', []])
{
    my ($options, $include) = @$case;

    $t = Test::Agent->new;
    $t->write_file_expand('nginx.conf', engine_conf($mock,
        adapter => 'openai_responses', agent => "options '$options';"));
    $t->run;

    $mock->reset;
    $mock->script({ reasoning => 'Thinking it over.', text => 'Yes.' },
                  { text => 'Again yes.' });

    send_message($t, 'o1', 'well?');
    wait_state($t, 'o1', 'idle');
    send_message($t, 'o1', 'sure?');
    wait_state($t, 'o1', 'idle');

    $req = $mock->requests->[0];
    is_deeply($req->{json}{include}, $include, "$options: include");
    is(() = $req->{body} =~ /"include"/g, 1, "$options: once");

    @in = @{input(1)};

    if (@$include) {
        is_deeply([map { $_->{type} // $_->{role} } @in],
                  [qw(user reasoning message user)],
                  "$options: the reasoning item goes back");
        like($in[1]{encrypted_content}, qr/^gAAAAA/,
             "$options: with its encrypted content");

    } else {
        is_deeply([map { $_->{type} // $_->{role} } @in],
                  [qw(user message user)],
                  "$options: without it, the reasoning item cannot");
    }

    $t->done(more => 1);
}

$mock->stop;
done_testing();
