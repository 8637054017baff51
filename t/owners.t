#!/usr/bin/perl

# Owners: with agent_owner, a conversation belongs to the owner it was
# created for.  Every verb from another owner is answered as for an
# unknown conversation, byte for byte, and changes nothing; a request
# with no owner is answered 401.  The owner is written to the store and
# comes back with the conversation after a restart.

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

plan(skip_all => 'no sqlite3 command') unless `sqlite3 -version 2>&1` =~ /^3/;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'default reply' };
});

my $db = $t->testdir . '/agent.db';

# the owner is who the X-User header says: a stand-in for $remote_user
# or a JWT claim

my $http = "agent_store $db; agent_owner \$http_x_user;";

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => $http, agent => 'tools ask_user;',
    tools => "agent_tool ask_user { executor human; timeout 1h; }"));
$t->run;

my $port = $t->port(8080);

# a request as a user (undef: with no X-User header)

sub req {
    my ($user, $method, $uri, $body) = @_;

    my %h = defined $user ? ('X-User' => $user) : ();
    $h{'Content-Type'} = 'application/json' if defined $body;

    my $r = http(http_request($method, $uri, $body, headers => \%h),
                 port => $port);
    $r->{json} = eval { decode_json($r->{body}) };
    return $r;
}

# every verb on a conversation, as the user; a message to an unknown
# id would create it, so the verbs to send may be named

my %VERBS = (
    message => [ 'POST', 'messages', '{"content":"let me in"}' ],
    events => [ 'GET', 'events' ],
    inspect => [ 'GET', '' ],
    resolve => [ 'POST', 'calls/q1', '{"result":"from bob"}' ],
    cancel => [ 'POST', 'cancel', '' ],
);

sub verbs {
    my ($user, $cid, @verbs) = @_;

    @verbs = sort keys %VERBS unless @verbs;

    return map {
        my ($method, $path, $body) = @{$VERBS{$_}};
        ($_ => req($user, $method, "/c/$cid" . ($path ? "/$path" : ''),
                   $body));
    } @verbs;
}

sub as_alice {
    my ($cid) = @_;
    my $r = req('alice', 'GET', "/c/$cid");
    return $r->{status} == 200 ? $r->{json} : undef;
}

sub wait_alice {
    my ($cid, $state) = @_;
    my $deadline = time + 10;
    my $c;
    while (time < $deadline) {
        $c = as_alice($cid);
        return $c if $c && $c->{state} eq $state && !defined $c->{lease};
        sleep 0.05;
    }
    return $c;
}

# alice's conversation waits for her answer

$mock->script({ tool_calls => [{ id => 'q1', name => 'ask_user',
                                 arguments => '{"q":"which?"}' }] });

my $r = req('alice', 'POST', '/c/c1/messages', '{"content":"hello"}');
is($r->{status}, 202, 'alice creates a conversation');

my $before = wait_alice('c1', 'awaiting_input');
is($before->{pending}[0]{tool_call_id}, 'q1', 'it waits for her answer');

my $requests = scalar @{$mock->requests};

# bob: every verb as for an unknown conversation

my $unknown = req('bob', 'GET', '/c/nosuch');
is($unknown->{status}, 404, 'an unknown conversation');

my %bob = verbs('bob', 'c1');

for my $verb (sort keys %bob) {
    is($bob{$verb}{status}, 404, "bob's $verb: 404");
    is($bob{$verb}{body}, $unknown->{body}, "bob's $verb: as unknown");
}

my %unknown = verbs('bob', 'nosuch', qw(events inspect resolve cancel));

for my $verb (sort keys %unknown) {
    is($unknown{$verb}{body}, $bob{$verb}{body},
       "$verb of an unknown conversation: the same answer");
}

my $after = as_alice('c1');
is_deeply($after->{messages}, $before->{messages}, 'the log unchanged');
is($after->{state}, 'awaiting_input', 'still waiting');
is_deeply($after->{pending}, $before->{pending}, 'the call still waits');
is(scalar @{$mock->requests}, $requests, 'the model was not called');

# no owner: 401

my %anon = verbs(undef, 'c1');

for my $verb (sort keys %anon) {
    is($anon{$verb}{status}, 401, "no owner, $verb: 401");
    is($anon{$verb}{json}{error}{code}, 'unauthorized',
       "no owner, $verb: as JSON");
}

is(req('', 'GET', '/c/c1')->{status}, 401, 'an empty owner: 401');
is(req('x' x 257, 'GET', '/c/c1')->{status}, 401,
   'an owner too long to record: 401');

is_deeply(as_alice('c1')->{messages}, $before->{messages},
          'the log still unchanged');

# alice goes on

$r = req('alice', 'POST', '/c/c1/calls/q1', '{"result":"this one"}');
is($r->{status}, 200, 'alice answers');

my $done = wait_alice('c1', 'idle');
is($done->{messages}[-1]{type}, 'turn_completed', 'her turn finished');

# the owner survives a restart: revived from the store, still alice's

is(`sqlite3 '$db' "SELECT owner FROM conversations WHERE id = 'c1'"`,
   "alice\n", 'the owner is written');

$t->stop;
$t->run;

$r = req('bob', 'POST', '/c/c1/messages', '{"content":"after"}');
is($r->{status}, 404, 'after a restart, bob still gets 404');
is($r->{body}, $unknown->{body}, 'as for an unknown conversation');
is(req('bob', 'GET', '/c/c1')->{status}, 404, 'and cannot inspect it');

my $back = as_alice('c1');
is_deeply($back->{messages}, $done->{messages},
          'alice gets it back, as it was');

$r = req('alice', 'POST', '/c/c1/messages', '{"content":"again"}');
is($r->{status}, 202, 'and goes on');
is(wait_alice('c1', 'idle')->{messages}[-2]{content}, 'default reply',
   'a new turn');

# bob's own conversation of the same agent is his

is(req('bob', 'POST', '/c/c2/messages', '{"content":"mine"}')->{status},
   202, 'bob creates his own');
is(req('alice', 'GET', '/c/c2')->{status}, 404, 'which alice cannot see');

$mock->stop;
$t->done;
