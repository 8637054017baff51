#!/usr/bin/perl

# agent_create with a PostgreSQL store (one nginx, no agent_node): the
# conversation's row is written before the 201, bound to its agent and
# owner, so the binding outlives a restart (another owner still finds no
# such conversation, a message of theirs is refused); the list leaves it
# out until its first message; once unused for agent_evict_unused its
# row goes with its record, and the id is free again.

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
use Test::Agent::Postgres;

plan(skip_all => Test::Agent::Postgres->missing)
    if Test::Agent::Postgres->missing;

my $pg = Test::Agent::Postgres->new;
my $conninfo = $pg->conninfo;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'hello' };
});

my $t = Test::Agent->new;
$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store \"$conninfo\"; agent_evict_unused 3s;",
    server => 'agent_owner $http_x_user;
        location = /conversations {
            agent chat;
            agent_create;
        }

        location = /list {
            agent chat;
            agent_list;
        }'));
$t->run;

sub req { owner_request($t, @_) }

sub row {
    my ($id) = @_;
    return $pg->sql("SELECT agent, owner, coalesce(node, '-'), last_seq"
                    . " FROM conversations WHERE id = '$id'");
}

sub listed {
    my ($user) = @_;
    my $r = req($user, 'GET', '/list');
    return join ' ', map { $_->{id} } @{$r->{json}{conversations} // []};
}

my $r = req('alice', 'POST', '/conversations', '');
is($r->{status}, 201, 'created');
my $id = $r->{json}{conversation} // '';
is(row($id), 'chat|alice|-|0', 'its row written: bound, with no event');
is(listed('alice'), '', 'not listed while it has no message');

# a restart: the zone is empty, the store has the binding

$t->stop;
$t->run;

is(req('bob', 'GET', "/c/$id")->{status}, 404,
   'after a restart, another owner finds no such conversation');
is(req('bob', 'POST', "/c/$id/messages", '{"content":"mine now"}')
   ->{status}, 404, 'nor can take it with a message');
is(req('alice', 'GET', "/c/$id")->{status}, 200, 'its owner does');
is(row($id), 'chat|alice|-|0', 'the row as it was');

is(req('alice', 'POST', "/c/$id/messages", '{"content":"hi"}')->{status},
   202, 'the owner sends');
for (1 .. 200) {
    my $c = req('alice', 'GET', "/c/$id")->{json};
    last if $c && $c->{state} eq 'idle' && !defined $c->{lease}
            && @{$c->{messages}};
    sleep 0.05;
}
like($pg->wait_sql("SELECT last_seq FROM conversations WHERE id = '$id'",
                   qr/^3$/, 10), qr/^3$/, 'its turn written in the same row');
is(listed('alice'), $id, 'and listed now');

# one never used: freed after agent_evict_unused, its row with it

$r = req('alice', 'POST', '/conversations', '');
my $unused = $r->{json}{conversation} // '';
is(row($unused), 'chat|alice|-|0', 'another created');

is($pg->wait_sql("SELECT count(*) FROM conversations WHERE id = '$unused'",
                 qr/^0$/, 15), 0, 'unused: its row goes with its record');
is(req('bob', 'POST', "/c/$unused/messages", '{"content":"a new one"}')
   ->{status}, 202, 'the id is free again');
is(row($id), 'chat|alice|-|3', 'the used one stays');

$mock->stop;
$t->stop;

done_testing;
