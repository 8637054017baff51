package Test::Agent::Hang;

# A backend that takes connections and never answers: a tool call that
# stays in flight until its worker dies.  Each connection is a line in
# $dir/hang.log.
#
#   my $hang = Test::Agent::Hang->new($t->testdir);
#   ... proxy_pass http://127.0.0.1:${\ $hang->port};
#   $hang->calls;    # connections taken so far

use strict;
use warnings;

use IO::Socket::INET;
use POSIX ();

sub new {
    my ($class, $dir) = @_;

    my $l = IO::Socket::INET->new(Listen => 64, LocalAddr => '127.0.0.1',
                                  LocalPort => 0, ReuseAddr => 1)
        or die "listen: $!\n";
    my $port = $l->sockport;

    my $pid = fork // die "fork: $!\n";

    if ($pid == 0) {
        my @held;
        while (my $c = $l->accept) {
            push @held, $c;
            open my $fh, '>>', "$dir/hang.log" or POSIX::_exit(1);
            print $fh "call\n";
            close $fh;
        }
        POSIX::_exit(0);
    }

    close $l;

    return bless { port => $port, pid => $pid, dir => $dir, owner => $$ },
        $class;
}

sub port { $_[0]{port} }

sub calls {
    my ($self) = @_;

    open my $fh, '<', "$self->{dir}/hang.log" or return 0;
    my @l = <$fh>;
    close $fh;
    return scalar @l;
}

sub DESTROY {
    my ($self) = @_;
    local $?;
    return unless $self->{pid} && $$ == $self->{owner};
    kill 'KILL', $self->{pid};
    waitpid $self->{pid}, 0;
}

1;
