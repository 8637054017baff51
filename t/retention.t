#!/usr/bin/perl

# Retention, per tool, in every adapter: a result older than its tool's
# "turns" bound, or with "count" newer results of its tool, reaches the
# model as a stub ("[result expired]") while its call stays, so a call is
# never sent without its result; a tool with "never_evict", or none, is
# sent whole; the log keeps everything.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $mock = Test::Agent::MockProvider->new;

my $TOOLS = '';
for ([recent => 'retention turns=1;'], [latest => 'retention count=1;'],
     [kept => 'retention never_evict;'], [plain => ''])
{
    my ($name, $retention) = @$_;
    $TOOLS .= <<"EOF";
    agent_tool $name {
        description "Echoes what it got";
        parameters '{"type":"object","properties":{"n":{"type":"integer"}}}';
        $retention
        location /tools/echo;
    }
EOF
}

# each call's result as the request gives it to the model, by call id

sub results {
    my ($adapter, $req) = @_;

    my $j = $req->{json};
    my %r;

    if ($adapter eq 'openai_chat') {
        $r{$_->{tool_call_id}} = $_->{content}
            for grep { $_->{role} eq 'tool' } @{$j->{messages}};

    } elsif ($adapter eq 'anthropic_messages') {
        for my $m (@{$j->{messages}}) {
            next unless ref $m->{content};
            for my $b (grep { $_->{type} eq 'tool_result' } @{$m->{content}}) {
                my $c = $b->{content};
                $c = join '', map { $_->{text} // '' } @$c if ref $c;
                $r{$b->{tool_use_id}} = $c;
            }
        }

    } else {
        $r{$_->{call_id}} = $_->{output}
            for grep { ($_->{type} // '') eq 'function_call_output' }
                     @{$j->{input}};
    }

    return \%r;
}

sub calls {
    my ($adapter, $req) = @_;
    my $body = $req->{body};
    return [grep { index($body, "\"$_\"") >= 0 }
                 qw(call_r1 call_l1 call_k1 call_p1 call_l2)];
}

my $stub = '{"ok":true,"result":"[result expired]"}';

for my $adapter (qw(openai_chat anthropic_messages openai_responses)) {
    my $t = Test::Agent->new;

    $t->write_file_expand('nginx.conf', engine_conf($mock,
        adapter => $adapter, tools => $TOOLS, server => $ECHO_LOCATION,
        agent => 'tools recent latest kept plain;'));
    $t->run;

    $mock->reset;
    $mock->script(
        { tool_calls => [
            { id => 'call_r1', name => 'recent', arguments => '{"n":11}' },
            { id => 'call_l1', name => 'latest', arguments => '{"n":21}' },
            { id => 'call_k1', name => 'kept', arguments => '{"n":31}' },
            { id => 'call_p1', name => 'plain', arguments => '{"n":41}' }] },
        { text => 'First done.' },
        { tool_calls => [
            { id => 'call_l2', name => 'latest', arguments => '{"n":22}' }] },
        { text => 'Second done.' },
        { text => 'Third done.' });

    for my $i (1 .. 3) {
        send_message($t, 'r', "message $i");
        wait_state($t, 'r', 'idle');
    }

    my @req = @{$mock->requests};
    is(scalar @req, 5, "$adapter: five model calls");

    # turn 1, after its calls: every result whole

    my $r = results($adapter, $req[1]);
    is(scalar(grep { $_ eq $stub } values %$r), 0,
       "$adapter: turn 1: no result expired");
    like($r->{call_r1} // '', qr/"n":11/, "$adapter: turn 1: recent whole");

    # turn 2: recent's result is a turn old; latest has one result yet

    $r = results($adapter, $req[2]);
    is($r->{call_r1}, $stub, "$adapter: turn 2: recent (turns=1) expired");
    like($r->{call_l1} // '', qr/"n":21/,
         "$adapter: turn 2: latest whole, no newer result yet");

    # after latest's second result: its first one expired

    $r = results($adapter, $req[3]);
    is($r->{call_l1}, $stub, "$adapter: latest (count=1): the older expired");
    like($r->{call_l2} // '', qr/"n":22/, "$adapter: the newest whole");

    # turn 3: what stays whole, and every call still with its result

    $r = results($adapter, $req[4]);
    like($r->{call_k1} // '', qr/"n":31/, "$adapter: never_evict whole");
    like($r->{call_p1} // '', qr/"n":41/, "$adapter: no retention: whole");
    is($r->{call_r1}, $stub, "$adapter: turn 3: recent still expired");
    is_deeply([sort keys %$r],
              [sort @{calls($adapter, $req[4])}],
              "$adapter: every call sent has its result");
    is(scalar keys %$r, 5, "$adapter: five results sent");

    # the log keeps everything

    my $c = inspect($t, 'r')->{json};
    my @results = grep { $_->{type} eq 'tool_result' } @{$c->{messages}};
    is(scalar(grep { encode_json($_->{result} // {}) =~ /"n":/ } @results),
       5, "$adapter: the log keeps every result whole");

    $mock->stop if $adapter eq 'openai_responses';
    $t->done(more => $adapter ne 'openai_responses');
}
