package Test::Agent::Engine;

# What the conversation tests share: an nginx.conf with one agent whose
# provider is the mock, and calls of the conversation API.
#
#   my $t = Test::Agent->new;
#   my $mock = Test::Agent::MockProvider->new;
#   $t->write_file_expand('nginx.conf', engine_conf($mock));
#   $t->run;
#   my $r = send_message($t, 'c1', 'hello');
#   my $c = wait_state($t, 'c1', 'idle');

use strict;
use warnings;

use Exporter qw(import);
use File::Temp qw(tempfile);
use IO::Select;
use JSON::PP;
use Test::More ();
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Store;
use Test::Agent::SSE;

our @EXPORT = qw(engine_conf send_message send_message_later inspect
                 events_stream store_node
                 wait_state wait_pending wait_recorded lease_of
                 log_types events_request resolve cancel owner_request
                 metric echo_calls held_calls store_engine store_backlog
                 store_stop worker_pids worker_connection promtool
                 promtool_ok
                 $ECHO_TOOL $ECHO_LOCATION $METRICS_LOCATION
                 $WORKERS_SERVER);

# a server tool "echo" (for tools), and its location (for server), which
# answers {"args": the arguments it got}

our $ECHO_TOOL = <<'EOF';
    agent_tool echo {
        description "Echoes what it got";
        parameters '{"type":"object","properties":{"n":{"type":"integer"}}}';
        location /tools/echo;
    }
EOF

our $ECHO_LOCATION = <<'EOF';
        location = /tools/echo {
            internal;
            default_type application/json;
            return 200 '{"args":$request_body}';
        }
EOF

# a reply's tool calls: n calls of echo with no arguments, c1 to cn

sub echo_calls {
    my ($n) = @_;
    return [ map { { id => "c$_", name => 'echo', arguments => '{}' } }
             1 .. $n ];
}

# the mock's reply of the tests of many calls: n calls of echo, held
# after their first event until released; "done" once the tool results
# come; $other->($last message) first, for a reply of the test's own

sub held_calls {
    my ($n, $other) = @_;

    return sub {
        my ($req) = @_;
        my $msgs = $req->{json}{messages} || [];
        my $last = $msgs->[-1] || {};

        return { text => 'done' } if ($last->{role} // '') eq 'tool';

        my $reply = $other ? $other->($last) : undef;

        return $reply // { pause_after => 1, tool_calls => echo_calls($n) };
    };
}

# for server: agent_metrics at /metrics

our $METRICS_LOCATION = <<'EOF';
        location = /metrics {
            agent_metrics;
        }
EOF

# for server: port 8081, whose connections reuseport spreads over the
# workers, each answer naming its worker in X-Worker; agent_metrics there

our $WORKERS_SERVER = <<'EOF';
        listen 127.0.0.1:%%PORT_8081%% reuseport;
        add_header X-Worker $pid always;

        location = /metrics {
            agent_metrics;
        }
EOF

# %opts: workers, zone (size), http (more http-level lines), server (more
# server-level lines), provider (lines in the provider location), agent
# (more lines in the agent block), tools (agent_tool blocks), adapter (the
# agent's provider adapter, which also picks the mock's API path)

my %API_PATH = (
    openai_chat      => '/v1/chat/completions',
    openai_responses => '/v1/responses',
    anthropic_messages => '/v1/messages',
);

sub engine_conf {
    my ($mock, %opts) = @_;

    my $workers = $opts{workers} // 1;
    my $port = $mock->port;
    my $http = $opts{http} // '';
    my $server = $opts{server} // '';
    my $provider = $opts{provider} // '';
    my $agent = $opts{agent} // '';
    my $tools = $opts{tools} // '';
    my $zone = $opts{zone} // '1m';
    my $adapter = $opts{adapter} // 'openai_chat';
    my $path = $API_PATH{$adapter} // die "unknown adapter $adapter";

    return <<"EOF";
%%TEST_GLOBALS%%

worker_processes $workers;

events {
}

http {
    %%TEST_GLOBALS_HTTP%%

    agent_zone zone=agents:$zone;
    $http

    $tools

    agent chat {
        provider $adapter /internal/llm;
        model gpt-test;
        system "You are terse.";
        retry attempts=3 base=50ms cap=200ms;
        $agent
    }

    server {
        listen 127.0.0.1:%%PORT_8080%%;

        location ~ ^/c/(?<cid>[^/]+)/messages\$ {
            agent chat;
            agent_conversation \$cid;
            agent_message;
        }

        location ~ ^/c/(?<cid>[^/]+)/events\$ {
            agent chat;
            agent_conversation \$cid;
            agent_events;
        }

        location ~ ^/c/(?<cid>[^/]+)/cancel\$ {
            agent chat;
            agent_conversation \$cid;
            agent_cancel;
        }

        location ~ ^/c/(?<cid>[^/]+)/calls/(?<tcid>[^/]+)\$ {
            agent chat;
            agent_conversation \$cid;
            agent_tool_call \$tcid;
            agent_resolve;
        }

        location ~ ^/c/(?<cid>[^/]+)\$ {
            agent chat;
            agent_conversation \$cid;
            agent_inspect;
        }

        location = /internal/llm {
            internal;
            proxy_pass http://127.0.0.1:$port$path;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            $provider
        }

        $server
    }
}
EOF
}

sub send_message {
    my ($t, $cid, $content, %opts) = @_;

    my $body = exists $opts{body} ? $opts{body}
        : encode_json({ content => $content,
                        $opts{source_id} ? (source_id => $opts{source_id})
                                         : () });

    my $r = http_post("/c/$cid/messages", $body, port => $t->port(8080),
                      headers => { 'Content-Type' => 'application/json',
                                   %{$opts{headers} || {}} },
                      $opts{timeout} ? (timeout => $opts{timeout}) : ());

    $r->{json} = eval { decode_json($r->{body}) } if $r;
    return $r;
}

# POST a message, its answer read later from the connection returned
# (http_status)

sub send_message_later {
    my ($t, $cid, $content) = @_;

    my $s = Test::Agent::HTTP::connect_to($t->port(8080));
    print $s http_request('POST', "/c/$cid/messages",
                          encode_json({ content => $content }),
                          headers => { 'Content-Type' => 'application/json' });
    return $s;
}

# POST a resolution of a pending call; body is a Perl structure or, with
# raw => 1, bytes

sub resolve {
    my ($t, $cid, $tcid, $body, %opts) = @_;

    $body = encode_json($body) unless $opts{raw};

    my $r = http_post("/c/$cid/calls/$tcid", $body, port => $t->port(8080),
                      headers => { 'Content-Type' => 'application/json' });

    $r->{json} = eval { decode_json($r->{body}) } if $r;
    return $r;
}

sub cancel {
    my ($t, $cid) = @_;

    my $r = http_post("/c/$cid/cancel", '', port => $t->port(8080));
    $r->{json} = eval { decode_json($r->{body}) } if $r;
    return $r;
}

# a request on port 8080 as an owner, named in X-User (undef: none), its
# answer with the JSON body decoded

sub owner_request {
    my ($t, $user, $method, $uri, $body) = @_;

    my %h = defined $user ? ('X-User' => $user) : ();
    $h{'Content-Type'} = 'application/json' if defined $body;

    my $r = http(http_request($method, $uri, $body, headers => \%h),
                 port => $t->port(8080));
    $r->{json} = eval { decode_json($r->{body}) };
    return $r;
}

sub inspect {
    my ($t, $cid, $args) = @_;

    my $r = http_get("/c/$cid" . ($args ? "?$args" : ''),
                     port => $t->port(8080));
    $r->{json} = eval { decode_json($r->{body}) } if $r;
    return $r;
}

# the pid of the worker that holds the conversation's turn, polled for
# two seconds; undef if none does

sub lease_of {
    my ($t, $cid) = @_;

    for (1 .. 100) {
        my $c = inspect($t, $cid)->{json};
        return $c->{lease} if $c && $c->{lease};
        select undef, undef, undef, 0.02;
    }

    return undef;
}

# polls inspect until the conversation is in the state with no turn
# running; returns its JSON (the last seen, if the state never came)

sub wait_state {
    my ($t, $cid, $state, $timeout) = @_;

    my $deadline = time + ($timeout // 10);
    my $c;

    while (time < $deadline) {
        my $r = inspect($t, $cid);
        $c = $r->{json} if $r && $r->{status} == 200;
        return $c if $c && $c->{state} eq $state && !defined $c->{lease};
        sleep 0.05;
    }

    return $c;
}

# polls inspect until the conversation's log has a user_msg: the
# message is in the zone, where the store's next batch, or the one in
# flight at its end, takes it from; true once it has

sub wait_recorded {
    my ($t, $cid, $timeout) = @_;

    my $deadline = time + ($timeout // 10);

    while (time < $deadline) {
        my $r = inspect($t, $cid);
        my $c = $r && $r->{status} == 200 ? $r->{json} : undef;

        return 1 if $c && grep { ($_->{type} // '') eq 'user_msg' }
                                @{$c->{messages} || []};
        sleep 0.05;
    }

    return 0;
}

# polls inspect until a call waits for input of kind $kind, whether or
# not a turn runs (a running MCP call's question); returns the JSON and
# that pending call (undef if none came), and checks $also if given

sub wait_pending {
    my ($t, $cid, $kind, $also) = @_;

    my $deadline = time + 10;

    while (time < $deadline) {
        my $c = inspect($t, $cid)->{json} // {};
        my ($p) = grep { $_->{kind} eq $kind } @{$c->{pending} // []};
        return ($c, $p) if $p && (!$also || $also->());
        sleep 0.05;
    }

    return ({}, undef);
}

sub log_types {
    my ($c) = @_;
    return join ' ', map { $_->{type} } @{$c->{messages}};
}

sub events_request {
    my ($cid, %headers) = @_;

    my $req = "GET /c/$cid/events HTTP/1.1\r\nHost: localhost\r\n";
    $req .= "$_: $headers{$_}\r\n" for sort keys %headers;
    return $req . "\r\n";
}

# agent_events of a conversation opened on port 8080, its head read: a
# Test::Agent::SSE

sub events_stream {
    my ($t, $cid, %headers) = @_;

    my $s = Test::Agent::HTTP::connect_to($t->port(8080));
    print $s events_request($cid, %headers);

    my $sse = Test::Agent::SSE->new(bless {
        sock => $s, sel => IO::Select->new($s), buf => '', eof => 0,
        started => time }, 'Test::Agent::HTTP::Stream');
    $sse->stream->read_head(10) or die "no head\n";
    return $sse;
}

# an nginx node (agent_node id, two workers, heartbeat 500ms, ttl 2s) on
# a PostgreSQL store, its nginx -t checked, running: ($t, its address);
# %opts go to engine_conf, http's after the store's

sub store_node {
    my ($mock, $conninfo, $id, %opts) = @_;

    my $t = Test::Agent->new;
    my $addr = '127.0.0.1:' . $t->port(8080);

    $t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
        %opts,
        http => "agent_store \"$conninfo\";\n"
                . "    agent_node id=$id addr=$addr heartbeat=500ms"
                . " ttl=2s;\n    " . ($opts{http} // '')));
    my ($rc, $out) = $t->test_config;
    Test::More::is($rc, 0, "nginx -t of node $id") or Test::More::diag($out);

    $t->run;
    return ($t, $addr);
}

# a series of agent_metrics on port 8080 (/metrics), its labelled series
# summed; -1 if there is none

sub metric {
    my ($t, $name) = @_;

    my $r = http_get('/metrics', port => $t->port(8080));
    my @v = ($r && $r->{body} // '') =~ /^\Q$name\E(?:\{[^}]*\})? (\d+)$/mg;

    my $sum = 0;
    $sum += $_ for @v;

    return @v ? $sum : -1;
}

# promtool's path, or '' if it is not installed

sub promtool {
    my $promtool = `sh -c 'command -v promtool' 2>/dev/null`;
    chomp $promtool;
    return $promtool;
}

# promtool check metrics on an exposition: (it passed, what it said)

sub promtool_ok {
    my ($body) = @_;

    my $promtool = promtool();
    my ($fh, $file) = tempfile(UNLINK => 1);
    print $fh $body;
    close $fh;
    my $out = `'$promtool' check metrics < '$file' 2>&1`;
    return ($? == 0, $out);
}

# nginx run with one worker, an agent with the echo tool, agent_metrics
# and a store (agent.db in the test's directory; store: agent_store's
# options, zone: the zone's size): ($t, $db, $path)

sub store_engine {
    my ($mock, %o) = @_;

    my $t = Test::Agent->new;
    my $path = $t->testdir . '/agent.db';
    my $opts = $o{store} ? " $o{store}" : '';

    my $workers = $o{workers} // 1;
    my $conf = engine_conf($mock, workers => $workers,
        zone => $o{zone} // '32m', http => "agent_store $path$opts;",
        tools => $ECHO_TOOL, agent => 'tools echo;',
        server => $ECHO_LOCATION
                  . ($workers > 1 ? $WORKERS_SERVER : $METRICS_LOCATION));

    # debug => 1: every worker's debug log in debug.log (if nginx has
    # it); or the level, debug_event for the event loop's lines alone

    if ($o{debug}) {
        my $log = $t->testdir . '/debug.log';
        my $level = $o{debug} eq '1' ? 'debug' : $o{debug};
        $conf =~ s/(%%TEST_GLOBALS%%\n)/$1error_log $log $level;\n/;
    }

    $t->write_file_expand('nginx.conf', $conf);
    $t->run;

    return ($t, Test::Agent::Store->new($path), $path);
}

# with $WORKERS_SERVER: the pids of the n workers (2 unless told), from
# the answers of new connections to port 8081

sub worker_pids {
    my ($t, $n) = @_;
    my %pids;

    $n //= 2;

    for (1 .. 200) {
        my $s = worker_connection($t);
        last unless $s;
        $pids{${*$s}{worker}} = 1;
        close $s;
        last if keys %pids == $n;
    }

    return sort { $a <=> $b } keys %pids;
}

# with $WORKERS_SERVER: a connection to port 8081 that worker $pid (any,
# if undef) accepted, its first answer read: new connections until one
# is (reuseport spreads them by their ports); undef if none was

sub worker_connection {
    my ($t, $pid) = @_;

    for (1 .. 200) {
        my $s = Test::Agent::HTTP::connect_to($t->port(8081));

        print $s "HEAD /worker HTTP/1.1\r\nHost: localhost\r\n\r\n";

        my $head = '';
        my $sel = IO::Select->new($s);

        while ($head !~ /\r\n\r\n/ && $sel->can_read(5)) {
            sysread($s, $head, 4096, length $head) or last;
        }

        my ($worker) = $head =~ /^X-Worker: (\d+)/mi;

        if (defined $worker && (!defined $pid || $worker == $pid)) {
            ${*$s}{worker} = $worker;
            return $s;
        }

        close $s;
    }

    return undef;
}

# the end of a store_engine() test: nothing left to write, nginx and the
# mock stopped, no alert logged; the error log

sub store_stop {
    my ($t, $mock) = @_;

    Test::More::is(metric($t, 'agent_store_lag_events'), 0,
                   'nothing waits for the store');

    $t->stop;
    $mock->stop;

    my $log = $t->read_file('error.log');

    Test::More::unlike($log, qr/\[(alert|emerg)\]/, 'no alert in error.log');

    return $log;
}

# a backlog for a store_engine() with the held_calls() mock: the turns
# of w1 and w2 record their events while another process holds the
# database's lock, which it keeps; the number of events that wait

sub store_backlog {
    my ($t, $mock, $db, $calls) = @_;

    Test::More::is(send_message($t, $_, 'question')->{status}, 202,
                   "$_: acknowledged") for qw(w1 w2);

    Test::More::ok($mock->wait_paused($_, 10), "the model's reply to w"
                   . ($_ + 1) . ' under way') for 0, 1;

    Test::More::is(metric($t, 'agent_store_lag_events'), 0,
                   'nothing waits for the store');

    Test::More::ok($db->lock, 'the database is locked by another process');

    $mock->release;

    wait_state($t, $_, 'idle', 30) for qw(w1 w2);

    my $events = 2 * (2 * $calls + 3);

    Test::More::is(metric($t, 'agent_store_lag_events'), $events,
                   "the two turns' $events events wait for the store");

    return $events;
}

1;
