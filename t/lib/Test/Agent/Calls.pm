package Test::Agent::Calls;

# What the MCP tests share: a scripted tool call, the results of a
# conversation by call id, and the live events of a turn as a subscriber
# sees them until it ends.

use strict;
use warnings;

use Exporter qw(import);

use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::SSE;

our @EXPORT = qw(tool_call tool_results turn_events);

sub tool_call {
    my ($id, $name, $args) = @_;
    return { id => $id, name => $name, arguments => $args };
}

sub tool_results {
    my ($c) = @_;
    return { map { $_->{tool_call_id} => $_ }
             grep { $_->{type} eq 'tool_result' } @{$c->{messages}} };
}

# the events of conversation $cid (with their arrival time t) until
# turn_completed, subscribing on port $port

sub turn_events {
    my ($port, $cid, $timeout) = @_;

    my $sse = Test::Agent::SSE->new(http_stream(events_request($cid),
                                                port => $port));
    my @seen = grep { defined $_->{event} } $sse->events_until(
        sub { ($_[0]{event} // '') eq 'turn_completed' }, $timeout // 15);
    $sse->stream->close;

    return @seen;
}

1;
