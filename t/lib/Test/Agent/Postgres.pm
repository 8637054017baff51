package Test::Agent::Postgres;

# A PostgreSQL server of the test's own, on a unix socket in a temporary
# directory (no TCP port), stopped when the test ends.  initdb refuses to
# run as root: as root the server runs as nobody, in a directory of
# nobody's.  fsync is off: the tests are about the module's writes, not
# the disk's (new(fsync => 1): on, for a benchmark).
#
#   plan(skip_all => Test::Agent::Postgres->missing)
#       if Test::Agent::Postgres->missing;
#   my $pg = Test::Agent::Postgres->new;
#   $pg->conninfo;                     # "postgres:host=... dbname=agent"
#   $pg->sql("SELECT ...");            # rows as "a|b\nc|d"
#   $pg->wait_sql("SELECT ...", qr/.../, 10);
#   $pg->stop; $pg->start;             # the server away and back
#   $pg->lock; ... $pg->unlock;        # another session's write lock
#   $pg->node_lines('n1', $addr);      # agent_store and agent_node lines
#
# The test database has group_concat() and json_extract() as SQLite has
# them, for the queries of the tests that run against either store.

use strict;
use warnings;

use File::Temp qw(tempdir);
use Time::HiRes qw(time sleep);

# wait_sql, whole_logs, hold and unlock are the SQLite store's
use parent -norequire, 'Test::Agent::Store';
require Test::Agent::Store;

my @servers;

sub bindir {
    for my $v (15, 16, 17, 14) {
        my $d = "/usr/lib/postgresql/$v/bin";
        return $d if -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/postgres";
    }

    return undef;
}

# why the tests cannot run, or undef

sub missing {
    return 'PostgreSQL is not installed (apt-get install postgresql)'
        unless bindir();
    return 'no psql command (apt-get install postgresql-client)'
        unless `psql --version 2>&1` =~ /PostgreSQL/;
    return 'running as root, and no user nobody to run PostgreSQL as'
        if $> == 0 && !defined getpwnam('nobody');
    return undef;
}

sub new {
    my ($class, %opts) = @_;

    my $dir = tempdir('agent-pg-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    my $self = bless { dir => $dir, bin => bindir(), db => 'agent',
                       fsync => $opts{fsync} ? 'on' : 'off' }, $class;

    if ($> == 0) {
        my (undef, undef, $uid, $gid) = getpwnam('nobody');
        chown $uid, $gid, $dir or die "chown $dir: $!\n";
        $self->{as} = 'runuser -u nobody --';
    } else {
        $self->{as} = '';
    }

    $self->run_as("$self->{bin}/initdb -D $dir/data -A trust -U agent"
                  . " --no-sync --no-locale -E UTF8 > $dir/initdb.log 2>&1")
        or die "initdb failed:\n" . `cat $dir/initdb.log`;

    push @servers, $self;

    $self->start;

    system("psql -X -q -h $dir -U agent -d postgres"
           . " -c 'CREATE DATABASE agent' > /dev/null") == 0
        or die "CREATE DATABASE failed\n";

    $self->sql(<<'EOF');
CREATE FUNCTION group_concat_step(acc text, v text, sep text) RETURNS text
  LANGUAGE sql IMMUTABLE
  AS $$ SELECT CASE WHEN acc IS NULL THEN v ELSE acc || sep || v END $$;
CREATE FUNCTION group_concat_step(acc text, v text) RETURNS text
  LANGUAGE sql IMMUTABLE AS $$ SELECT group_concat_step(acc, v, ',') $$;
CREATE AGGREGATE group_concat(text, text)
  (SFUNC = group_concat_step, STYPE = text);
CREATE AGGREGATE group_concat(text)
  (SFUNC = group_concat_step, STYPE = text);
CREATE FUNCTION json_extract(d text, path text) RETURNS text
  LANGUAGE sql IMMUTABLE
  AS $$ SELECT d::json #>> string_to_array(substr(path, 3), '.') $$;
EOF

    return $self;
}

sub dir { $_[0]{dir} }
sub backend { 'pg' }

# agent_store's first argument, quoted: the conninfo has spaces
sub directive { '"' . $_[0]->conninfo . '"' }

# the http-level lines of a node on this store: agent_store, agent_node
# with the id, the address and short times (heartbeat 500ms, ttl 2s)
sub node_lines {
    my ($self, $id, $addr) = @_;
    return 'agent_store ' . $self->directive . ";\n"
           . "    agent_node id=$id addr=$addr heartbeat=500ms ttl=2s;";
}

sub conninfo {
    my ($self) = @_;
    return "postgres:host=$self->{dir} dbname=$self->{db} user=agent";
}

sub run_as {
    my ($self, $cmd) = @_;
    return system("$self->{as} sh -c '$cmd'") == 0;
}

sub start {
    my ($self) = @_;
    my $dir = $self->{dir};

    $self->run_as("$self->{bin}/pg_ctl -D $dir/data -l $dir/server.log -w"
                  . " -t 30 -o \"-k $dir -c listen_addresses=\\\"\\\""
                  . " -c fsync=$self->{fsync}"
                  . " -c full_page_writes=$self->{fsync}\" start"
                  . " > /dev/null")
        or die "pg_ctl start failed:\n" . `tail -20 $dir/server.log`;

    $self->{running} = 1;
}

sub stop {
    my ($self) = @_;
    return unless $self->{running};

    $self->run_as("$self->{bin}/pg_ctl -D $self->{dir}/data -m fast -w"
                  . " stop > /dev/null");
    $self->{running} = 0;
}

sub sql {
    my ($self, $q) = @_;

    open my $fh, '|-', "psql -X -q -At -F '|' -h $self->{dir} -U agent"
                       . " -d $self->{db} -v ON_ERROR_STOP=1"
                       . " > $self->{dir}/out 2>&1"
        or die "psql: $!\n";
    print $fh $q;
    close $fh;

    open $fh, '<', "$self->{dir}/out" or return '';
    local $/;
    my $r = <$fh> // '';
    close $fh;

    $r =~ s/\n+\z//;
    return $r;
}

# another session's write lock on the log's tables (or those named),
# held until unlock(): the workers' writes wait for it up to their
# lock_timeout, and fail

sub lock {
    my ($self, @tables) = @_;

    @tables = qw(events conversations model_calls) unless @tables;

    return $self->hold("psql -X -q -At -h $self->{dir} -U agent"
                       . " -d $self->{db}",
                       'BEGIN; LOCK TABLE ' . join(', ', @tables)
                       . " IN EXCLUSIVE MODE; SELECT 'held';\n");
}

sub held_file { "$_[0]{dir}/held" }

sub DESTROY {
    $_[0]->stop;
}

END {
    $_->stop for @servers;
}

1;
