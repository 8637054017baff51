package Test::Agent::Store;

# The SQLite file of agent_store, read with the sqlite3 command (not
# through nginx: a request would revive a conversation).
#
#   my $db = Test::Agent::Store->new($t->testdir . '/agent.db');
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
    return $self->sql('SELECT count(*) FROM (SELECT conversation,'
                      . ' count(*) AS n, max(seq) AS m FROM events'
                      . ' GROUP BY conversation HAVING n = m)');
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

    my $held = "$self->{path}.held";
    unlink $held;

    open my $lock, '|-', "sqlite3 '$self->{path}' > '$held'"
        or die "sqlite3: $!\n";
    $lock->autoflush(1);
    print $lock ".bail on\n.timeout 10000\nBEGIN IMMEDIATE;\n"
        . "INSERT INTO meta VALUES ('lock', 'held');\nSELECT 'held';\n";
    $self->{lock} = $lock;

    for (1 .. 300) {
        last if -s $held;
        sleep 0.05;
    }

    open my $fh, '<', $held or return 0;
    my $out = <$fh> // '';
    close $fh;

    return $out eq "held\n";
}

sub unlock {
    my ($self) = @_;

    my $lock = delete $self->{lock} or return;
    print $lock "ROLLBACK;\n";
    close $lock;
}

1;
