#!/usr/bin/perl

# An agent's options are more members of every request body it sends:
# what the API takes there and no directive sets (Anthropic's thinking
# and max_tokens, sampling parameters), passed through as written.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $mock = Test::Agent::MockProvider->new;

for my $case (
    [ 'anthropic_messages',
      '{"thinking":{"type":"enabled","budget_tokens":2048},'
      . '"max_tokens":8192}' ],
    [ 'openai_responses', '{"reasoning":{"summary":"auto"}}' ],
    [ 'openai_chat', '{"temperature":0.25}' ])
{
    my ($adapter, $options) = @$case;

    my $t = Test::Agent->new;
    $t->write_file_expand('nginx.conf', engine_conf($mock,
        adapter => $adapter, agent => "options '$options';"));
    $t->run;

    $mock->reset;
    $mock->script({ text => 'fine' });
    send_message($t, 'o1', 'hi');
    wait_state($t, 'o1', 'idle');

    my $req = $mock->requests->[0];

    if ($adapter eq 'anthropic_messages') {
        is_deeply($req->{json}{thinking},
                  { type => 'enabled', budget_tokens => 2048 },
                  "$adapter: thinking enabled");
        is($req->{json}{max_tokens}, 8192, "$adapter: max_tokens set");
        my @n = $req->{body} =~ /"max_tokens"/g;
        is(scalar @n, 1, "$adapter: the adapter's default left out");

    } elsif ($adapter eq 'openai_responses') {
        is_deeply($req->{json}{reasoning}, { summary => 'auto' },
                  "$adapter: reasoning summaries asked for");

    } else {
        like($req->{body}, qr/"temperature":0\.25/,
             "$adapter: the number as written");
    }

    $t->done(more => 1);
}

# not an object: nginx -t names it

my $t = Test::Agent->new;
$t->write_file_expand('nginx.conf', engine_conf($mock,
    agent => "options '[1,2]';"));
my ($rc, $out) = $t->test_config;
isnt($rc, 0, 'options that are not an object are refused');
like($out, qr/agent "chat": options is not a JSON object in .*nginx\.conf:\d+/,
     'with the agent, the reason, the file and the line');

$mock->stop;
done_testing();
