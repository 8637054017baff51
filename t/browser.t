#!/usr/bin/perl

# The demo page of nginx.conf.example in a real browser (Chromium driven
# by t/browser/demo.mjs), with the offline demo provider: streamed text,
# a server tool, a streaming tool, approve, reject, edit, a form, a
# question, a client tool, a stop mid-reply, and a reload mid-reply that
# loses and doubles nothing.  Each step leaves a screenshot in the test's
# directory (TEST_NGINX_LEAVE=1 keeps it).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use POSIX ();
use Time::HiRes qw(sleep);
use Test::More;
use Test::Agent;

my $chromium = $ENV{CHROMIUM}
    // (grep { -x } qw(/usr/bin/chromium /usr/bin/chromium-browser))[0];
my $dir = "$FindBin::Bin/browser";

plan skip_all => 'no Chromium (apt-get install chromium, or set CHROMIUM)'
    unless $chromium && -x $chromium;
plan skip_all => 'no node or npm (apt-get install nodejs npm)'
    unless `node --version 2>/dev/null` =~ /^v(\d+)/ && $1 >= 18
           && `npm --version 2>/dev/null`;

unless (-d "$dir/node_modules/playwright-core") {
    system("cd '$dir' && npm ci --no-audit --no-fund --loglevel=error "
           . '>&2') == 0
        or plan skip_all => 'npm ci failed: playwright-core not installed';
}

my $t = Test::Agent->new;

open my $fh, '<', Test::Agent->root . '/nginx.conf.example' or die "$!\n";
my $conf = do { local $/; <$fh> };
close $fh;

$conf =~ s/^load_module .*$/%%TEST_GLOBALS%%/m;
$conf =~ s/^(pid|error_log) .*$//mg;
$conf =~ s/127\.0\.0\.1:8080/127.0.0.1:%%PORT_8080%%/g;
$conf =~ s/127\.0\.0\.1:8081/127.0.0.1:%%PORT_8081%%/g;
mkdir $t->testdir . $_ for '/demo', '/demo/tmp', '/demo/logs', '/shots';
symlink(Test::Agent->root . '/client', $t->testdir . '/client')
    or die "symlink: $!\n";
$t->write_file_expand('demo/provider.conf',
    "proxy_pass http://127.0.0.1:%%PORT_8081%%/v1/responses;\n");
$t->write_file_expand('nginx.conf', $conf);

my $provider_port = $t->port(8081);

$t->run;

# the demo's own provider, a little faster than for people
my $provider = fork // die "fork: $!\n";

if ($provider == 0) {
    open STDOUT, '>', '/dev/null';
    $ENV{DEMO_PROVIDER_DELAY} = 0.02;
    exec $^X, Test::Agent->root . '/bin/demo-provider', $provider_port
        or POSIX::_exit(127);
}

END { kill 'TERM', $provider if $provider; }

sleep 0.5;

my $base = 'http://127.0.0.1:' . $t->port(8080);
my $shots = $t->testdir . '/shots';

local $ENV{CHROMIUM} = $chromium;
open my $run, '-|', "cd '$dir' && node demo.mjs $base '$shots' 2>&1"
    or die "node: $!\n";

my $checks = 0;

while (my $line = <$run>) {
    chomp $line;

    if ($line =~ /^(not )?ok - (.*)$/) {
        ok(!$1, $2);
        $checks++;
    } elsif ($line =~ /^screenshot /) {
        note($line);
    } else {
        diag($line);
    }
}

close $run;
is($? >> 8, 0, 'the browser run ended well');
unlike($t->read_file('error.log'), qr/\[error\].*(favicon|open\(\))/,
       'no file asked for and missing (an icon) in the error log');
cmp_ok($checks, '>=', 45, 'every check ran');

$t->done;
