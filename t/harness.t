#!/usr/bin/perl

# The harness fails a test file on what it must: alerts, crits, emergs and
# sanitizer reports in the logs, and nothing else.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Test::Agent;


sub problems_with {
    my ($file, $text) = @_;
    my $h = Test::Agent->new;
    $h->write_file($file, $text);
    return $h->log_problems;
}

my $ok = "2026/01/01 00:00:00 [error] 1#1: *1 open() failed\n"
    . "2026/01/01 00:00:00 [warn] 1#1: conflicting server name\n"
    . "2026/01/01 00:00:00 [info] 1#1: *2 client closed connection\n";

is(scalar problems_with('error.log', $ok), 0, 'errors and warnings pass');

for my $level (qw(alert crit emerg)) {
    is(scalar problems_with('error.log',
                            $ok . "2026/01/01 00:00:00 [$level] 1#1: x\n"),
       1, "[$level] fails the file");
}

is(scalar problems_with('stderr.log',
                        "==1==ERROR: AddressSanitizer: heap-use-after-free\n"),
   1, 'AddressSanitizer report on stderr fails the file');
is(scalar problems_with('error.log',
                        "src/x.c:1:2: runtime error: signed integer overflow\n"),
   1, 'UBSan report in the error log fails the file');
is(scalar problems_with('asan.1234',
                        "==1234==ERROR: LeakSanitizer: detected memory leaks\n"),
   1, 'sanitizer log file fails the file');

my $h = Test::Agent->new;
$h->write_file('error.log',
               "2026/01/01 00:00:00 [alert] 1#1: worker process 42 exited"
               . " on signal 9\n");
$h->allow_alert(qr/worker process \d+ exited on signal 9/);
is(scalar $h->log_problems, 0, 'an alert the test provoked can be allowed');

done_testing();
