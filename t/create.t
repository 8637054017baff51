#!/usr/bin/perl

# agent_create: the module mints a conversation's id, unguessable, and
# binds the conversation to its agent and owner at once: the owner uses
# it as any conversation, another owner finds no such conversation, and
# a request with no owner is answered 401.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'hello' };
});

$t->write_file_expand('nginx.conf', engine_conf($mock,
    server => 'agent_owner $http_x_user;
        location = /conversations {
            agent chat;
            agent_create;
        }'));
$t->run;


sub req { owner_request($t, @_) }

my $r = req('alice', 'POST', '/conversations', '');
is($r->{status}, 201, 'created');
my $id = $r->{json}{conversation} // '';
like($id, qr/^[0-9a-f]{32}$/, 'a 128-bit id, in hex');
is_deeply([sort keys %{$r->{json}}], ['conversation'], 'and nothing else');

my %seen = ($id => 1);
$seen{req('alice', 'POST', '/conversations', '')->{json}{conversation}}++
    for 1 .. 20;
is(scalar keys %seen, 21, 'each id new');

# the owner's, at once: before any message

my $c = req('alice', 'GET', "/c/$id");
is($c->{status}, 200, 'the owner sees it');
is($c->{json}{state}, 'idle', 'idle');
is_deeply($c->{json}{messages}, [], 'with nothing in it');

is(req('bob', 'GET', "/c/$id")->{status}, 404, 'another owner does not');
is(req('bob', 'POST', "/c/$id/messages", '{"content":"mine now"}')
   ->{status}, 404, 'nor can take it with a message');
is(scalar @{$mock->requests}, 0, 'no model call for it');

# the owner talks in it

is(req('alice', 'POST', "/c/$id/messages", '{"content":"hi"}')->{status},
   202, 'the owner sends');

for (1 .. 200) {
    $c = req('alice', 'GET', "/c/$id")->{json};
    last if $c && $c->{state} eq 'idle' && !defined $c->{lease}
            && @{$c->{messages}};
    select(undef, undef, undef, 0.05);
}

is(log_types($c), 'user_msg assistant_msg turn_completed', 'a turn ran');
is($c->{messages}[1]{content}, 'hello', 'and was answered');

# no owner, no conversation; only POST

is(req(undef, 'POST', '/conversations', '')->{status}, 401,
   'no owner: 401');
$r = req('alice', 'GET', '/conversations');
is($r->{status}, 405, 'GET: 405');
is($r->{headers}{allow} // '', 'POST', 'POST is allowed');

$mock->stop;
$t->done;
