package Test::Agent::MockProvider::OpenAIResponses;

# OpenAI Responses (POST /v1/responses), streamed the way api.openai.com
# streams it: named events, each with its "type" and "sequence_number"
# first; response.created and response.in_progress with the response
# object; each output item opened by output_item.added, filled by its
# own events (content parts, text deltas, argument deltas, reasoning
# summary parts, web search progress) and closed by output_item.done
# with the item whole; then response.completed with every item and the
# usage.  Delta events carry "obfuscation", the random padding OpenAI
# adds so that the size of an event does not tell its content.
#
# Output items, in this order:
#
#   reasoning   => 'summary' | ['part', 'part'] |
#                  { summary => ..., encrypted_content => 'gAAA...' }
#                  a reasoning item with its summary parts; the encrypted
#                  content is also sent, made up, when the request's
#                  "include" asks for reasoning.encrypted_content
#   web_search  => { query => 'q', id => 'ws_...', url => ..., title => }
#                  or a list of them: hosted web_search_call items; a url
#                  makes the text cite it (url_citation annotation), and
#                  is the action's source when the request's "include"
#                  asks for web_search_call.action.sources
#   text        => '...'          a message item, in chunks deltas
#   tool_calls  => [...]          function_call items, as OpenAIChat's
#
# usage takes input_tokens / output_tokens (or OpenAIChat's names);
# finish_reason other than "completed" ends with response.incomplete
# and that reason.  error_after sends "event: error" with the fields in
# an "error" object, as OpenAI sends it, or with error => { event =>
# 'response.failed' } a response.failed whose error has code and message.

use v5.36;
use parent -norequire, 'Test::Agent::MockProvider::Framer';

use Test::Agent::MockProvider::Framer qw(raw obj arr num total true false
                                         json sse split_text random_id);

sub name ($class) { return 'openai_responses' }

sub _json ($req) { return ref $req->{json} eq 'HASH' ? $req->{json} : {} }

sub streaming ($class, $req) { return _json($req)->{stream} ? 1 : 0 }

sub stream_headers ($class, $reply, $req) {
    return (['Content-Type', 'text/event-stream; charset=utf-8'],
            ['openai-processing-ms', 1 + int rand 300],
            ['openai-version', '2020-10-01'],
            ['x-request-id', random_id('req_', 32)]);
}

sub _hex ($prefix) {
    return $prefix . join '', map { sprintf '%x', rand 16 } 1 .. 50;
}

sub _pad { return random_id('', 1 + int rand 15) }

sub _list ($v) { return ref $v eq 'ARRAY' ? @$v : defined $v ? ($v) : () }

sub _arguments ($tc) {
    my $a = $tc->{arguments} // '';
    return ref $a ? json($a) : $a;
}

sub _usage ($reply) {
    my $u = $reply->{usage} // {};
    my $in = $u->{input_tokens} // $u->{prompt_tokens} // 10;
    my $out = $u->{output_tokens} // $u->{completion_tokens} // 5;

    return obj(input_tokens => num($in),
               input_tokens_details => obj(
                   cached_tokens => num($u->{cached_tokens} // 0)),
               output_tokens => num($out),
               output_tokens_details => obj(
                   reasoning_tokens => num($u->{reasoning_tokens} // 0)),
               total_tokens => num($u->{total_tokens} // total($in, $out)));
}

# What every response object of one reply shares, from the request.
sub _context ($reply, $req) {
    my $j = _json($req);

    return { id => $reply->{id} // _hex('resp_'),
             created => time,
             model => $reply->{model} // $j->{model} // 'gpt-mock',
             instructions => $j->{instructions},
             store => exists $j->{store} && !$j->{store} ? false : true,
             tools => raw(json($j->{tools} // [])),
             # the request's text format and tool choice, echoed
             text => raw(json({ format => { type => 'text' },
                                verbosity => 'medium',
                                %{ $j->{text} // {} } })),
             tool_choice => raw(json($j->{tool_choice} // 'auto')),
             encrypted => (grep { $_ eq 'reasoning.encrypted_content' }
                                @{ $j->{include} // [] }) ? 1 : 0,
             sources => (grep { $_ eq 'web_search_call.action.sources' }
                              @{ $j->{include} // [] }) ? 1 : 0 };
}

sub _response ($ctx, $status, $output, $usage, %more) {
    return obj(id => $ctx->{id}, object => 'response',
               created_at => num($ctx->{created}), status => $status,
               background => false, error => $more{error},
               incomplete_details => $more{incomplete},
               instructions => $ctx->{instructions},
               max_output_tokens => undef, max_tool_calls => undef,
               model => $ctx->{model}, output => arr(@$output),
               parallel_tool_calls => true, previous_response_id => undef,
               prompt_cache_key => undef,
               reasoning => obj(effort => undef, summary => undef),
               safety_identifier => undef, service_tier => 'auto',
               store => $ctx->{store}, temperature => raw('1.0'),
               text => $ctx->{text},
               tool_choice => $ctx->{tool_choice}, tools => $ctx->{tools},
               top_logprobs => num(0), top_p => raw('1.0'),
               truncation => 'disabled', usage => $usage, user => undef,
               metadata => obj());
}

# the pages a search found, sent only when the request's "include" asks
# for them, as the API does
sub _sources ($s, $ctx) {
    return () unless $ctx->{sources} && defined $s->{url};
    return (sources => arr(map { obj(type => 'url', url => $_) }
                               _list($s->{url})));
}

# The output items: for each, the item as added, the events between
# (each [type, fields...] without type and sequence_number) and the item
# as done.
sub _items ($reply, $ctx) {
    my (@items, @search, $r, $text, @calls);

    $r = $reply->{reasoning};
    $r = { summary => $r } if defined $r && ref $r ne 'HASH';
    @search = map { ref $_ ? $_ : { query => $_ } }
              _list($reply->{web_search});
    $text = $reply->{text};
    @calls = @{ $reply->{tool_calls} // [] };

    if ($r) {
        my $id = _hex('rs_');
        my $i = num(scalar @items);
        my @parts = _list($r->{summary});
        my $enc = $r->{encrypted_content}
                  // ($ctx->{encrypted} ? 'gAAAAA' . random_id('', 64)
                                        : undef);
        my @ev;

        for my $k (0 .. $#parts) {
            my @at = (item_id => $id, output_index => $i,
                      summary_index => num($k));

            push @ev, ['response.reasoning_summary_part.added', @at,
                       part => obj(type => 'summary_text', text => '')];
            push @ev, map { ['response.reasoning_summary_text.delta', @at,
                             delta => $_, obfuscation => _pad()] }
                          split_text($parts[$k], $reply->{chunks});
            push @ev, ['response.reasoning_summary_text.done', @at,
                       text => $parts[$k]];
            push @ev, ['response.reasoning_summary_part.done', @at,
                       part => obj(type => 'summary_text',
                                   text => $parts[$k])];
        }

        push @items, {
            added => obj(id => $id, type => 'reasoning', summary => arr()),
            events => \@ev,
            done => obj(id => $id, type => 'reasoning',
                        defined $enc ? (encrypted_content => $enc) : (),
                        summary => arr(map { obj(type => 'summary_text',
                                                 text => $_) } @parts)) };
    }

    for my $s (@search) {
        my $id = $s->{id} // _hex('ws_');
        my @at = (output_index => num(scalar @items), item_id => $id);

        push @items, {
            added => obj(id => $id, type => 'web_search_call',
                         status => 'in_progress'),
            events => [map { ["response.web_search_call.$_", @at] }
                           qw(in_progress searching completed)],
            done => obj(id => $id, type => 'web_search_call',
                        status => 'completed',
                        action => obj(type => 'search',
                                      query => $s->{query} // '',
                                      _sources($s, $ctx)))};
    }

    if (defined $text || !@calls && !$r && !@search) {
        my $id = _hex('msg_');
        my @at = (item_id => $id, output_index => num(scalar @items),
                  content_index => num(0));
        my @cited = grep { defined $_->{url} } @search;
        my @notes = map {
            obj(type => 'url_citation', end_index => num(length $text),
                start_index => num(0), title => $_->{title} // $_->{url},
                url => $_->{url})
        } length($text // '') ? @cited : ();
        my $part = obj(type => 'output_text', annotations => arr(@notes),
                       logprobs => arr(), text => $text // '');
        my @ev;

        push @ev, ['response.content_part.added', @at,
                   part => obj(type => 'output_text', annotations => arr(),
                               logprobs => arr(), text => '')];
        push @ev, map { ['response.output_text.delta', @at, delta => $_,
                         logprobs => arr(), obfuscation => _pad()] }
                      split_text($text, $reply->{chunks});
        push @ev, map { ['response.output_text.annotation.added', @at,
                         annotation_index => num($_),
                         annotation => $notes[$_]] } 0 .. $#notes;
        push @ev, ['response.output_text.done', @at, text => $text // '',
                   logprobs => arr()];
        push @ev, ['response.content_part.done', @at, part => $part];

        push @items, {
            added => obj(id => $id, type => 'message',
                         status => 'in_progress', content => arr(),
                         role => 'assistant'),
            events => \@ev,
            done => obj(id => $id, type => 'message', status => 'completed',
                        content => arr($part), role => 'assistant') };
    }

    for my $tc (@calls) {
        my $id = _hex('fc_');
        my $call_id = $tc->{id} // random_id('call_', 24);
        my @at = (item_id => $id, output_index => num(scalar @items));
        my $args = _arguments($tc);
        my @ev;

        push @ev, map { ['response.function_call_arguments.delta', @at,
                         delta => $_, obfuscation => _pad()] }
                      split_text($args, $tc->{chunks} // $reply->{chunks});
        push @ev, ['response.function_call_arguments.done', @at,
                   arguments => $args];

        push @items, {
            added => obj(id => $id, type => 'function_call',
                         status => 'in_progress', arguments => '',
                         call_id => $call_id, name => $tc->{name}),
            events => \@ev,
            done => obj(id => $id, type => 'function_call',
                        status => 'completed', arguments => $args,
                        call_id => $call_id, name => $tc->{name}) };
    }

    return @items;
}

sub _end ($reply) {
    my $reason = $reply->{finish_reason} // 'completed';

    return $reason eq 'completed'
           ? ('response.completed', 'completed', undef)
           : ('response.incomplete', 'incomplete', obj(reason => $reason));
}

sub events ($class, $reply, $req) {
    my ($ctx, @items, $seq, @events, $event);

    $ctx = _context($reply, $req);
    @items = _items($reply, $ctx);
    $seq = 0;

    $event = sub ($type, @fields) {
        push @events, sse(obj(type => $type, sequence_number => num($seq++),
                              @fields), $type);
    };

    for my $type (qw(response.created response.in_progress)) {
        $event->($type, response => _response($ctx, 'in_progress', [],
                                              undef));
    }

    for my $i (0 .. $#items) {
        $event->('response.output_item.added', output_index => num($i),
                 item => $items[$i]{added});
        $event->(@$_) for @{ $items[$i]{events} };
        $event->('response.output_item.done', output_index => num($i),
                 item => $items[$i]{done});
    }

    my ($type, $status, $incomplete) = _end($reply);

    $event->($type, response => _response($ctx, $status,
                                          [map { $_->{done} } @items],
                                          _usage($reply),
                                          incomplete => $incomplete));

    return @events;
}

# After error_after events: the error event as OpenAI sends it mid-stream,
# or a response.failed.
sub stream_error ($class, $reply, $req) {
    my $e = $class->error_fields(500, $reply->{error});
    my $seq = num($reply->{error_after} // 0);

    if (($e->{event} // '') eq 'response.failed') {
        my $ctx = _context($reply, $req);
        my $err = obj(code => $e->{code} // $e->{type},
                      message => $e->{message});

        return sse(obj(type => 'response.failed', sequence_number => $seq,
                       response => _response($ctx, 'failed', [], undef,
                                             error => $err)),
                   'response.failed');
    }

    return sse(obj(type => 'error', sequence_number => $seq,
                   error => obj(type => $e->{type}, code => $e->{code},
                                message => $e->{message},
                                param => $e->{param})),
               'error');
}

sub complete ($class, $reply, $req) {
    my $ctx = _context($reply, $req);
    my (undef, $status, $incomplete) = _end($reply);

    return ([['Content-Type', 'application/json'],
             ['openai-version', '2020-10-01'],
             ['x-request-id', random_id('req_', 32)]],
            json(_response($ctx, $status,
                           [map { $_->{done} } _items($reply, $ctx)],
                           _usage($reply), incomplete => $incomplete)));
}

1;
