package Test::Agent::MockProvider::OpenAIChat;

# OpenAI Chat Completions (POST /v1/chat/completions), streamed the way
# api.openai.com streams it: key order, the role chunk, tool call pieces,
# finish chunk, the usage chunk with "choices":[] (only when the request
# asked for it with stream_options.include_usage), then "data: [DONE]".
# reasoning => 'text' streams "reasoning_content" deltas before the text,
# as DeepSeek and vLLM do.

use v5.36;
use parent -norequire, 'Test::Agent::MockProvider::Framer';

use Test::Agent::MockProvider::Framer qw(obj arr num total json sse
                                         split_text random_id);

use constant FINGERPRINT => 'fp_mock';

sub name ($class) { return 'openai_chat' }

sub _json ($req) { return ref $req->{json} eq 'HASH' ? $req->{json} : {} }

sub streaming ($class, $req) { return _json($req)->{stream} ? 1 : 0 }

sub stream_headers ($class, $reply, $req) {
    return (['Content-Type', 'text/event-stream; charset=utf-8'],
            ['access-control-expose-headers', 'X-Request-ID'],
            ['openai-processing-ms', 1 + int rand 300],
            ['openai-version', '2020-10-01'],
            ['x-request-id', random_id('req_', 32)]);
}

# Fields every chunk of one completion repeats identically.
sub _head ($reply, $req, $object) {
    return (id => $reply->{id} // random_id('chatcmpl-', 29),
            object => $object,
            created => num(time),
            model => $reply->{model} // _json($req)->{model} // 'gpt-mock');
}

sub _usage ($reply) {
    my $u = $reply->{usage} // {};
    my $p = $u->{prompt_tokens} // 10;
    my $c = $u->{completion_tokens} // 5;

    return obj(prompt_tokens => num($p),
               completion_tokens => num($c),
               total_tokens => num($u->{total_tokens} // total($p, $c)),
               prompt_tokens_details => obj(
                   cached_tokens => num($u->{cached_tokens} // 0),
                   audio_tokens => num(0)),
               completion_tokens_details => obj(
                   reasoning_tokens => num($u->{reasoning_tokens} // 0),
                   audio_tokens => num(0),
                   accepted_prediction_tokens => num(0),
                   rejected_prediction_tokens => num(0)));
}

sub _arguments ($tc) {
    my $a = $tc->{arguments} // '';
    return ref $a ? json($a) : $a;
}

sub events ($class, $reply, $req) {
    my (@head, $usage, $chunk, $choice, @calls, @events);

    @head = _head($reply, $req, 'chat.completion.chunk');
    $usage = $reply->{include_usage}
             // (_json($req)->{stream_options} // {})->{include_usage};
    @calls = @{ $reply->{tool_calls} // [] };

    $chunk = sub ($choices, @u) {
        return sse(obj(@head, service_tier => 'default',
                       system_fingerprint => FINGERPRINT,
                       choices => $choices,
                       $usage ? (usage => $u[0]) : ()));
    };

    $choice = sub ($delta, $finish = undef) {
        return $chunk->(arr(obj(index => num(0), delta => $delta,
                                logprobs => undef,
                                finish_reason => $finish)));
    };

    if (defined $reply->{text} || defined $reply->{reasoning} || !@calls) {
        push @events, $choice->(obj(role => 'assistant', content => '',
                                    refusal => undef));
        push @events, map { $choice->(obj(content => undef,
                                          reasoning_content => $_)) }
                          split_text($reply->{reasoning}, $reply->{chunks});
        push @events, map { $choice->(obj(content => $_)) }
                          split_text($reply->{text}, $reply->{chunks});
    }

    for my $i (0 .. $#calls) {
        my $tc = $calls[$i];
        my $index = num($tc->{index} // $i);
        my $start = obj(index => $index,
                        id => $tc->{id} // random_id('call_', 24),
                        type => 'function',
                        function => obj(name => $tc->{name},
                                        arguments => ''));

        # without text, the role rides on the first tool call piece
        push @events, $choice->(@events
            ? obj(tool_calls => arr($start))
            : obj(role => 'assistant', content => undef,
                  tool_calls => arr($start), refusal => undef));

        push @events, map {
            $choice->(obj(tool_calls => arr(obj(index => $index,
                          function => obj(arguments => $_)))))
        } split_text(_arguments($tc), $tc->{chunks} // $reply->{chunks});
    }

    push @events, $choice->(obj(), $reply->{finish_reason}
                                   // (@calls ? 'tool_calls' : 'stop'));
    push @events, $chunk->(arr(), _usage($reply)) if $usage;
    push @events, "data: [DONE]\n\n";

    return @events;
}

# What OpenAI sends when a stream fails after it started: an error object
# in place of a chunk (its own separators, as observed), then the end.
# Fields of error beyond OpenAI's four follow them, as Groq sends its
# "failed_generation".
sub stream_error ($class, $reply, $req) {
    my $e = $class->error_fields(500, $reply->{error});
    my @more = grep { !/^(message|type|param|code)$/ } sort keys %$e;

    return sprintf "data: {\"error\": {\"message\": %s, \"type\": %s,"
                   . " \"param\": %s, \"code\": %s%s}}\n\n",
                   (map { json($e->{$_}) } qw(message type param code)),
                   join '', map { ", \"$_\": " . json($e->{$_}) } @more;
}

sub complete ($class, $reply, $req) {
    my (@calls, $message);

    @calls = map {
        obj(id => $_->{id} // random_id('call_', 24), type => 'function',
            function => obj(name => $_->{name}, arguments => _arguments($_)))
    } @{ $reply->{tool_calls} // [] };

    $message = obj(role => 'assistant', content => $reply->{text},
                   refusal => undef,
                   @calls ? (tool_calls => arr(@calls)) : (),
                   annotations => arr());

    return ([['Content-Type', 'application/json'],
             ['openai-version', '2020-10-01'],
             ['x-request-id', random_id('req_', 32)]],
            json(obj(
                _head($reply, $req, 'chat.completion'),
                choices => arr(obj(index => num(0), message => $message,
                                   logprobs => undef,
                                   finish_reason => $reply->{finish_reason}
                                       // (@calls ? 'tool_calls' : 'stop'))),
                usage => _usage($reply),
                service_tier => 'default',
                system_fingerprint => FINGERPRINT)));
}

1;
