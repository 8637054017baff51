#!/usr/bin/perl

# Prompt caching: the rendered system prompt and tool list are the same
# bytes in every request of a conversation; "cache system tools" puts
# Anthropic's cache_control breakpoints on the system prompt and the
# last tool (other adapters ignore it); the tokens a cache served (and,
# for Anthropic, wrote) are recorded with the assistant message's usage.

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

my $tools = $ECHO_TOOL . <<'EOF';
    agent_tool web_search {
        executor provider;
        provider_definition anthropic_messages
            '{"type":"web_search_20250305","name":"web_search","max_uses":3}';
    }
EOF

my $ephemeral = { type => 'ephemeral' };

# the request body without its messages: what must not change

sub prefix {
    my ($body, $key) = @_;
    (my $p = $body) =~ s/"$key":\[.*\],"tools"/"$key":[],"tools"/s;
    return $p;
}

sub usage_of {
    my ($c, $n) = @_;
    my @m = grep { $_->{type} eq 'assistant_msg' } @{$c->{messages}};
    return $m[$n]{usage};
}

###############################################################################

# Anthropic, with breakpoints on the system prompt and the tools

{
    my $t = Test::Agent->new;

    $t->write_file_expand('nginx.conf', engine_conf($mock,
        adapter => 'anthropic_messages', tools => $tools,
        server => $ECHO_LOCATION,
        agent => 'tools echo web_search; cache system tools;'));
    $t->run;

    $mock->reset;
    $mock->script(
        { text => 'One.', usage => { input_tokens => 12, output_tokens => 2,
                                     cache_creation_input_tokens => 900 } },
        { text => 'Two.', usage => { input_tokens => 5, output_tokens => 2,
                                     cache_read_input_tokens => 900 } });

    send_message($t, 'a1', 'first');
    wait_state($t, 'a1', 'idle');
    send_message($t, 'a1', 'second');
    my $c = wait_state($t, 'a1', 'idle');

    my @req = @{$mock->requests};
    is(scalar @req, 2, 'anthropic: two model calls');

    my $j = $req[0]{json};
    is_deeply($j->{system}, [{ type => 'text', text => 'You are terse.',
                               cache_control => $ephemeral }],
              'anthropic: the system prompt a block with a breakpoint');
    ok(!exists $j->{tools}[0]{cache_control},
       'anthropic: no breakpoint on the first tool');
    is_deeply($j->{tools}[1],
              { type => 'web_search_20250305', name => 'web_search',
                max_uses => 3, cache_control => $ephemeral },
              'anthropic: the breakpoint on the last tool');

    like($req[0]{body}, qr/^\{"model":"gpt-test","max_tokens":4096,/,
         'anthropic: the body as rendered');
    is(prefix($req[1]{body}, 'messages'), prefix($req[0]{body}, 'messages'),
       'anthropic: system and tools the same bytes in the second turn');
    is(scalar @{$req[1]{json}{messages}}, 3,
       'anthropic: only the messages grew');

    is_deeply(usage_of($c, 0), { input_tokens => 12, output_tokens => 2,
                                 cache_creation_tokens => 900 },
              'anthropic: tokens written to the cache recorded');
    is_deeply(usage_of($c, 1), { input_tokens => 5, output_tokens => 2,
                                 cached_tokens => 900 },
              'anthropic: tokens read from the cache recorded');

    $t->stop;
}

# only the system prompt

{
    my $t = Test::Agent->new;

    $t->write_file_expand('nginx.conf', engine_conf($mock,
        adapter => 'anthropic_messages', tools => $ECHO_TOOL,
        server => $ECHO_LOCATION, agent => 'tools echo; cache system;'));
    $t->run;

    $mock->reset;
    $mock->script({ text => 'One.' });

    send_message($t, 'a2', 'first');
    wait_state($t, 'a2', 'idle');

    my $j = $mock->requests->[0]{json};
    is_deeply($j->{system}[0]{cache_control}, $ephemeral,
              'cache system: the system prompt has a breakpoint');
    ok(!exists $j->{tools}[0]{cache_control},
       'cache system: the tools have none');

    $t->stop;
}

###############################################################################

# the OpenAI APIs cache by themselves: "cache" changes nothing there, the
# prefix is the same bytes, and the cached tokens they report are kept

for my $adapter (qw(openai_chat openai_responses)) {
    my $t = Test::Agent->new;

    $t->write_file_expand('nginx.conf', engine_conf($mock,
        adapter => $adapter, tools => $ECHO_TOOL, server => $ECHO_LOCATION,
        agent => 'tools echo; cache system tools;'));
    $t->run;

    $mock->reset;
    $mock->script(
        { text => 'One.', usage => { prompt_tokens => 40,
                                     completion_tokens => 2 } },
        { text => 'Two.', usage => { prompt_tokens => 50,
                                     completion_tokens => 2,
                                     cached_tokens => 32 } });

    send_message($t, 'o1', 'first');
    wait_state($t, 'o1', 'idle');
    send_message($t, 'o1', 'second');
    my $c = wait_state($t, 'o1', 'idle');

    my @req = @{$mock->requests};
    unlike($req[0]{body}, qr/cache_control/, "$adapter: no cache_control");

    my $key = $adapter eq 'openai_chat' ? 'messages' : 'input';
    is(prefix($req[1]{body}, $key), prefix($req[0]{body}, $key),
       "$adapter: system and tools the same bytes in the second turn");

    is_deeply(usage_of($c, 0), { input_tokens => 40, output_tokens => 2 },
              "$adapter: no cached tokens, none recorded");
    is_deeply(usage_of($c, 1), { input_tokens => 50, output_tokens => 2,
                                 cached_tokens => 32 },
              "$adapter: cached tokens recorded");

    $t->stop;
}

done_testing();
