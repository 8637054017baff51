#!/usr/bin/perl

# The module builds against Debian's nginx-dev and loads into the stock
# nginx binary; the harness controls the running nginx.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Test::Agent;
use Test::Agent::HTTP;

my $t = Test::Agent->new;

$t->write_file_expand('nginx.conf', <<'EOF');
%%TEST_GLOBALS%%

worker_processes 2;

events {
}

http {
    %%TEST_GLOBALS_HTTP%%

    server {
        listen 127.0.0.1:%%PORT_8080%%;

        location / {
            return 200 "served\n";
        }
    }
}
EOF

my ($rc, $out) = $t->test_config;
is($rc, 0, 'nginx -t accepts the configuration with the module loaded');
like($out, qr/test is successful/, 'nginx -t reports success');

$t->run;

my $port = $t->port(8080);
my $r = http_get('/', port => $port);
is($r->{status}, 200, 'request served with the module loaded');
is($r->{body}, "served\n", 'response body');

like($t->read_file('error.log'), qr/start worker process/,
     'error log written in the test dir');

my @workers = $t->wait_workers(2);
is(scalar @workers, 2, 'two workers');

my $killed = $t->kill_worker;
my @after = $t->wait_workers(2);
ok(!grep({ $_ == $killed } @after) && @after == 2,
   'a SIGKILLed worker is replaced by the master');
is(http_get('/', port => $port)->{status}, 200, 'served after the kill');

ok($t->reload, 'reload starts new workers');
is(http_get('/', port => $port)->{status}, 200, 'served after reload');

# the kill above makes the master log an alert about the worker; nothing
# else may

like($t->read_file('error.log'), qr/exited on signal 9/,
     'master noticed the killed worker');

$t->allow_alert(qr/worker process \d+ exited on signal 9/);
$t->done;
