package Test::Agent::Otel;

# An OTLP/HTTP collector and a tool backend instrumented with
# OpenTelemetry's own SDK (t/js/otel.mjs, one node process), on ports the
# harness drew, and the spans the collector received.
#
#   Test::Agent::Otel->needs(@packages);       # node and t/js, or skip_all
#   my $otel = Test::Agent::Otel->start($t);   # before $t->run
#   $otel->{cport}, $otel->{tport}               # collector, tool backend
#   my @s = $otel->spans('nginx');               # by service.name
#   my @s = $otel->wait_spans('nginx', sub { grep { ... } @_ });
#   my ($turn, @under) = $otel->turn('nginx', $conversation_id);
#   server => $otel->locations                  # /otlp, /tools/backend
#   attrs($span)->{'gen_ai.operation.name'}      # attributes as a hash
#   engine_conf($mock, tools => $TRACED_TOOLS, ...)  # lookup, send_note
#   $otel->stop;

use strict;
use warnings;

use Exporter 'import';
use FindBin;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;

our @EXPORT = qw(attrs $TRACED_TOOLS);

# two tools of the backend (location /tools/backend), one that waits for
# approval

our $TRACED_TOOLS = <<'END';
    agent_tool lookup {
        description "Looks up";
        location /tools/backend;
    }

    agent_tool send_note {
        description "Sends a note";
        location /tools/backend;
        approval requires_approval;
    }
END

# the test is skipped without node 18 or later, or without OpenTelemetry's
# packages and those named (npm ci in t/js)

sub needs {
    my ($class, @packages) = @_;

    plan(skip_all => 'no node 18 or later (apt-get install nodejs npm)')
        unless (`node --version 2>/dev/null` // '') =~ /^v(\d+)/ && $1 >= 18;

    Test::Agent->npm_ci("$FindBin::Bin/js", '@opentelemetry/sdk-trace',
                        '@opentelemetry/exporter-trace-otlp-http', @packages)
        or plan(skip_all => 'npm ci failed in t/js');
}

sub start {
    my ($class, $t) = @_;

    my $dir = $t->testdir;
    my $self = bless { dir => $dir, cport => $t->port('collector'),
                       tport => $t->port('tool'), owner => $$ }, $class;

    # node listens on them: the harness's sockets held for them go

    for my $p ($self->{cport}, $self->{tport}) {
        $_->close for grep { $_ && ($_->sockport // 0) == $p }
                      @{$t->{port_sockets}};
    }

    $self->{pid} = fork // die "fork: $!";

    if ($self->{pid} == 0) {
        exec('node', "$FindBin::Bin/js/otel.mjs", $dir, $self->{cport},
             $self->{tport})
            or exit 1;
    }

    # node loads the OpenTelemetry SDK first: seconds on a loaded machine

    for (1 .. 600) {
        last if -e "$dir/otel.ready";
        sleep 0.05;
    }

    $self->{ready} = -e "$dir/otel.ready";

    return $self;
}

# every request the collector got: {path, headers, body}

sub received {
    my ($self) = @_;

    open my $fh, '<', "$self->{dir}/otlp.jsonl" or return ();
    return map { decode_json($_) } <$fh>;
}

# the spans of a service (its resource's service.name)

sub spans {
    my ($self, $service) = @_;
    my @s;

    for my $r ($self->received) {
        for my $rs (@{$r->{body}{resourceSpans} || []}) {
            my ($name) = map { $_->{value}{stringValue} }
                         grep { $_->{key} eq 'service.name' }
                         @{$rs->{resource}{attributes} || []};
            next unless ($name // '') eq $service;
            push @s, map { @{$_->{spans} || []} } @{$rs->{scopeSpans}};
        }
    }

    return @s;
}

# the spans of a service once $cond holds of them (10 s at most)

sub wait_spans {
    my ($self, $service, $cond) = @_;

    for (1 .. 100) {
        my @s = $self->spans($service);
        return @s if $cond->(@s);
        sleep 0.1;
    }

    return $self->spans($service);
}

# the invoke_agent span of conversation $id's turn (once it is in), and
# the spans under it: ({} and none if it does not come)

sub turn {
    my ($self, $service, $id) = @_;

    my $of = sub { (attrs($_[0])->{'gen_ai.conversation.id'} // '') eq $id };
    my @all = $self->wait_spans($service, sub { grep { $of->($_) } @_ });
    my ($turn) = grep { $of->($_) } @all;

    return ({}) unless $turn;
    return ($turn, grep { ($_->{parentSpanId} // '') eq $turn->{spanId} }
                   @all);
}

# nginx.conf's locations of the collector (/otlp) and the backend's tools
# (/tools/backend)

sub locations {
    my ($self) = @_;

    return <<"END";
        location = /otlp {
            internal;
            proxy_pass http://127.0.0.1:$self->{cport}/v1/traces;
        }

        location = /tools/backend {
            internal;
            proxy_pass http://127.0.0.1:$self->{tport}/tool;
        }
END
}

# the collector's answer from now on

sub status {
    my ($self, $status) = @_;

    open my $fh, '>', "$self->{dir}/collector.status" or die $!;
    print $fh "$status\n";
    close $fh;
}

sub stop {
    my ($self) = @_;

    # only the test's own process, not a child forked after the start
    return unless $self->{pid} && $self->{owner} == $$;

    kill 'TERM', $self->{pid};
    waitpid($self->{pid}, 0);
    delete $self->{pid};
}

sub DESTROY { $_[0]->stop }

# a span's (or an event's) attributes: strings and integers as they are

sub attrs {
    my ($span) = @_;
    return { map {
        my $v = $_->{value};
        ($_->{key} => exists $v->{stringValue} ? $v->{stringValue}
                    : exists $v->{intValue} ? $v->{intValue}
                    : $v)
    } @{$span->{attributes} || []} };
}

1;
