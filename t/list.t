#!/usr/bin/perl

# The conversation list (agent_list): the owner's conversations of the
# location's agent (id, agent, state, last activity, pending calls), in
# id order, a page at a time with a cursor.  Another owner sees none of
# them, a request with no owner gets 401.  With the store, conversations
# the zone no longer holds (after a restart) are listed from SQLite, and
# one both hold is listed once.

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
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => Test::Agent::Store->missing) if Test::Agent::Store->missing;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'a reply' };
});

my $t = Test::Agent->new;
my $store = Test::Agent::Store->for_test($t);
my $db = $store->directive;

my $tools = <<'EOF';
    agent_tool ask_user {
        executor human;
        timeout 1h;
    }
EOF

my $server = <<'EOF';
        agent_owner $http_x_user;

        location = /list {
            agent chat;
            agent_list;
        }

        location = /all {
            agent chat;
            agent_owner off;
            agent_list;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store $db;", server => $server, tools => $tools,
    agent => 'tools ask_user;'));
$t->run;

sub req { owner_request($t, @_) }

sub list {
    my ($user, $args) = @_;
    return req($user, 'GET', '/list' . ($args ? "?$args" : ''));
}

# every page, following the cursor; the ids in order

sub all_ids {
    my ($user, $limit) = @_;

    my (@ids, $cursor, $pages);

    do {
        my $r = list($user, "limit=$limit"
                            . (defined $cursor ? "&cursor=$cursor" : ''));
        return "status $r->{status}" unless $r->{status} == 200;
        push @ids, map { $_->{id} } @{$r->{json}{conversations}};
        $cursor = $r->{json}{next_cursor};
        return 'too many pages' if ++$pages > 20;
    } while (defined $cursor);

    return join ' ', @ids;
}

sub wait_idle {
    my ($user, $cid, $state) = @_;
    my $deadline = time + 10;
    while (time < $deadline) {
        my $r = req($user, 'GET', "/c/$cid");
        return 1 if $r->{status} == 200 && $r->{json}{state} eq $state
                    && !defined $r->{json}{lease};
        sleep 0.05;
    }
    return 0;
}

for my $cid (qw(a3 a1 a5 a2 a4)) {
    is(req('alice', 'POST', "/c/$cid/messages", '{"content":"hi"}')
       ->{status}, 202, "alice creates $cid");
    wait_idle('alice', $cid, 'idle');
}

for my $cid (qw(b2 b1)) {
    req('bob', 'POST', "/c/$cid/messages", '{"content":"hi"}');
    wait_idle('bob', $cid, 'idle');
}

$mock->script({ tool_calls => [{ id => 'q1', name => 'ask_user',
                                 arguments => '{"question":"Which?"}' }] });
req('alice', 'POST', '/c/a6/messages', '{"content":"ask me"}');
ok(wait_idle('alice', 'a6', 'awaiting_input'), 'a6 waits for an answer');

my $r = list('alice', 'limit=2');
is($r->{status}, 200, 'the list');
is_deeply([ map { $_->{id} } @{$r->{json}{conversations}} ], [qw(a1 a2)],
          'a page of two, in id order');
is($r->{json}{next_cursor}, 'a2', 'with a cursor');

my $c = $r->{json}{conversations}[0];
is($c->{agent}, 'chat', 'the agent');
is($c->{state}, 'idle', 'the state');
is($c->{pending}, 0, 'nothing pending');
ok(abs($c->{last_activity} / 1000 - time) < 60,
   'last activity, ms since the epoch');

is(all_ids('alice', 2), 'a1 a2 a3 a4 a5 a6', 'the cursor reaches them all');
is(all_ids('alice', 6), 'a1 a2 a3 a4 a5 a6', 'a page that holds them all');
is(list('alice', 'limit=6')->{json}{next_cursor}, undef, 'and ends there');

my ($a6) = grep { $_->{id} eq 'a6' } @{list('alice')->{json}{conversations}};
is($a6->{state}, 'awaiting_input', 'a waiting conversation');
is($a6->{pending}, 1, 'with its pending call');

is(all_ids('bob', 1), 'b1 b2', 'bob sees his own only');
is(all_ids('carol', 5), '', 'carol none');
is(list(undef)->{status}, 401, 'no owner: 401');
is(list(undef)->{json}{error}{code}, 'unauthorized', 'unauthorized');

$r = req(undef, 'GET', '/all?limit=100');
is(join(' ', map { $_->{id} } @{$r->{json}{conversations}}),
   'a1 a2 a3 a4 a5 a6 b1 b2', 'without agent_owner: every owner\'s');

$r = list('alice', 'cursor=../x');
is($r->{status}, 400, 'a bad cursor: 400');
is($r->{json}{error}{code}, 'invalid_argument', 'invalid_argument');
is(list('alice', 'limit=0')->{status}, 400, 'a bad limit: 400');
is(req('alice', 'POST', '/list', '{}')->{status}, 405, 'POST: 405');

# after a restart the zone is empty: the list comes from the store

$t->stop;
is($t->{unclean}, undef, 'stopped');
$t->run;

is(all_ids('alice', 2), 'a1 a2 a3 a4 a5 a6', 'after a restart, all of them');
($a6) = grep { $_->{id} eq 'a6' } @{list('alice')->{json}{conversations}};
is($a6->{state}, 'awaiting_input', 'a6 still waits');
is($a6->{pending}, 1, 'its call still pending');
($c) = grep { $_->{id} eq 'a1' } @{list('alice')->{json}{conversations}};
is($c->{state}, 'idle', 'a1 idle');
is(all_ids('bob', 1), 'b1 b2', 'bob still his own only');

# some back in the zone, some not: each listed once

is(req('alice', 'GET', '/c/a3')->{status}, 200, 'a3 revived');
is(req('alice', 'POST', '/c/a7/messages', '{"content":"new"}')->{status},
   202, 'a7 created');
wait_idle('alice', 'a7', 'idle');
is(all_ids('alice', 3), 'a1 a2 a3 a4 a5 a6 a7', 'zone and store merged');
is(all_ids('bob', 3), 'b1 b2', 'and bob\'s apart');

$t->done;
