#!/usr/bin/perl

# Numbers from outside, bounded where they enter.  Those a provider
# reports: each adapter takes a token count of the
# usage as a non-negative number up to 2147483647 (2^31 - 1).  A larger
# one (a 64-bit maximum, two that would wrap when summed, a number no
# integer holds) counts as that maximum, a fraction is rounded down, a
# negative count or a string counts as none; each with a warning.  So a
# broken or hostile provider cannot wrap a token budget into credit: the
# next message is refused 429, the logged usage and the token metrics
# hold the bounded counts, and the exposition stays valid.  A
# Retry-After too large to be a delay is taken as "as long as the cap".
# A client's cursor (Last-Event-ID, ?after=) past the log's end is taken
# as its end, so the events that come later are not skipped.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::SSE;

my $MAX = 2147483647;

my $promtool = promtool();

my $http = <<'EOF';
    agent_budget_zone key=$http_x_user zone=budget:1m tokens=1000/d;
EOF

my $server = <<"EOF";
        agent_budget zone=budget;
$METRICS_LOCATION
EOF

sub usage {
    my ($in, $out) = @_;
    return { prompt_tokens => $in, completion_tokens => $out };
}

for my $adapter (qw(openai_chat anthropic_messages openai_responses)) {
    my $mock = Test::Agent::MockProvider->new;
    my $t = Test::Agent->new;

    $t->write_file_expand('nginx.conf', engine_conf($mock,
        adapter => $adapter, http => $http, server => $server));
    $t->run;

    my $msg = sub {
        my ($user, $text) = @_;
        return send_message($t, $user, $text,
                            headers => { 'X-User' => $user });
    };

    # user => [usage, the usage logged, the next message's status]
    my @cases = (
        [ 'max', usage('9223372036854775807', '9223372036854775807'),
          [ $MAX, $MAX ], 429 ],
        [ 'near', usage('4611686018427387904', '4611686018427387904'),
          [ $MAX, $MAX ], 429 ],
        [ 'big', usage({ raw => '1e400' }, { raw => '12.9' }),
          [ $MAX, 12 ], 429 ],
        [ 'wide', usage({ raw => '18446744073709551616' }, 3),
          [ $MAX, 3 ], 429 ],
        [ 'bad', usage({ raw => '-5' }, { raw => '"700"' }),
          [ 0, undef ], 202 ],
    );

    for my $c (@cases) {
        my ($user, $usage, $logged, $next) = @$c;

        $mock->script({ text => 'ok', usage => $usage });

        is($msg->($user, 'hi')->{status}, 202,
           "$adapter: $user: the first message is taken");

        my $conv = wait_state($t, $user, 'idle');
        my ($a) = grep { $_->{type} eq 'assistant_msg' }
                  @{$conv->{messages}};

        is($a->{usage}{input_tokens}, $logged->[0],
           "$adapter: $user: input_tokens logged as $logged->[0]");
        is($a->{usage}{output_tokens}, $logged->[1],
           "$adapter: $user: output_tokens logged as $logged->[1]")
            if defined $logged->[1];

        $mock->script({ text => 'again', usage => usage(1, 1) })
            if $next == 202;

        my $r = $msg->($user, 'more');
        is($r->{status}, $next, "$adapter: $user: the next message: $next");
        is($r->{json}{error}{code}, 'budget_exceeded',
           "$adapter: $user: budget_exceeded") if $next == 429;
        wait_state($t, $user, 'idle');
    }

    like($t->read_file('error.log'),
         qr/\[warn\].*(?:input|prompt)_tokens.*9223372036854775807
            .*2147483647/x,
         "$adapter: the error log warns of the count it bounded");
    like($t->read_file('error.log'),
         qr/\[warn\].*(?:input|prompt)_tokens.*not a count/,
         "$adapter: and of one it did not take");

    # four calls of the maximum input tokens and one of 1: the
    # histogram's sum is theirs, not 64-bit counts wrapped

    my $r = http_get('/metrics', port => $t->port(8080));
    my ($sum) = $r->{body} =~ /^gen_ai_client_token_usage_sum\{[^}]*
                               gen_ai_token_type="input"\}\ (\d+)$/xm;
    is($sum, 4 * $MAX + 1,
       "$adapter: input tokens' sum: 4 times the maximum, and 1");

    SKIP: {
        skip 'promtool is not installed', 1 unless $promtool;
        my ($ok, $out) = promtool_ok($r->{body});
        ok($ok, "$adapter: promtool check metrics passes") or diag $out;
    }

    $t->done(more => 1);
}

# Retry-After: 2^61 seconds, whose milliseconds wrap a 64-bit count to 0,
# still means "wait": the retry comes after the cap, not at once

{
    my $mock = Test::Agent::MockProvider->new;
    my $t = Test::Agent->new;

    my $conf = engine_conf($mock);
    $conf =~ s/retry attempts=3 base=50ms cap=200ms;/retry attempts=2 base=10ms cap=1s;/
        or die 'no retry line to change';

    $t->write_file_expand('nginx.conf', $conf);
    $t->run;

    $mock->script({ status => 429, retry_after => '2305843009213693952' },
                  { text => 'ok' });

    is(send_message($t, 'ra', 'hi')->{status}, 202, 'a message is taken');
    is(log_types(wait_state($t, 'ra', 'idle')), 'user_msg assistant_msg '
       . 'turn_completed', 'the turn completes after the retry');

    my $reqs = $mock->requests;
    my $gap = $reqs->[1]{received_at} - $reqs->[0]{received_at};
    cmp_ok($gap, '>=', 0.9,
           sprintf('the retry waited for the cap (%.3f s)', $gap));

    $t->done(more => 1);
}

# cursors past the log's end: a subscriber gets the events that follow,
# an inspect's next page starts at the end

{
    my $mock = Test::Agent::MockProvider->new;
    my $t = Test::Agent->new;

    $t->write_file_expand('nginx.conf', engine_conf($mock));
    $t->run;

    $mock->script({ text => 'one' }, { text => 'two' });

    is(send_message($t, 'cur', 'hi')->{status}, 202, 'a message is taken');
    is(wait_state($t, 'cur', 'idle')->{last_seq}, 3, 'its turn: seq 1 to 3');

    my $c = inspect($t, 'cur', 'after=1000')->{json};
    is_deeply($c->{messages}, [], 'inspect after 1000: no messages');
    ok(!exists $c->{next_after}, 'and no next page');

    # next_after while more follow, none on the last page: a pager that
    # stops when it is missing stops

    $c = inspect($t, 'cur', 'after=0&limit=2')->{json};
    is(scalar @{$c->{messages}}, 2, 'a page of 2 of 3 events');
    is($c->{next_after}, 2, 'and the next page after 2');

    $c = inspect($t, 'cur', 'after=2&limit=2')->{json};
    is(scalar @{$c->{messages}}, 1, 'the last page: one event');
    ok(!exists $c->{next_after}, 'and no next_after');

    $c = inspect($t, 'cur', 'after=1&limit=2')->{json};
    is(scalar @{$c->{messages}}, 2, 'a page that ends at the last seq');
    ok(!exists $c->{next_after}, 'is the last page too');

    my $sse = Test::Agent::SSE->new(http_stream(
        "GET /c/cur/events HTTP/1.1\r\nHost: localhost\r\n"
        . "Last-Event-ID: 1000\r\n\r\n", port => $t->port(8080)));

    # the stream is open (its heartbeat or nothing) before the message
    $sse->next_event(0.5);

    is(send_message($t, 'cur', 'more')->{status}, 202,
       'another message is taken');

    my @got = $sse->events_until(sub { ($_[0]{event} // '') eq
                                       'turn_completed' }, 5);
    is(join(' ', map { $_->{id} } grep { defined $_->{id} } @got), '4 5 6',
       'a subscriber resuming after 1000 gets seq 4 to 6');

    my $r = http_get('/c/cur/events?after=99999999999999999999',
                     port => $t->port(8080));
    is($r->{status}, 400, 'a cursor no integer holds: 400');
    like($r->{body}, qr/"invalid_argument"/, 'invalid_argument');

    $t->done;
}
