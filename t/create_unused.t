#!/usr/bin/perl

# A conversation agent_create made and nobody used is freed after
# agent_evict_unused: no request named it for that long, it has no
# event and no subscriber.  Its record goes from the zone (the count of
# conversations and the zone's bytes come back); the id is free again,
# as after a restart: a message to it starts a new conversation under
# it.  One that got a message stays, as one with a subscriber waiting
# for its first event does until the subscriber goes.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::SSE;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'hello' };
});

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => 'agent_evict_unused 5s;',
    server => 'agent_owner $http_x_user;
        location = /conversations {
            agent chat;
            agent_create;
        }

        location = /zone {
            agent_zone_status;
        }'));
$t->run;

sub req { owner_request($t, @_) }

sub zone {
    my $r = http_get('/zone', port => $t->port(8080));
    return decode_json($r->{body});
}

# polls the zone until it holds $n conversations; the last count seen

sub wait_count {
    my ($n, $timeout) = @_;
    my $deadline = time + $timeout;
    my $got;

    while (time < $deadline) {
        $got = zone()->{conversations};
        return $got if $got == $n;
        sleep 0.1;
    }

    return $got;
}

my $base = zone();
is($base->{conversations}, 0, 'an empty zone');

# 5 s: minting 300 and using two of them fits in it on a loaded machine

my @ids = map { req('alice', 'POST', '/conversations', '')->{json}
                    {conversation} } 1 .. 300;
is(scalar(grep { defined && /^[0-9a-f]{32}$/ } @ids), 300, '300 ids minted');

my $made = zone();
is($made->{conversations}, 300, 'each a conversation in the zone');
cmp_ok($made->{used} - $base->{used}, '>=', 300 * 512,
       'holding zone memory');

# one used at once, one watched by a subscriber

my ($used, $watched, $gone) = @ids[0, 1, 2];

is(req('alice', 'POST', "/c/$used/messages", '{"content":"hi"}')->{status},
   202, 'a message to one');

my $sse = Test::Agent::SSE->new(http_stream(
    events_request($watched, 'X-User' => 'alice'), port => $t->port(8080)));
is($sse->stream->status, 200, 'a subscriber to another');

is(wait_count(2, 15), 2, 'after agent_evict_unused, the others are freed');
cmp_ok(zone()->{used} - $base->{used}, '<', 300 * 512,
       'and their zone memory');

is(req('alice', 'GET', "/c/$gone")->{status}, 404,
   'a freed id names no conversation');

my $c = req('alice', 'GET', "/c/$used")->{json};
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'the one used is kept');
is(req('alice', 'GET', "/c/$watched")->{status}, 200,
   'the one watched is kept');

# the subscriber goes: so does the conversation it waited on

$sse->stream->close;
is(wait_count(1, 15), 1, 'unwatched, it is freed too');

# the id is free again: a message starts a new conversation under it

is(req('alice', 'POST', "/c/$gone/messages", '{"content":"back"}')
   ->{status}, 202, 'a message to a freed id is taken');

for (1 .. 100) {
    $c = req('alice', 'GET', "/c/$gone")->{json};
    last if $c && $c->{state} eq 'idle' && @{$c->{messages} // []} > 1;
    sleep 0.05;
}

is(log_types($c), 'user_msg assistant_msg turn_completed',
   'as a new conversation');

sleep 5.5;
is(zone()->{conversations}, 2, 'conversations in use stay');

$mock->stop;
$t->done;
