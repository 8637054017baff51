#!/usr/bin/perl

# Relaying a 1,000-token provider stream: through the module (a turn, its
# deltas read by an SSE subscriber) against plain proxy_pass of the same
# stream.  Reports time to first token, time to the end, and the nginx
# worker's CPU time per stream.
#
#   perl bench/relay.pl [runs]        (make first; TEST_NGINX_* as in t/)

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../t/lib";

use JSON::PP;
use POSIX qw(sysconf);
use Time::HiRes qw(time);

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::SSE;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $runs = shift // 30;
my $tokens = 1000;

my $text = join ' ', map { "w$_" } 1 .. $tokens;
my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => $text, chunks => $tokens };
});

my $t = Test::Agent->new;

$t->write_file_expand('nginx.conf', engine_conf($mock, zone => '64m',
    server => "location /plain/ {
                   proxy_pass http://127.0.0.1:${\ $mock->port}/;
                   proxy_http_version 1.1;
                   proxy_set_header Connection \"\";
                   proxy_buffering off;
               }"));
$t->run;

my $port = $t->port(8080);
my ($worker) = $t->worker_pids;
my $hz = sysconf(POSIX::_SC_CLK_TCK()) || 100;

sub cpu {
    open my $fh, '<', "/proc/$worker/stat" or die "$!\n";
    my @f = split / /, (split /\) /, <$fh>)[1];
    return ($f[11] + $f[12]) / $hz;
}

sub plain {
    my $body = encode_json({ model => 'm', stream => JSON::PP::true,
                             messages => [{ role => 'user',
                                            content => 'go' }] });
    my $start = time;
    my $s = http_stream(http_request('POST', '/plain/v1/chat/completions',
        $body, headers => { 'Content-Type' => 'application/json' }),
        port => $port);
    my $sse = Test::Agent::SSE->new($s);
    my ($first, $last);

    while (my $e = $sse->next_event(10)) {
        next unless defined $e->{data};
        $first //= $e->{t} if $e->{data} =~ /"content":"w/;
        if ($e->{data} eq '[DONE]') {
            $last = $e->{t};
            last;
        }
    }

    $s->close;
    return ($first - $start, $last - $start);
}

my $n = 0;

sub module {
    my $cid = 'b' . $n++;
    my $start = time;
    my $r = send_message($t, $cid, 'go');
    die "message: $r->{status}\n" unless $r->{status} == 202;

    # a conversation exists from its first message on
    my $sse = Test::Agent::SSE->new(http_stream(events_request($cid),
                                                port => $port));

    my ($first, $last);

    while (my $e = $sse->next_event(10)) {
        next unless defined $e->{event};
        $first //= $e->{t} if $e->{event} eq 'text_delta';
        if ($e->{event} eq 'turn_completed') {
            $last = $e->{t};
            last;
        }
    }

    $sse->stream->close;
    return ($first - $start, $last - $start);
}

sub measure {
    my ($name, $run) = @_;

    $run->() for 1 .. 3;

    my (@ttft, @total);
    my $cpu0 = cpu();

    for (1 .. $runs) {
        my ($f, $l) = $run->();
        push @ttft, $f;
        push @total, $l;
    }

    my $cpu = (cpu() - $cpu0) / $runs;

    @ttft = sort { $a <=> $b } @ttft;
    @total = sort { $a <=> $b } @total;

    printf "%-12s ttft median %6.2f ms  p90 %6.2f ms   end median %7.2f ms"
           . "   worker cpu %6.2f ms/stream\n",
           $name, 1000 * $ttft[$#ttft / 2], 1000 * $ttft[int($#ttft * 0.9)],
           1000 * $total[$#total / 2], 1000 * $cpu;
}

print "relaying a $tokens-token stream, $runs runs each, 1 worker\n";
measure('proxy_pass', \&plain);
measure('module', \&module);

$mock->stop;
$t->stop;
