#!/usr/bin/perl

# A full zone with keep_idle answers 503 and names itself in the error
# log; what it already holds stays intact, and the refused message leaves
# no trace.  Without keep_idle (and with no store) the oldest
# conversations at rest make room instead.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'noted' };
});

$t->write_file_expand('nginx.conf', engine_conf($mock,
    zone => '32k keep_idle', http => 'client_body_buffer_size 16k;'));
$t->run;

my $big = 'x' x 3000;
my ($full, $n);

for my $i (1 .. 100) {
    my $r = send_message($t, "z$i", $big);

    if ($r->{status} == 503) {
        $full = $r;
        $n = $i;
        last;
    }

    is($r->{status}, 202, "message $i taken") or last;
    wait_state($t, "z$i", 'idle');
}

ok($full, "zone full after " . (($n // 0) - 1) . " conversations");
is($full->{json}{error}{code}, 'zone_full', 'error code');

like($t->read_file('error.log'), qr/agent zone "agents" is full/,
     'error log names the zone');

is(inspect($t, "z$n")->{status}, 404, 'the refused conversation does not exist');

for my $i (1, $n - 1) {
    my $c = inspect($t, "z$i")->{json};
    is(log_types($c), 'user_msg assistant_msg turn_completed',
       "conversation $i intact");
    is($c->{messages}[0]{content}, $big, "conversation $i content intact");
}

$mock->stop;
$t->done(more => 1);

# live events are what gives way under pressure: the deltas of finished
# turns make room for new conversations, and nothing canonical is lost

my $t2 = Test::Agent->new;
my $mock2 = Test::Agent::MockProvider->new(default => sub {
    return { text => 'abcd' x 64, chunks => 64 };
});

# a conversation takes about two pages (its record and its log) and its
# ring of deltas four more: without the deltas giving way, about ten
# would fit

$t2->write_file_expand('nginx.conf', engine_conf($mock2, zone => '256k'));
$t2->run;

for my $i (1 .. 16) {
    my $r = send_message($t2, "l$i", 'go');
    is($r->{status}, 202, "conversation $i taken while old deltas fill up");
    my $c = wait_state($t2, "l$i", 'idle');
    is($c->{messages}[1]{content}, 'abcd' x 64, "conversation $i complete");
}

for my $i (1 .. 16) {
    is(log_types(inspect($t2, "l$i")->{json}),
       'user_msg assistant_msg turn_completed', "conversation $i log kept");
}

$mock2->stop;
$t2->done(more => 1);

# no store, no keep_idle: finished conversations never keep new ones out;
# the least recently used at rest leaves

my $t3 = Test::Agent->new;
my $mock3 = Test::Agent::MockProvider->new(default => sub {
    return { text => 'noted' };
});

$t3->write_file_expand('nginx.conf', engine_conf($mock3, zone => '128k',
    http => 'client_body_buffer_size 16k;',
    server => 'location = /metrics { agent_metrics; }'));
$t3->run;

my @refused;

for my $i (1 .. 80) {
    my $r = send_message($t3, "d$i", $big);
    push @refused, $i unless $r->{status} == 202;
    wait_state($t3, "d$i", 'idle') if $r->{status} == 202;
}

is("@refused", '', 'no message refused: conversations at rest gave way');
is(inspect($t3, 'd1')->{status}, 404, 'the oldest was dropped');

my $last = inspect($t3, 'd80')->{json};
is(log_types($last), 'user_msg assistant_msg turn_completed',
   'the newest is whole');
is($last->{messages}[0]{content}, $big, 'its content intact');

like($t3->read_file('error.log'),
     qr/agent zone "agents" is full: conversation "d1" at rest dropped/,
     'each drop is logged');

my $m = http_get('/metrics', port => $t3->port(8080))->{body};
my ($dropped) = $m =~ /^agent_zone_dropped_total\{zone="agents"\} (\d+)$/m;
ok(defined $dropped && $dropped > 0 && $dropped < 80,
   'and counted: ' . ($dropped // 'none'));

$mock3->stop;
$t3->done;
