#!/usr/bin/perl

# The README's five-minute tour, as it is there: its shell commands run
# against nginx.conf.example with the demo's offline provider, as
# `./run demo` runs them, on this test's ports.  The events stream,
# which the reader stops with Ctrl-C, is stopped after a few seconds;
# the store's step runs after nginx is stopped and started again.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use IO::Socket::INET;
use POSIX ();
use Test::More;
use Test::Agent;
use Test::Agent::HTTP;

plan(skip_all => 'no curl')
    unless grep { -x "$_/curl" } split /:/, $ENV{PATH};

my $t = Test::Agent->new;
my $root = Test::Agent->root;

open my $fh, '<', "$root/README.md" or die "README.md: $!\n";
my $readme = do { local $/; <$fh> };
close $fh;

my ($tour) = $readme =~ /^## A five-minute tour\n(.*?)^## /ms;
my @blocks = ($tour // '') =~ /^```sh\n(.*?)^```$/msg;

is(scalar @blocks, 4, 'the tour: a conversation, a tool, an approval, '
   . 'the store');

# the README's first commands: ./run knows them (asked for none, it
# says what it takes and fails, installing nothing)

my ($top) = $readme =~ /^```sh\n(\.\/run demo.*?)^```$/ms;
my @commands = ($top // '') =~ /^\.\/run (\w+)/mg;
is("@commands", 'demo cluster test',
   'the README starts with ./run demo, cluster and test');

my $usage = `$root/run 2>&1`;
is($? >> 8, 2, './run with no command fails');
for my $command (@commands) {
    like($usage, qr/\b$command\b/, "./run takes $command");
}

# bin/demo, which ./run demo runs, with a port it needs taken: it says
# which and how to choose another, and stops.  It runs from a copy of
# the checkout's layout (links), its demo/ directory the copy's own.

{
    my $copy = $t->testdir . '/checkout';
    mkdir $copy or die "mkdir $copy: $!\n";
    symlink("$root/$_", "$copy/$_") or die "symlink $_: $!\n"
        for qw(bin t nginx.conf.example build client);

    my $taken = IO::Socket::INET->new(LocalAddr => '127.0.0.1:0',
                                      Listen => 1, ReuseAddr => 1)
        or die "listen: $!\n";
    my $tport = $taken->sockport;
    my ($free, $pfree) = ($t->port(8090), $t->port(8092));
    $t->release_ports;

    my $said = `AGENT_DEMO_PORT=$free AGENT_DEMO_PROVIDER_PORT=$tport \\
                timeout 20 $copy/bin/demo 2>&1 < /dev/null`;
    is($? >> 8, 1, 'bin/demo, the provider\'s port taken: it fails');
    like($said, qr/AGENT_DEMO_PROVIDER_PORT=\d+ \.\/run demo/,
         'and says how to choose another') or diag($said);

    SKIP: {
        skip('no module built for /usr/sbin/nginx', 2)
            unless -e "$root/build/nginx/objs/ngx_http_agent_module.so"
                   && -x '/usr/sbin/nginx';

        $said = `AGENT_DEMO_PORT=$tport AGENT_DEMO_PROVIDER_PORT=$pfree \\
                 timeout 20 $copy/bin/demo 2>&1 < /dev/null`;
        is($? >> 8, 1, 'bin/demo, nginx\'s port taken: it fails');
        like($said, qr/127\.0\.0\.1:$tport is taken.*AGENT_DEMO_PORT=\d+ /s,
             'and says how to choose another') or diag($said);
    }

    # bin/cluster (./run cluster), a node's port taken: it says so
    # before it starts anything

    $said = `AGENT_DEMO_PORT=$free AGENT_DEMO_PROVIDER_PORT=$pfree \\
             AGENT_CLUSTER_NODE_PORT=$tport \\
             timeout 20 $copy/bin/cluster 2>&1 < /dev/null`;
    is($? >> 8, 1, 'bin/cluster, a node\'s port taken: it fails');
    like($said, qr/127\.0\.0\.1:$tport is taken.*AGENT_CLUSTER_NODE_PORT=\d+ /s,
         'and says how to choose another') or diag($said);
    unlike($said, qr/PostgreSQL/, 'before PostgreSQL is started');
}

# nginx.conf.example as t/example.t runs it, the offline provider on 8081

open $fh, '<', "$root/nginx.conf.example" or die "$!\n";
my $conf = do { local $/; <$fh> };
close $fh;

$conf =~ s/^load_module .*$/%%TEST_GLOBALS%%/m;
$conf =~ s/^(pid|error_log) .*$//mg;
$conf =~ s/127\.0\.0\.1:8080/127.0.0.1:%%PORT_8080%%/g;
mkdir $t->testdir . $_ for '/demo', '/demo/tmp', '/demo/logs';
chmod 0777, $t->testdir . '/demo';
$t->write_file_expand('demo/provider.conf',
    "proxy_pass http://127.0.0.1:%%PORT_8081%%/v1/responses;\n");
$t->write_file_expand('nginx.conf', $conf);
symlink("$root/client", $t->testdir . '/client') or die "symlink: $!\n";

my $pport = $t->port(8081);
$t->release_ports;

my $provider = fork // die "fork: $!\n";

if ($provider == 0) {
    open STDOUT, '>', '/dev/null';
    exec $^X, "$root/bin/demo-provider", $pport or POSIX::_exit(1);
}

wait_port($pport) or BAIL_OUT('the demo provider did not start');

$t->run;

my $base = '127.0.0.1:' . $t->port(8080);
my $dir = $t->testdir;

sub shell {
    my ($block) = @_;

    $block =~ s/127\.0\.0\.1:8080/$base/g;

    # the stream the reader stops with Ctrl-C
    $block =~ s/^curl -N /timeout 8 curl -s -N /mg;
    $block =~ s/^curl /curl -s /mg;
    $block =~ s/; curl /; curl -s /g;

    $t->write_file('tour.sh', $block);

    return scalar `bash $dir/tour.sh 2>&1`;
}

# the conversation once its turn is over (a slow machine's turns may
# take longer than the tour's "sleep 2")

sub conv {
    my ($id) = @_;
    my $c = {};

    for (1 .. 100) {
        my $r = http_get("/chat/$id", port => $t->port(8080));
        $c = eval { decode_json($r->{body}) } || {};
        last if ($c->{state} // '') eq 'idle';
        select undef, undef, undef, 0.1;
    }

    return $c;
}

# a conversation

my $out = shell($blocks[0]);
like($out, qr/"conversation":"tour","turn":1,"seq":1/, 'a message: 202');
like($out, qr/event: turn_ended/, 'its reply streamed to the end');
is(conv('tour')->{state}, 'idle', 'and the turn is over');

# a tool

$out = shell($blocks[1]);
my @m = @{conv('tour')->{messages} // []};
my ($result) = grep { $_->{type} eq 'tool_result' } @m;
is($result && $result->{name}, 'get_time', 'get_time ran');
like($out, qr/"type":"tool_result".*"time":/s,
     'the page after the first turn shows its result');

# an approval

$out = shell($blocks[2]);
like($out, qr/"state":"awaiting_input".*"kind":"approval"/s,
     'the note waits for approval');
like($out, qr/"tool_call_id":"[^"]+","seq":\d+\}/, 'the approval: 200');

my $note = conv('note');
is($note->{state}, 'idle', 'the turn went on');
($result) = grep { $_->{type} eq 'tool_result' } @{$note->{messages}};
is_deeply($result && $result->{result}, { saved => JSON::PP::true },
          'the note was saved');

# the store: nginx stopped and started again

$t->stop;
$t->run;

$out = shell($blocks[3]);
like($out, qr/"conversation":"tour","state":"idle"/,
     'the conversation after a restart');
like($out, qr/"get_time"/, 'with its history');
like($out, qr/"zone":"agents"/, 'the zone status');

kill 'TERM', $provider;
waitpid $provider, 0;

$t->done;

sub wait_port {
    my ($port) = @_;

    for (1 .. 50) {
        my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port");
        return 1 if $s;
        select undef, undef, undef, 0.1;
    }

    return 0;
}
