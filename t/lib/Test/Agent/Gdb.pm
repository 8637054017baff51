package Test::Agent::Gdb;

# gdb attached to a running process (a worker), driven over a pipe: it
# stops the process at a function, where the test looks at what the
# process left behind, and kills it there with SIGKILL.  For windows
# with no I/O in them, which no timing of a test opens at will.
#
#   my $why = Test::Agent::Gdb->missing($t->module);
#   plan(skip_all => $why) if $why;
#
#   my $gdb = Test::Agent::Gdb->attach($pid, $t->testdir . '/gdb.log');
#   $gdb->break_at('ngx_http_agent_emit_all');
#   ... make the process get there ...
#   $gdb->stopped(30) or diag($gdb->output);   # where it stopped
#   $gdb->command('finish');                   # out of the function
#   $gdb->sigkill;                             # SIGKILL, there

use strict;
use warnings;

use File::Basename qw(dirname);
use IO::Handle;
use POSIX qw(WNOHANG);
use Time::HiRes qw(time sleep);

# why gdb cannot stop the module's functions here, or undef: no gdb, a
# module without debugging information (the conditions name its
# parameters and enums), or no ptrace of a process that is not gdb's
# descendant, as a worker is not (kernel.yama.ptrace_scope, no
# CAP_SYS_PTRACE in a container): tried on a child of the test

sub missing {
    my ($class, $module) = @_;

    my $gdb = `sh -c 'command -v gdb' 2>/dev/null`;
    return 'no gdb' unless $gdb =~ /\S/;

    my $ptype = "ptype ngx_http_agent_fsm_input_e";
    my $out = `gdb -nx -batch -ex '$ptype' '$module' 2>&1`;
    return 'the module has no debugging information (built without -g?)'
        unless $out =~ /NGX_HTTP_AGENT_FSM_SUSPEND/;

    my $pid = fork // return "fork: $!";

    if ($pid == 0) {
        sleep 60;
        POSIX::_exit(0);
    }

    $out = `gdb -nx -batch -p $pid -ex 'info proc' 2>&1`;

    CORE::kill('KILL', $pid);
    waitpid($pid, 0);

    return undef if $out =~ /^process $pid$/m;

    my ($why) = $out =~ /^(ptrace: .*?)\.?$/m;
    return 'gdb cannot attach to a process here ('
           . ($why // 'it did not say why')
           . '; kernel.yama.ptrace_scope, or no CAP_SYS_PTRACE?)';
}

# gdb -p $pid, its output in $log; the process is stopped until stopped()

sub attach {
    my ($class, $pid, $log) = @_;

    pipe(my $r, my $w) or die "pipe: $!\n";

    # no symbols fetched from elsewhere, every signal passed on silently:
    # the process stops only at the breakpoints

    local $ENV{DEBUGINFOD_URLS} = '';

    my $gdb = fork // die "fork: $!\n";

    if ($gdb == 0) {
        # a core of a gdb that failed is left with the test's files
        chdir dirname($log);
        close $w;
        open STDIN, '<&', $r or POSIX::_exit(127);
        open STDOUT, '>', $log or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        exec 'gdb', '-nx', '-q', '-p', $pid or POSIX::_exit(127);
    }

    close $r;
    $w->autoflush(1);

    my $self = bless { pid => $pid, gdb => $gdb, in => $w, log => $log,
                       n => 0, owner => $$ }, $class;

    $self->_send('set pagination off', 'set confirm off',
                'handle all nostop noprint pass');

    return $self;
}

sub output {
    my ($self) = @_;

    open my $fh, '<', $self->{log} or return '';
    local $/;
    my $out = <$fh> // '';
    close $fh;
    return $out;
}

sub _send {
    my ($self, @commands) = @_;

    # a gdb gone says so in its output, not with a SIGPIPE of the test
    local $SIG{PIPE} = 'IGNORE';

    print { $self->{in} } "$_\n" for @commands;
}

# runs gdb commands and waits until gdb is done with them: the output
# they made, or undef after $timeout seconds (30)

sub command {
    my ($self, $commands, $timeout) = @_;

    my $mark = '@@ done ' . ++$self->{n} . ' @@';
    my $from = length $self->output;

    $self->_send(ref $commands ? @$commands : $commands, "echo $mark\\n");

    my $deadline = time + ($timeout // 30);

    while (time < $deadline) {
        my $out = substr($self->output, $from);
        return $out =~ s/\Q$mark\E\n?//r if index($out, $mark) >= 0;
        return undef unless $self->_running;
        sleep 0.05;
    }

    return undef;
}

# a breakpoint at a function (with a condition if given); true once set
# where a function of that name is

sub break_at {
    my ($self, $spec) = @_;

    my $out = $self->command("break $spec", 60) // '';
    return $out =~ /Breakpoint \d+ at /;
}

# the process runs until it stops at a breakpoint: what gdb said then,
# or undef if it did not within $timeout seconds (30); gdb then detaches
# and lets it go

sub stopped {
    my ($self, $timeout) = @_;

    my $out = $self->command('continue', $timeout);
    return $out if defined $out && $out =~ /Breakpoint \d+, /;

    CORE::kill('INT', $self->{gdb});
    $self->command(['detach', 'quit'], 10);
    $self->_wait_exit(10);

    return undef;
}

# SIGKILL of the stopped process, where it stands (gdb's kill, which
# waits for each of its threads to go); true once it died of it and gdb
# is gone

sub sigkill {
    my ($self) = @_;

    my $out = $self->command('kill', 30) // '';

    $self->_send('quit');
    $self->_wait_exit(10);

    return $out =~ /\(process $self->{pid}\) killed\]/;
}

sub _running {
    my ($self) = @_;

    return 0 unless $self->{gdb};
    return 1 if waitpid($self->{gdb}, WNOHANG) == 0;

    delete $self->{gdb};
    return 0;
}

sub _wait_exit {
    my ($self, $timeout) = @_;

    my $deadline = time + $timeout;

    while ($self->_running && time < $deadline) {
        sleep 0.05;
    }

    close $self->{in};

    return 1 unless $self->{gdb};

    CORE::kill('KILL', $self->{gdb});
    waitpid($self->{gdb}, 0);
    delete $self->{gdb};

    return 0;
}

sub DESTROY {
    my ($self) = @_;

    local ($?, $!, $@);
    return unless $self->{gdb} && $$ == $self->{owner};

    CORE::kill('INT', $self->{gdb});
    $self->_send('detach', 'quit');
    $self->_wait_exit(10);
}

1;
