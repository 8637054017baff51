package Test::Agent::Cluster;

# Several nginx nodes on one PostgreSQL, and a front nginx that routes
# by conversation: what t/scaleout.t and bench/cluster.pl share.
#
#   my $pg = Test::Agent::Postgres->new;
#   my $mock = Test::Agent::Cluster::mock(0.2, sub { my ($last) = @_; ... });
#   my $c = Test::Agent::Cluster->new(pg => $pg, mock => $mock,
#                                     nodes => 3, tools => ..., ...);
#   $c->front_port;                    # the front tier
#   $c->node(2)->{t};                  # n2's Test::Agent
#   $c->node(2)->{addr};               # "127.0.0.1:PORT"
#   $c->kill_node(2, 'KILL');          # its master and workers
#
# Each node is engine_conf()'s nginx (the /c/ID/... locations of agent
# "chat", the mock as its provider) with the PostgreSQL store and
# agent_node id=nK addr=127.0.0.1:PORT; new(...) takes engine_conf's
# options (tools, agent, server, http, workers, zone) for every node,
# %%NODE%% in them replaced by the node's id.  The front is
#
#   map $uri $conversation  (the id in /c/ID/...)
#   upstream agents { hash $conversation consistent; server nK ...; }
#
# with a 421 from a node followed to the node it names (X-Agent-Owner),
# event streams unbuffered, and a request that a node does not answer
# in time (a paused node) tried at the next one.

use strict;
use warnings;

use Time::HiRes qw(sleep time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::Front;
use Test::Agent::MockProvider;

my $EVENTS = "events {\n    worker_connections 4096;\n}";

sub new {
    my ($class, %o) = @_;

    my $self = bless { pg => $o{pg}, mock => $o{mock}, nodes => [] },
        $class;
    my $conninfo = $o{pg}->conninfo;
    my $n = $o{nodes} // 3;

    for my $k (1 .. $n) {
        my $t = Test::Agent->new;
        my $id = "n$k";
        my $addr = '127.0.0.1:' . $t->port(8080);
        my %conf;

        for my $key (qw(tools agent server http)) {
            ($conf{$key} = $o{$key} // '') =~ s/%%NODE%%/$id/g;
        }

        $conf{http} = "agent_store \"$conninfo application_name=$id\";\n"
            . "    agent_node id=$id addr=$addr"
            . " heartbeat=" . ($o{heartbeat} // '500ms')
            . " ttl=" . ($o{ttl} // '2s') . ";\n"
            . "    agent_heartbeat 1s;\n    $conf{http}";

        my $nginx = engine_conf($o{mock}, workers => $o{workers} // 2,
                                zone => $o{zone} // '64m', %conf);
        $nginx =~ s/^events \{\n\}/worker_rlimit_nofile 8192;\n\n$EVENTS/m;

        $t->write_file_expand('nginx.conf', $nginx);

        push @{$self->{nodes}}, { t => $t, id => $id, addr => $addr };
    }

    $_->{t}->run for @{$self->{nodes}};

    my $front = Test::Agent->new;
    my $port = $front->port(8080);
    my $conf = "%%TEST_GLOBALS%%\n\nworker_processes 1;\n\n"
        . "worker_rlimit_nofile 8192;\n\n$EVENTS\n\nhttp {\n"
        . "    %%TEST_GLOBALS_HTTP%%\n\n"
        . Test::Agent::Front::http(port => $port, prefix => '/c/',
                                   log => $front->testdir . '/front.log',
                     nodes => [map { $_->{addr} } @{$self->{nodes}}])
        . "}\n";

    # the front needs no module, but loads it as every test's nginx does
    $front->write_file_expand('nginx.conf', $conf);
    $front->run;
    $self->{front} = $front;

    return $self;
}

# the mock provider of a cluster: a request with an Idempotency-Key is a
# tool run (the tool locations proxy to it), answered "ran KEY" after
# $latency seconds; any other is a model call, answered by $reply with
# the request's last message

sub mock {
    my ($latency, $reply) = @_;

    return Test::Agent::MockProvider->new(default => sub {
        my ($req) = @_;

        my $key = $req->{headers}{'idempotency-key'};
        return { text => "ran $key", latency => $latency } if defined $key;

        my $msgs = ($req->{json} || {})->{messages} || [];
        return $reply->($msgs->[-1] || {});
    });
}

sub front { $_[0]{front} }
sub front_port { $_[0]{front}->port(8080) }
sub nodes { @{$_[0]{nodes}} }
sub node { $_[0]{nodes}[$_[1] - 1] }

# the node (1..n) whose address is $addr

sub node_of {
    my ($self, $addr) = @_;

    for my $k (1 .. @{$self->{nodes}}) {
        return $k if $self->{nodes}[$k - 1]{addr} eq $addr;
    }

    return undef;
}

# the pids of node k: master and workers

sub pids {
    my ($self, $k) = @_;
    my $t = $self->node($k)->{t};
    return grep { defined } ($t->master_pid, $t->worker_pids);
}

# a signal to node k, master and workers at once; for KILL, the master
# is reaped and the node counts as stopped

sub kill_node {
    my ($self, $k, $signal) = @_;

    my $t = $self->node($k)->{t};
    my @pids = $self->pids($k);

    kill $signal, @pids;

    if ($signal eq 'KILL') {
        waitpid $t->master_pid, 0;
        $t->{pid} = undef;
        $self->node($k)->{dead} = 1;
    }

    return @pids;
}

# node k, killed, started again

sub start_node {
    my ($self, $k) = @_;

    $self->node($k)->{t}->run;
    $self->node($k)->{dead} = 0;
}

# the PostgreSQL connections each node holds now: { nK => count }
# (each node's conninfo names it in application_name)

sub pg_connections {
    my ($self) = @_;

    my %n = map { $_->{id} => 0 } @{$self->{nodes}};
    for (split /\n/, $self->{pg}->sql("SELECT application_name, count(*)"
                                     . " FROM pg_stat_activity"
                                     . " WHERE application_name LIKE 'n%'"
                                     . " GROUP BY 1")) {
        my ($id, $count) = split /\|/;
        $n{$id} = $count;
    }

    return \%n;
}

sub stop {
    my ($self) = @_;

    $self->{front}->stop;
    $_->{t}->stop for grep { !$_->{dead} } @{$self->{nodes}};
}

1;
