package Test::Agent::Store;

# The SQLite file of agent_store, read with the sqlite3 command (not
# through nginx: a request would revive a conversation).
#
#   my $db = Test::Agent::Store->new($t->testdir . '/agent.db');
#
# Or the store of a test that runs against either backend: SQLite's file
# in the test's directory, or with TEST_AGENT_STORE=pg a PostgreSQL
# server of the test's own (Test::Agent::Postgres, which answers the
# same methods but lock):
#
#   plan(skip_all => Test::Agent::Store->missing)
#       if Test::Agent::Store->missing;
#   my $store = Test::Agent::Store->for_test($t);
#   "agent_store " . $store->directive . ";"
#
#   $db->sql("SELECT ...");                   # rows as "a|b\nc|d"
#   $db->wait_sql("SELECT ...", qr/.../, 10); # until it matches, or the last
#   $db->lock; ... $db->unlock;               # another process's write lock
#   $db->whole_logs;                          # logs from seq 1, no gap

use strict;
use warnings;

use Time::HiRes qw(time sleep);

sub new {
    my ($class, $path) = @_;
    return bless { path => $path }, $class;
}

sub available { `sqlite3 -version 2>&1` =~ /^3/ }

sub pg { ($ENV{TEST_AGENT_STORE} // '') eq 'pg' }

# why the test cannot run with the store asked for, or undef

sub missing {
    my ($class) = @_;

    if ($class->pg) {
        require Test::Agent::Postgres;
        return Test::Agent::Postgres->missing;
    }

    return $class->available ? undef : 'no sqlite3 command';
}

sub for_test {
    my ($class, $t) = @_;

    if ($class->pg) {
        require Test::Agent::Postgres;
        return Test::Agent::Postgres->new;
    }

    return $class->new($t->testdir . '/agent.db');
}

# agent_store's first argument
sub directive { $_[0]{path} }
sub backend { 'sqlite' }

sub sql {
    my ($self, $q) = @_;
    my $db = $self->{path};
    my $r = `sqlite3 -cmd '.timeout 5000' -separator '|' '$db' "$q" 2>&1`;
    chomp $r;
    return $r;
}

# the conversations whose log runs from seq 1 with no gap

sub whole_logs {
    my ($self) = @_;
    return $self->sql('SELECT count(*) FROM (SELECT conversation'
                      . ' FROM events GROUP BY conversation'
                      . ' HAVING count(*) = max(seq)) w');
}

sub wait_sql {
    my ($self, $q, $want, $timeout) = @_;
    my $deadline = time + ($timeout // 10);
    my $got;

    while (time < $deadline) {
        $got = $self->sql($q);
        return $got if $got =~ $want;
        sleep 0.05;
    }

    return $got;
}

# BEGIN IMMEDIATE in a sqlite3 process of its own, held until unlock():
# the workers' writes wait for it, up to their busy timeout.  True once
# sqlite3 says it holds it: it may take a while to start on a loaded
# machine, and wait for a write in progress to finish.

sub lock {
    my ($self) = @_;

    return $self->hold("sqlite3 '$self->{path}'",
                       ".bail on\n.timeout 10000\nBEGIN IMMEDIATE;\n"
                       . "INSERT INTO meta VALUES ('lock', 'held');\n"
                       . "SELECT 'held';\n");
}

# a client that runs script and says "held", kept until unlock()

sub hold {
    my ($self, $client, $script) = @_;

    my $held = $self->held_file;
    unlink $held;

    open my $lock, '|-', "$client > '$held' 2>&1"
        or die "$client: $!\n";
    $lock->autoflush(1);
    print $lock $script;
    $self->{lock} = $lock;

    for (1 .. 300) {
        last if -s $held;
        sleep 0.05;
    }

    open my $fh, '<', $held or return 0;
    my $out = <$fh> // '';
    close $fh;

    $self->{held} = $out;

    return $out eq "held\n";
}

sub held_file { "$_[0]{path}.held" }

# what the lock's client said last: "held", or why it holds nothing
sub held_output { $_[0]{held} // '' }

sub unlock {
    my ($self) = @_;

    my $lock = delete $self->{lock} or return;
    print $lock "ROLLBACK;\n";
    close $lock;
}

1;
