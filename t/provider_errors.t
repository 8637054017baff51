#!/usr/bin/perl

# Errors a provider reports in its stream, for each adapter: before the
# first token, a rate limit, an overload or a server error is tried
# again, and an error that another attempt cannot mend (an exhausted
# quota, a refused request, a bad key, a content filter, an unknown
# model) ends the turn at once; one of a type the adapter does not know
# is tried again.  The turn_failed event keeps the provider's type and
# code, and its failed_generation where it sends one.

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
        adapter => $adapter));
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

    $t->done(more => 1);
}

$mock->stop;
done_testing();
