#!/usr/bin/perl

# A full zone answers 503 and names itself in the error log; what it
# already holds stays intact, and the refused message leaves no trace.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'noted' };
});

$t->write_file_expand('nginx.conf', engine_conf($mock, zone => '32k',
    http => 'client_body_buffer_size 16k;'));
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
$t->done;
