#!/usr/bin/perl

# agent_agui: the answers one RunAgentInput carries to calls that wait.
# Two approvals answered by two tool messages, each content a JSON text:
# each call's decision is logged as its client sent it, and the turn
# goes on.  A batch with an answer that does not fit its call (a
# decision missing), or that answers a call that does not wait (an
# interrupt unknown or named twice), is refused as a whole: nothing of
# it is recorded, both calls still wait.

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

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

$t->write_file_expand('nginx.conf', engine_conf($mock,
    tools => $ECHO_TOOL . <<'END',
    agent_tool send_email {
        description "Sends an email";
        approval requires_approval;
        location /tools/echo;
        timeout 1h;
    }
END
    agent => 'tools echo send_email;',
    server => $ECHO_LOCATION . <<'END'));
        location /agui {
            agent chat;
            agent_agui;
        }
END
$t->run;

sub agui_post {
    my ($body) = @_;
    my $r = http_post('/agui', encode_json($body), port => $t->port(8080),
                      headers => { 'Content-Type' => 'application/json' });
    $r->{json} = eval { decode_json($r->{body}) };
    return $r;
}

sub tool_message {
    my ($call, $content) = @_;
    return { id => "t-$call", role => 'tool', toolCallId => $call,
             content => $content };
}

sub resolutions {
    my ($c) = @_;
    return { map { $_->{tool_call_id} => $_->{decision} }
             grep { $_->{type} eq 'resolution' } @{$c->{messages}} };
}

# both calls wait, and nothing answered them
sub unchanged {
    my ($id, $what) = @_;
    my $c = inspect($t, $id)->{json};
    is($c->{state}, 'awaiting_input', "$what: the turn still waits");
    is_deeply([ sort map { $_->{tool_call_id} } @{$c->{pending}} ],
              [qw(call_a call_b)], "$what: both calls still wait");
    is_deeply(resolutions($c), {}, "$what: no resolution recorded");
}

# a turn of conversation $id waiting for the approval of two calls
sub waiting {
    my ($id) = @_;

    $mock->script(
        { tool_calls => [
            { id => 'call_a', name => 'send_email',
              arguments => '{"to":"a@example.com"}' },
            { id => 'call_b', name => 'send_email',
              arguments => '{"to":"b@example.com"}' }] },
        { text => 'One sent, one not', chunks => 1 });

    my $r = agui_post({ threadId => $id, runId => "r-$id",
                        messages => [{ id => "u-$id", role => 'user',
                                       content => 'mail a and b' }] });
    like($r->{body}, qr/"RUN_FINISHED"/,
         "$id: the run ends with the calls waiting");
    is(scalar @{wait_state($t, $id, 'awaiting_input')->{pending}}, 2,
       "$id: two approvals wait");
}

# approved and rejected, each by the JSON text of a tool message
sub decide {
    my ($id) = @_;

    my $r = agui_post({ threadId => $id, runId => "r-$id-go",
                        messages => [
                            tool_message('call_a', '{"decision": "approve"}'),
                            tool_message('call_b', '{"decision": "reject"}')]
                      });
    is($r->{status}, 200, "$id: two decisions: 200");
    like($r->{body}, qr/"RUN_FINISHED".*"type":"success"/s,
         "$id: the run goes on to its end");

    my $c = wait_state($t, $id, 'idle');
    is_deeply(resolutions($c), { call_a => 'approve', call_b => 'reject' },
              "$id: each decision logged as the client sent it");

    my %results = map { $_->{tool_call_id} => $_ }
                  grep { $_->{type} eq 'tool_result' } @{$c->{messages}};
    ok($results{call_a}{ok}, "$id: the approved call ran");
    is($results{call_b}{error}, 'denied by approver',
       "$id: the rejected one did not");
    is($c->{messages}[-1]{type}, 'turn_completed', "$id: the turn completed");
}

waiting('d1');
decide('d1');

# a batch with an answer that does not fit: the others are not taken

waiting('d2');

my $r = agui_post({ threadId => 'd2', runId => 'r2',
                    resume => [{ interruptId => 'call_a',
                                 status => 'resolved',
                                 payload => { approved => JSON::PP::true } }],
                    messages => [tool_message('call_b', '{"approve": 1}')] });
is($r->{status}, 400, 'a tool message with no decision: 400');
is($r->{json}{error}{code}, 'invalid_resolution', 'invalid_resolution');
unchanged('d2', 'a decision missing');

$r = agui_post({ threadId => 'd2', runId => 'r3',
                 messages => [tool_message('call_a', '{"decision": "approve"}'),
                              tool_message('call_b', '{"decision": "maybe"}')]
               });
is($r->{status}, 400, 'a decision neither approve nor reject: 400');
is($r->{json}{error}{code}, 'invalid_resolution', 'invalid_resolution');
unchanged('d2', 'a decision unknown');

# an interrupt that does not wait, after one that does

$r = agui_post({ threadId => 'd2', runId => 'r4',
                 resume => [{ interruptId => 'call_a', status => 'resolved',
                              payload => { approved => JSON::PP::true } },
                            { interruptId => 'call_zz',
                              status => 'resolved',
                              payload => { approved => JSON::PP::true } }] });
is($r->{status}, 409, 'an unknown interrupt: 409');
is($r->{json}{error}{code}, 'stale', 'stale');
unchanged('d2', 'an unknown interrupt');

# the same interrupt twice: its second answer finds it answered

$r = agui_post({ threadId => 'd2', runId => 'r5',
                 resume => [ map { { interruptId => 'call_a',
                                     status => 'resolved',
                                     payload => { approved => $_ } } }
                             JSON::PP::true, JSON::PP::false ] });
is($r->{status}, 409, 'an interrupt answered twice: 409');
unchanged('d2', 'an interrupt answered twice');

# the batch made right is taken whole

decide('d2');

$t->done;
