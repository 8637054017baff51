#!/usr/bin/perl

# The harness's stream reader and SSE parser against a provider stream
# proxied by nginx with the module loaded, the way turns will reach the
# provider: pieces arrive as the provider sends them, each stamped with
# its arrival time.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::SSE;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

$t->write_file_expand('nginx.conf', <<"EOF");
%%TEST_GLOBALS%%

events {
}

http {
    %%TEST_GLOBALS_HTTP%%

    server {
        listen 127.0.0.1:%%PORT_8080%%;

        location /v1/ {
            proxy_pass http://127.0.0.1:${\ $mock->port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
}
EOF

$t->run;

my $port = $t->port(8080);
my $body = encode_json({ model => 'gpt-test', stream => JSON::PP::true,
                         messages => [{ role => 'user', content => 'hi' }] });

sub completion {
    return http_stream(http_request('POST', '/v1/chat/completions', $body,
        headers => { 'Content-Type' => 'application/json' }),
        port => $port);
}

$mock->script({ text => 'one two three four', chunks => 4, delay => 0.3 });

my $sse = Test::Agent::SSE->new(completion());
is($sse->stream->status, 200, 'stream status');
like($sse->stream->header('content-type'), qr{^text/event-stream},
     'stream content type');

my @events = $sse->events_until(sub { $_[0]{data} eq '[DONE]' }, 10);
is($events[-1]{data}, '[DONE]', 'stream ends with [DONE]');

my @content = map { decode_json($_->{data})->{choices}[0]{delta}{content} }
    grep { $_->{data} ne '[DONE]' } @events;
is(join('', grep { defined } @content), 'one two three four',
   'text reassembled from the deltas');

my $spread = $events[-1]{t} - $events[0]{t};
cmp_ok($spread, '>=', 1.2,
       'events arrived as they were sent, not at the end');

# a client that goes away mid-stream: nginx closes the upstream and the
# mock notices

$mock->script({ text => 'a b c d e f', chunks => 6, delay => 0.5 });

my $s = completion();
ok($s->next_chunk(5), 'first piece of the second stream');
$s->close;

ok($mock->wait_closed(1, 10), 'provider saw the connection close');

# the harness parses heartbeats and multi-line data

$mock->script({ raw => [": keepalive\n\n", "id: 7\nevent: x\ndata: a\n",
                        "data: b\n\n"] });

$sse = Test::Agent::SSE->new(completion());
my $e = $sse->next_event(5);
is($e->{comment}, ' keepalive', 'comment line read as a heartbeat');
$e = $sse->next_event(5);
is_deeply([@$e{qw(id event data)}], ['7', 'x', "a\nb"],
          'event split across chunks, with id, type and two data lines');

$mock->stop;
$t->done;
