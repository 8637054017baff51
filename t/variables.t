#!/usr/bin/perl

# Variables for log_format: $agent_conversation and $agent_owner as the
# request's location evaluates them, $agent_turn and $agent_state as the
# zone holds the conversation when the access log is written, and
# $agent_tokens, the tokens of the turn the request started; outside an
# agent's location, or for a conversation the zone does not hold, none.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => 'agent_owner $http_x_user;
    log_format agent "$request_method $uri conv=$agent_conversation '
        . 'owner=$agent_owner turn=$agent_turn state=$agent_state '
        . 'tokens=$agent_tokens";
    access_log %%TESTDIR%%/agent.log agent;',
    server => 'location = /plain { agent_owner off; return 200 "ok\n"; }
        location = /api/chat { agent chat; agent_aisdk; }'));
$t->run;

# the first reply comes late: the message's log line is long written

$mock->script({ text => 'First.', latency => 0.5 }, { text => 'Second.' },
              { text => 'Third.', usage => { prompt_tokens => 31,
                                            completion_tokens => 9 } });

my $port = $t->port(8080);

sub req {
    my ($method, $uri, $body, $user) = @_;
    my %h = defined $user ? ('X-User' => $user) : ();
    return http(http_request($method, $uri, $body, headers => \%h),
                port => $port);
}

sub idle {
    my ($cid) = @_;
    for (1 .. 200) {
        my $r = req('GET', "/c/$cid", undef, 'alice');
        return 1 if $r && ($r->{body} // '') =~ /"state":"idle"/
                    && ($r->{body} // '') !~ /"lease":\d/;
        sleep 0.05;
    }
    return 0;
}

is(req('POST', '/c/v1/messages', '{"content":"hi"}', 'alice')->{status},
   202, 'message sent');
ok(idle('v1'), 'the turn ended');

is(req('POST', '/c/v1/messages', '{"content":"again"}', 'alice')->{status},
   202, 'second message');
ok(idle('v1'), 'the second turn ended');

is(req('GET', '/c/v1', undef, 'alice')->{status}, 200, 'inspect');

# the AI SDK's POST answers when its turn has ended: all its tokens

my $chat = req('POST', '/api/chat', '{"id":"v2","messages":[{"id":"u1",'
    . '"role":"user","parts":[{"type":"text","text":"hi"}]}]}', 'alice');
is($chat->{status}, 200, 'a chat turn');
like($chat->{body}, qr/Third\./, 'streamed to its end');
is(req('GET', '/c/nobody', undef, 'alice')->{status}, 404,
   'an unknown conversation');
is(req('GET', '/plain')->{status}, 200, 'a plain location');

# the access log is written as each request ends (the last one's line
# may follow its answer by a moment)

my @lines;
for (1 .. 100) {
    @lines = split /\n/, $t->read_file('agent.log');
    last if grep { m{^GET /plain } } @lines;
    sleep 0.05;
}

like((grep { m{^POST /c/v1/messages} } @lines)[0] // '',
     qr/conv=v1 owner=alice turn=1 state=\w+ tokens=0$/,
     'a message: its conversation, owner and turn, no tokens yet (the '
     . 'answer does not wait for the model)');
like((grep { m{^POST /c/v1/messages} } @lines)[1] // '',
     qr/conv=v1 owner=alice turn=2 /, 'the second message: turn 2');
like((grep { m{^GET /c/v1 } } @lines)[-1] // '',
     qr/conv=v1 owner=alice turn=2 state=idle tokens=-$/,
     'inspect at rest: idle, and it started no turn');
like((grep { m{^POST /api/chat } } @lines)[0] // '',
     qr/owner=alice turn=- state=- tokens=40$/,
     'a chat that waits for its turn: the tokens the provider reported '
     . '(the chat names its conversation in its body)');
like((grep { m{^GET /c/nobody } } @lines)[0] // '',
     qr/conv=nobody owner=alice turn=- state=- tokens=-$/,
     'a conversation the zone does not hold: no turn, no state');
like((grep { m{^GET /plain } } @lines)[0] // '',
     qr/conv=- owner=- turn=- state=- tokens=-$/, 'outside an agent: none');

$mock->stop;
$t->done;
