#!/usr/bin/perl

# Structured output, in every adapter: a message's "output" (a name and a
# JSON Schema) is recorded in its user_msg and asked of the API its own
# way (Chat's response_format, Responses' text.format, Anthropic's forced
# tool); the reply's JSON object is recorded as the assistant message's
# "object" and ends the turn, no tool run.  A reply that is not such an
# object fails the turn saying why; a bad "output" gets 400 and changes
# nothing.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $mock = Test::Agent::MockProvider->new;

my $schema = { type => 'object',
               properties => { city => { type => 'string' },
                               temp => { type => 'integer' } },
               required => ['city', 'temp'],
               additionalProperties => JSON::PP::false };

my $output = { name => 'weather', schema => $schema };
my $object = '{"city":"Paris","temp":21}';

sub ask {
    my ($t, $cid, $content, $out) = @_;
    return send_message($t, $cid, $content,
        body => encode_json({ content => $content,
                              $out ? (output => $out) : () }));
}

sub of_type {
    my ($c, $type) = @_;
    return grep { $_->{type} eq $type } @{$c->{messages}};
}

# the reply the API gives when asked for the output: text, or (Anthropic)
# a call of the forced tool

sub answer {
    my ($adapter, $json) = @_;

    return { tool_calls => [{ id => 'toolu_out1', name => 'weather',
                              arguments => $json }] }
        if $adapter eq 'anthropic_messages';

    return { text => $json };
}

for my $adapter (qw(openai_chat openai_responses anthropic_messages)) {
    my $t = Test::Agent->new;

    $t->write_file_expand('nginx.conf', engine_conf($mock,
        adapter => $adapter, tools => $ECHO_TOOL, server => $ECHO_LOCATION,
        agent => 'tools echo;'));
    $t->run;

    $mock->reset;

    ###########################################################################

    # the output asked for, the object recorded, no tool run

    $mock->script(answer($adapter, $object), { text => 'Sunny.' });

    is(ask($t, 's1', 'weather in Paris?', $output)->{status}, 202,
       "$adapter: message with an output accepted");

    my $c = wait_state($t, 's1', 'idle');
    is(log_types($c), 'user_msg assistant_msg turn_completed',
       "$adapter: one reply ends the turn");

    my ($user) = of_type($c, 'user_msg');
    is_deeply($user->{output}, $output, "$adapter: output in the user_msg");

    my ($msg) = of_type($c, 'assistant_msg');
    is_deeply($msg->{object}, decode_json($object),
              "$adapter: the object recorded");
    is($msg->{content}, $object, "$adapter: content keeps the text");
    ok(!exists $msg->{tool_calls}, "$adapter: the output is not a call");

    my $j = $mock->requests->[0]{json};

    if ($adapter eq 'openai_chat') {
        is_deeply($j->{response_format},
                  { type => 'json_schema',
                    json_schema => { name => 'weather', schema => $schema,
                                     strict => JSON::PP::true } },
                  "$adapter: response_format json_schema");
        is($j->{tool_choice}, 'none', "$adapter: no tool chosen");
        is($j->{tools}[0]{function}{name}, 'echo', "$adapter: tools kept");

    } elsif ($adapter eq 'openai_responses') {
        is_deeply($j->{text},
                  { format => { type => 'json_schema', name => 'weather',
                                schema => $schema,
                                strict => JSON::PP::true } },
                  "$adapter: text.format json_schema");
        is($j->{tool_choice}, 'none', "$adapter: no tool chosen");
        is($j->{tools}[0]{name}, 'echo', "$adapter: tools kept");

    } else {
        is_deeply($j->{tools}[1], { name => 'weather',
                                    input_schema => $schema },
                  "$adapter: the output as a tool, after the agent's");
        is($j->{tools}[0]{name}, 'echo', "$adapter: the agent's tool first");
        is(scalar @{$j->{tools}}, 2, "$adapter: two tools");
        is_deeply($j->{tool_choice}, { type => 'tool', name => 'weather' },
                  "$adapter: the output's tool forced");
    }

    # the next turn, without output: asks for none, sees the reply as text

    ask($t, 's1', 'and tomorrow?');
    $c = wait_state($t, 's1', 'idle');
    is(log_types($c), 'user_msg assistant_msg turn_completed user_msg '
       . 'assistant_msg turn_completed', "$adapter: a plain turn after");

    $j = $mock->requests->[1]{json};
    ok(!exists $j->{response_format} && !exists $j->{tool_choice}
       && !exists $j->{text}, "$adapter: no output asked the next turn");

    if ($adapter eq 'anthropic_messages') {
        is(scalar @{$j->{tools}}, 1, "$adapter: the agent's tools alone");
        is_deeply($j->{messages}[1],
                  { role => 'assistant',
                    content => [{ type => 'text', text => $object }] },
                  "$adapter: the object sent back as the reply's text");

    } elsif ($adapter eq 'openai_chat') {
        is_deeply($j->{messages}[2],
                  { role => 'assistant', content => $object },
                  "$adapter: the object sent back as the reply's text");

    } else {
        is_deeply($j->{input}[1], { role => 'assistant', content => $object },
                  "$adapter: the object sent back as the reply's text");
    }

    ###########################################################################

    # a reply that is not the object: the turn fails saying why

    $mock->script({ text => 'It is sunny in Paris.' },
                  answer($adapter, '["Paris",21]'));

    ask($t, 's2', 'weather?', $output);
    $c = wait_state($t, 's2', 'idle');
    is(log_types($c), 'user_msg assistant_msg turn_failed',
       "$adapter: not JSON: the turn fails");
    ($msg) = of_type($c, 'assistant_msg');
    is($msg->{content}, 'It is sunny in Paris.',
       "$adapter: the reply recorded as it came");
    ok(!exists $msg->{object}, "$adapter: no object");

    my ($failed) = of_type($c, 'turn_failed');
    like($failed->{reason}, qr/^the reply is not valid JSON/,
         "$adapter: the reason says so");
    is($failed->{output}, 'weather', "$adapter: and names the output");

    ask($t, 's3', 'weather?', $output);
    $c = wait_state($t, 's3', 'idle');
    ($failed) = of_type($c, 'turn_failed');
    is($failed->{reason},
       'the reply is JSON but not the object the output asks for',
       "$adapter: JSON but not an object fails the turn");

    is(scalar @{$mock->requests}, 4, "$adapter: one model call per turn");

    ###########################################################################

    # a bad output: 400, nothing changed

    for my $bad (
        [ 'not an object', 'weather' ],
        [ 'no schema', { name => 'weather' } ],
        [ 'a member more', { %$output, strict => JSON::PP::true } ],
        [ 'a bad name', { name => 'the weather', schema => $schema } ],
        [ 'a name too long', { name => 'w' x 65, schema => $schema } ],
        [ 'a schema not of an object',
          { name => 'weather', schema => { type => 'array' } } ],
        [ 'a schema not an object', { name => 'weather', schema => 'x' } ],
        [ "a tool's name", { name => 'echo', schema => $schema } ])
    {
        my ($what, $out) = @$bad;

        my $r = ask($t, 's1', 'again', $out);
        is($r->{status}, 400, "$adapter: $what: 400");
        is($r->{json}{error}{code}, 'invalid_message',
           "$adapter: $what: invalid_message");
        like($r->{json}{error}{message}, qr/^"output"/,
             "$adapter: $what: the message names \"output\"");

        $r = ask($t, 'new1', 'hello', $out);
        is($r->{status}, 400, "$adapter: $what: 400 for a new one");
    }

    is(inspect($t, 'new1')->{status}, 404,
       "$adapter: no conversation made by a bad output");
    is(scalar @{inspect($t, 's1')->{json}{messages}}, 6,
       "$adapter: nothing logged by a bad output");
    is(scalar @{$mock->requests}, 4, "$adapter: no model call");

    $t->stop;
}

###############################################################################

# the model calls a tool though asked for output: the call never runs,
# its result says so, and the turn fails

{
    my $t = Test::Agent->new;

    $t->write_file_expand('nginx.conf', engine_conf($mock,
        adapter => 'openai_chat', tools => $ECHO_TOOL,
        server => $ECHO_LOCATION, agent => 'tools echo;'));
    $t->run;

    $mock->reset;
    $mock->script({ tool_calls => [{ id => 'call_e1', name => 'echo',
                                     arguments => '{"n":1}' }] });

    ask($t, 'c1', 'weather?', $output);
    my $c = wait_state($t, 'c1', 'idle');
    is(log_types($c),
       'user_msg assistant_msg tool_call tool_result turn_failed',
       'a call in a structured turn: the turn fails');

    my ($result) = of_type($c, 'tool_result');
    ok(!$result->{ok}, 'the call has an error result');
    my ($failed) = of_type($c, 'turn_failed');
    is($failed->{reason}, 'the model called a tool instead of answering '
       . 'with the output asked for', 'the reason says so');
    is(scalar @{$mock->requests}, 1, 'no model call after it');

    $t->stop;
}

done_testing();
