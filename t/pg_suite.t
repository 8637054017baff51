#!/usr/bin/perl

# The tests of the store's behaviour that hold for either backend, run
# against PostgreSQL (TEST_AGENT_STORE=pg, a server of each test's own):
# revival after a restart with waiting calls and their deadlines, a
# deadline passed while nginx was stopped, a turn cut off by a crash of
# the whole server, queued messages (revival.t); agent_list's pages
# (list.t); the audit's rows and pages, rows that cannot be written, a
# batch behind another session's lock (audit.t); queue ids given once
# (store_queue_ids.t); take-overs counted across restarts
# (store_takeovers.t).  SQLite's own (WAL,
# VFS, sync, schema files) stay SQLite's.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Test::Agent::Postgres;

plan(skip_all => Test::Agent::Postgres->missing)
    if Test::Agent::Postgres->missing;

local $ENV{TEST_AGENT_STORE} = 'pg';

for my $file (qw(revival.t list.t audit.t store_queue_ids.t
                 store_takeovers.t)) {
    my $out = `$^X $FindBin::Bin/$file 2>&1`;
    my $rc = $? >> 8;
    my @failed = $out =~ /^(not ok \d+ .*)$/mg;
    my ($planned) = $out =~ /^1\.\.(\d+)$/m;

    ok($rc == 0 && !@failed && $planned, "$file against PostgreSQL")
        or diag(join "\n", "exit $rc", @failed,
                grep { /^#/ } split /\n/, $out);
}

done_testing();
