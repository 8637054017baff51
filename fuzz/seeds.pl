#!/usr/bin/perl
# fuzz/seeds.pl: writes the seed corpora of the fuzz targets into
# fuzz/corpus/<target>/, from the test suite's mock provider: its framers
# (t/lib/Test/Agent/MockProvider/*.pm) make the bytes each API streams,
# so the seeds are the wire formats the tests use.  It also writes the
# libFuzzer dictionaries, fuzz/dict/<target>.dict: the JSON keys and
# values each adapter looks for (the quoted names in its source), and
# SSE's field names.  Both are committed; run this again after a framer
# or an adapter changes (ids and times are fixed, so the files only
# change when the formats do).
#
# A stream target's input starts with the header of
# fuzz/ngx_http_agent_fuzz.h: a byte with the number of piece lengths
# and the target's flags, then the lengths.

use v5.36;
use FindBin;

# the framers put the time into their events: a fixed one
BEGIN { *CORE::GLOBAL::time = sub () { 1700000000 } }

use lib "$FindBin::Bin/../t/lib";

use File::Path qw(make_path remove_tree);
use JSON::PP;

use Test::Agent::MockProvider::OpenAIChat;
use Test::Agent::MockProvider::Anthropic;
use Test::Agent::MockProvider::OpenAIResponses;

my $DIR = "$FindBin::Bin/corpus";
my $DICT = "$FindBin::Bin/dict";
my $SRC = "$FindBin::Bin/../src";

# whole, and in pieces of 1, 7 and 32 bytes in turn
my @CUTS = ("\x00", "\x03\x00\x06\x1f");

my $REQ = { json => { model => 'gpt-test', stream => JSON::PP::true,
                      stream_options => { include_usage => JSON::PP::true },
                      include => ['reasoning.encrypted_content'] } };

my $TEXT = "Hello, w\x{f6}rld \x{2713} \x{1f600}: \"quoted\"\nnew line";

my @CALLS = (
    { id => 'call_1', name => 'get_weather',
      arguments => '{"city":"Paris","units":"c"}', chunks => 4 },
    { id => 'call_2', name => 'lookup',
      arguments => { q => "caf\x{e9}", n => 3, deep => { a => [1, 2] } },
      chunks => 3 },
);

my %REPLIES = (
    text => { text => $TEXT, chunks => 5 },
    empty => { text => '' },
    calls => { tool_calls => \@CALLS },
    text_calls => { text => 'Let me check.', chunks => 2,
                    tool_calls => [$CALLS[0]] },
    usage => { text => 'ok', include_usage => 1,
               usage => { prompt_tokens => 42, completion_tokens => 7,
                          cached_tokens => 3, reasoning_tokens => 2 } },
    length => { text => 'cut short', finish_reason => 'length' },
    error => { text => 'partial answer', chunks => 3, error_after => 3 },
    cut => { text => 'partial answer', chunks => 3, cut_after => 3 },
);

my %ANTHROPIC = (
    thinking => { thinking => 'Let me think about it.', chunks => 3,
                  signature => 'EuYBCkQYAiJA', text => 'Answer.' },
    thinking_calls => { thinking => 'A tool is needed.',
                        tool_calls => \@CALLS },
    web_search => { web_search => {
        id => 'srvtoolu_01', query => 'nginx agents', before => 'Looking.',
        results => [{ url => 'https://example.com/a', title => 'A' },
                    { url => 'https://example.com/b', title => 'B' }],
        citations => [{ url => 'https://example.com/a', title => 'A',
                        cited_text => 'agents run in nginx' }] },
        text => 'Found it.' },
    overloaded => { text => 'partial', error_after => 4,
                    error => { type => 'overloaded_error',
                               message => 'Overloaded' } },
    blocks => { content => [
        { type => 'thinking', thinking => 'First.', signature => 'EuYB1' },
        { type => 'redacted_thinking', data => 'EmwKAhgB' },
        { type => 'thinking', thinking => 'Second.', signature => 'EuYB2' },
        { type => 'tool_use', id => 'toolu_01', name => 'get_weather',
          input => { city => 'Paris' },
          caller => { type => 'code_execution_20250825',
                      tool_id => 'srvtoolu_02' } }], chunks => 2 },
    paused => { content => [
        { type => 'server_tool_use', id => 'srvtoolu_03',
          name => 'web_search', input => { query => 'nginx' } },
        { type => 'web_search_tool_result', tool_use_id => 'srvtoolu_03',
          content => [{ type => 'web_search_result',
                        url => 'https://example.com/c', title => 'C',
                        encrypted_content => 'Eqgf' }] }],
        finish_reason => 'pause_turn' },
);

my %RESPONSES = (
    reasoning => { reasoning => { summary => ['First.', 'Second.'],
                                  encrypted_content => 'gAAAAAfuzz' },
                   text => 'Done.', chunks => 2 },
    web_search => { web_search => [{ query => 'nginx', id => 'ws_1',
                                     url => 'https://nginx.org/',
                                     title => 'nginx' }],
                    text => 'nginx is a web server.' },
    function_calls => { reasoning => 'Needs tools.', tool_calls => \@CALLS },
    incomplete => { text => 'cut', finish_reason => 'max_output_tokens' },
    failed => { text => 'partial', error_after => 5,
                error => { event => 'response.failed', code => 'server_error',
                           message => 'The model failed.' } },
);


remove_tree($DIR, $DICT);

for my $api (['openai_chat', 'Test::Agent::MockProvider::OpenAIChat', {}],
             ['anthropic', 'Test::Agent::MockProvider::Anthropic',
              \%ANTHROPIC],
             ['openai_responses', 'Test::Agent::MockProvider::OpenAIResponses',
              \%RESPONSES])
{
    my ($target, $framer, $more) = @$api;
    my %replies = (%REPLIES, %$more);

    for my $name (sort keys %replies) {
        my $stream = stream($framer, $replies{$name});

        for my $i (0 .. $#CUTS) {
            write_seed($target, "$name-$i", $CUTS[$i] . $stream);
            write_seed('sse', "$target-$name", $CUTS[$i] . $stream)
                if $i == 1;
        }

        write_seed($target, "$name-crlf", "\x02\x04\x0a"
                                           . ($stream =~ s/\n/\r\n/gr))
            if $name eq 'text' || $name eq 'calls';
    }

    write_seed($target, 'not-json', "\x00data: {not json\n\n");
    write_seed($target, 'not-object', "\x00data: [1,2]\n\n");
}

# SSE framing on its own: line ends, BOM, comments, fields, limits
my %SSE = (
    bom => "\xef\xbb\xbfdata: x\n\n",
    cr => "data: a\rdata: b\r\revent: e\rdata: c\r\r",
    crlf => "data: a\r\ndata: b\r\n\r\n",
    fields => ": keep-alive\nid: 7\nretry: 1000\nevent: named\n"
              . "data\ndata:\ndata:  two spaces\nunknown: x\n\n",
    no_data => "event: lonely\n\nid\n\n",
    nul_id => "id: a\0b\ndata: x\n\n",
    long => 'data: ' . ('x' x 5000) . "\n\n",
);

for my $name (sort keys %SSE) {
    write_seed('sse', $name, "\x00" . $SSE{$name});
    write_seed('sse', "$name-small", "\x13\x00\x05\x40" . $SSE{$name});
}

write_seed('sse', 'fail-second', "\x44data: 1\n\ndata: 2\n\ndata: 3\n\n");

# JSON texts as they reach the parsers
my %JSON = (
    event => '{"type":"tool_result","tool_call_id":"call_1","name":"w",'
             . '"ok":true,"result":{"temp":21,"list":[1,2.5,-3e2,true,'
             . 'false,null]}}',
    error_result => '{"ok":false,"error":"the tool failed"}',
    partial => '{"content":"so far","status":"interrupted"}',
    cancelled => '{"content":"","status":"cancelled"}',
    escapes => '{"s":"\u00e9\ud83d\ude00\"\\\/\b\f\n\r\t","e":"\ud800"}',
    numbers => '[0,-0,1e999,-1.5E-3,123456789012345678901234567890]',
    comment => '/* c */ {"a":1} // d',
    nul => '{"a":"\u0000"}',
    deep63 => ('[' x 63) . (']' x 63),
    deep65 => ('{"a":' x 65) . '1' . ('}' x 65),
    utf8_bad => "{\"a\":\"\xc3\x28 \xed\xa0\x80 \xf4\x90\x80\x80\"}",
    trailing => " \t\r\n{\"a\":1} \n",
    two => '{"a":1}{"b":2}',
    chunk => '{"id":"c1","object":"chat.completion.chunk","created":1,'
             . '"choices":[{"index":0,"delta":{"content":"caf' . "\xc3\xa9 "
             . '\u00e9\n\ud83d\ude00"},"finish_reason":null}],'
             . '"usage":null}',
    surrogates => '["\udc00","\ud800x","\ud800\u0041",'
                  . '"\ud800\\\\u0041","\uDBFF\uDFFF"]',
    glued => '[true1,nullx,falsefalse,01,1.,-,1e+,"a"1,[]{}]',
    spaces => "{\"a\":\x0b1,\x0c\"b\":2}",
    words => '["' . join('","', map { ('a' x $_) . '\\"' . ('b' x (15 - $_)) }
                                0 .. 15) . '","' . ('c' x 13) . "\xc3\xa9\x7f"
             . ('d' x 9) . '"]',
    words_ctl => '["' . ('e' x 11) . "\x1f" . ('f' x 8) . '"]',
    utf8_lax => "[\"\x7f\xc0\x80\xe0\x80\x80\xf7\xbf\xbf\xbf\",\"\xf8\"]",
);

for my $name (sort keys %JSON) {
    write_seed('json', $name, $JSON{$name});
}

my %MESSAGE = (
    content => '{"content":"hello"}',
    source => '{"content":"hi \u00e9","source_id":"client-42"}',
    source_long => '{"content":"x","source_id":"' . ('s' x 129) . '"}',
    empty => '{"content":""}',
    not_string => '{"content":123}',
    array => '[{"content":"hi"}]',
    bad => '{"content":',
);

for my $name (sort keys %MESSAGE) {
    write_seed('message', $name, $MESSAGE{$name});
}

my %RESOLVE = (
    result => '{"result":{"temp":21,"tags":["a","b"]}}',
    result_text => '{"result":"plain text"}',
    result_null => '{"result":null}',
    approve => '{"decision":"approve"}',
    approve_args => '{"decision":"approve","args":{"city":"Paris"}}',
    reject => '{"decision":"reject","reason":"not now"}',
    bad_decision => '{"decision":"maybe"}',
    bad_args => '{"decision":"approve","args":[1]}',
    bad_reason => '{"decision":"reject","reason":5}',
);

for my $name (sort keys %RESOLVE) {
    write_seed('resolve', $name, $RESOLVE{$name});
}

# a tool's output: flags 0x10 streaming, 0x20 status 502, 0x40 NGX_ERROR
my %TOOLS = (
    json => "\x00" . '{"temp":21,"sky":"clear"}',
    text => "\x02\x03\x10" . "plain text, not JSON\n",
    bad_utf8 => "\x00" . "caf\xe9 \xff\xfe",
    status => "\x20" . '{"error":"bad gateway"}',
    aborted => "\x40" . 'partial',
    stream => "\x13\x00\x08\x20" . '{"progress":{"pct":10}}' . "\n"
              . '{"progress":"half"}' . "\r\n\n"
              . '{"result":{"ok":1},"error":null}' . "\n"
              . '{"result":"ignored"}' . "\n",
    stream_error => "\x10" . '{"error":"boom"}' . "\n",
    stream_error_obj => "\x10" . '{"error":{"code":7}}',
    stream_garbage => "\x10" . "not json\n",
    stream_none => "\x10" . '{"progress":1}' . "\n" . '{"other":2}' . "\n",
    stream_last => "\x10" . '{"result":[1,2,3]}',
);

for my $name (sort keys %TOOLS) {
    write_seed('tools', $name, $TOOLS{$name});
}
# conversations as the log holds them, for each adapter's request
my $EV = sub ($seq, $type, $fields) {
    return qq({"type":"$type","seq":$seq,"turn":1,"ts":1700000000)
           . ($fields eq '' ? '' : ",$fields") . '}';
};

my @CHAT = (
    $EV->(1, 'user_msg', '"content":"What is the weather in Paris?"'),
    $EV->(2, 'assistant_msg', '"message_id":"m1","content":"Checking.",'
          . '"tool_calls":[{"id":"call_1","name":"get_weather",'
          . '"arguments":"{\\"city\\":\\"Paris\\"}"},{"id":"call_2",'
          . '"name":"lookup","arguments":""}],"finish_reason":"tool_calls",'
          . '"usage":{"input_tokens":10,"output_tokens":5},'
          . '"status":"complete"'),
    $EV->(3, 'tool_call', '"tool_call_id":"call_1","name":"get_weather",'
          . '"arguments":"{\\"city\\":\\"Paris\\"}","executor":"server"'),
    $EV->(4, 'tool_result', '"tool_call_id":"call_1","name":"get_weather",'
          . '"ok":true,"result":{"temp":21,"sky":["clear"]}'),
    $EV->(5, 'tool_result', '"tool_call_id":"call_2","name":"lookup",'
          . '"ok":false,"error":"[failed] the tool failed"'),
    $EV->(6, 'assistant_msg', '"message_id":"m2","content":"It is 21 C",'
          . '"status":"interrupted"'),
    $EV->(7, 'user_msg', '"content":[{"type":"text","text":"thanks"}],'
          . '"source_id":"s1"'),
    $EV->(8, 'assistant_msg', '"message_id":"m3","content":"",'
          . '"status":"cancelled"'),
);

my @ANTHROPIC_LOG = (
    $CHAT[0],
    $EV->(2, 'assistant_msg', '"message_id":"m1","content":"Looking.",'
          . '"thinking":"A search.","thinking_signature":"EuYBCkQYAiJA",'
          . '"provider_content":[{"type":"thinking","thinking":"A search.",'
          . '"signature":"EuYBCkQYAiJA"},{"type":"text","text":"Looking."},'
          . '{"type":"server_tool_use","id":"srvtoolu_01","name":'
          . '"web_search","input":{"query":"paris"}},{"type":'
          . '"web_search_tool_result","tool_use_id":"srvtoolu_01","content":'
          . '[{"type":"web_search_result","title":"A","url":'
          . '"https://example.com/a","encrypted_content":"Eqgf"}]},'
          . '{"type":"text","text":"Found.","citations":[{"type":'
          . '"web_search_result_location","cited_text":"c","url":'
          . '"https://example.com/a","title":"A","encrypted_index":"Eo8B"}]},'
          . '{"type":"tool_use","id":"toolu_1","name":"get_weather",'
          . '"input":{"city":"Paris"}}],"tool_calls":[{"id":"toolu_1",'
          . '"name":"get_weather","arguments":"{\\"city\\":\\"Paris\\"}"}],'
          . '"status":"complete"'),
    $EV->(3, 'tool_call', '"tool_call_id":"srvtoolu_01","name":"web_search",'
          . '"arguments":"{\\"query\\":\\"paris\\"}","executor":"provider"'),
    $EV->(4, 'tool_result', '"tool_call_id":"srvtoolu_01","name":'
          . '"web_search","ok":true,"result":[{"type":"web_search_result"}],'
          . '"provider_executed":true'),
    $EV->(5, 'tool_result', '"tool_call_id":"toolu_1","name":"get_weather",'
          . '"ok":true,"result":"sunny"'),
);

my @RESPONSES_LOG = (
    $CHAT[0],
    $EV->(2, 'assistant_msg', '"message_id":"m1","content":"",'
          . '"provider_content":[{"id":"rs_1","type":"reasoning",'
          . '"encrypted_content":"gAAAA","summary":[{"type":"summary_text",'
          . '"text":"Needs tools."}]},{"id":"ws_1","type":"web_search_call",'
          . '"status":"completed","action":{"type":"search","query":"q"}},'
          . '{"id":"fc_1","type":"function_call","status":"completed",'
          . '"arguments":"{}","call_id":"call_1","name":"get_weather"}],'
          . '"tool_calls":[{"id":"call_1","name":"get_weather",'
          . '"arguments":"{}"}],"status":"complete"'),
    $CHAT[3],
);

for my $i (0 .. 2) {
    write_seed('request', "chat-$i", chr($i | 4) . join "\n", @CHAT);
    write_seed('request', "anthropic-$i", chr($i) . join "\n", @ANTHROPIC_LOG);
    write_seed('request', "responses-$i", chr($i | 4)
                                           . join "\n", @RESPONSES_LOG);
}

my @SSE_TOKENS = ('data:', 'data: ', 'event: ', 'id: ', 'retry: ', ': ',
                  "\n\n", "\r\n", "\r", "\xef\xbb\xbf", '[DONE]');
my @JSON_TOKENS = ('{', '}', '[', ']', '":"', '","', '":{', '":[', 'null',
                   'true', 'false', '\\u0000', '\\ud83d\\ude00', '1e999');

write_dict('sse', @SSE_TOKENS);
write_dict('json', @JSON_TOKENS, src_strings('core/ngx_http_agent_json.c'),
           src_strings('core/ngx_http_agent_json_tree.c'),
           src_strings('provider/ngx_http_agent_provider.c'));
write_dict('message', @JSON_TOKENS, '"content"', '"source_id"');
write_dict('resolve', @JSON_TOKENS, '"result"', '"decision"', '"approve"',
           '"reject"', '"reason"', '"args"');
write_dict('tools', @JSON_TOKENS, "\n", '"progress"', '"result"',
           '"error"');
write_dict('request', @JSON_TOKENS, "\n", '"status"', '"interrupted"',
           '"cancelled"', '"ok"', '"result"', '"error"',
           map { src_strings("provider/ngx_http_agent_$_.c") }
               qw(request openai_chat anthropic_request
                  openai_responses_request));

for my $target (qw(openai_chat anthropic openai_responses)) {
    write_dict($target, @SSE_TOKENS, @JSON_TOKENS,
               src_strings("provider/ngx_http_agent_$target.c"));
}


# the quoted names a source file looks for, as JSON strings
sub src_strings ($file) {
    my (%seen, @s);

    open my $fh, '<', "$SRC/$file" or die "$SRC/$file: $!";

    while (my $line = <$fh>) {
        push @s, grep { !$seen{$_}++ } map { "\"$_\"" }
                                        $line =~ /"([a-z][a-z0-9_.]+)"/g;
    }

    return grep { !/\.[ch]"$/ } @s;
}

sub write_dict ($target, @tokens) {
    make_path($DICT);

    open my $fh, '>:raw', "$DICT/$target.dict"
        or die "$DICT/$target.dict: $!";

    for my $t (@tokens) {
        my $q = join '', map {
            my $c = ord;
            $c < 0x20 || $c > 0x7e || $_ eq '"' || $_ eq '\\'
                ? sprintf('\\x%02x', $c) : $_
        } split //, $t;

        print $fh "\"$q\"\n";
    }

    close $fh;
}

sub stream ($framer, $reply) {
    my @events;

    srand(1);
    @events = $framer->events($reply, $REQ);

    if (defined $reply->{error_after}) {
        splice @events, $reply->{error_after};
        push @events, $framer->stream_error($reply, $REQ);

    } elsif (defined $reply->{cut_after}) {
        splice @events, $reply->{cut_after};
    }

    return join '', @events;
}

sub write_seed ($target, $name, $bytes) {
    make_path("$DIR/$target");

    open my $fh, '>:raw', "$DIR/$target/$name"
        or die "$DIR/$target/$name: $!";
    print $fh $bytes;
    close $fh;
}
