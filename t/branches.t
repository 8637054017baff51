#!/usr/bin/perl

# Regenerate and edit through the message location: a rewind event in the
# log ("the context continues from to_seq"), then the user message again
# (regenerate) or its new text (edit).  The model's request holds the
# current branch only; the log, inspect and the store keep every branch;
# after a restart the context is still the branch.  A seq that is not a
# user message of the branch, and a busy conversation with agent_busy
# reject, get 409.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;
use Test::Agent::SSE;

plan(skip_all => Test::Agent::Store->missing) if Test::Agent::Store->missing;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;
my $store = Test::Agent::Store->for_test($t);
my $db = $store->directive;

my $server = <<'END';
        location ~ ^/q/(?<cid>[^/]+)/messages$ {
            agent chat;
            agent_conversation $cid;
            agent_busy queue;
            agent_message;
        }

        location ~ ^/i/(?<cid>[^/]+)/messages$ {
            agent chat;
            agent_conversation $cid;
            agent_busy interrupt;
            agent_message;
        }

        location ~ ^/sum/(?<cid>[^/]+)/messages$ {
            agent summed;
            agent_conversation $cid;
            agent_message;
        }

        location ~ ^/ret/(?<cid>[^/]+)/messages$ {
            agent retained;
            agent_conversation $cid;
            agent_message;
        }

        location ~ ^/ret/(?<cid>[^/]+)$ {
            agent retained;
            agent_conversation $cid;
            agent_inspect;
        }

        location = /tools/echo {
            internal;
            default_type application/json;
            return 200 '{"args":$request_body}';
        }

        location ~ ^/sum/(?<cid>[^/]+)$ {
            agent summed;
            agent_conversation $cid;
            agent_inspect;
        }
END

my $http = <<"END";
    agent_store $db;

    agent_tool held {
        description "Echoes what it got";
        parameters '{"type":"object","properties":{"n":{"type":"integer"}}}';
        retention turns=2;
        location /tools/echo;
    }

    agent retained {
        provider openai_chat /internal/llm;
        model gpt-test;
        tools held;
    }

    agent summed {
        provider openai_chat /internal/llm;
        model gpt-test;
        context_budget 10;
    }
END

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 1,
    http => $http, server => $server));
$t->run;

sub post {
    my ($cid, $body, $loc) = @_;
    my $r = http_post('/' . ($loc // 'c') . "/$cid/messages",
                      encode_json($body),
                      port => $t->port(8080),
                      headers => { 'Content-Type' => 'application/json' });
    $r->{json} = eval { decode_json($r->{body}) };
    return $r;
}

# the messages of the model's request n (from 0), as "role: text" lines

sub sent {
    my ($n) = @_;
    my $reqs = $mock->wait_requests($n + 1, 10);
    return join "\n", map { "$_->{role}: " . ($_->{content} // '') }
        @{$reqs->[$n]{json}{messages}};
}

sub turn {
    my ($cid, $body, $reply) = @_;
    $mock->script({ text => $reply });
    my $r = post($cid, $body);
    my $c = wait_state($t, $cid, 'idle');
    $c = wait_state($t, $cid, 'idle')
        until $c->{messages}[-1]{type} eq 'turn_completed';
    return $r;
}

sub users_seqs {
    my ($c) = @_;
    return map { $_->{seq} } grep { $_->{type} eq 'user_msg' }
        @{$c->{messages}};
}

my $r = turn('c1', { content => 'one' }, 'A1');
is($r->{status}, 202, 'first message');
my $one = $r->{json}{seq};
$r = turn('c1', { content => 'two' }, 'A2');
my $two = $r->{json}{seq};

is(sent(1), "system: You are terse.\nuser: one\nassistant: A1\nuser: two",
   'the second turn has the first in its context');

# regenerate the last reply

$r = turn('c1', { regenerate => JSON::PP::true }, 'A2 again');
is($r->{status}, 202, 'regenerate: taken');
ok($r->{json}{rewound}, 'regenerate: the answer says it rewound');
is($r->{json}{tool_calls_undone}, JSON::PP::false,
   'regenerate: and that tool calls are not undone');
is(sent(2), "system: You are terse.\nuser: one\nassistant: A1\nuser: two",
   'regenerate: the same context, without the superseded reply');

my $c = inspect($t, 'c1')->{json};
my ($rw) = grep { $_->{type} eq 'rewind' } @{$c->{messages}};
ok($rw, 'the log has a rewind event');
is($rw->{to_seq}, $two - 1, 'it goes on from just before the message');
is($r->{json}{seq}, $rw->{seq} + 1, 'and the user message follows it');
is($c->{messages}[$r->{json}{seq} - 1]{content}, 'two',
   'the user message is the same one');
ok((grep { ($_->{content} // '') eq 'A2' } @{$c->{messages}}),
   'the superseded reply stays in the log');

# a turn after it: the superseded reply is not in its context

turn('c1', { content => 'three' }, 'A3');
is(sent(3), "system: You are terse.\nuser: one\nassistant: A1\nuser: two\n"
   . "assistant: A2 again\nuser: three", 'the next turn follows the branch');

# edit the first message: the context goes on from before it

$r = turn('c1', { edit => $one, content => 'uno' }, 'A-uno');
is($r->{status}, 202, 'edit: taken');
is(sent(4), "system: You are terse.\nuser: uno", 'edit: nothing after it');

# a seq that is not a user message of the branch

$r = post('c1', { edit => $two, content => 'dos' });
is($r->{status}, 409, 'edit of a superseded message: 409');
is($r->{json}{error}{code}, 'not_on_branch', 'not on the branch');
$r = post('c1', { regenerate => $one + 1 });
is($r->{status}, 409, 'regenerate of a seq that is no user message: 409');

# bad input

$r = post('c1', { regenerate => JSON::PP::true, content => 'x' });
is($r->{status}, 400, 'regenerate with content: 400');
$r = post('c1', { edit => 'x', content => 'x' });
is($r->{status}, 400, 'edit of no seq: 400');
$r = post('c1', { edit => 1 });
is($r->{status}, 400, 'edit without content: 400');
$r = post('new1', { regenerate => JSON::PP::true });
is($r->{status}, 409, 'regenerate of a conversation without messages: 409');

# another agent's conversation: as for every verb, it does not exist

$r = post('c1', { regenerate => JSON::PP::true }, 'sum');
is($r->{status}, 404, 'another agent\'s regenerate: 404');
$r = post('c1', { edit => 1, content => 'mine' }, 'sum');
is($r->{status}, 404, 'another agent\'s edit: 404');

# busy (agent_busy reject, the default): 409, nothing written

$mock->script({ text => 'slow', chunks => 2, pause_after => 1 });
my $before = scalar @{inspect($t, 'c1')->{json}{messages}};
post('c1', { content => 'four' });
$mock->wait_paused(scalar(@{$mock->requests}) - 1, 5);
$r = post('c1', { regenerate => JSON::PP::true });
is($r->{status}, 409, 'regenerate while a turn runs: 409');
is($r->{json}{error}{code}, 'busy', 'busy');
$mock->release;
$c = wait_state($t, 'c1', 'idle');
is(scalar(grep { $_->{type} eq 'rewind' } @{$c->{messages}}), 2,
   'the refused regenerate wrote nothing');

# agent_busy queue: a regenerate while the reply streams runs after it

$mock->script({ text => 'Q1' });
post('qc', { content => 'first' }, 'q');
wait_state($t, 'qc', 'idle');
$mock->script({ text => 'Q2', chunks => 2, pause_after => 1 },
              { text => 'Q2 again' });
my $m = scalar @{$mock->requests};
post('qc', { content => 'second' }, 'q');
$mock->wait_paused($m, 5);
$r = post('qc', { regenerate => JSON::PP::true }, 'q');
is($r->{status}, 202, 'queue: a regenerate while a turn runs is taken');
ok($r->{json}{queued}, 'queued');
$mock->release;
$c = wait_state($t, 'qc', 'idle');
$c = wait_state($t, 'qc', 'idle')
    until scalar(grep { $_->{type} eq 'turn_completed' } @{$c->{messages}})
          == 3;
is(sent($m + 1), "system: You are terse.\nuser: first\nassistant: Q1\n"
   . "user: second", 'queue: the reply made again once the turn ended');
ok((grep { ($_->{content} // '') eq 'Q2' } @{$c->{messages}}),
   'queue: the turn it superseded ran to its end, and is kept');

# agent_busy interrupt: an edit cancels the running turn, then runs

$mock->script({ text => 'I1', chunks => 2, pause_after => 1 },
              { text => 'I1 edited' });
$m = scalar @{$mock->requests};
$r = post('ic', { content => 'question' }, 'i');
my $q = $r->{json}{seq};
$mock->wait_paused($m, 5);
$r = post('ic', { edit => $q, content => 'better question' }, 'i');
is($r->{status}, 202, 'interrupt: an edit while a turn runs is taken');
$c = wait_state($t, 'ic', 'idle');
$c = wait_state($t, 'ic', 'idle')
    until $c->{messages}[-1]{type} eq 'turn_completed';
is(sent($m + 1), "system: You are terse.\nuser: better question",
   'interrupt: the turn cancelled, the edit runs without it');
ok((grep { $_->{type} eq 'cancelled' } @{$c->{messages}}),
   'interrupt: the cancelled turn is in the log');

# a subscriber sees the rewind; Last-Event-ID across it

{
    my $cid = 'sub1';
    turn($cid, { content => 'alpha' }, 'X1');
    my $before = inspect($t, $cid)->{json}{last_seq}
                 // inspect($t, $cid)->{json}{seq};
    my $sse = Test::Agent::SSE->new(http_stream(
        events_request($cid), port => $t->port(8080)));
    my $rg = turn($cid, { regenerate => JSON::PP::true }, 'X1 again');
    is($rg->{status}, 202, 'a regenerate with a subscriber: taken')
        or diag($rg->{body});
    my @ev = $sse->events_until(sub {
        ($_[0]{data} // '') =~ /"type":"turn_completed"/
            && ($_[0]{data} // '') =~ /"turn":2/ }, 10);
    my ($rew) = grep { ($_->{data} // '') =~ /"type":"rewind"/ } @ev;
    ok($rew, 'a subscriber gets the rewind');
    my $to = $rew ? decode_json($rew->{data})->{to_seq} : -1;

    my $again = Test::Agent::SSE->new(http_stream(
        events_request($cid, 'Last-Event-ID' => $rew->{id} - 1),
        port => $t->port(8080)));
    my $first = $again->next_event(5);
    $first = $again->next_event(5) while $first && !defined $first->{data};
    like($first->{data} // '', qr/"type":"rewind","seq":$rew->{id}\b/,
         'Last-Event-ID before the rewind: the rewind comes first');
    my $next = $again->next_event(5);
    like($next->{data} // '', qr/"type":"user_msg".*"content":"alpha"/,
         'then the user message again');
    is($to, 0, 'the rewind goes to before the first message');
}

# retention counts the turns of the branch: a result two turns back is
# still whole after a regenerate (the superseded turn does not count)

{
    my $cid = 'ret';
    my $done = sub {
        my ($k) = @_;
        my $deadline = time + 10;
        while (time < $deadline) {
            my $r = http_get("/ret/$cid", port => $t->port(8080));
            my $m = (eval { decode_json($r->{body}) } // {})->{messages}
                    || [];
            return 1 if $k == grep { $_->{type} eq 'turn_completed' } @$m;
            sleep 0.05;
        }
        return 0;
    };
    $mock->script({ tool_calls => [{ id => 'call_h1', name => 'held',
                                     arguments => '{"n":7}' }] },
                  { text => 'R1' }, { text => 'R2' }, { text => 'R2b' });
    my $m = scalar @{$mock->requests};
    post($cid, { content => 'use the tool' }, 'ret');
    $done->(1);
    post($cid, { content => 'and then' }, 'ret');
    $done->(2);
    post($cid, { regenerate => JSON::PP::true }, 'ret');
    $done->(3);
    my $reqs = $mock->wait_requests($m + 4, 10);
    my ($res) = grep { $_->{role} eq 'tool' }
        @{$reqs->[$m + 3]{json}{messages}};
    like($res->{content} // '', qr/"n":7/,
         'retention: a result of the turn before is whole after a '
         . 'regenerate');
}

# a summary's range cannot be rewound into

{
    my $cid = 'summed';
    $mock->script({ text => 'S1', usage => { prompt_tokens => 500 } },
                  { text => 'S2', usage => { prompt_tokens => 500 } },
                  { text => 'the summary' });
    my $log = sub {
        my $r = http_get("/sum/$cid", port => $t->port(8080));
        return (eval { decode_json($r->{body}) } // {})->{messages} || [];
    };
    my $r1 = post($cid, { content => 'sum one' }, 'sum');
    my $deadline = time + 10;
    sleep 0.05 until time > $deadline
        || (grep { $_->{type} eq 'turn_completed' } @{$log->()});
    post($cid, { content => 'sum two' }, 'sum');
    my $sums = [];
    while (time < $deadline + 10) {
        $sums = [ grep { $_->{type} eq 'summary' } @{$log->()} ];
        last if @$sums;
        sleep 0.05;
    }
    is(scalar @$sums, 1, 'a summary was made');
    $r = post($cid, { edit => $r1->{json}{seq}, content => 'x' }, 'sum');
    is($r->{status}, 409, 'an edit inside the summary\'s range: 409');
    is($r->{json}{error}{code}, 'summarized', 'summarized');
}

# after a restart: the context read back from the store is the branch

my $n = scalar @{$mock->requests};
$t->stop;
$t->run;

turn('c1', { content => 'five' }, 'A5');
is(sent($n), "system: You are terse.\nuser: uno\nassistant: A-uno\n"
   . "user: four\nassistant: slow\nuser: five",
   'after a restart the context is the branch');

$r = turn('c1', { regenerate => JSON::PP::true }, 'A5 again');
is(sent($n + 1), "system: You are terse.\nuser: uno\nassistant: A-uno\n"
   . "user: four\nassistant: slow\nuser: five",
   'regenerate after a restart');

# the store keeps every branch

my @types = split /\n/, $store->sql(
    "SELECT type FROM events WHERE conversation = 'c1' ORDER BY seq");
is(scalar(grep { $_ eq 'rewind' } @types), 3, 'the store has the rewinds');
is(scalar(grep { $_ eq 'user_msg' } @types), 8,
   'and every user message of every branch');

$t->stop;
$mock->stop;

unlike($t->read_file('error.log'), qr/\[(alert|emerg|crit)\]/,
       'no alert');

done_testing;
