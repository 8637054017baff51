package Test::Agent::Store;

# The SQLite file of agent_store, read with the sqlite3 command (not
# through nginx: a request would revive a conversation).
#
#   my $db = Test::Agent::Store->new($t->testdir . '/agent.db');
#   $db->sql("SELECT ...");                   # rows as "a|b\nc|d"
#   $db->wait_sql("SELECT ...", qr/.../, 10); # until it matches, or the last

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

1;
