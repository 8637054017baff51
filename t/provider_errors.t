#!/usr/bin/perl

# Errors a provider reports in its stream, for each adapter: before the
# first token, a rate limit, an overload or a server error is tried
# again, and an error that another attempt cannot mend (an exhausted
# quota, a refused request, a bad key, a content filter, an unknown
# model) ends the turn at once; one of a type the adapter does not know
# is tried again.  The turn_failed event keeps the provider's type and
# code, and its failed_generation where it sends one.  A failed turn
# keeps what the provider said before the error: thinking as well as
# text, and the calls it began, which never run and get an error result
# at once, so that the next request to the provider stays paired.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $mock = Test::Agent::MockProvider->new;

my $thinking = join ' ', ('Weighing what the user may mean.') x 12;

# the events before the error: the reasoning whole, or the start of a
# call with a part of its arguments

my %partial = (
    openai_chat => {
        thinking => { reasoning => $thinking, chunks => 4,
                      error_after => 5 },
        call => { tool_calls => [{ id => 'call_1', name => 'echo',
                                   arguments => '{"n": 12345}' }],
                  chunks => 4, error_after => 3 },
    },
    anthropic_messages => {
        thinking => { thinking => $thinking, chunks => 4, text => 'never',
                      error_after => 7 },
        call => { tool_calls => [{ id => 'toolu_1', name => 'echo',
                                   arguments => '{"n": 12345}' }],
                  chunks => 4, error_after => 6 },
    },
    openai_responses => {
        thinking => { reasoning => $thinking, chunks => 4, text => 'never',
                      error_after => 8 },
        call => { tool_calls => [{ id => 'call_1', name => 'echo',
                                   arguments => '{"n": 12345}' }],
                  chunks => 4, error_after => 5 },
    },
);

# the messages of the next request to the provider, each role and
# content, whatever the API's shape

sub context {
    my ($adapter, $req) = @_;

    my $j = $req->{json};
    my @m = $adapter eq 'openai_responses' ? @{$j->{input}}
                                           : @{$j->{messages}};

    return [map {
        my $c = $_->{content};
        $c = join '', map { $_->{text} // "<$_->{type}>" } @$c if ref $c;
        ($_->{role} // $_->{type}) . ': ' . ($c // '')
               . ($_->{tool_calls} ? ' <tool_calls>' : '')
    } @m];
}

# each adapter: the events before its first token, and its errors: the
# fields of the error event (see the mock's framers), retried or not

my @adapters = (
    [openai_chat => 1, [
        [{ type => 'requests', code => 'rate_limit_exceeded' }, 1],
        [{ type => 'server_error', code => undef }, 1],
        [{ type => 'mystery_error', code => undef }, 1],
        [{ type => 'insufficient_quota', code => 'insufficient_quota' }, 0],
        [{ type => 'invalid_request_error',
           code => 'context_length_exceeded' }, 0],
        [{ type => 'invalid_request_error', code => 'invalid_api_key' }, 0],
        [{ type => 'invalid_request_error', code => 'content_filter' }, 0],
        [{ type => 'invalid_request_error', code => 'model_not_found' }, 0],
        [{ type => 'invalid_request_error', code => 'tool_use_failed',
           failed_generation => '<function=lookup>{"q": "x"</function>' },
         0],
    ]],
    [anthropic_messages => 1, [
        [{ type => 'rate_limit_error' }, 1],
        [{ type => 'overloaded_error' }, 1],
        [{ type => 'api_error' }, 1],
        [{ type => 'invalid_request_error' }, 0],
        [{ type => 'authentication_error' }, 0],
        [{ type => 'permission_error' }, 0],
        [{ type => 'not_found_error' }, 0],
    ]],
    [openai_responses => 2, [
        [{ type => 'requests', code => 'rate_limit_exceeded' }, 1],
        [{ type => 'server_error', code => 'server_error' }, 1],
        [{ type => 'insufficient_quota', code => 'insufficient_quota' }, 0],
        [{ type => 'invalid_request_error',
           code => 'context_length_exceeded' }, 0],
        [{ event => 'response.failed', code => 'server_error' }, 1],
        [{ event => 'response.failed', code => 'rate_limit_exceeded' }, 1],
        [{ event => 'response.failed', code => 'invalid_prompt' }, 0],
    ]],
);

for my $a (@adapters) {
    my ($adapter, $head, $errors) = @$a;

    my $t = Test::Agent->new;

    $t->write_file_expand('nginx.conf', engine_conf($mock,
        adapter => $adapter, tools => $ECHO_TOOL, server => $ECHO_LOCATION,
        agent => 'tools echo;'));
    $t->run;

    my $n = 0;

    for my $e (@$errors) {
        my ($err, $retried) = @$e;
        my $cid = 'e' . $n++;
        my $name = "$adapter "
                   . join(' ', map { $err->{$_} // 'null' }
                                   grep { $_ ne 'failed_generation' }
                                        sort keys %$err);

        $err = { message => "It went wrong ($cid).", %$err };

        $mock->reset;
        $mock->script({ text => 'never', error_after => $head,
                        error => $err },
                      { text => 'recovered' });

        send_message($t, $cid, 'x');
        my $c = wait_state($t, $cid, 'idle');

        if ($retried) {
            is(log_types($c), 'user_msg assistant_msg turn_completed',
               "$name: retried");
            is(scalar @{$mock->requests}, 2, "$name: two requests");
            next;
        }

        is(log_types($c), 'user_msg turn_failed', "$name: not retried");
        is(scalar @{$mock->requests}, 1, "$name: one request");

        my $failed = $c->{messages}[-1];
        is($failed->{error}, "It went wrong ($cid).", "$name: message kept");
        is($failed->{error_code}, $err->{code}, "$name: code kept")
            if defined $err->{code};
        is($failed->{error_type}, $err->{type}, "$name: type kept")
            if defined $err->{type};
        is($failed->{failed_generation}, $err->{failed_generation},
           "$name: the failed generation kept")
            if defined $err->{failed_generation};
    }

    # an HTTP error's body names it as an error event would: OpenAI sends
    # an exhausted quota as a 429, which another attempt cannot mend

    my @http = $adapter eq 'anthropic_messages'
        ? ([429, { type => 'rate_limit_error' }, 1],
           [529, { type => 'overloaded_error' }, 1])
        : ([429, { type => 'insufficient_quota',
                   code => 'insufficient_quota' }, 0],
           [429, { type => 'requests', code => 'rate_limit_exceeded' }, 1],
           [500, { type => 'server_error', code => undef }, 1]);

    for my $h (@http) {
        my ($status, $err, $retried) = @$h;
        my $cid = 'h' . $n++;
        my $name = "$adapter HTTP $status "
                   . join(' ', map { $err->{$_} // 'null' } sort keys %$err);

        $mock->reset;
        $mock->script({ status => $status,
                        error => { message => "Refused ($cid).", %$err } },
                      { text => 'recovered' });

        send_message($t, $cid, 'x');
        my $c = wait_state($t, $cid, 'idle', 30);

        is(scalar @{$mock->requests}, $retried ? 2 : 1,
           "$name: " . ($retried ? 'retried' : 'not retried'));

        next if $retried;

        my $failed = $c->{messages}[-1];
        is($failed->{type}, 'turn_failed', "$name: the turn failed");
        is($failed->{status}, $status, "$name: its status");
        is($failed->{error_code}, $err->{code}, "$name: code kept");
        like($failed->{error}, qr/Refused \($cid\)/, "$name: body kept");
    }

    if ($adapter eq 'openai_chat') {

        # servers that send the HTTP status as the code (OpenRouter, vLLM)

        for my $s ([402, 0], [400, 0], [429, 1], [502, 1]) {
            my ($code, $retried) = @$s;

            $mock->reset;
            $mock->script({ raw => ['data: {"error":{"message":"Provider '
                                    . 'returned error","code":' . $code
                                    . '}}' . "\n\n"] },
                          { text => 'recovered' });

            send_message($t, "n$code", 'x');
            my $c = wait_state($t, "n$code", 'idle');

            is(log_types($c), $retried
                   ? 'user_msg assistant_msg turn_completed'
                   : 'user_msg turn_failed',
               "code $code: " . ($retried ? 'retried' : 'not retried'));
            is(scalar @{$mock->requests}, $retried ? 2 : 1,
               "code $code: requests");
        }
    }

    # thinking, then an error: the thinking is kept, with the error

    my $p = $partial{$adapter};
    my $err = { type => 'server_error', code => 'server_error',
                message => 'The model failed.' };

    $err = { type => 'overloaded_error', message => 'Overloaded' }
        if $adapter eq 'anthropic_messages';

    $mock->reset;
    $mock->script({ %{$p->{thinking}}, error => $err });

    send_message($t, 'th', 'x');
    my $c = wait_state($t, 'th', 'idle');

    is(log_types($c), 'user_msg assistant_msg turn_failed',
       "$adapter: thinking then an error, the reply is kept");
    is(scalar @{$mock->requests}, 1, "$adapter: not retried");

    my ($m, $failed) = @{$c->{messages}}[1, 2];
    is($m->{status}, 'interrupted', "$adapter: interrupted");
    is($m->{thinking}, $thinking, "$adapter: the thinking kept whole");
    is($m->{content}, '', "$adapter: no text");
    is($failed->{error}, $err->{message}, "$adapter: message");
    is($failed->{error_type}, $err->{type}, "$adapter: type");
    is($failed->{error_code}, $err->{code}, "$adapter: code")
        if $err->{code};

    # a call begun, then an error: the call is kept, never run, and has
    # its error result; the next request has neither

    $mock->reset;
    $mock->script({ %{$p->{call}}, error => $err }, { text => 'Fine.' });

    send_message($t, 'ca', 'x');
    $c = wait_state($t, 'ca', 'idle');

    is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
       . 'turn_failed', "$adapter: a call begun, then an error");

    my ($call, $result);
    ($m, $call, $result) = @{$c->{messages}}[1, 2, 3];

    my $id = $p->{call}{tool_calls}[0]{id};

    is($m->{status}, 'interrupted', "$adapter: the reply interrupted");
    is(scalar @{$m->{tool_calls} || []}, 1, "$adapter: with its call");
    is($m->{tool_calls}[0]{id}, $id, "$adapter: the call's id");
    is($call->{tool_call_id}, $id, "$adapter: tool_call");
    is($call->{name}, 'echo', "$adapter: its name");
    is($call->{status}, 'interrupted', "$adapter: marked interrupted");
    like($call->{arguments}, qr/^\{"n"/, "$adapter: the arguments so far");
    isnt($call->{arguments}, '{"n": 12345}', "$adapter: not all of them");
    is($result->{tool_call_id}, $id, "$adapter: its result");
    is($result->{ok}, JSON::PP::false, "$adapter: an error");
    like($result->{error}, qr/cut off.*not run/, "$adapter: not run");

    send_message($t, 'ca', 'again');
    $c = wait_state($t, 'ca', 'idle');

    is(log_types($c), 'user_msg assistant_msg tool_call tool_result '
       . 'turn_failed user_msg assistant_msg turn_completed',
       "$adapter: the next turn");

    my @ctx = grep { !/^(system|developer): / } @{context($adapter,
                                                  $mock->requests->[1])};
    is_deeply(\@ctx, ['user: x', 'assistant: [interrupted]',
                      'user: again'],
              "$adapter: the call and its result are not sent");

    $t->done(more => 1);
}

$mock->stop;
done_testing();
