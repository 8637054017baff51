#!/usr/bin/perl

# Every HTTP method with every kind of hostile body, to every kind of
# location the module provides: agent_message, agent_events,
# agent_cancel, agent_resolve, agent_inspect, agent_list, agent_create,
# agent_describe, agent_zone_status, agent_metrics, agent_aisdk (its
# POST and its resume URL) and agent_agui.  Each request gets a whole
# answer: a 2xx where the request is one the location takes, else the
# module's JSON error (405 with Allow for a method it does not take);
# never a 5xx, an alert in the error log, or a worker that dies.  And
# nothing changes: the conversation, the zone's count, the store and the
# provider are as they were.  Hostile conversation ids on the AI SDK
# location and in a captured path get 400 invalid_conversation, once.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan skip_all => 'sqlite3 is not installed' unless Test::Agent::Store->available;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'hello there' };
});

my $db = $t->testdir . '/agent.db';
my $store = Test::Agent::Store->new($db);

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    zone => '8m',
    http => "agent_store $db;\n"
        . "client_body_buffer_size 64k; client_max_body_size 16k;\n",
    server => <<'EOF'));
        location = /metrics {
            agent_metrics;
        }

        location = /zone {
            agent_zone_status;
        }

        location = /describe {
            agent chat;
            agent_describe;
        }

        location = /list {
            agent chat;
            agent_list;
        }

        location = /conversations {
            agent chat;
            agent_create;
        }

        location /aisdk {
            agent chat;
            agent_aisdk;
        }

        location = /agui {
            agent chat;
            agent_agui;
        }
EOF
$t->run;

my $port = $t->port(8080);

# a conversation with one turn, which nothing below may change

my $r = send_message($t, 'c1', 'hello');
is($r && $r->{status}, 202, 'a first message');
my $before = wait_state($t, 'c1', 'idle');
is(log_types($before), 'user_msg assistant_msg turn_completed',
   'its turn completed');

my %count;

# the store's events: the three of the turn, once written behind

sub snapshot {
    my $zone = decode_json(http_get('/zone', port => $port)->{body});
    $store->wait_sql('SELECT count(*) FROM events', qr/^3$/, 5);

    return {
        inspect => inspect($t, 'c1')->{body},
        conversations => $zone->{conversations},
        events => $store->sql('SELECT count(*) FROM events'),
        model_calls => scalar @{$mock->requests},
    };
}

my $snap = snapshot();

# one request on its own connection; the answer read until the server
# closes it, or only up to its header for a stream

sub request {
    my ($method, $uri, $body, %h) = @_;

    my $s = Test::Agent::HTTP::connect_to($port);
    my $req = "$method $uri HTTP/1.1\r\nHost: localhost\r\n"
        . "Connection: close\r\n";

    $req .= "$_: $h{$_}\r\n" for sort keys %h;

    if (defined $body) {
        $req .= "Content-Type: application/json\r\n"
            . "Content-Length: " . length($body) . "\r\n";
    }

    $req .= "\r\n" . ($body // '');

    # a server may answer and close before the body is all written
    local $SIG{PIPE} = 'IGNORE';
    syswrite($s, $req);

    my $sel = IO::Select->new($s);
    my $deadline = time + 10;
    my $raw = '';

    while (time < $deadline) {
        last if $raw =~ /\r\n\r\n/
                && $raw =~ m{\r\ncontent-type: text/event-stream}i;
        next unless $sel->can_read($deadline - time);
        my $n = sysread($s, my $buf, 65536);
        last unless $n;
        $raw .= $buf;
    }

    close $s;

    return Test::Agent::HTTP::parse_response($raw);
}

my $log_at = length $t->read_file('error.log');

# the error log's lines since the last call that are alerts or worse

sub new_alerts {
    my $log = $t->read_file('error.log');
    my $new = substr($log, $log_at);
    $log_at = length $log;
    return join "\n", grep { /\[(alert|crit|emerg)\]/ } split /\n/, $new;
}

# the answer is a clear one: a status with no 5xx; an error is the
# module's JSON with a code; 405 names what the location takes

sub check_answer {
    my ($r, $method, $name) = @_;

    ok($r && $r->{status} =~ /^[1-4]\d\d$/, "$name: answered, no 5xx")
        or diag($r ? "status $r->{status}: $r->{body}" : 'no answer');
    return unless $r;

    is(new_alerts(), '', "$name: no alert");

    return if $r->{status} < 400;

    like($r->{headers}{'content-type'} // '', qr{^application/json},
         "$name: a JSON error");

    if ($method ne 'HEAD') {
        my $j = eval { decode_json($r->{body}) } // {};
        like($j->{error}{code} // '', qr/^[a-z_]+$/, "$name: its code")
            or diag($r->{body});
    }

    like($r->{headers}{allow} // '', qr/^[A-Z, ]+$/, "$name: Allow")
        if $r->{status} == 405;
}

my %bodies = (
    none => undef,
    empty => '',
    invalid => '{"content": "unfinished',
    deep => ('[' x 3000) . (']' x 3000),
    non_utf8 => qq({"content":"caf\xe9 \xff\xfe","id":"c1",)
        . qq("messages":[{"role":"user","content":"\xc3\x28"}]}),
    oversized => '{"content":"' . ('a' x 20000) . '"}',
);

my @methods = qw(GET HEAD POST PUT DELETE OPTIONS PATCH);

my @uris = qw(/c/c1/messages /c/c1/events /c/c1/cancel /c/c1/calls/call_1
              /c/c1 /metrics /zone /describe /list /conversations
              /aisdk /aisdk/c1/stream /agui);

my @workers = $t->worker_pids;
is(scalar @workers, 2, 'two workers');

my $created = 0;

for my $uri (@uris) {
    for my $method (@methods) {
        for my $kind (sort keys %bodies) {
            my $name = "$method $uri, body $kind";
            my $r = request($method, $uri, $bodies{$kind});

            check_answer($r, $method, $name);

            $created++ if $r && $uri eq '/conversations'
                          && $r->{status} == 201;
        }
    }

    is_deeply([$t->worker_pids], \@workers, "$uri: no worker died");
}

# hostile conversation ids: too long, with CRLF, with quotes and spaces,
# none at all; in the AI SDK's body and resume URL, and in a path that
# a location captures

my $long = 'a' x 65;
my $msg = '[{"id":"m1","role":"user","parts":[{"type":"text","text":"hi"}]}]';

my @ids = (
    [ 'POST', '/aisdk', qq({"id":"$long","messages":$msg}) ],
    [ 'POST', '/aisdk', qq({"id":"a\\r\\nb","messages":$msg}) ],
    [ 'POST', '/aisdk', qq({"messages":$msg}) ],
    [ 'POST', '/aisdk', qq({"id":"","messages":$msg}) ],
    [ 'GET', '/aisdk/a%20b%22c/stream' ],
    [ 'GET', "/aisdk/$long/stream" ],
    [ 'GET', '/aisdk/a%0D%0Ab/stream' ],
    [ 'POST', '/c/a%0D%0Ab/messages', '{"content":"hi"}' ],
    [ 'POST', "/c/$long/messages", '{"content":"hi"}' ],
    [ 'GET', '/c/a%22b' ],
);

for (1 .. 3) {
    for my $case (@ids) {
        my ($method, $uri, $body) = @$case;
        my $name = "$method $uri" . ($body ? " $body" : '');
        my $r = request($method, $uri, $body);

        is($r && $r->{status}, 400, "$name: 400");
        my $j = eval { decode_json($r->{body}) } // {};
        is($j->{error}{code} // '', 'invalid_conversation',
           "$name: invalid_conversation");
        is(new_alerts(), '', "$name: no alert");
    }
}

is_deeply([$t->worker_pids], \@workers, 'no worker died');

# nothing changed but the conversations agent_create minted

my $after = snapshot();

is($after->{inspect}, $snap->{inspect}, 'the conversation is as it was');
is($after->{events}, $snap->{events}, 'the store holds the same events');
is($after->{model_calls}, $snap->{model_calls}, 'no model call');
is($after->{conversations}, $snap->{conversations} + $created,
   'the zone holds the same conversations, and those created');

# and it still works

$r = send_message($t, 'c1', 'again');
is($r && $r->{status}, 202, 'a message after all that');
is(log_types(wait_state($t, 'c1', 'idle')),
   'user_msg assistant_msg turn_completed user_msg assistant_msg '
   . 'turn_completed', 'and its turn');

$t->done;
