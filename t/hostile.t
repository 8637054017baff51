#!/usr/bin/perl

# Hostile input from providers, tools and clients: JSON nested too deep,
# results that cannot be taken apart, call ids made to break headers and
# URLs, bytes that are not UTF-8, NUL characters, contexts of many MB, too
# many waiting calls, late answers, and workers that keep dying.  Each
# gets a clear answer or an error result; no worker crashes, no call runs
# again without bound, and the conversation goes on working.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Encode qw(decode FB_CROAK);
use IO::Socket::INET;
use JSON::PP;
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::Hang;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $mport = $mock->port;
my $dir = $t->testdir;

# a backend that never answers (Test::Agent::Hang)

my $hang = Test::Agent::Hang->new($dir);
my $hport = $hang->port;

my $deep200 = ('[' x 200) . (']' x 200);

my $tools = <<'EOF';
    agent_tool deep {
        location /tools/deep;
    }

    agent_tool latin {
        location /tools/latin;
    }

    agent_tool nul {
        location /tools/nul;
    }

    agent_tool hdr {
        location /tools/hdr;
    }

    agent_tool hang {
        location /tools/hang;
    }

    agent_tool ask_user {
        executor human;
        timeout 1h;
    }

    agent_tool quick_ask {
        executor human;
        timeout 2s;
    }
EOF

my $server = <<"EOF";
        location = /tools/deep {
            internal;
            log_subrequest on;
            access_log $dir/deep.log;
            return 200 '$deep200';
        }

        location = /tools/latin {
            internal;
            return 200 "caf\xe9 \xff\xfe";
        }

        location = /tools/nul {
            internal;
            default_type application/json;
            return 200 '{"v":"abc\\u0000def"}';
        }

        location = /tools/hdr {
            internal;
            default_type application/json;
            return 200 '{"key":"\$http_idempotency_key",
                "injected":"\$http_x_injected"}';
        }

        location = /tools/hang {
            internal;
            proxy_pass http://127.0.0.1:$hport;
            proxy_read_timeout 1h;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    zone => '64m', tools => $tools, server => $server,
    http => "agent_store $dir/agent.db; client_max_body_size 1m;"
            . " client_body_buffer_size 1m;",
    agent => 'tools deep latin nul hdr hang ask_user quick_ask;'));
$t->run;

sub no_crash {
    unlike($t->read_file('error.log'), qr/exited on signal (?!9)/,
           "$_[0]: no worker crashed");
}

sub strict_utf8 {
    my ($bytes) = @_;
    return eval { decode('UTF-8', $bytes, FB_CROAK); 1 } ? 1 : 0;
}

sub still_works {
    my ($cid, $name) = @_;
    $mock->script({ text => "still here" });
    my $r = send_message($t, $cid, 'are you there?');
    is($r->{status}, 202, "$name: the conversation takes a message");
    my $c = wait_state($t, $cid, 'idle');
    is($c->{messages}[-1]{type}, 'turn_completed',
       "$name: and its turn completes");
}

sub results_of {
    my ($c) = @_;
    return grep { $_->{type} eq 'tool_result' } @{$c->{messages}};
}

# 1. JSON nested 300,000 deep from the provider: the event is refused
# before a tree is built; the turn fails with the reason, no worker dies

my $deep = ('[' x 300000) . (']' x 300000);
my $event = 'data: {"id":"x","object":"chat.completion.chunk",'
    . '"choices":[{"index":0,"delta":{"content":' . $deep . '}}]}' . "\n\n";

$mock->script({ raw => [$event] });

send_message($t, 'd1', 'go deep');
my $c = wait_state($t, 'd1', 'idle', 20);
is($c->{messages}[-1]{type}, 'turn_failed', 'deep provider event: failed');
like($t->read_file('error.log'), qr/nested deeper than 64 levels/,
     'deep provider event: the reason is logged');
no_crash('deep provider event');
still_works('d1', 'deep provider event');

# the same text in a client body: 400, nothing recorded

my $before = inspect($t, 'd1')->{json};
my $r = send_message($t, 'd1', undef,
                     body => qq{{"content":"x","extra":$deep}});
is($r->{status}, 400, 'deep client body: 400');
is($r->{json}{error}{code}, 'invalid_message', 'deep client body: code');
like($r->{json}{error}{message}, qr/nested deeper than 64 levels/,
     'deep client body: says why');
is(inspect($t, 'd1')->{json}{last_seq}, $before->{last_seq},
   'deep client body: nothing recorded');

# 2. a tool answering arrays nested 200 deep: the call runs once, its
# result is kept as text, the turn goes on

$mock->reset;
$mock->script({ tool_calls => [{ id => 'call_deep', name => 'deep',
                                 arguments => '{}' }] },
              { text => 'done' });

send_message($t, 'd2', 'deep tool');
$c = wait_state($t, 'd2', 'idle', 20);
is($c->{messages}[-1]{type}, 'turn_completed', 'deep tool result: completed');
my @res = results_of($c);
is(scalar @res, 1, 'deep tool result: one tool_result');
is($res[0]{result}, $deep200, 'deep tool result: kept as its text');
sleep 0.5;
my @hits = split /\n/, $t->read_file('deep.log');
is(scalar @hits, 1, 'deep tool result: the tool ran once');
is(scalar @{$mock->requests}, 2, 'deep tool result: two model calls');

# 3. a call id made to inject a header: it never reaches one raw

$mock->reset;
$mock->script({ tool_calls => [{ id => "call_x\r\nX-Injected: yes",
                                 name => 'hdr', arguments => '{}' }] },
              { text => 'ok' });

send_message($t, 'd3', 'inject');
$c = wait_state($t, 'd3', 'idle');
my ($call) = grep { $_->{type} eq 'tool_call' } @{$c->{messages}};
like($call->{tool_call_id}, qr/^[A-Za-z0-9_-]{1,64}$/,
     'odd id: the call has an id of the API\'s grammar');
is($call->{provider_id}, "call_x\r\nX-Injected: yes",
   'odd id: the provider\'s id is kept');
@res = results_of($c);
is($res[0]{result}{injected}, '', 'odd id: no header injected');
is($res[0]{result}{key}, $call->{tool_call_id},
   'odd id: Idempotency-Key is the new id');
my $req = $mock->requests->[1]{json};
my ($am) = grep { $_->{role} eq 'assistant' } @{$req->{messages}};
my ($tm) = grep { $_->{role} eq 'tool' } @{$req->{messages}};
is($am->{tool_calls}[0]{id}, $tm->{tool_call_id},
   'odd id: the model sees the call and its result paired');

# 4. bytes that are not UTF-8: replaced, one result, readable everywhere

$mock->reset;
$mock->script({ tool_calls => [{ id => 'call_latin', name => 'latin',
                                 arguments => '{}' }] },
              { text => 'read it' });

send_message($t, 'd4', 'latin');
$c = wait_state($t, 'd4', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'not UTF-8: completed');
@res = results_of($c);
is(scalar @res, 1, 'not UTF-8: one tool_result');
is($res[0]{result}, "caf\x{fffd} \x{fffd}\x{fffd}",
   'not UTF-8: invalid bytes become U+FFFD');

my $raw = http_get('/c/d4', port => $t->port(8080));
ok(strict_utf8($raw->{body}), 'not UTF-8: inspect serves UTF-8');

my $s = Test::Agent::HTTP::http_stream(events_request('d4'),
                                       port => $t->port(8080));
my $sse = '';
my $end = time + 5;
while (time < $end && $sse !~ /turn_completed/) {
    my $chunk = $s->next_chunk(1) // last;
    $sse .= $chunk->{data};
}
$s->close;
like($sse, qr/turn_completed/, 'not UTF-8: the events stream replays');
ok(strict_utf8($sse), 'not UTF-8: the events stream is UTF-8');
still_works('d4', 'not UTF-8');

# 9. NUL characters: refused from clients, kept whole from tools

$before = inspect($t, 'd4')->{json};
$r = send_message($t, 'd4', undef, body => '{"content":"abc\u0000def"}');
is($r->{status}, 400, 'NUL in content: 400');
like($r->{json}{error}{message}, qr/NUL/, 'NUL in content: says why');
$r = send_message($t, 'd4', undef,
                  body => '{"content":"abc","source_id":"a\u0000b"}');
is($r->{status}, 400, 'NUL in source_id: 400');
is(inspect($t, 'd4')->{json}{last_seq}, $before->{last_seq},
   'NUL: nothing recorded');

$mock->reset;
$mock->script({ tool_calls => [{ id => 'call_nul', name => 'nul',
                                 arguments => '{}' }] },
              { text => 'ok' });
send_message($t, 'd9', 'nul');
$c = wait_state($t, 'd9', 'idle');
@res = results_of($c);
is($res[0]{result}, '{"v":"abc\u0000def"}',
   'NUL in a tool result: kept whole, as text');

# 6. ids the API cannot address, and more waiting calls than slots

$mock->reset;
$mock->script({ tool_calls => [
                    { id => 'a b/c?d', name => 'ask_user',
                      arguments => '{}' },
                    { id => 'x' x 100, name => 'ask_user',
                      arguments => '{}' } ] },
              { text => 'answered' });

send_message($t, 'd6', 'ask twice');
$c = wait_state($t, 'd6', 'awaiting_input');
is(scalar @{$c->{pending}}, 2, 'odd ids: both calls wait');
for my $p (@{$c->{pending}}) {
    like($p->{tool_call_id}, qr/^[A-Za-z0-9_-]{1,64}$/,
         'odd ids: each is addressable');
    is(resolve($t, 'd6', $p->{tool_call_id}, { result => 'yes' })
       ->{status}, 200, 'odd ids: and resolvable');
}
$c = wait_state($t, 'd6', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'odd ids: the turn went on');

$mock->reset;
$mock->script({ tool_calls => [ map { { id => "ask_$_", name => 'ask_user',
                                        arguments => '{}' } } 1 .. 17 ] },
              { text => 'all answered' });

send_message($t, 'd7', 'ask 17 times');
$c = wait_state($t, 'd7', 'awaiting_input');
is(scalar @{$c->{pending}}, 16, 'too many waiting calls: 16 wait');
@res = results_of($c);
is(scalar @res, 1, 'too many waiting calls: one gets a result');
like($res[0]{error}, qr/too many calls wait/,
     'too many waiting calls: an error result');
resolve($t, 'd7', $_->{tool_call_id}, { result => 'y' })
    for @{$c->{pending}};
$c = wait_state($t, 'd7', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed',
   'too many waiting calls: the turn completes');

# 11. a resolution nested too deep: 400, the call still waits

$mock->reset;
$mock->script({ tool_calls => [{ id => 'call_r', name => 'ask_user',
                                 arguments => '{}' }] },
              { text => 'fine' });
send_message($t, 'd11', 'ask');
wait_state($t, 'd11', 'awaiting_input');
$before = inspect($t, 'd11')->{json};
$r = resolve($t, 'd11', 'call_r', qq{{"result":$deep200}}, raw => 1);
is($r->{status}, 400, 'deep resolution: 400');
is($r->{json}{error}{code}, 'invalid_resolution', 'deep resolution: code');
$r = resolve($t, 'd11', 'call_r', '{"result":"a\u0000b"}', raw => 1);
is($r->{status}, 400, 'NUL in a resolution: 400');
$c = inspect($t, 'd11')->{json};
is($c->{last_seq}, $before->{last_seq}, 'bad resolutions: nothing recorded');
is($c->{pending}[0]{tool_call_id}, 'call_r', 'bad resolutions: still waits');
is(resolve($t, 'd11', 'call_r', { result => 'ok' })->{status}, 200,
   'bad resolutions: then a good one is taken');
wait_state($t, 'd11', 'idle');

# 5. contexts of many MB: a 5 MB reply, and the turns after it

$mock->reset;
my $big = 'lorem ipsum ' x (5 * 1024 * 1024 / 12);
$mock->script({ text => $big, chunks => 50 }, { text => 'after' },
              { text => 'and after' });

send_message($t, 'd5', 'write a lot');
$c = wait_state($t, 'd5', 'idle', 30);
is($c->{messages}[-1]{type}, 'turn_completed', '5 MB reply: completed');
send_message($t, 'd5', 'and now?');
$c = wait_state($t, 'd5', 'idle', 30);
is($c->{messages}[-1]{type}, 'turn_completed', '5 MB context: completed');
is($c->{messages}[-2]{content}, 'after', '5 MB context: the model answered');
ok(length($mock->requests->[1]{body}) > 5 * 1024 * 1024,
   '5 MB context: the whole history went to the provider');

# 8. a late answer: past its deadline a call is stale, even before any
# timer has seen it (here: nginx was stopped through the deadline)

$mock->reset;
$mock->script({ tool_calls => [{ id => 'call_late', name => 'quick_ask',
                                 arguments => '{}' }] },
              { text => 'too late' });
send_message($t, 'd8', 'ask quickly');
wait_state($t, 'd8', 'awaiting_input');
$t->stop;
sleep 2.5;
$t->run;
$r = resolve($t, 'd8', 'call_late', { result => 'now' });
is($r->{status}, 409, 'late answer: 409');
is($r->{json}{error}{code}, 'stale', 'late answer: stale');
$c = wait_state($t, 'd8', 'idle');
@res = results_of($c);
is(scalar @res, 1, 'late answer: one result');
is($res[0]{ok}, JSON::PP::false, 'late answer: the expiry\'s error result');
ok(!grep({ $_->{type} eq 'resolution' && ($_->{result} // '') eq 'now' }
         @{$c->{messages}}), 'late answer: not recorded');

# a provider's error body with a NUL and bytes that are not UTF-8: the
# turn fails with the body made UTF-8; the log reads back, also from the
# store after a restart

$mock->reset;
$mock->script({ status => 400, body => "bad \x00 input \xff\xfe" });
send_message($t, 'd9', 'provoke');
$c = wait_state($t, 'd9', 'idle');
is($c->{messages}[-1]{type}, 'turn_failed', 'provider error body: failed');
like($c->{messages}[-1]{error} // '', qr/^bad \x{fffd} input /,
     'provider error body: the NUL is U+FFFD');
$t->stop;
$t->run;
$r = inspect($t, 'd9');
is($r->{status}, 200, 'provider error body: read back from the store');
still_works('d9', 'provider error body');

# bounded take-overs: a turn whose workers keep dying is taken over a
# few times, then fails; its call is not sent again without bound

$mock->reset;
$mock->script({ tool_calls => [{ id => 'call_hang', name => 'hang',
                                 arguments => '{}' }] },
              { text => 'never' });

sub hang_calls { $hang->calls }

send_message($t, 'd10', 'hang');

my $kills = 0;
for my $n (1 .. 8) {
    my $deadline = time + 10;
    sleep 0.05 while hang_calls() < $n && time < $deadline;
    last if hang_calls() < $n;

    my $lease = inspect($t, 'd10')->{json}{lease} or last;
    $t->kill_worker($lease);
    $kills++;
}

$c = wait_state($t, 'd10', 'idle', 10);
is($kills, 6, 'take-overs: the call ran after 5 take-overs, not after 6');
is(hang_calls(), 6, 'take-overs: the call was sent 6 times in all');
is($c->{messages}[-1]{type}, 'turn_failed', 'take-overs: the turn failed');
like($c->{messages}[-1]{reason}, qr/died repeatedly/,
     'take-overs: and says why');
@res = results_of($c);
is(scalar @res, 1, 'take-overs: the call has one result');
still_works('d10', 'take-overs');

no_crash('the whole file');

$t->allow_alert(qr/worker process \d+ exited on signal 9/);
undef $hang;
$mock->stop;
$t->done;
