#!/usr/bin/perl

# The resolve API: POST /c/ID/calls/TCID answers a suspended call (a
# person's answer, a browser's result, an approval decision) once it is
# recorded, and the turn resumes when no call of its batch waits any
# more.  Approve runs the tool (with edited arguments if given), reject
# never does; a gated client call is resolved twice.  Every refusal
# changes nothing, and two resolves racing on two workers resolve once.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use IO::Socket::INET;
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

my $tools = <<'EOF';
    agent_tool echo {
        description "Echoes what it got";
        location /tools/echo;
    }

    agent_tool stamp {
        location /tools/stamp;
    }

    agent_tool ask_user {
        executor human;
        timeout 1h;
    }

    agent_tool send_email {
        description "Sends an email";
        parameters '{"type":"object","properties":{"to":{"type":"string"}}}';
        approval requires_approval;
        location /tools/gated;
        timeout 1h;
    }

    agent_tool click {
        description "Clicks in the user's browser";
        executor client;
        approval requires_approval;
        timeout 1h;
    }
EOF

# the gated tool's location logs every call it gets (its Idempotency-Key
# is the tool_call_id): what the location received, or that it never ran

my $server = <<"EOF";
        listen 127.0.0.1:%%PORT_8081%% reuseport;
        add_header X-Worker \$pid always;

        location = /tools/echo {
            internal;
            default_type application/json;
            return 200 '{"args":\$request_body,
                "key":"\$http_idempotency_key"}';
        }

        location = /tools/stamp {
            internal;
            default_type application/json;
            return 200 '{"stamp":"\$http_idempotency_key"}';
        }

        location = /tools/gated {
            internal;
            log_subrequest on;
            access_log %%TESTDIR%%/gated.log calls;
            default_type application/json;
            return 200 '{"args":\$request_body,
                "key":"\$http_idempotency_key"}';
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $tools,
    agent => 'tools echo stamp ask_user send_email click; '
             . 'max_model_calls 3;',
    http => "log_format calls '\$http_idempotency_key \$request_body';",
    server => $server));
$t->run;

my $port = $t->port(8080);

sub call {
    my ($id, $name, $args) = @_;
    return { id => $id, name => $name, arguments => $args };
}

sub events_of {
    my ($c, $type, $tcid) = @_;
    return grep { $_->{type} eq $type
                  && (!defined $tcid || ($_->{tool_call_id} // '') eq $tcid) }
           @{($c || {})->{messages} || []};
}

sub one_of {
    my ($c, $type, $tcid) = @_;
    my @e = events_of($c, $type, $tcid);
    return @e == 1 ? $e[0] : undef;
}

# polls inspect until the callback accepts the conversation (and no
# worker holds its turn); returns the last one seen

sub wait_for {
    my ($cid, $cond, $timeout) = @_;

    my $deadline = time + ($timeout // 10);
    my $c;

    while (time < $deadline) {
        my $r = inspect($t, $cid);
        $c = $r->{json} if $r && $r->{status} == 200;
        return $c if $c && !defined $c->{lease} && $cond->($c);
        sleep 0.05;
    }

    return $c;
}

# what a refused resolve must leave as it was

sub snapshot {
    my (@cids) = @_;

    return [map {
        my $r = inspect($t, $_);
        my $j = $r->{json} || {};
        { status => $r->{status}, state => $j->{state}, turn => $j->{turn},
          last_seq => $j->{last_seq}, pending => $j->{pending},
          messages => $j->{messages} }
    } @cids];
}

# a resolve that must be refused with status and error code, changing
# nothing in the conversations named (the one resolved by default)

sub refused {
    my ($cid, $tcid, $body, $status, $code, $name, %opts) = @_;

    my @cids = @{$opts{cids} || [$cid]};
    my $before = snapshot(@cids);

    my $r = $opts{get}
        ? http_get("/c/$cid/calls/$tcid", port => $port)
        : resolve($t, $cid, $tcid, $body, raw => $opts{raw});

    is($r && $r->{status}, $status, "$name: $status");
    if ($r && $opts{get}) {
        like($r->{headers}{allow} // '', qr/\bPOST\b/, "$name: Allow: POST");
    } elsif ($r) {
        my $j = eval { decode_json($r->{body}) } || {};
        is($j->{error}{code}, $code, "$name: $code");
    }

    is_deeply(snapshot(@cids), $before, "$name: nothing changed");
    return $r;
}

sub content_of {
    my ($m) = @_;
    return eval { decode_json($m->{content}) }
        // { content => $m->{content} };
}

sub gated_calls {
    my %n;
    $n{(split / /, $_)[0]}++ for split /\n/, $t->read_file('gated.log');
    return \%n;
}

# two server calls and a human call in one batch: the server results are
# recorded while the human call waits; its resolution is acknowledged
# before the next model call, which gets every result paired with its call

$mock->script({ tool_calls => [call('s1', 'echo', '{"n":1}'),
                               call('s2', 'stamp', '{}'),
                               call('h1', 'ask_user',
                                    '{"question":"Which city?"}')] },
              { text => 'Paris it is.', pause_after => 1 });

send_message($t, 'r1', 'plan my trip');
my $c = wait_for('r1', sub { $_[0]{state} eq 'awaiting_input'
                             && events_of($_[0], 'tool_result') == 2 });

is($c->{state}, 'awaiting_input', 'awaiting input');
ok(one_of($c, 'tool_result', 's1') && one_of($c, 'tool_result', 's1')->{ok},
   'first server result recorded');
ok(one_of($c, 'tool_result', 's2') && one_of($c, 'tool_result', 's2')->{ok},
   'second server result recorded');
ok(!events_of($c, 'tool_result', 'h1'), 'no result for the human call');

my @susp = events_of($c, 'suspension');
is(scalar @susp, 1, 'one suspension');
is($susp[0]{tool_call_id}, 'h1', 'of the human call');
is($susp[0]{kind}, 'elicitation', 'an elicitation');
is(scalar @{$mock->requests}, 1, 'no model call while the call waits');

my $r = resolve($t, 'r1', 'h1', { result => { city => 'Paris' } });
is($r->{status}, 200, 'resolved: 200');
is($r->{json}{conversation}, 'r1', 'answer names the conversation');
is($r->{json}{tool_call_id}, 'h1', 'and the call');
my $seq = $r->{json}{seq};

# recorded before the answer

$c = inspect($t, 'r1')->{json};
my ($ev) = grep { $_->{seq} == ($seq // -1) } @{$c->{messages}};
is($ev && $ev->{type}, 'resolution', 'the seq answered is the resolution');
is($ev && $ev->{tool_call_id}, 'h1', 'of the call');
is($ev && $ev->{kind}, 'elicitation', 'kind elicitation');
is($ev && $ev->{source}, 'human', 'source human');
is_deeply($ev && $ev->{result}, { city => 'Paris' }, 'with the result');

# the next model call starts after the answer and is held there

ok($mock->wait_paused(1, 5), 'the next model call started');
$c = inspect($t, 'r1')->{json};
ok(!events_of($c, 'turn_completed'), 'answered before the turn went on');

my $res = one_of($c, 'tool_result', 'h1');
ok($res && $res->{ok}, 'the human call has its result');
is_deeply($res && $res->{result}, { city => 'Paris' }, 'the answer given');
cmp_ok($res ? $res->{seq} : 0, '>', $seq // 0, 'after the resolution');

my $sent = $mock->requests->[1]{json}{messages} || [];
is_deeply([map { $_->{role} } @$sent],
          [qw(system user assistant tool tool tool)], 'three results sent');
is_deeply([sort map { $_->{id} } @{$sent->[2]{tool_calls} || []}],
          [qw(h1 s1 s2)], 'after the assistant message with the calls');
is_deeply([sort map { $_->{tool_call_id} // '' }
                grep { $_->{role} eq 'tool' } @$sent],
          [qw(h1 s1 s2)], 'each result paired with its call');

my %content = map { $_->{tool_call_id} => content_of($_) }
              grep { $_->{role} eq 'tool' } @$sent;
is_deeply($content{h1}, { ok => JSON::PP::true,
                          result => { city => 'Paris' } },
          'the model sees the answer as {"ok":true,"result":...}');
is($content{s1}{result}{args}{n}, 1, 'and the server results');
is($content{s2}{result}{stamp}, 's2', 'both of them');

$mock->release;
$c = wait_state($t, 'r1', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'the turn completed');
is($c->{messages}[-2]{content}, 'Paris it is.', 'with the next reply');

refused('r1', 'h1', { result => 'Lyon' }, 409, 'stale',
        'a second resolve of the same call');

# approve, reject, approve with edited arguments: three gated calls of one
# batch; the model is called again only once all three are decided

$mock->reset;
$mock->script({ tool_calls => [call('a1', 'send_email', '{"to":"ann"}'),
                               call('a2', 'send_email', '{"to":"bob"}'),
                               call('a3', 'send_email', '{"to":"cid"}')] },
              { text => 'One sent, one denied, one edited.' });

send_message($t, 'r2', 'send three');
$c = wait_state($t, 'r2', 'awaiting_input');

is(scalar(events_of($c, 'suspension')), 3, 'three calls await approval');
is_deeply([map { $_->{kind} } events_of($c, 'suspension')],
          [qw(approval approval approval)], 'each of kind approval');
is_deeply([map { $_->{arguments}{to} } events_of($c, 'suspension')],
          [qw(ann bob cid)], 'with its arguments');
ok(!events_of($c, 'tool_result'), 'none has run');
is_deeply(gated_calls(), {}, 'the tool location got nothing yet');

is(resolve($t, 'r2', 'a1', { decision => 'approve' })->{status}, 200,
   'approve: 200');
is(resolve($t, 'r2', 'a2', { decision => 'reject',
                             reason => 'too risky' })->{status}, 200,
   'reject: 200');

$c = wait_for('r2', sub { one_of($_[0], 'tool_result', 'a2')
                          && one_of($_[0], 'tool_result', 'a1')
                          && !defined $_[0]{lease} });
ok(one_of($c, 'tool_result', 'a2'), 'reject: its result at once');
ok(one_of($c, 'tool_result', 'a1'),
   'approve: the tool ran at once, with a call still undecided');
is($c->{state}, 'awaiting_input', 'still awaiting the third call');
is(scalar @{$mock->requests}, 1, 'no model call while one is undecided');

is(resolve($t, 'r2', 'a3', { decision => 'approve',
                             args => { to => 'dan', cc => 'eve' } }
          )->{status}, 200, 'approve with edited args: 200');

$c = wait_state($t, 'r2', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'the turn completed');

my %resn = map { $_->{tool_call_id} => $_ } events_of($c, 'resolution');
my %result = map { $_->{tool_call_id} => $_ } events_of($c, 'tool_result');

is($resn{a1}{kind}, 'approval', 'approve: resolution of kind approval');
is($resn{a1}{decision}, 'approve', 'approve: decision recorded');
is($resn{a1}{source}, 'human', 'approve: by a human');
ok(!defined $resn{a1}{args}, 'approve: no edit recorded');
ok($result{a1}{ok}, 'approve: the tool ran');
is_deeply($result{a1}{result}, { args => { to => 'ann' }, key => 'a1' },
          'approve: the location got the arguments and the key');

is($resn{a2}{decision}, 'reject', 'reject: decision recorded');
is($resn{a2}{reason}, 'too risky', 'reject: reason recorded');
ok(!$result{a2}{ok}, 'reject: an error result');
is($result{a2}{error}, 'denied by approver: too risky',
   'reject: denied by approver, with the reason');

is($resn{a3}{decision}, 'approve', 'edit: approved');
is_deeply($resn{a3}{args}, { to => 'dan', cc => 'eve' },
          'edit: the new arguments recorded');
is_deeply($result{a3}{result}, { args => { to => 'dan', cc => 'eve' },
                                  key => 'a3' },
          'edit: the location got the edited arguments');

is_deeply(gated_calls(), { a1 => 1, a3 => 1 },
          'the location ran once for each approval, never for the reject');

is(scalar @{$mock->requests}, 2, 'one more model call');
$sent = $mock->requests->[1]{json}{messages} || [];
%content = map { $_->{tool_call_id} => content_of($_) }
           grep { $_->{role} eq 'tool' } @$sent;
is_deeply([sort keys %content], [qw(a1 a2 a3)], 'three results sent');
is_deeply($content{a2}, { ok => JSON::PP::false,
                          error => 'denied by approver: too risky' },
          'the model sees the denial');

# a gated client call suspends twice: approval, then execution by the
# browser (a live subscriber, which a client call needs)

$mock->reset;
$mock->script({ tool_calls => [call('g1', 'click', '{"selector":"#buy"}')] },
              { text => 'Clicked.' });

send_message($t, 'r3', 'buy it');
my $sse = Test::Agent::SSE->new(http_stream(events_request('r3'),
                                            port => $port));
is($sse->stream->status, 200, 'subscribed');

$c = wait_state($t, 'r3', 'awaiting_input');
@susp = events_of($c, 'suspension');
is(scalar @susp, 1, 'one suspension first');
is($susp[0]{kind}, 'approval', 'for approval');
is($susp[0]{executor}, 'client', 'of a client call');

refused('r3', 'g1', { result => 'too early' }, 400, 'invalid_resolution',
        'a result while approval is pending');

is(resolve($t, 'r3', 'g1', { decision => 'approve' })->{status}, 200,
   'approved: 200');

$c = wait_for('r3', sub { $_[0]{state} eq 'awaiting_input'
                          && events_of($_[0], 'suspension') == 2 });
@susp = events_of($c, 'suspension', 'g1');
is(scalar @susp, 2, 'then a second suspension of the same call');
is($susp[1] && $susp[1]{kind}, 'client_exec', 'for the browser to run it');
is($susp[1] && $susp[1]{arguments}{selector}, '#buy', 'with its arguments');
ok(!events_of($c, 'tool_result'), 'no result yet');

refused('r3', 'g1', { decision => 'approve' }, 400, 'invalid_resolution',
        'a second approval instead of a result');

is(resolve($t, 'r3', 'g1', { result => { clicked => JSON::PP::true } }
          )->{status}, 200, 'client result: 200');

$c = wait_state($t, 'r3', 'idle');
is(log_types($c), 'user_msg assistant_msg tool_call suspension resolution '
   . 'suspension resolution tool_result assistant_msg turn_completed',
   'log of a gated client call');

my @resn = events_of($c, 'resolution', 'g1');
is_deeply([map { $_->{kind} } @resn], [qw(approval client_exec)],
          'two resolutions: approval, then execution');
is($resn[0]{decision}, 'approve', 'the approval');
is($resn[0]{source}, 'human', 'by a human');
is($resn[1]{source}, 'client', 'the result recorded as the client\'s');
is_deeply($resn[1]{result}, { clicked => JSON::PP::true },
          'with the result');
$res = one_of($c, 'tool_result', 'g1');
ok($res && $res->{ok}, 'the call has its result');
is_deeply($res && $res->{result}, { clicked => JSON::PP::true },
          'the client\'s result');

my @seen = grep { defined $_->{id} } $sse->events_until(
    sub { ($_[0]{event} // '') eq 'turn_completed' }, 10);
is(join(' ', map { $_->{event} } @seen), log_types($c),
   'the subscriber got the same canonical events');
is(join(' ', map { $_->{id} } @seen),
   join(' ', map { $_->{seq} } @{$c->{messages}}), 'with their seq');
$sse->stream->close;

# every refusal, and none changes anything

$mock->reset;
$mock->script({ tool_calls => [call('e1s', 'echo', '{"n":1}'),
                               call('e1h', 'ask_user', '{"q":"?"}'),
                               call('e1a', 'send_email', '{"to":"ann"}')] },
              { tool_calls => [call('e2h', 'ask_user', '{"q":"?"}')] });

send_message($t, 'e1', 'mixed');
$c = wait_for('e1', sub { $_[0]{state} eq 'awaiting_input'
                          && events_of($_[0], 'tool_result') == 1 });
ok(one_of($c, 'tool_result', 'e1s'), 'e1: the server call has its result');
is(scalar(events_of($c, 'suspension')), 2, 'e1: two calls wait');

send_message($t, 'e2', 'ask');
$c = wait_state($t, 'e2', 'awaiting_input');
is(scalar(events_of($c, 'suspension')), 1, 'e2: one call waits');

refused('nosuch', 'x1', { result => 1 }, 404, 'not_found',
        'unknown conversation');
refused('bad!id', 'x1', { result => 1 }, 400, 'invalid_conversation',
        'invalid conversation id');

refused('e1', 'nosuch', { result => 1 }, 409, 'stale', 'unknown call id');
refused('e1', 'e2h', { result => 1 }, 409, 'stale',
        'a call of another conversation', cids => ['e1', 'e2']);
refused('e1', 'e1s', { result => 1 }, 409, 'stale',
        'a server call that has its result');

refused('e1', 'e1h', '{"result":', 400, 'invalid_resolution',
        'malformed JSON', raw => 1);
refused('e1', 'e1h', '', 400, 'invalid_resolution', 'empty body', raw => 1);
refused('e1', 'e1h', '{"result":1} x', 400, 'invalid_resolution',
        'trailing garbage', raw => 1);
refused('e1', 'e1h', '[{"result":1}]', 400, 'invalid_resolution',
        'an array', raw => 1);
refused('e1', 'e1h', '"yes"', 400, 'invalid_resolution', 'a string',
        raw => 1);

refused('e1', 'e1h', {}, 400, 'invalid_resolution',
        'elicitation without result');
refused('e1', 'e1h', { decision => 'approve' }, 400, 'invalid_resolution',
        'elicitation answered with a decision');

refused('e1', 'e1a', {}, 400, 'invalid_resolution',
        'approval without decision');
refused('e1', 'e1a', { decision => 'maybe' }, 400, 'invalid_resolution',
        'approval with an unknown decision');
refused('e1', 'e1a', { result => 1 }, 400, 'invalid_resolution',
        'approval answered with a result');
refused('e1', 'e1a', { decision => 'approve', args => [1] }, 400,
        'invalid_resolution', 'args an array');
refused('e1', 'e1a', { decision => 'approve', args => '{"to":"x"}' }, 400,
        'invalid_resolution', 'args a string');

refused('e1', 'e1h', undef, 405, undef, 'GET', get => 1);

# the refusals left the pending set whole: one call resolved, the turn
# still waits for the other; the resolved one is stale from then on

$mock->script({ text => 'All done.' });

is(resolve($t, 'e1', 'e1h', { result => 'yes' })->{status}, 200,
   'e1: the human call resolves after the refusals');
$c = wait_for('e1', sub { events_of($_[0], 'tool_result') == 2 });
is($c->{state}, 'awaiting_input', 'e1: still awaiting the approval');
is(scalar @{$mock->requests}, 2, 'e1: no model call yet');

refused('e1', 'e1h', { result => 'again' }, 409, 'stale',
        'an already resolved call, another still pending');

is(resolve($t, 'e1', 'e1a', { decision => 'approve' })->{status}, 200,
   'e1: the approval resolves too');
$c = wait_state($t, 'e1', 'idle');
is($c->{messages}[-1]{type}, 'turn_completed', 'e1: the turn completed');
is(scalar(events_of($c, 'resolution')), 2, 'e1: two resolutions');
is(scalar(events_of($c, 'tool_call')), scalar(events_of($c, 'tool_result')),
   'e1: every call paired');

$c = wait_state($t, 'e2', 'awaiting_input');
is(scalar(events_of($c, 'resolution')), 0, 'e2: untouched');

# two resolves of one call at the same moment, on two connections that
# the kernel spreads over the two workers (reuseport): one wins

sub race {
    my ($cid, $tcid, @bodies) = @_;

    my @socks = map {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                      PeerPort => $t->port(8081),
                                      Timeout => 5)
            or die "cannot connect: $!\n";
        $s->autoflush(1);
        binmode $s;
        $s;
    } @bodies;

    my @reqs = map {
        http_request('POST', "/c/$cid/calls/$tcid", encode_json($_),
                     headers => { 'Content-Type' => 'application/json' })
    } @bodies;

    syswrite($socks[$_], $reqs[$_]) for 0 .. $#socks;

    my @raw = map { '' } @socks;
    my %open = map { $_ => 1 } 0 .. $#socks;
    my $deadline = time + 10;

    while (%open && time < $deadline) {
        my $sel = IO::Select->new(map { $socks[$_] } keys %open);
        for my $s ($sel->can_read($deadline - time)) {
            my ($i) = grep { $socks[$_] == $s } keys %open;
            my $n = sysread($s, my $buf, 65536);
            if ($n) {
                $raw[$i] .= $buf;
            } else {
                delete $open{$i};
                close $s;
            }
        }
    }

    return map { parse_response($_) } @raw;
}

$mock->reset;

my ($races, $split) = (0, 0);

while ($races < 5 || ($split < 3 && $races < 20)) {
    my $i = ++$races;
    my ($cid, $tcid) = ("race$i", "q$i");

    $mock->script({ tool_calls => [call($tcid, 'ask_user', '{}')] },
                  { text => 'ok' });
    send_message($t, $cid, 'race');
    wait_state($t, $cid, 'awaiting_input');

    my @r = race($cid, $tcid, { result => 'A' }, { result => 'B' });

    my $once = is(join(' ', sort map { $_ ? $_->{status} : 'none' } @r),
                  '200 409', "race $i: one 200, one 409");

    my ($won) = grep { $r[$_] && $r[$_]{status} == 200 } 0 .. 1;
    my ($lost) = grep { $r[$_] && $r[$_]{status} == 409 } 0 .. 1;
    $split++ if $r[0] && $r[1] && $r[0]{headers}{'x-worker'}
                && $r[1]{headers}{'x-worker'}
                && $r[0]{headers}{'x-worker'} ne $r[1]{headers}{'x-worker'};

    my $lj = defined $lost ? eval { decode_json($r[$lost]{body}) } : undef;
    is($lj && $lj->{error}{code}, 'stale', "race $i: the loser is stale");

    $c = wait_state($t, $cid, 'idle');
    my @rs = events_of($c, 'resolution', $tcid);
    is(scalar @rs, 1, "race $i: one resolution");
    is(scalar(events_of($c, 'tool_result', $tcid)), 1,
       "race $i: one result");

    my $wj = defined $won ? eval { decode_json($r[$won]{body}) } : undef;
    is($rs[0] && $rs[0]{seq}, $wj && $wj->{seq},
       "race $i: the winner's seq");
    is($rs[0] && $rs[0]{result}, defined $won ? ('A', 'B')[$won] : 'none',
       "race $i: the winner's result recorded");

    last unless $once;      # a broken race would only repeat itself
}

cmp_ok($split, '>=', 1, "races on two workers ($split of $races)");

$mock->stop;
$t->done;
