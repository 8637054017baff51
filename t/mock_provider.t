#!/usr/bin/perl

# Tests for the mock LLM provider itself, spoken to over raw sockets (no
# nginx): wire format byte for byte, timing of chunks, request records,
# and every scripted fault.

use v5.36;
use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent::MockProvider;

my $JSON = JSON::PP->new->utf8->canonical;

my $mock = Test::Agent::MockProvider->new;

###############################################################################

# A raw HTTP client.  A response is read incrementally so that each HTTP
# chunk carries its arrival time and a test can stop after N chunks.

sub connect_mock () {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $mock->port,
                                  Proto => 'tcp', Timeout => 3);
    return $s // die "connect: $@";
}

sub send_request ($sock, %a) {
    my ($body, $method, $path, $version, $head);

    $body = $a{body} // { model => 'gpt-test', stream => JSON::PP::true,
                          messages => [{ role => 'user', content => 'hi' }],
                          %{ $a{json} // {} } };
    $body = $JSON->encode($body) if ref $body;
    $method = $a{method} // 'POST';
    $path = $a{path} // '/v1/chat/completions';
    $version = $a{version} // '1.1';

    $head = "$method $path HTTP/$version\r\nHost: localhost\r\n"
            . "Content-Type: application/json\r\n"
            . join('', map { "$_\r\n" } @{ $a{headers} // [] });

    if ($a{chunked}) {
        # three uneven chunks, as a streaming client would send them
        my $third = int(length($body) / 3);
        my @parts = (substr($body, 0, $third), substr($body, $third, 1),
                     substr($body, $third + 1));
        $head .= "Transfer-Encoding: chunked\r\n\r\n"
                 . join('', map { sprintf("%x\r\n%s\r\n", length, $_) }
                                @parts)
                 . "0\r\n\r\n";
    } else {
        $head .= 'Content-Length: ' . length($body) . "\r\n\r\n$body";
    }

    print $sock $head;
    return $body;
}

sub reader ($sock) {
    return { sock => $sock, buf => '', state => 'head', chunks => [],
             body => '', complete => 0, eof => 0 };
}

sub parse_some ($r) {
    if ($r->{state} eq 'head') {
        my $end = index($r->{buf}, "\r\n\r\n");
        return if $end < 0;

        my $head = substr($r->{buf}, 0, $end + 4, '');
        my ($line, @lines) = split /\r\n/, $head;
        ($r->{status}) = $line =~ m{^HTTP/1\.1 (\d{3}) };
        $r->{headers} = { map { /^([^:]+):\s*(.*)$/ ? (lc $1, $2) : () }
                          @lines };
        $r->{head_at} = $r->{t};

        my $h = $r->{headers};
        $r->{state} = ($h->{'transfer-encoding'} // '') eq 'chunked'
                      ? 'chunks'
                      : defined $h->{'content-length'} ? 'length' : 'close';
    }

    if ($r->{state} eq 'chunks') {
        while ($r->{buf} =~ /\A([0-9a-f]+)\r\n/) {
            my ($size, $skip) = (hex $1, length($1) + 2);
            last if length $r->{buf} < $skip + $size + 2;

            my $chunk = substr($r->{buf}, 0, $skip + $size + 2, '');
            die "bad chunk end" unless substr($chunk, -2) eq "\r\n";

            if ($size == 0) {
                $r->{complete} = 1;
                $r->{state} = 'done';
                last;
            }

            my $data = substr($chunk, $skip, $size);
            push @{ $r->{chunks} }, { data => $data, t => $r->{t} };
            $r->{body} .= $data;
        }

    } elsif ($r->{state} eq 'length') {
        if (length $r->{buf} >= $r->{headers}{'content-length'}) {
            $r->{body} = substr($r->{buf}, 0,
                                $r->{headers}{'content-length'}, '');
            $r->{complete} = 1;
            $r->{state} = 'done';
        }

    } elsif ($r->{state} eq 'close') {
        $r->{body} .= $r->{buf};
        $r->{buf} = '';
        $r->{complete} = 1 if $r->{eof};
    }
}

# Read until $want->($r) holds; false on EOF or timeout first.
sub pump ($r, $want, $timeout = 5) {
    my $deadline = time + $timeout;

    while (1) {
        parse_some($r);
        return 1 if $want->($r);
        return 0 if $r->{eof};

        my $left = $deadline - time;
        return 0 if $left <= 0;
        next unless IO::Select->new($r->{sock})->can_read($left);

        my $n = sysread($r->{sock}, $r->{buf}, 65536, length $r->{buf});
        $r->{t} = time;
        $r->{eof} = 1 unless $n;
    }
}

sub done ($r) { return $r->{complete} }
sub chunks ($n) { return sub ($r) { @{ $r->{chunks} } >= $n } }

sub request (%a) {
    my $sock = connect_mock();
    my $r = reader($sock);

    $r->{sent} = send_request($sock, %a);
    pump($r, \&done, $a{timeout} // 5);

    return $r;
}

# What every chunk of one completion starts with; id and created are taken
# from the stream, the rest is fixed.
sub chunk_prefix ($event) {
    my ($id, $created) = $event =~ /^data:[ ]\{"id":"(chatcmpl-\w+)",
                                    "object":"[^"]+","created":(\d+),/x
        or return '';

    return qq(data: {"id":"$id","object":"chat.completion.chunk",)
           . qq("created":$created,"model":"gpt-test",)
           . qq("service_tier":"default","system_fingerprint":"fp_mock",);
}

sub events ($r) { return map { $_->{data} } @{ $r->{chunks} } }

sub json_events ($r) {
    return map { /^data: (\{.*\})\n\n\z/s ? $JSON->decode($1) : () }
               events($r);
}

###############################################################################

# text, chunk by chunk, byte for byte

$mock->script({ text => 'Hello world', chunks => 5, delay => 0.1 });

my $start = time;
my $r = request(json => { stream_options => { include_usage => \1 } });
my $rec = $mock->requests->[0];

is($r->{status}, 200, 'text: 200');
like($r->{headers}{'content-type'}, qr{^text/event-stream\b},
     'text: event stream');
is($r->{headers}{'transfer-encoding'}, 'chunked', 'text: chunked');
ok($r->{complete}, 'text: terminating chunk');

my @ev = events($r);
my $pre = chunk_prefix($ev[0]);
ok($pre, 'text: chatcmpl id and created');

my $choice = sub ($delta, $finish = 'null') {
    return $pre . qq("choices":[{"index":0,"delta":$delta,)
           . qq("logprobs":null,"finish_reason":$finish}],"usage":null}\n\n);
};

is_deeply(\@ev, [
    $choice->('{"role":"assistant","content":"","refusal":null}'),
    (map { $choice->(qq({"content":"$_"})) } 'Hel', 'lo', ' w', 'or', 'ld'),
    $choice->('{}', '"stop"'),
    $pre . '"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,'
         . '"total_tokens":15,'
         . '"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},'
         . '"completion_tokens_details":{"reasoning_tokens":0,'
         . '"audio_tokens":0,"accepted_prediction_tokens":0,'
         . '"rejected_prediction_tokens":0}}}' . "\n\n",
    "data: [DONE]\n\n",
], 'text: exact events, one per HTTP chunk');

# a late read can merge chunks, never make one early: chunk i cannot
# arrive before i delays have passed
my @t = map { $_->{t} } @{ $r->{chunks} };
is(scalar(grep { $t[$_] < $start + $_ * 0.1 } 0 .. $#t), 0,
   'text: no chunk before its scripted time');
cmp_ok($t[-1] - $t[0], '>=', 0.4, 'text: spread over the delays');
cmp_ok($t[0], '<', $rec->{finished_at} - 0.4,
       'text: first chunk long before the provider finished');

# the recorded request

is($rec->{method}, 'POST', 'record: method');
is($rec->{path}, '/v1/chat/completions', 'record: path');
is($rec->{api}, 'openai_chat', 'record: api');
is($rec->{headers}{'content-type'}, 'application/json', 'record: header');
is($rec->{body}, $r->{sent}, 'record: raw body');
is($rec->{json}{model}, 'gpt-test', 'record: json body');
ok($rec->{finished} && !$rec->{client_closed}, 'record: finished');

###############################################################################

# parallel tool calls after text, arguments split, usage configured

my @calls = ({ id => 'call_1', name => 'get_weather',
               arguments => '{"city":"Paris"}' },
             { id => 'call_2', name => 'get_time',
               arguments => '{"tz":"Europe/Paris"}' });

$mock->script({ text => 'Let me check.', tool_calls => \@calls, chunks => 4,
                usage => { prompt_tokens => 42, completion_tokens => 7 } });

$r = request(json => { stream_options => { include_usage => \1 } },
             headers => ['Authorization: Bearer sk-test']);

my @j = json_events($r);
@ev = events($r);

is($j[0]{choices}[0]{delta}{role}, 'assistant', 'tools: role first');
# deltas of the chunks that have a choice (not the usage chunk)
my @deltas = map { $_->{choices}[0]{delta} } grep { @{ $_->{choices} } } @j;

is(join('', map { $_->{content} // '' } @deltas),
   'Let me check.', 'tools: text before the calls');

my (%args, %pieces, %start, $named_pieces);
for my $d (map { @{ $_->{tool_calls} // [] } } @deltas) {
    my $i = $d->{index};
    if (defined $d->{id}) {
        $start{$i} = [$d->{id}, $d->{type}, $d->{function}{name}];
    } elsif (exists $d->{function}{name}) {
        $named_pieces++;
    }
    $args{$i} .= $d->{function}{arguments};
    $pieces{$i}++ if length $d->{function}{arguments};
}

is_deeply(\%start, { 0 => ['call_1', 'function', 'get_weather'],
                     1 => ['call_2', 'function', 'get_time'] },
          'tools: parallel calls by index');
is_deeply(\%args, { 0 => $calls[0]{arguments}, 1 => $calls[1]{arguments} },
          'tools: arguments reassembled');
is_deeply(\%pieces, { 0 => 4, 1 => 4 }, 'tools: arguments in 4 pieces');
ok(!$named_pieces, 'tools: name only in the first piece');

is($ev[6], chunk_prefix($ev[0])
          . '"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
          . '"function":{"arguments":"{\\"ci"}}]},"logprobs":null,'
          . '"finish_reason":null}],"usage":null}' . "\n\n",
   'tools: exact argument piece');
is($j[-2]{choices}[0]{finish_reason}, 'tool_calls', 'tools: finish_reason');
is_deeply([$j[-1]{choices}, @{ $j[-1]{usage} }{qw(prompt_tokens
          completion_tokens total_tokens)}], [[], 42, 7, 49], 'tools: usage');
is($ev[-1], "data: [DONE]\n\n", 'tools: [DONE] last');

$rec = $mock->requests->[1];
is($rec->{headers}{authorization}, 'Bearer sk-test', 'tools: auth recorded');

###############################################################################

# tool call only, no usage requested: the role rides on the first piece and
# no usage chunk is sent, as on OpenAI

$mock->script({ tool_calls => [$calls[0]], chunks => 2 });

$r = request();
@ev = events($r);

like($ev[0], qr/"delta":\{"role":"assistant","content":null,"tool_calls":
                \[\{"index":0,"id":"call_1","type":"function","function":
                \{"name":"get_weather","arguments":""\}\}\],"refusal":null\}/x,
     'tool only: role with the first call');
is(scalar(grep { /usage/ } @ev), 0, 'tool only: no usage');
like($ev[-2], qr/"finish_reason":"tool_calls"\}\]\}\n\n\z/,
     'tool only: finish chunk before [DONE]');
is(scalar @ev, 5, 'tool only: start, 2 pieces, finish, [DONE]');
is_deeply($mock->requests->[2]{json}, $JSON->decode($r->{sent}),
          'record: json exactly as sent');

###############################################################################

# keep-alive with a chunked request body, then HTTP/1.0

$mock->script({ text => 'one' }, { text => 'two' });

my $sock = connect_mock();
$r = reader($sock);
send_request($sock);
pump($r, \&done);
is($r->{headers}{connection}, 'keep-alive', 'keep-alive: first reply');

my $r2 = reader($sock);
my $sent = send_request($sock, chunked => 1,
                        json => { messages => [{ role => 'user',
                                                 content => 'x' x 100 }] });
ok(pump($r2, \&done), 'keep-alive: second reply on the same connection');
like($r2->{body}, qr/"content":"two"/, 'keep-alive: second reply content');

my $reqs = $mock->requests;
is($reqs->[-1]{body}, $sent, 'chunked request body reassembled');
is($reqs->[-1]{json}{messages}[0]{content}, 'x' x 100,
   'chunked request body decoded');

$mock->script({ text => 'old', chunks => 2 });
$r = request(version => '1.0');

ok(!exists $r->{headers}{'transfer-encoding'}, 'HTTP/1.0: not chunked');
is($r->{headers}{connection}, 'close', 'HTTP/1.0: connection close');
ok($r->{eof} && $r->{body} =~ /"content":"d"\}.*data: \[DONE\]\n\n\z/s,
   'HTTP/1.0: events until the connection closes');

###############################################################################

# non-streamed request gets a chat.completion object

$mock->script({ text => 'whole' });
$r = request(json => { stream => JSON::PP::false });

my $c = eval { $JSON->decode($r->{body}) } // {};
is($c->{object}, 'chat.completion', 'non-stream: completion object');
is($c->{choices}[0]{message}{content}, 'whole', 'non-stream: content');
ok(defined $r->{headers}{'content-length'}, 'non-stream: content length');

###############################################################################

# pause after 2 events, then release

$mock->reset;
is_deeply($mock->requests, [], 'reset: records cleared');

$mock->script({ text => 'abcd', chunks => 4, pause_after => 2 });

$r = reader(connect_mock());
send_request($r->{sock});

ok(pump($r, chunks(2)), 'pause: first 2 events');
ok(!pump($r, chunks(3), 0.5), 'pause: nothing during the pause');
ok($mock->wait_paused(0), 'pause: reported paused');

my $released_at = time;
is($mock->release, 1, 'pause: one stream released');
ok(pump($r, \&done), 'pause: the rest after release');
is(scalar @{ $r->{chunks} }, 7, 'pause: all events');
cmp_ok($r->{chunks}[2]{t}, '>=', $released_at, 'pause: resumed on release');
is($r->{chunks}[-1]{data}, "data: [DONE]\n\n", 'pause: [DONE] last');

###############################################################################

# client closing mid-stream is noticed

$mock->script({ text => 'x' x 20, chunks => 20, delay => 0.1 });

$r = reader(connect_mock());
send_request($r->{sock});
pump($r, chunks(1));
close $r->{sock};

ok($mock->wait_closed(1, 3), 'client close: noticed');
$rec = $mock->requests->[1];
ok(!$rec->{finished}, 'client close: reply not finished');
cmp_ok($rec->{sent}, '<', 22, 'client close: stream stopped');
ok(!$mock->requests->[0]{client_closed}, 'client close: not on a finished');

###############################################################################

# HTTP error with Retry-After

$mock->script({ status => 429, retry_after => 2 },
              { status => 400, error => { message => 'too long',
                                          code => 'context_length_exceeded' }
              });

$r = request();
is($r->{status}, 429, 'error: status');
is($r->{headers}{'retry-after'}, 2, 'error: retry-after');
like($r->{headers}{'content-type'}, qr{^application/json}, 'error: json');
is_deeply(eval { $JSON->decode($r->{body}) },
          { error => { message => 'Rate limit reached for requests.',
                       type => 'requests', param => undef,
                       code => 'rate_limit_exceeded' } },
          'error: OpenAI error body');

$r = request();
my $e = eval { $JSON->decode($r->{body})->{error} } // {};
is_deeply([$r->{status}, @$e{qw(message type code)}],
          [400, 'too long', 'invalid_request_error',
           'context_length_exceeded'], 'error: scripted fields');

###############################################################################

# error mid-stream: events, the error object, a proper end, no [DONE]

$mock->script({ text => 'abcd', chunks => 4, error_after => 2 });

$r = request();
@ev = events($r);

is(scalar @ev, 3, 'mid-stream error: 2 events then the error');
is($ev[2], 'data: {"error": {"message": "The server had an error while'
           . ' processing your request. Sorry about that!", "type":'
           . ' "server_error", "param": null, "code": null}}' . "\n\n",
   'mid-stream error: exact event');
ok($r->{complete}, 'mid-stream error: stream ended');
ok(!grep({ /\[DONE\]/ } @ev), 'mid-stream error: no [DONE]');

###############################################################################

# cut: closed without [DONE] and without the terminating chunk

$mock->script({ text => 'abcd', chunks => 4, cut_after => 3 });

$r = request();

is(scalar @{ $r->{chunks} }, 3, 'cut: 3 events');
ok($r->{eof} && !$r->{complete}, 'cut: closed without terminating chunk');
is($r->{buf}, '', 'cut: nothing partial');
ok($mock->requests->[-1]{cut}, 'cut: recorded');

###############################################################################

# stall: connection held open with nothing on it, other requests still
# served; release closes it

$mock->script({ text => 'abcd', chunks => 4, stall_after => 1 },
              { text => 'meanwhile' });

$r = reader(connect_mock());
send_request($r->{sock});
ok(pump($r, chunks(1)), 'stall: first event');

$r2 = request(timeout => 2);
like($r2->{body}, qr/meanwhile/, 'stall: other request served meanwhile');

ok(!pump($r, sub ($r) { @{ $r->{chunks} } > 1 }, 0.5)
   && !$r->{eof}, 'stall: no data, connection open');

my $stalled = $mock->requests->[-2];
ok($stalled->{stalled} && !$stalled->{finished}, 'stall: recorded');
is($mock->release($stalled->{index}), 1, 'stall: released by index');
ok(!pump($r, \&done, 2) && $r->{eof}, 'stall: release closes it');

###############################################################################

# empty queue, unregistered API path, wrong method

is($mock->pending, 0, 'queue empty');

$r = request();
is($r->{status}, 500, 'empty queue: 500');
is(eval { $JSON->decode($r->{body}) }->{error}{code}, 'empty_queue',
   'empty queue: JSON error');

$mock->script({ text => 'unused' });

$r = request(path => '/v1/embeddings');
is($r->{status}, 404, 'unregistered API: 404');
like(eval { $JSON->decode($r->{body}) }->{error}{message},
     qr{^Invalid URL \(POST /v1/embeddings\)}, 'unregistered API: JSON error');

$r = request(method => 'GET', body => '');
is($r->{status}, 405, 'wrong method: 405');
is($mock->pending, 1, 'errors consumed no reply');

eval { $mock->script({ text => 'x', chunk => 5 }) };
like($@, qr/unknown reply key.*chunk/, 'script: mistyped key refused');

###############################################################################

# a given port; the child goes with stop, and with its parent

my $port = do {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                                  Listen => 1, ReuseAddr => 1);
    $s->sockport;
};

# a connection the test holds when the mock forks must close when the test
# closes it (a client-close test through nginx depends on it)
my $l = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                              Listen => 1, ReuseAddr => 1);
my $client = connect_port($l->sockport);
my $server = $l->accept;

my $m2 = Test::Agent::MockProvider->new(port => $port);
my $m2pid = $m2->pid;
is($m2->port, $port, 'explicit port');

close $client;
ok(IO::Select->new($server)->can_read(2) && !sysread($server, my $x, 1),
   'mock holds no socket of the test');

$m2->stop;
ok(!kill(0, $m2pid) && !connect_port($port), 'stop: child gone');

pipe(my $rd, my $wr) or die "pipe: $!";
my $pid = fork // die "fork: $!";

if ($pid == 0) {
    # _exit, never DESTROY: the mock must notice its parent died by itself
    close $rd;
    my $m = eval { Test::Agent::MockProvider->new };
    print $wr $m->port, "\n" if $m;
    close $wr;
    POSIX::_exit(0);
}

close $wr;
my $orphan = <$rd> // 0;
chomp $orphan;
waitpid($pid, 0);
ok($orphan, 'mock started in a child');

my $gone = 0;
for (1 .. 50) {
    last if $gone = !connect_port($orphan);
    sleep 0.05;
}
ok($gone, 'orphaned mock exits');

sub connect_port ($p) {
    return IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $p,
                                 Proto => 'tcp', Timeout => 1);
}

###############################################################################

# OpenAI Responses: named events, each with its type and sequence number
# first, items opened and closed around their deltas, byte for byte

sub rsp_request (%a) {
    return request(path => '/v1/responses',
                   body => { model => 'gpt-test', stream => JSON::PP::true,
                             instructions => 'Be brief.',
                             input => [{ role => 'user', content => 'hi' }],
                             store => JSON::PP::false, %{ $a{json} // {} } },
                   %a);
}

# (event name, decoded data) of each event; undef where the framing is off
sub rsp_events ($r) {
    return map {
        /\Aevent: ([\w.]+)\ndata: (\{.*\})\n\n\z/s
            ? [$1, $JSON->decode($2), $_] : [undef, undef, $_]
    } events($r);
}

$mock->reset;
$mock->script({ text => 'Hello world', chunks => 2,
                usage => { input_tokens => 21, output_tokens => 3 } });

$r = rsp_request();
$rec = $mock->requests->[0];

is($rec->{api}, 'openai_responses', 'responses: api recorded');
like($r->{headers}{'content-type'}, qr{^text/event-stream\b},
     'responses: event stream');
ok($r->{complete}, 'responses: proper end');

my @re = rsp_events($r);

is(scalar(grep { !defined $_->[0] } @re), 0,
   'responses: every event named, one data line');
is(scalar(grep { $_->[0] ne $_->[1]{type} } @re), 0,
   'responses: the name is the type');
is_deeply([map { $_->[1]{sequence_number} } @re], [0 .. $#re],
          'responses: sequence numbers');
ok(!grep({ $_->[2] !~ /\Aevent:[ ]\S+\ndata:[ ]\{"type":"[^"]+",
                        "sequence_number":\d+[,}]/x } @re),
   'responses: type and sequence_number first');
is_deeply([map { $_->[0] } @re],
          [qw(response.created response.in_progress
              response.output_item.added response.content_part.added
              response.output_text.delta response.output_text.delta
              response.output_text.done response.content_part.done
              response.output_item.done response.completed)],
          'responses: text events');

my $resp = $re[0][1]{response};
my $msg = $re[2][1]{item}{id};

like($resp->{id}, qr/^resp_[0-9a-f]{50}$/, 'responses: response id');
is_deeply([@$resp{qw(object status model instructions)}, $resp->{output}],
          ['response', 'in_progress', 'gpt-test', 'Be brief.', []],
          'responses: response object of the request');
ok(!$resp->{store}, 'responses: store as asked');
like($msg, qr/^msg_[0-9a-f]{50}$/, 'responses: message item id');

my ($pad) = $re[4][2] =~ /"obfuscation":"(\w+)"\}/;
is($re[4][2], 'event: response.output_text.delta' . "\n"
              . 'data: {"type":"response.output_text.delta",'
              . qq("sequence_number":4,"item_id":"$msg","output_index":0,)
              . '"content_index":0,"delta":"Hello ","logprobs":[],'
              . qq("obfuscation":"$pad"}\n\n),
   'responses: exact delta event');
is($re[8][2], 'event: response.output_item.done' . "\n"
              . 'data: {"type":"response.output_item.done",'
              . '"sequence_number":8,"output_index":0,"item":{'
              . qq("id":"$msg","type":"message","status":"completed",)
              . '"content":[{"type":"output_text","annotations":[],'
              . '"logprobs":[],"text":"Hello world"}],"role":"assistant"}}'
              . "\n\n",
   'responses: exact item done');

$resp = $re[-1][1]{response};
is($resp->{status}, 'completed', 'responses: completed');
is_deeply($resp->{output}, [$re[8][1]{item}], 'responses: output whole');
is_deeply($resp->{usage}, { input_tokens => 21, output_tokens => 3,
                            total_tokens => 24,
                            input_tokens_details => { cached_tokens => 0 },
                            output_tokens_details => { reasoning_tokens => 0 }
                          }, 'responses: usage');

# reasoning, a hosted search, text citing it, then a call in pieces

$mock->script({ reasoning => ['Think.', 'Then act.'],
                web_search => { query => 'q', url => 'https://e.org/' },
                text => 'Found.',
                tool_calls => [{ id => 'call_9', name => 'f',
                                 arguments => '{"a":1}', chunks => 3 }] });

@re = rsp_events(rsp_request(json => {
    include => ['reasoning.encrypted_content'] }));

my @done = map { $_->[1]{item} }
           grep { $_->[0] eq 'response.output_item.done' } @re;

is_deeply([map { $_->{type} } @done],
          [qw(reasoning web_search_call message function_call)],
          'responses: output items in order');
is_deeply([map { $_->{text} } @{ $done[0]{summary} }], ['Think.', 'Then act.'],
          'responses: summary parts');
like($done[0]{encrypted_content}, qr/^gAAAA/,
     'responses: encrypted content when included');
is(join('', map { $_->[1]{delta} } grep {
       $_->[0] eq 'response.reasoning_summary_text.delta'
   } @re), 'Think.Then act.', 'responses: summary deltas');
is_deeply([map { $_->[0] } grep { $_->[0] =~ /web_search_call\./ } @re],
          [map { "response.web_search_call.$_" }
               qw(in_progress searching completed)],
          'responses: web search progress');
is_deeply($done[1]{action}, { type => 'search', query => 'q' },
          'responses: the search action');
is($done[2]{content}[0]{annotations}[0]{url}, 'https://e.org/',
   'responses: the text cites it');

my @args = grep { $_->[0] eq 'response.function_call_arguments.delta' } @re;
is(scalar @args, 3, 'responses: arguments in 3 pieces');
is(join('', map { $_->[1]{delta} } @args), '{"a":1}',
   'responses: arguments reassembled');
is_deeply([@{ $done[3] }{qw(call_id name arguments status)}],
          ['call_9', 'f', '{"a":1}', 'completed'], 'responses: call item');

# errors after HTTP 200: the error event, or response.failed

$mock->script({ text => 'abcd', chunks => 4, error_after => 5 },
              { text => 'abcd', chunks => 4, error_after => 5,
                error => { event => 'response.failed',
                           message => 'The model failed.' } });

@re = rsp_events(rsp_request());
is(scalar @re, 6, 'responses error: 5 events then the error');
is($re[-1][2], 'event: error' . "\n"
               . 'data: {"type":"error","sequence_number":5,"error":{'
               . '"type":"server_error","code":null,"message":"The server '
               . 'had an error while processing your request. Sorry about'
               . ' that!","param":null}}' . "\n\n",
   'responses error: exact event');

@re = rsp_events(rsp_request());
is($re[-1][0], 'response.failed', 'responses failed: event');
is_deeply([@{ $re[-1][1]{response} }{qw(status error)}],
          ['failed', { code => 'server_error',
                       message => 'The model failed.' }],
          'responses failed: status and error');

# not streamed: the response object

$mock->script({ text => 'whole' });
$r = rsp_request(json => { stream => JSON::PP::false });
$resp = eval { $JSON->decode($r->{body}) } // {};
is_deeply([$resp->{object}, $resp->{status},
           $resp->{output}[0]{content}[0]{text}],
          ['response', 'completed', 'whole'], 'responses: non-streamed');

###############################################################################

# Anthropic Messages (/v1/messages): named events byte for byte, the ping
# with its padding, thinking, tool input pieces, a hosted web search with
# citations, and errors in Anthropic's shape before and after HTTP 200

sub anthropic (%a) {
    return request(path => '/v1/messages',
                   json => { model => 'claude-test', max_tokens => 1024,
                             %{ $a{json} // {} } },
                   headers => ['anthropic-version: 2023-06-01']);
}

sub named_events ($r) {
    return map { /^event: (\w+)\ndata: (\{.*\})\n\n\z/s
                 ? { event => $1, %{ $JSON->decode($2) } } : () } events($r);
}

$mock->reset;
$mock->script({ text => 'Hello world', chunks => 2, id => 'msg_01test',
                usage => { input_tokens => 25, output_tokens => 7 } });

$r = anthropic();
$rec = $mock->requests->[0];

is($r->{status}, 200, 'anthropic: 200');
like($r->{headers}{'content-type'}, qr{^text/event-stream\b},
     'anthropic: event stream');
like($r->{headers}{'request-id'}, qr/^req_/, 'anthropic: request-id');
is($rec->{api}, 'anthropic_messages', 'anthropic: api recorded');
is($rec->{headers}{'anthropic-version'}, '2023-06-01',
   'anthropic: version header recorded');

my $ae = sub ($type, $json) { return "event: $type\ndata: $json\n\n" };

is_deeply([events($r)], [
    $ae->(message_start => '{"type":"message_start","message":{'
          . '"id":"msg_01test","type":"message","role":"assistant",'
          . '"model":"claude-test","content":[],"stop_reason":null,'
          . '"stop_sequence":null,"usage":{"input_tokens":25,'
          . '"cache_creation_input_tokens":0,"cache_read_input_tokens":0,'
          . '"output_tokens":1}}}'),
    $ae->(content_block_start => '{"type":"content_block_start","index":0,'
          . '"content_block":{"type":"text","text":""}}'),
    "event: ping\ndata: {\"type\": \"ping\"}\n\n",
    (map { $ae->(content_block_delta => '{"type":"content_block_delta",'
                 . qq("index":0,"delta":{"type":"text_delta","text":"$_"}}))
         } 'Hello ', 'world'),
    $ae->(content_block_stop => '{"type":"content_block_stop","index":0}'),
    $ae->(message_delta => '{"type":"message_delta","delta":{'
          . '"stop_reason":"end_turn","stop_sequence":null},'
          . '"usage":{"output_tokens":7}}'),
    $ae->(message_stop => '{"type":"message_stop"}'),
], 'anthropic: exact events, one per HTTP chunk');

# thinking, then a tool call whose input comes in pieces

$mock->script({ thinking => 'Weather? Ask the tool.', signature => 'sig-1',
                chunks => 3,
                tool_calls => [{ id => 'toolu_1', name => 'get_weather',
                                 arguments => '{"city":"Paris"}' }] });

my @ae = named_events(anthropic());

is_deeply([map { $_->{content_block}{type} }
           grep { $_->{event} eq 'content_block_start' } @ae],
          ['thinking', 'tool_use'], 'anthropic: thinking, then tool_use');

my %by;
push @{ $by{ $_->{index} } }, $_->{delta}
    for grep { $_->{event} eq 'content_block_delta' } @ae;

is(join('', map { $_->{thinking} // '' } @{ $by{0} }),
   'Weather? Ask the tool.', 'anthropic: thinking deltas');
is_deeply($by{0}[-1], { type => 'signature_delta', signature => 'sig-1' },
          'anthropic: signature last');
is_deeply([map { $_->{partial_json} } @{ $by{1} }],
          ['', '{"city', '":"Pa', 'ris"}'],
          'anthropic: input in pieces after an empty one');
is($ae[-2]{delta}{stop_reason}, 'tool_use', 'anthropic: stop reason tool_use');

# a hosted web search, then text with its citations

$mock->script({ web_search => { id => 'srvtoolu_1', query => 'paris',
                                results => [{ url => 'https://x.test/',
                                              title => 'X' }],
                                citations => [{ url => 'https://x.test/',
                                                title => 'X',
                                                cited_text => 'Sunny' }] },
                text => 'Sunny.' });

@ae = named_events(anthropic());

my @starts = map { $_->{content_block} }
             grep { $_->{event} eq 'content_block_start' } @ae;
is_deeply([map { $_->{type} } @starts],
          [qw(server_tool_use web_search_tool_result text)],
          'anthropic: search, result, text');
is($starts[1]{tool_use_id}, 'srvtoolu_1', 'anthropic: result paired');
is($starts[1]{content}[0]{type}, 'web_search_result',
   'anthropic: results in the start block');
my @td = map { $_->{delta} } grep { ($_->{index} // -1) == 2
                                    && $_->{event} eq 'content_block_delta' }
                                  @ae;
is_deeply([map { $_->{type} } @td], ['citations_delta', 'text_delta'],
          'anthropic: citations before the text');
is($td[0]{citation}{cited_text}, 'Sunny', 'anthropic: citation');
is($ae[-2]{usage}{server_tool_use}{web_search_requests}, 1,
   'anthropic: search counted in usage');

# HTTP errors

$mock->script({ status => 429, retry_after => 3 }, { status => 529 });

$r = anthropic();
is($r->{status}, 429, 'anthropic error: status');
is($r->{headers}{'retry-after'}, 3, 'anthropic error: retry-after');
$e = eval { $JSON->decode($r->{body}) } // {};
is_deeply([$e->{type}, $e->{error}{type}],
          ['error', 'rate_limit_error'], 'anthropic error: body');

$r = anthropic();
is_deeply([$r->{status},
           eval { $JSON->decode($r->{body})->{error}{type} }],
          [529, 'overloaded_error'], 'anthropic error: 529 overloaded');

# error after HTTP 200: an error event, then a proper end

$mock->script({ text => 'abcd', chunks => 4, error_after => 4 });

$r = anthropic();
@ev = events($r);
is(scalar @ev, 5, 'anthropic mid-stream error: 4 events, then the error');
is($ev[-1], "event: error\ndata: {\"type\":\"error\",\"error\":"
            . "{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
   'anthropic mid-stream error: exact event');
ok($r->{complete} && !grep({ /message_stop/ } @ev),
   'anthropic mid-stream error: ended, no message_stop');

# not streamed: a Message object

$mock->script({ thinking => 'T', signature => 's', text => 'whole' });
$r = anthropic(json => { stream => JSON::PP::false });
$c = eval { $JSON->decode($r->{body}) } // {};
is_deeply([$c->{type}, $c->{stop_reason}, $c->{content}],
          ['message', 'end_turn',
           [{ type => 'thinking', thinking => 'T', signature => 's' },
            { type => 'text', text => 'whole' }]],
          'anthropic non-stream: a message with its blocks');

done_testing();
