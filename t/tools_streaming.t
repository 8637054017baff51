#!/usr/bin/perl

# Streaming server tools: the tool's location answers NDJSON, one JSON
# object per line.  {"progress": ...} lines become tool_progress live
# events as they arrive, never logged; the {"result": ...} line (or
# {"error": "..."}) is the call's result.  A stream that ends without a
# result line, a line that is not JSON, a line over 1 MiB and a status
# other than 2xx are error results.
#
# The tool backend is the mock provider sending raw chunks: each chunk
# is passed on as it comes (proxy_buffering off), with delays between.

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
use Test::Agent::SSE;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mport = $mock->port;

my $tools = <<'EOF';
    agent_tool build {
        description "Builds the project, reporting progress";
        streaming on;
        location /tools/build;
    }
EOF

my $server = <<"EOF";
        location = /tools/build {
            internal;
            proxy_pass http://127.0.0.1:$mport/tools/v1/chat/completions;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_read_timeout 5s;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, tools => $tools,
    agent => 'tools build; max_model_calls 3;', server => $server));
$t->run;

my $port = $t->port(8080);

sub call {
    my ($id, $args) = @_;
    return { tool_calls => [{ id => $id, name => 'build',
                              arguments => $args // '{}' }] };
}

sub events_of {
    my ($c, $type) = @_;
    return grep { $_->{type} eq $type } @{($c || {})->{messages} || []};
}

sub json_of { my $d = eval { decode_json($_[0]{data} // '') }; $d // {} }

# a turn with one streaming call answered by the raw chunks given; the
# conversation when it is idle again

sub run_tool {
    my ($cid, $chunks, %reply) = @_;

    $mock->reset;
    $mock->script(call("${cid}_1"),
                  { ($chunks ? (raw => $chunks) : ()), %reply },
                  { text => 'Done.' });

    send_message($t, $cid, 'build it');
    return wait_state($t, $cid, 'idle');
}

sub result_of {
    my ($c) = @_;
    my @r = events_of($c, 'tool_result');
    return @r == 1 ? $r[0] : undef;
}

# progress before the result, as a subscriber sees it; a line split over
# chunks, CR LF, an empty line and an object of no known member are taken.
# The tool's answer is held before it starts until the subscriber has the
# call, and after its first line until that line's progress has come.

$mock->script(call('p1', '{"target":"all"}'),
              { pause_after => [0, 1], delay => 0.3,
                raw => ["{\"progress\":{\"step\":1,\"of\":3}}\n",
                        '{"progress":{"step":2,',
                        "\"of\":3}}\r\n",
                        "\n{\"keepalive\":true}\n{\"progress\":\"linking\"}\n",
                        "{\"result\":{\"ok\":\"built\","
                        . "\"log\":\"line 1\\nline 2\"}}\n"] },
              { text => 'Built.' });

my $r = send_message($t, 's1', 'build it');
is($r->{status}, 202, 'message accepted');

my $sse = Test::Agent::SSE->new(http_stream(events_request('s1'),
                                            port => $port));
is($sse->stream->status, 200, 'subscribed');

sub seen_until {
    my ($type) = @_;
    return grep { defined $_->{event} }
           $sse->events_until(sub { ($_[0]{event} // '') eq $type }, 15);
}

my @seen = seen_until('tool_call');
ok($mock->wait_paused(1, 10), 'the tool\'s answer held before it starts');
$mock->release(1);

push @seen, seen_until('tool_progress');
my $early = $mock->wait_paused(1, 10)
            && !grep { $_->{event} eq 'tool_result' } @seen;
$mock->release(1);

push @seen, seen_until('turn_completed');
$sse->stream->close;

my @progress = grep { $_->{event} eq 'tool_progress' } @seen;
my ($result) = grep { $_->{event} eq 'tool_result' } @seen;

is(scalar @progress, 3, 'three progress events');
is_deeply([map { json_of($_)->{progress} } @progress],
          [{ step => 1, of => 3 }, { step => 2, of => 3 }, 'linking'],
          'each with its progress, in order');
is_deeply([map { json_of($_)->{tool_call_id} } @progress],
          [('p1') x 3], 'naming the call');
is_deeply([map { json_of($_)->{name} } @progress], [('build') x 3],
          'and the tool');
ok(!grep({ defined $_->{id} } @progress), 'progress is live (no seq)');

ok($result, 'then the result');
ok(@progress && $result && $progress[-1]{t} <= $result->{t},
   'every progress event before the result');
ok($early, 'the first progress arrived while the tool still ran');

my $c = wait_state($t, 's1', 'idle');

is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'progress is not logged');
my $res = result_of($c);
ok($res && $res->{ok}, 'the result is ok');
is_deeply($res && $res->{result}, { ok => 'built',
                                    log => "line 1\nline 2" },
          'the result line\'s value');

my $tool_req = $mock->requests->[1];
is($tool_req->{body}, '{"target":"all"}', 'the tool got its arguments');
is($tool_req->{headers}{'idempotency-key'}, 'p1', 'and the call id');

my @sent = @{$mock->requests->[2]{json}{messages} || []};
my ($tool_msg) = grep { $_->{role} eq 'tool' } @sent;
is($tool_msg && $tool_msg->{tool_call_id}, 'p1',
   'the next model call gets the result');
is_deeply($tool_msg && eval { decode_json($tool_msg->{content}) },
          { ok => JSON::PP::true,
            result => { ok => 'built', log => "line 1\nline 2" } },
          'as {"ok":true,"result":...}');

# the stream ends without a result line

$c = run_tool('s2', ["{\"progress\":1}\n", "{\"progress\":2}\n"]);
$res = result_of($c);
ok($res && !$res->{ok}, 'no result line: an error result');
is($res && $res->{error}, 'the tool ended without a result line',
   'no result line: the error');
is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
   . 'assistant_msg turn_completed', 'no result line: the turn went on');

# an error line

$c = run_tool('s3', ["{\"progress\":1}\n{\"error\":\"disk full\"}\n",
                     "{\"result\":\"too late\"}\n"]);
$res = result_of($c);
ok($res && !$res->{ok}, 'error line: an error result');
is($res && $res->{error}, 'disk full', 'error line: its text');

# the result line may be the last bytes, without LF

$c = run_tool('s4', ["{\"progress\":1}\n", '{"result":[1,2,', '3]}']);
$res = result_of($c);
ok($res && $res->{ok}, 'last line without LF: a result');
is_deeply($res && $res->{result}, [1, 2, 3], 'last line without LF: value');

# a line that is not a JSON object

$c = run_tool('s5', ["{\"progress\":1}\n", "Building...\n",
                     "{\"result\":1}\n"]);
$res = result_of($c);
is($res && $res->{error}, 'the tool\'s output line is not a JSON object',
   'not JSON: an error result');

# a line over 1 MiB, in pieces

$c = run_tool('s6', ['{"progress":"', ('x' x 300000) x 4, "\"}\n",
                     "{\"result\":1}\n"]);
$res = result_of($c);
is($res && $res->{error}, 'the tool\'s output line is too large',
   'a line over 1 MiB: an error result');

# a status other than 2xx, whatever the body: its body goes with it

my $busy = 'the tool failed: its location answered 503: '
           . "{\"progress\":1}\n{\"result\":\"queue full\"}";

$c = run_tool('s7', undef, status => 503,
              body => "{\"progress\":1}\n{\"result\":\"queue full\"}\n");
$res = result_of($c);
is($res && $res->{error}, $busy, 'a 503: an error result with the body');
($tool_msg) = grep { $_->{role} eq 'tool' }
                   @{$mock->requests->[2]{json}{messages} || []};
is_deeply($tool_msg && eval { decode_json($tool_msg->{content}) },
          { ok => JSON::PP::false, error => $busy },
          'a 503: the model sees the body');

$mock->stop;
$t->done;
