package Test::Agent::MockProvider::Anthropic;

# Anthropic Messages (POST /v1/messages), streamed the way
# api.anthropic.com streams it: named events, message_start, a ping after
# the first content_block_start (with the space after the colon that only
# the ping has), content_block_start / _delta / _stop per block,
# message_delta with the stop reason and usage, message_stop.  Errors are
# {"type":"error","error":{"type","message"}}, as an HTTP body and as an
# "event: error" mid-stream.
#
# The blocks of a reply, in order:
#   thinking   thinking => 'text' (chunks), signature => 'sig' (default
#              a random one), one signature_delta
#   web search web_search => { id, query, results => [{ url, title }],
#              citations => [{ url, title, cited_text }], before => 'text' }:
#              a text block "before" if given, the server_tool_use with its
#              query as input_json_delta, the web_search_tool_result, and
#              the citations on the text block that follows
#   text       text => '...' (chunks); citations_delta first, if any
#   tool calls tool_calls => [{ id, name, arguments, chunks }]: input as
#              input_json_delta pieces after an empty one, as the API does
# or, instead of all these, content => [{ type, ... }, ...]: any blocks,
# each whole as the unstreamed API returns it, and every field of it that
# is not streamed (a tool_use's caller, say) in its content_block_start.
# finish_reason is the stop_reason (end_turn, or tool_use with calls);
# usage => { input_tokens, output_tokens, cache_read_input_tokens,
# cache_creation_input_tokens } (prompt_tokens and completion_tokens are
# taken too; the cache counts default to 0).

use v5.36;
use parent -norequire, 'Test::Agent::MockProvider::Framer';

use Test::Agent::MockProvider::Framer qw(raw obj arr num json sse
                                         split_text random_id);

sub name ($class) { return 'anthropic_messages' }

sub _json ($req) { return ref $req->{json} eq 'HASH' ? $req->{json} : {} }

sub streaming ($class, $req) { return _json($req)->{stream} ? 1 : 0 }

sub stream_headers ($class, $reply, $req) {
    return (['Content-Type', 'text/event-stream; charset=utf-8'],
            ['Cache-Control', 'no-cache'],
            ['request-id', random_id('req_011C', 20)],
            ['anthropic-organization-id',
             '00000000-0000-4000-8000-000000000000'],
            ['via', '1.1 google']);
}

sub _usage ($reply) {
    my $u = $reply->{usage} // {};

    return ($u->{input_tokens} // $u->{prompt_tokens} // 10,
            $u->{output_tokens} // $u->{completion_tokens} // 5);
}

sub _cache ($reply) {
    my $u = $reply->{usage} // {};

    return (cache_creation_input_tokens =>
                num($u->{cache_creation_input_tokens} // 0),
            cache_read_input_tokens =>
                num($u->{cache_read_input_tokens} // 0));
}

sub _arguments ($tc) {
    my $a = $tc->{arguments} // '';
    return ref $a ? json($a) : $a;
}

sub _id ($reply) {
    return $reply->{id} // random_id('msg_01', 22);
}

# The reply's content blocks: for each, the content_block of its start,
# its deltas, and the whole block as a non-streamed reply has it.
sub _blocks ($reply) {
    my (@blocks, $ws, @calls);

    return map { _whole($_, $reply->{chunks}) } @{ $reply->{content} }
        if $reply->{content};

    $ws = $reply->{web_search};
    @calls = @{ $reply->{tool_calls} // [] };

    if (defined $reply->{thinking}) {
        my $sig = $reply->{signature} // random_id('Eu8BCkYIBxgCKkA', 64);

        push @blocks, {
            start => obj(type => 'thinking', thinking => '', signature => ''),
            deltas => [(map { obj(type => 'thinking_delta', thinking => $_) }
                            split_text($reply->{thinking}, $reply->{chunks})),
                       obj(type => 'signature_delta', signature => $sig)],
            whole => obj(type => 'thinking', thinking => $reply->{thinking},
                         signature => $sig),
        };
    }

    my @cites;

    if ($ws) {
        my $id = $ws->{id} // random_id('srvtoolu_01', 22);
        my $query = json({ query => $ws->{query} // 'query' });
        my $results = arr(map {
            obj(type => 'web_search_result', title => $_->{title},
                url => $_->{url},
                encrypted_content => $_->{encrypted_content}
                                     // random_id('EqgfCioIARgB', 40),
                page_age => $_->{page_age})
        } @{ $ws->{results} // [] });

        push @blocks, _text($ws->{before}, $reply->{chunks})
            if defined $ws->{before};

        push @blocks, {
            start => obj(type => 'server_tool_use', id => $id,
                         name => 'web_search', input => obj()),
            deltas => [map { obj(type => 'input_json_delta',
                                 partial_json => $_) }
                           split_text($query, 2)],
            whole => obj(type => 'server_tool_use', id => $id,
                         name => 'web_search', input => raw($query)),
        }, {
            start => obj(type => 'web_search_tool_result', tool_use_id => $id,
                         content => $results),
            deltas => [],
            whole => obj(type => 'web_search_tool_result', tool_use_id => $id,
                         content => $results),
        };

        @cites = map {
            obj(type => 'web_search_result_location',
                cited_text => $_->{cited_text}, url => $_->{url},
                title => $_->{title},
                encrypted_index => $_->{encrypted_index}
                                   // random_id('Eo8BCioIAhgB', 32))
        } @{ $ws->{citations} // [] };
    }

    push @blocks, _text($reply->{text}, $reply->{chunks}, @cites)
        if defined $reply->{text} || (!@calls && !@blocks);

    for my $tc (@calls) {
        my $id = $tc->{id} // random_id('toolu_01', 22);
        my $args = _arguments($tc);

        push @blocks, {
            start => obj(type => 'tool_use', id => $id, name => $tc->{name},
                         input => obj()),
            deltas => [map { obj(type => 'input_json_delta',
                                 partial_json => $_) }
                           '', split_text($args,
                                          $tc->{chunks} // $reply->{chunks})],
            whole => obj(type => 'tool_use', id => $id, name => $tc->{name},
                         input => raw(length $args ? $args : '{}')),
        };
    }

    return @blocks;
}

sub _text ($text, $chunks, @cites) {
    $text //= '';

    return {
        start => obj(type => 'text', text => ''),
        deltas => [(map { obj(type => 'citations_delta', citation => $_) }
                        @cites),
                   map { obj(type => 'text_delta', text => $_) }
                       split_text($text, $chunks)],
        whole => obj(type => 'text', text => $text,
                     @cites ? (citations => arr(@cites)) : ()),
    };
}

# A block given whole, streamed: what the deltas carry is empty at its
# start, everything else is there as it is.
sub _whole ($b, $chunks) {
    my $type = $b->{type} // '';

    if ($type eq 'text') {
        my %start = (%$b, text => '');
        delete $start{citations};

        return {
            start => \%start,
            deltas => [(map { obj(type => 'citations_delta', citation => $_) }
                            @{ $b->{citations} // [] }),
                       map { obj(type => 'text_delta', text => $_) }
                           split_text($b->{text}, $chunks)],
            whole => $b,
        };
    }

    if ($type eq 'thinking') {
        return {
            start => { %$b, thinking => '', signature => '' },
            deltas => [(map { obj(type => 'thinking_delta', thinking => $_) }
                            split_text($b->{thinking}, $chunks)),
                       obj(type => 'signature_delta',
                           signature => $b->{signature} // '')],
            whole => $b,
        };
    }

    if ($type eq 'tool_use' || $type eq 'server_tool_use') {
        return {
            start => { %$b, input => {} },
            deltas => [map { obj(type => 'input_json_delta',
                                 partial_json => $_) }
                           '', split_text(json($b->{input} // {}), $chunks)],
            whole => $b,
        };
    }

    # redacted_thinking, hosted tool results: whole at their start
    return { start => $b, deltas => [], whole => $b };
}

sub _stop_reason ($reply) {
    my @uses = grep { ($_->{type} // '') eq 'tool_use' }
                    @{ $reply->{content} // [] };

    return $reply->{finish_reason}
           // (@{ $reply->{tool_calls} // [] } || @uses ? 'tool_use'
                                                         : 'end_turn');
}

sub _event ($type, @kv) { return sse(obj(type => $type, @kv), $type) }

sub events ($class, $reply, $req) {
    my ($in, $out, @blocks, @events);

    ($in, $out) = _usage($reply);
    @blocks = _blocks($reply);

    push @events, _event(message_start => message => obj(
        id => _id($reply), type => 'message', role => 'assistant',
        model => $reply->{model} // _json($req)->{model} // 'claude-mock',
        content => arr(), stop_reason => undef, stop_sequence => undef,
        usage => obj(input_tokens => num($in), _cache($reply),
                     output_tokens => num(1))));

    for my $i (0 .. $#blocks) {
        my $b = $blocks[$i];

        push @events, _event(content_block_start => index => num($i),
                             content_block => $b->{start});
        push @events, "event: ping\ndata: {\"type\": \"ping\"}\n\n"
            if $i == 0;
        push @events, map { _event(content_block_delta => index => num($i),
                                   delta => $_) } @{ $b->{deltas} };
        push @events, _event(content_block_stop => index => num($i));
    }

    push @events, _event(message_delta =>
        delta => obj(stop_reason => _stop_reason($reply),
                     stop_sequence => undef),
        usage => obj(output_tokens => num($out),
                     $reply->{web_search}
                         ? (server_tool_use => obj(web_search_requests =>
                                                   num(1)))
                         : ()));
    push @events, _event('message_stop');

    return @events;
}

# Anthropic's error types by HTTP status
my %ERROR = (
    400 => ['invalid_request_error', 'Invalid request.'],
    401 => ['authentication_error', 'invalid x-api-key'],
    403 => ['permission_error',
            'Your API key does not have permission to use the specified'
            . ' resource.'],
    404 => ['not_found_error', 'Not found.'],
    405 => ['invalid_request_error', 'Method not allowed.'],
    413 => ['request_too_large', 'Request exceeds the maximum size.'],
    429 => ['rate_limit_error',
            'Number of requests has exceeded your rate limit.'],
    500 => ['api_error', 'Internal server error'],
    529 => ['overloaded_error', 'Overloaded'],
);

sub error_fields ($class, $status, $err) {
    my $d = $ERROR{$status} // ($status >= 500 ? $ERROR{500} : $ERROR{400});

    return { type => $d->[0], message => $d->[1], %{ $err // {} } };
}

sub error ($class, $status, $err, $req) {
    my $e = $class->error_fields($status, $err);

    return ([['Content-Type', 'application/json'],
             ['request-id', random_id('req_011C', 20)],
             ['x-should-retry', $status == 429 || $status >= 500
                                ? 'true' : 'false']],
            json(obj(type => 'error',
                     error => obj(type => $e->{type},
                                  message => $e->{message}),
                     request_id => random_id('req_011C', 20))));
}

# An error after HTTP 200: the stream goes on with an error event, then
# ends; overloaded_error is the usual one.
sub stream_error ($class, $reply, $req) {
    my $e = $class->error_fields(529, $reply->{error});

    return _event(error => error => obj(type => $e->{type},
                                        message => $e->{message}));
}

sub complete ($class, $reply, $req) {
    my ($in, $out) = _usage($reply);

    return ([['Content-Type', 'application/json'],
             ['request-id', random_id('req_011C', 20)]],
            json(obj(
                id => _id($reply), type => 'message', role => 'assistant',
                model => $reply->{model} // _json($req)->{model}
                         // 'claude-mock',
                content => arr(map { $_->{whole} } _blocks($reply)),
                stop_reason => _stop_reason($reply), stop_sequence => undef,
                usage => obj(input_tokens => num($in), _cache($reply),
                             output_tokens => num($out)))));
}

1;
