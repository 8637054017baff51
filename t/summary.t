#!/usr/bin/perl

# A token budget per agent: a turn whose context (the provider's count of
# input tokens) passed context_budget is followed, after it ended, by a
# model call that sums up the turns before it; its text is a canonical
# summary event {from_seq, to_seq, text}, and the next model calls send
# system + summary + the turns since, whole, so a call is never sent
# without its result.  A failed summary changes nothing, and the next turn
# past the budget tries again.  No turn waits for a summary: a turn that
# runs meanwhile sends the context as it was.  With a store, the summary
# outlives a restart.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::Store;
use Test::Agent::MockProvider;

my $PROMPT = 'Sum it up.';
my $PREFIX = "Summary of the conversation so far:\n\n";

# the text of the request's last user message with text (a tool result
# has none)

sub user_text {
    my ($j) = @_;
    my @list = @{$j->{messages} // $j->{input} // []};

    for my $m (reverse @list) {
        next unless ($m->{role} // '') eq 'user';
        my $c = $m->{content};
        $c = join '', map { $_->{text} // '' } @$c if ref $c;
        return $c if length $c;
    }

    return '';
}

# The mock answers by what it is asked, whatever the order: a summary
# request gets SUMMARY-n (the second fails with a 500); a user message
# asking for a "tool" gets a call of echo; "big" in the last user message
# reports 500 input tokens, past the budget of 100, else 20.

sub new_mock {
    my (%opts) = @_;
    my ($nsum, $ncall) = (0, 0);

    return Test::Agent::MockProvider->new(default => sub {
        my ($req) = @_;
        my $j = $req->{json} // {};
        my $list = $j->{messages} // $j->{input} // [];
        my $last = $list->[-1] // {};
        my $text = user_text($j);

        if ($text eq $PROMPT) {
            $nsum++;
            return { status => 500 } if $nsum == 2;
            return { text => "SUMMARY-$nsum",
                     latency => $opts{latency} // 0,
                     usage => { prompt_tokens => 30 } };
        }

        my $tokens = $text =~ /big/ ? 500 : 20;
        my $asked = ($last->{role} // '') eq 'user' && !ref $last->{content}
                    || ($last->{role} // '') eq 'user' && ref $last->{content}
                       && grep { $_->{type} eq 'text' } @{$last->{content}};

        if ($text =~ /tool/ && $asked
            && ($last->{type} // 'message') eq 'message')
        {
            $ncall++;
            return { tool_calls => [{ id => "call_$ncall", name => 'echo',
                                      arguments => "{\"n\":$ncall}" }],
                     usage => { prompt_tokens => 20 } };
        }

        return { text => "Reply to $text",
                 usage => { prompt_tokens => $tokens } };
    });
}

my $mock = new_mock();

my $AGENT = <<"EOF";
        tools echo;
        context_budget 100;
        summary_model gpt-small;
        summary_prompt "$PROMPT";
EOF

sub log_of {
    my ($t, $cid) = @_;
    return inspect($t, $cid, 'limit=1000')->{json}{messages} // [];
}

sub summaries {
    my ($t, $cid) = @_;
    return [ grep { $_->{type} eq 'summary' } @{log_of($t, $cid)} ];
}

sub wait_summaries {
    my ($t, $cid, $n) = @_;
    my $deadline = time + 10;
    while (time < $deadline) {
        my $s = summaries($t, $cid);
        return $s if @$s >= $n;
        sleep 0.05;
    }
    return summaries($t, $cid);
}

sub wait_log {
    my ($t, $re, $n) = @_;
    my $deadline = time + 10;
    while (time < $deadline) {
        my @l = $t->read_file('error.log') =~ /$re/g;
        return scalar @l if @l >= $n;
        sleep 0.05;
    }
    return 0;
}

# the seq of the user_msg with this content

sub user_seq {
    my ($t, $cid, $content) = @_;
    my ($e) = grep { $_->{type} eq 'user_msg' && $_->{content} eq $content }
                   @{log_of($t, $cid)};
    return $e ? $e->{seq} : 0;
}

sub turn {
    my ($t, $cid, $content) = @_;
    is(send_message($t, $cid, $content)->{status}, 202, "message: $content");
    my $c = wait_state($t, $cid, 'idle');
    my @turn = grep { $_->{type} ne 'summary' } @{$c->{messages}};
    is($turn[-1]{type}, 'turn_completed', "$content: completed")
        or diag explain $c;
}

my $SYSTEM = { role => 'system', content => 'You are terse.' };

sub user { return { role => 'user', content => $_[0] } }
sub assistant { return { role => 'assistant', content => $_[0] } }

###############################################################################

# openai_chat, without a store: the whole log in the zone

my $t = Test::Agent->new;

$t->write_file_expand('nginx.conf', engine_conf($mock, tools => $ECHO_TOOL,
    server => $ECHO_LOCATION, agent => $AGENT));
$t->run;

turn($t, 's', 'one');
turn($t, 's', 'two tool big');

my $s = wait_summaries($t, 's', 1);
is(scalar @$s, 1, 'a turn past the budget: a summary');

my @req = @{$mock->requests};
is(scalar @req, 4, 'three model calls of the turns, and the summary');

# the summary call: the turn before the last, and the prompt

my $sum = $req[3]{json};
is($sum->{model}, 'gpt-small', 'summary: summary_model');
is_deeply($sum->{messages},
          [$SYSTEM, user('one'), assistant('Reply to one'), user($PROMPT)],
          'summary: the turns before the last one, then the prompt');
is_deeply($sum->{tools}, $req[1]{json}{tools}, 'summary: the tools');

is($s->[0]{from_seq}, 1, 'summary: from seq 1');
is($s->[0]{to_seq}, user_seq($t, 's', 'two tool big') - 1,
   'summary: up to the end of the turn before the last one');
is($s->[0]{text}, 'SUMMARY-1', 'summary: the reply');
is($s->[0]{model}, 'gpt-small', 'summary: its model');

# the next turn: system + summary + the last turn, call and result whole

my @turn2 = @{$req[2]{json}{messages}};    # the call's second request
my $tail2 = [@turn2[3 .. $#turn2], assistant('Reply to two tool big')];

turn($t, 's', 'three big');

@req = @{$mock->requests};
is_deeply($req[4]{json}{messages},
          [$SYSTEM, user($PREFIX . 'SUMMARY-1'), @$tail2, user('three big')],
          'system + summary + the turns since, exactly');
is($req[4]{json}{model}, 'gpt-test', 'the agent\'s model');

my @roles = map { $_->{role} } @$tail2;
is_deeply(\@roles, [qw(user assistant tool assistant)],
          'the call and its result are both sent');
is($tail2->[1]{tool_calls}[0]{id}, $tail2->[2]{tool_call_id},
   'the result is its call\'s');

# past the budget again: the summary fails (500), the context stays

is(wait_log($t, qr/agent summary failed/, 1), 1, 'the summary failed');
is(scalar @{summaries($t, 's')}, 1, 'a failed summary records nothing');

@req = @{$mock->requests};
is(scalar @req, 6, 'the failed summary was asked for');
is_deeply($req[5]{json}{messages},
          [$SYSTEM, user($PREFIX . 'SUMMARY-1'), @$tail2, user($PROMPT)],
          'the failed summary: the newest summary and the turns after it');

my $tail3 = [@$tail2, user('three big'), assistant('Reply to three big')];

turn($t, 's', 'four big');

@req = @{$mock->requests};
is_deeply($req[6]{json}{messages},
          [$SYSTEM, user($PREFIX . 'SUMMARY-1'), @$tail3, user('four big')],
          'after a failed summary the context is as it was');

# retried after the next turn past the budget

$s = wait_summaries($t, 's', 2);
is(scalar @$s, 2, 'retried: a summary');
@req = @{$mock->requests};
is_deeply($req[7]{json}{messages},
          [$SYSTEM, user($PREFIX . 'SUMMARY-1'), @$tail3, user($PROMPT)],
          'retried: the older summary and the turns after it');
is($s->[1]{text}, 'SUMMARY-3', 'retried: its text');
is($s->[1]{to_seq}, user_seq($t, 's', 'four big') - 1,
   'retried: up to the last turn');

turn($t, 's', 'five');

@req = @{$mock->requests};
is(scalar @req, 9, 'no summary under the budget');
is_deeply($req[8]{json}{messages},
          [$SYSTEM, user($PREFIX . 'SUMMARY-3'), user('four big'),
           assistant('Reply to four big'), user('five')],
          'the newest summary replaces the older one');

# the log keeps everything

my $types = join ' ', map { $_->{type} } @{log_of($t, 's')};
is(scalar(() = $types =~ /user_msg/g), 5, 'the log keeps every message');

$t->done(more => 1);
$mock->stop;

###############################################################################

# the summary runs after the turn, and no turn waits for it: a turn that
# runs meanwhile sends the context as it was, and the summary, recorded
# after that turn's events, is sent first all the same

$mock = new_mock(latency => 5);
$t = Test::Agent->new;

$t->write_file_expand('nginx.conf', engine_conf($mock, tools => $ECHO_TOOL,
    server => $ECHO_LOCATION, agent => $AGENT));
$t->run;

turn($t, 'w', 'one');

turn($t, 'w', 'two big');
turn($t, 'w', 'three tool');

@req = @{$mock->requests};
my ($pending) = grep { user_text($_->{json}) eq $PROMPT } @req;
ok($pending && !$pending->{finished},
   'two turns done while the summary call still runs');
is(scalar @{summaries($t, 'w')}, 0, 'no summary yet');

my @three = grep { user_text($_->{json}) eq 'three tool' } @req;
is_deeply([map { $_->{content} } @{$three[0]{json}{messages}}],
          ['You are terse.', 'one', 'Reply to one', 'two big',
           'Reply to two big', 'three tool'],
          'the turn meanwhile: the context as it was');

$s = wait_summaries($t, 'w', 1);
is($s->[0]{to_seq}, user_seq($t, 'w', 'two big') - 1,
   'the summary: up to the turn it followed');
my ($result) = grep { $_->{type} eq 'tool_result' } @{log_of($t, 'w')};
ok($s->[0]{seq} > $result->{seq}, 'recorded after the later turn\'s events');

turn($t, 'w', 'four');

my $last = $mock->requests->[-1]{json}{messages};
is_deeply([map { [$_->{role}, $_->{content} // ''] } @$last],
          [[system => 'You are terse.'], [user => $PREFIX . 'SUMMARY-1'],
           [user => 'two big'], [assistant => 'Reply to two big'],
           [user => 'three tool'], [assistant => ''],
           [tool => '{"ok":true,"result":{"args":{"n":1}}}'],
           [assistant => 'Reply to three tool'], [user => 'four']],
          'then: system + summary + the turns after its range');
is($last->[5]{tool_calls}[0]{id}, $last->[6]{tool_call_id},
   'the call and its result together');

$t->done(more => 1);
$mock->stop;

###############################################################################

# every adapter, with a store: the summary outlives a restart, and is
# sent first; "cache summary" puts Anthropic's cache breakpoint on it
# (the OpenAI adapters ignore it)


for my $adapter (qw(anthropic_messages openai_responses)) {
    $t = Test::Agent->new;
    my $db = $t->testdir . '/agent.db';

    $mock->stop;
    $mock = new_mock();

    $t->write_file_expand('nginx.conf', engine_conf($mock,
        adapter => $adapter, tools => $ECHO_TOOL, server => $ECHO_LOCATION,
        agent => "$AGENT cache summary;", http => "agent_store $db;"));
    $t->run;

    turn($t, 'p', 'one');
    turn($t, 'p', 'two big');

    $s = wait_summaries($t, 'p', 1);
    is(scalar @$s, 1, "$adapter: a summary");

    # written behind, as every event: the restart comes once it is
    is(Test::Agent::Store->new($db)->wait_sql("SELECT count(*) FROM events"
           . " WHERE conversation = 'p' AND type = 'summary'", qr/^1$/),
       1, "$adapter: the summary written");
    is(Test::Agent::Store->new($db)->sql("SELECT state FROM conversations"
           . " WHERE id = 'p'"), 'idle',
       "$adapter: the conversation at rest there (a summary is no turn)");

    $t->stop;
    is($t->{unclean}, undef, "$adapter: stopped");
    $t->run;

    $mock->reset;
    turn($t, 'p', 'three');

    @req = @{$mock->requests};
    is(scalar @req, 1, "$adapter: after the restart, one model call");

    my $j = $req[0]{json};

    if ($adapter eq 'anthropic_messages') {
        is($j->{system}, 'You are terse.', "$adapter: system");
        is_deeply($j->{messages}, [
            { role => 'user', content => [
                { type => 'text', text => $PREFIX . 'SUMMARY-1',
                  cache_control => { type => 'ephemeral' } },
                { type => 'text', text => 'two big' }] },
            { role => 'assistant', content => [
                { type => 'text', text => 'Reply to two big' }] },
            { role => 'user', content => 'three' }],
            "$adapter: summary + the last turn, exactly");

    } else {
        is($j->{instructions} // $j->{input}[0]{content}, 'You are terse.',
           "$adapter: system");
        my @in = grep { ($_->{role} // '') ne 'system'
                        && ($_->{role} // '') ne 'developer' }
                      @{$j->{input}};
        is_deeply([map { [$_->{role}, ref $_->{content}
                          ? $_->{content}[0]{text} : $_->{content}] } @in],
                  [[user => $PREFIX . 'SUMMARY-1'], [user => 'two big'],
                   [assistant => 'Reply to two big'], [user => 'three']],
                  "$adapter: summary + the last turn");
    }

    $t->done(more => $adapter ne 'openai_responses');
}
