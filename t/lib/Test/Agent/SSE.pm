package Test::Agent::SSE;

# Server-Sent Events read from a Test::Agent::HTTP::Stream, one event at
# a time with its arrival time.
#
#   my $sse = Test::Agent::SSE->new(http_stream($req, port => $port));
#   my $e = $sse->next_event(5);   # {id, event, data, retry, t} or undef
#   $e->{comment}                  # set for a ':' line (heartbeat)

use strict;
use warnings;

use Time::HiRes qw(time);

sub new {
    my ($class, $stream) = @_;
    return bless { stream => $stream, text => '', t => undef,
                   events => [] }, $class;
}

sub stream { $_[0]{stream} }

sub next_event {
    my ($self, $timeout) = @_;

    my $deadline = time + ($timeout // 10);

    until (@{$self->{events}}) {
        my $left = $deadline - time;
        return undef if $left <= 0;
        my $c = $self->{stream}->next_chunk($left) or return undef;
        $self->{text} .= $c->{data};
        $self->{t} = $c->{t};
        $self->parse;
    }

    return shift @{$self->{events}};
}

# Events (not comments) until the callback returns true for one, or the
# timeout; returns them all.

sub events_until {
    my ($self, $done, $timeout) = @_;

    my $deadline = time + ($timeout // 10);
    my @got;
    while (time < $deadline) {
        my $e = $self->next_event($deadline - time) or last;
        next if $e->{comment} && !defined $e->{data};
        push @got, $e;
        last if $done->($e);
    }
    return @got;
}

sub parse {
    my ($self) = @_;

    while ($self->{text} =~ s/^(.*?)(?:\r\n|\n|\r)(?:\r\n|\n|\r)//s) {
        my $block = $1;
        my %e = (t => $self->{t});
        my @data;

        for my $line (split /\r\n|\n|\r/, $block) {
            if ($line =~ /^:(.*)/) {
                $e{comment} = $1;
                next;
            }
            my ($field, $value) = $line =~ /^([^:]*)(?::\s?(.*))?$/;
            $value //= '';
            if ($field eq 'data') {
                push @data, $value;
            } elsif ($field =~ /^(id|event|retry)$/) {
                $e{$field} = $value;
            }
        }

        $e{data} = join "\n", @data if @data;
        push @{$self->{events}}, \%e;
    }
}

1;
