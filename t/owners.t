#!/usr/bin/perl

# Owners: with agent_owner, a conversation belongs to the owner it was
# created for.  Every verb from another owner is answered as for an
# unknown conversation, byte for byte, and changes nothing; a request
# with no owner is answered 401.  The owner is written to the store and
# comes back with the conversation after a restart.
#
# Approvers: only some users may approve (auth_request on an approvals
# location, which serves every owner); who approved is recorded in the
# resolution and reaches the gated tool's location as X-Agent-Approver,
# also when the call is sent again by a worker that took the turn over.

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
my $mport = $mock->port;

my $db = $t->testdir . '/agent.db';

# the owner is who the X-User header says: a stand-in for $remote_user
# or a JWT claim.  Only carol approves.  The gated tool's location is
# the mock, which records the headers it gets.

my $tools = <<'EOF';
    agent_tool ask_user {
        executor human;
        timeout 1h;
    }

    agent_tool send {
        approval requires_approval;
        location /tools/send;
        timeout 1h;
    }
EOF

my $server = <<"EOF";
        agent_owner \$http_x_user;

        location ~ ^/approve/(?<acid>[^/]+)/(?<atcid>[^/]+)\$ {
            auth_request /approvers;
            agent chat;
            agent_owner off;
            agent_conversation \$acid;
            agent_tool_call \$atcid;
            agent_approver \$http_x_user;
            agent_resolve;
        }

        location = /approvers {
            internal;
            if (\$http_x_user != "carol") {
                return 403;
            }
            return 204;
        }

        location = /tools/send {
            internal;
            proxy_pass http://127.0.0.1:$mport/v1/chat/completions;
        }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store $db;", server => $server, tools => $tools,
    agent => 'tools ask_user send;'));
$t->run;


# a request as a user (undef: with no X-User header)

sub req { owner_request($t, @_) }

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
is(req('x' x 129, 'GET', '/c/c1')->{status}, 401,
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

# approvers

sub approve {
    my ($user, $cid, $tcid) = @_;
    return req($user, 'POST', "/approve/$cid/$tcid",
               '{"decision":"approve"}');
}

sub tool_requests {
    return grep { $_->{headers}{'idempotency-key'} } @{$mock->requests};
}

$mock->reset;
$mock->script({ tool_calls => [{ id => 's1', name => 'send',
                                 arguments => '{"to":"x"}' }] },
              { text => 'sent' }, { text => 'done' });

is(req('alice', 'POST', '/c/c3/messages', '{"content":"send it"}')
   ->{status}, 202, 'alice asks for a gated call');
$before = wait_alice('c3', 'awaiting_input');
is($before->{pending}[0]{kind}, 'approval', 'it waits for approval');

$r = approve('dave', 'c3', 's1');
is($r->{status}, 403, 'dave may not approve');
is($r->{json}{error}{code}, 'forbidden', 'as JSON');
is_deeply(as_alice('c3')->{messages}, $before->{messages},
          'nothing changed');

is(approve('carol', 'c3', 's1')->{status}, 200, 'carol approves');

$done = wait_alice('c3', 'idle');
my ($res) = grep { $_->{type} eq 'resolution' } @{$done->{messages}};
is($res->{approver}, 'carol', 'the resolution names her');
is($done->{messages}[-2]{content}, 'done', 'the turn finished');

my @tool = tool_requests();
is(scalar @tool, 1, 'the tool ran once');
is($tool[0]{headers}{'x-agent-approver'}, 'carol',
   'its location was told who approved');

# a call sent again after its worker died keeps its approver: it is
# read from the log

$mock->reset;
$mock->script({ tool_calls => [{ id => 's2', name => 'send',
                                 arguments => '{"to":"y"}' }] },
              { stall_head => 1 }, { text => 'sent' }, { text => 'done' });

req('alice', 'POST', '/c/c4/messages', '{"content":"send again"}');
wait_alice('c4', 'awaiting_input');
is(approve('carol', 'c4', 's2')->{status}, 200, 'carol approves again');
$mock->wait_requests(2, 5);

my $lease;
for (1 .. 100) {
    $lease = as_alice('c4')->{lease} and last;
    sleep 0.02;
}
ok($lease, 'a worker runs the call');
$t->kill_worker($lease);
$t->allow_alert(qr/worker process \d+ exited on signal 9/);

$done = wait_alice('c4', 'idle');
is($done->{messages}[-2]{content}, 'done', 'taken over and finished');

@tool = tool_requests();
is(scalar @tool, 2, 'the call was sent again');
is_deeply([ map { $_->{headers}{'x-agent-approver'} } @tool ],
          [ 'carol', 'carol' ], 'both times with its approver');

$mock->stop;
$t->done;
