package Test::Agent;

# A test of ngx_http_agent_module: a temp dir, free ports, an nginx.conf
# filled from a template, and control of the running nginx (start, stop,
# reload, SIGKILL of one worker).  At the end of a file, done() fails the
# run if the error log holds [alert], [emerg], [crit] or a sanitizer report.
#
#   my $t = Test::Agent->new;
#   $t->write_file_expand('nginx.conf', <<'EOF');
#   %%TEST_GLOBALS%%
#   events {}
#   http {
#       %%TEST_GLOBALS_HTTP%%
#       server { listen 127.0.0.1:%%PORT_8080%%; ... }
#   }
#   EOF
#   $t->run;
#   ... http_get('/', port => $t->port(8080)) ...
#   $t->done;

use strict;
use warnings;

use Cwd qw(abs_path);
use Fcntl qw(:flock);
use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use IO::Socket::INET;
use POSIX qw(WNOHANG);
use Test::More;
use Time::HiRes qw(time sleep);

my $ROOT = abs_path(dirname(__FILE__) . '/../../..');
my @LIVE;

sub new {
    my ($class) = @_;

    my $dir = tempdir('agent-test-XXXXXX', TMPDIR => 1,
                      CLEANUP => !$ENV{TEST_NGINX_LEAVE});
    chmod 0755, $dir;

    my $self = bless {
        dir => $dir,
        ports => {},
        port_sockets => [],
        pid => undef,
    }, $class;

    push @LIVE, $self;
    return $self;
}

sub root { $ROOT }

# The npm packages a test needs, installed in $dir from its lock file when
# one of @modules is missing; tests run side by side take turns, so that
# one "npm ci" does not remove what another uses.  False when npm failed
# (with CI set, that is fatal rather than a skip).

sub npm_ci {
    my ($class, $dir, @modules) = @_;

    open my $lock, '>>', "$dir/.npm-ci.lock" or die "$dir: $!\n";
    flock($lock, LOCK_EX) or die "flock: $!\n";

    return 1 unless grep { !-d "$dir/node_modules/$_" } @modules;

    my $ok = system("cd '$dir' && npm ci --no-audit --no-fund "
                    . "--loglevel=error >&2") == 0;

    die "npm ci failed in $dir\n" if !$ok && $ENV{CI};
    return $ok;
}
sub testdir { $_[0]{dir} }
sub binary { abs_path($ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx') }

sub module {
    return abs_path($ENV{TEST_NGINX_MODULE}
                    || "$ROOT/build/nginx/objs/ngx_http_agent_module.so");
}

sub sanitized { $ENV{TEST_NGINX_SANITIZED} ? 1 : 0 }

# A free port for a name used in the template as %%PORT_<name>%%.  The
# listening socket is held until nginx starts so that parallel test files
# do not draw the same port.

sub port {
    my ($self, $name) = @_;

    return $self->{ports}{$name} if exists $self->{ports}{$name};

    my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1',
                                  LocalPort => 0, ReuseAddr => 1)
        or die "cannot find a free port: $!\n";

    push @{$self->{port_sockets}}, $s;
    return $self->{ports}{$name} = $s->sockport;
}

sub write_file {
    my ($self, $name, $content) = @_;

    my $path = "$self->{dir}/$name";
    my $d = dirname($path);
    system('mkdir', '-p', $d) == 0 or die "mkdir $d\n" unless -d $d;

    open my $fh, '>', $path or die "cannot write $path: $!\n";
    binmode $fh;
    print $fh $content;
    close $fh;

    return $self;
}

sub read_file {
    my ($self, $name) = @_;

    open my $fh, '<', "$self->{dir}/$name" or return '';
    local $/;
    my $content = <$fh>;
    close $fh;
    return $content;
}

sub globals {
    my ($self) = @_;

    my $d = $self->{dir};
    my $level = $ENV{TEST_NGINX_DEBUG} ? 'debug' : 'info';
    my $user = $> == 0 ? "user root;\n" : '';

    return "load_module " . $self->module . ";\n"
        . $user
        . "daemon off;\n"
        . "pid $d/nginx.pid;\n"
        . "error_log $d/error.log $level;\n";
}

sub globals_http {
    my ($self) = @_;

    my $d = $self->{dir};

    return "access_log $d/access.log;\n"
        . "client_body_temp_path $d/client_body_temp;\n"
        . "proxy_temp_path $d/proxy_temp;\n"
        . "fastcgi_temp_path $d/fastcgi_temp;\n"
        . "uwsgi_temp_path $d/uwsgi_temp;\n"
        . "scgi_temp_path $d/scgi_temp;\n";
}

sub expand {
    my ($self, $content) = @_;

    $content =~ s/%%TEST_GLOBALS%%/$self->globals/ge;
    $content =~ s/%%TEST_GLOBALS_HTTP%%/$self->globals_http/ge;
    $content =~ s/%%TESTDIR%%/$self->{dir}/g;
    $content =~ s/%%ROOT%%/$ROOT/g;
    $content =~ s/%%PORT_(\w+)%%/$self->port($1)/ge;

    return $content;
}

sub write_file_expand {
    my ($self, $name, $content) = @_;
    return $self->write_file($name, $self->expand($content));
}

sub nginx_args {
    my ($self, @extra) = @_;
    return ($self->binary, '-p', "$self->{dir}/", '-c', 'nginx.conf',
            '-e', 'error.log', @extra);
}

# Environment of every nginx we start: sanitizer reports go to files in
# the test dir as well as to stderr, which nginx sends to error.log.

sub sanitizer_env {
    my ($self) = @_;

    my $d = $self->{dir};

    # a dynamic module defines ngx_modules and ngx_module_names again by
    # design (nginx looks them up with dlsym); ASan would call that an ODR
    # violation

    $ENV{ASAN_OPTIONS} ||= "detect_leaks=1:detect_odr_violation=0"
        . ":log_path=$d/asan";
    $ENV{UBSAN_OPTIONS} ||= "print_stacktrace=1:halt_on_error=1"
        . ":suppressions=$ROOT/t/ubsan.supp";
    $ENV{LSAN_OPTIONS} ||= "suppressions=$ROOT/t/lsan.supp";
}

# nginx -t: returns (exit status, output)

sub test_config {
    my ($self) = @_;

    $self->sanitizer_env;

    # nginx -t returns from main() without freeing its cycle: whether
    # LeakSanitizer still finds a pointer to it on the dead stack is
    # chance.  Leaks are checked in every nginx that runs.
    local $ENV{ASAN_OPTIONS} =
        $ENV{ASAN_OPTIONS} =~ s/detect_leaks=1/detect_leaks=0/r;

    my @args = $self->nginx_args('-t');
    my $out = `@args 2>&1`;
    return ($? >> 8, $out);
}

sub release_ports {
    my ($self) = @_;
    close $_ for @{$self->{port_sockets}};
    $self->{port_sockets} = [];
}

sub run {
    my ($self) = @_;

    $self->release_ports;
    $self->sanitizer_env;

    my @args = $self->nginx_args;
    my $pid = fork;
    die "fork: $!\n" unless defined $pid;

    if ($pid == 0) {
        open STDOUT, '>>', "$self->{dir}/stderr.log";
        open STDERR, '>>', "$self->{dir}/stderr.log";
        exec @args or POSIX::_exit(127);
    }

    $self->{pid} = $pid;
    $self->wait_ready or die "nginx did not start:\n"
        . $self->read_file('stderr.log') . $self->read_file('error.log');

    return $self;
}

sub listen_ports {
    my ($self) = @_;
    my $conf = $self->read_file('nginx.conf');
    return $conf =~ /listen\s+127\.0\.0\.1:(\d+)/g;
}

sub wait_ready {
    my ($self) = @_;

    my @ports = $self->listen_ports;
    my $deadline = time + ($self->sanitized ? 30 : 10);

    while (time < $deadline) {
        if (waitpid($self->{pid}, WNOHANG) == $self->{pid}) {
            $self->{pid} = undef;
            return 0;
        }

        my @workers = $self->worker_pids;
        my $up = -e "$self->{dir}/nginx.pid" && @workers;
        for my $p ($up ? @ports : ()) {
            my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                          PeerPort => $p);
            $up = 0, last unless $s;
            close $s;
        }

        return 1 if $up;
        sleep 0.05;
    }

    return 0;
}

sub master_pid { $_[0]{pid} }

# worker processes of the running master, from /proc (no procps needed)

sub worker_pids {
    my ($self) = @_;

    my $master = $self->{pid} or return ();
    my @pids;

    opendir my $dh, '/proc' or return ();
    for my $pid (grep { /^\d+$/ } readdir $dh) {
        open my $fh, '<', "/proc/$pid/stat" or next;
        my $stat = <$fh>;
        close $fh;
        next unless defined $stat;

        # pid (comm) state ppid ...; comm may hold spaces
        my ($state, $ppid) = $stat =~ /\)\s+(\S)\s+(\d+)/ or next;
        next if $state eq 'Z';
        push @pids, $pid if $ppid == $master && $self->is_worker($pid);
    }
    closedir $dh;

    return sort { $a <=> $b } @pids;
}

sub is_worker {
    my ($self, $pid) = @_;

    open my $fh, '<', "/proc/$pid/cmdline" or return 0;
    local $/;
    my $cmd = <$fh> // '';
    close $fh;
    return $cmd =~ /worker process/;
}

sub wait_workers {
    my ($self, $n, $timeout) = @_;

    my $deadline = time + ($timeout // 10);
    while (time < $deadline) {
        my @w = $self->worker_pids;
        return @w if @w == $n;
        sleep 0.05;
    }
    return $self->worker_pids;
}

# SIGKILL one worker (the first, or the pid given) and wait until the
# master has replaced it; returns the killed pid.

sub kill_worker {
    my ($self, $pid) = @_;

    my @before = $self->worker_pids;
    $pid //= $before[0];
    die "no worker to kill\n" unless $pid;

    kill 'KILL', $pid;

    my $deadline = time + 10;
    while (time < $deadline) {
        my @now = $self->worker_pids;
        last if @now == @before && !grep { $_ == $pid } @now;
        sleep 0.05;
    }

    return $pid;
}

# A crash of the whole server: SIGKILL of the master and its workers,
# waited for until none of them runs (a worker killed goes a moment
# after kill() returns, its listening sockets with it: a start before
# that could not bind).  Not unclean: killed on purpose.

sub crash {
    my ($self) = @_;

    my @pids = ($self->{pid}, $self->worker_pids);

    kill 'KILL', @pids;
    $self->stop('KILL');
    delete $self->{unclean};

    my $deadline = time + 10;
    while (time < $deadline) {
        my $alive = grep { _running($_) } @pids;
        return $self unless $alive;
        sleep 0.05;
    }

    return $self;
}

# a process exists and is not a zombie (which holds no file)

sub _running {
    my ($pid) = @_;

    open my $fh, '<', "/proc/$pid/stat" or return 0;
    my $stat = <$fh> // '';
    close $fh;

    my ($state) = $stat =~ /\)\s+(\S)/ or return 0;
    return $state ne 'Z';
}

# nginx -s reload equivalent: HUP, then wait for a new set of workers

sub reload {
    my ($self) = @_;

    my %old = map { $_ => 1 } $self->worker_pids;
    my $n = keys %old;

    kill 'HUP', $self->{pid};

    my $deadline = time + 10;
    while (time < $deadline) {
        my @new = grep { !$old{$_} } $self->worker_pids;
        return 1 if @new >= $n;
        sleep 0.05;
    }

    return 0;
}

sub stop {
    my ($self, $signal) = @_;

    my $pid = $self->{pid} or return $self;
    $signal //= 'QUIT';
    kill $signal, $pid;

    my $deadline = time + ($self->sanitized ? 60 : 20);
    while (time < $deadline) {
        my $w = waitpid($pid, WNOHANG);
        if ($w == $pid || $w == -1) {
            $self->{pid} = undef;
            $self->{unclean} = "exit status $?" if $?;
            return $self;
        }
        sleep 0.05;
    }

    kill 'KILL', $pid;
    waitpid($pid, 0);
    $self->{pid} = undef;
    $self->{unclean} = "did not exit on $signal";
    return $self;
}

# Everything in the logs that a passing test must not produce.

sub log_problems {
    my ($self) = @_;

    my @bad;

    for my $log ('error.log', 'stderr.log') {
        for my $line (split /\n/, $self->read_file($log)) {
            next if grep { $line =~ $_ } @{$self->{allowed} || []};
            push @bad, "$log: $line"
                if $line =~ /\[(alert|emerg|crit)\]/
                   || $line =~ /(AddressSanitizer|LeakSanitizer
                                |runtime\ error:|UndefinedBehavior)/x;
        }
    }

    # LeakSanitizer's own tracer may crash on a worker that exits with a
    # pool thread still in libpq ("Tracer caught signal"): no finding,
    # and no check either; it is said, and every other line counts

    if ($self->read_file('error.log') =~ /^Tracer caught signal/m) {
        Test::More::diag('LeakSanitizer could not check a worker: its '
                         . 'tracer crashed');
        @bad = grep { !/==\d+==(LeakSanitizer\ has\ encountered\ a
                                \ fatal\ error|HINT:\ )/x } @bad;
    }

    opendir my $dh, $self->{dir} or return @bad;
    for my $f (grep { /^(asan|ubsan)\./ } readdir $dh) {
        push @bad, "$f: " . substr($self->read_file($f), 0, 4000);
    }
    closedir $dh;

    return @bad;
}

# whether the error log has a line matching $re within $timeout seconds
# (5)

sub wait_log {
    my ($self, $re, $timeout) = @_;

    my $deadline = time + ($timeout // 5);

    while (time < $deadline) {
        return 1 if $self->read_file('error.log') =~ $re;
        sleep 0.1;
    }

    return 0;
}

# A line a test provokes on purpose (the master's alert about a worker
# killed by the test, say) is not a failure.

sub allow_alert {
    my ($self, $re) = @_;
    push @{$self->{allowed}}, $re;
    return $self;
}

# The end of this nginx's part: stop it and check its logs.  A file that
# runs another nginx after this one says more => 1.

sub done {
    my ($self, %opts) = @_;

    $self->stop;
    is($self->{unclean}, undef, 'nginx stopped cleanly');

    my @bad = $self->log_problems;
    is(join("\n", @bad), '', 'no alerts, crits or sanitizer reports');

    done_testing() unless $opts{more};
}

sub DESTROY {
    my ($self) = @_;
    local $?;
    $self->stop('TERM') if $self->{pid};
}

END {
    local $?;
    $_->{pid} && $_->stop('TERM') for @LIVE;
}

1;
