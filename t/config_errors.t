#!/usr/bin/perl

# Every illegal agent or tool declaration is refused by nginx -t with a
# precise message naming the file and the line of the offending directive.
# In each case the line is marked with "#!" and found in the written file.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Test::Agent;

# a legal agent and tools the cases can lean on

my $base = <<'EOF';
    agent_tool weather {
        parameters '{"type":"object"}';
        location /tools/weather;
    }
EOF

my @cases = (

    # the legal matrix

    {
        name => 'gated human tool',
        conf => <<'EOF',
    agent_tool ask {
        executor human;
        approval requires_approval;  #!
    }
EOF
        error => 'agent_tool "ask": approval requires_approval is not '
            . 'allowed with executor human (a human tool\'s answer is '
            . 'already the human\'s decision)',
    },
    {
        name => 'gated provider tool',
        conf => <<'EOF',
    agent_tool web_search {
        approval requires_approval;  #!
        executor provider;
        provider_definition anthropic_messages
            '{"type":"web_search_20250305","name":"web_search"}';
    }
EOF
        error => 'agent_tool "web_search": approval requires_approval is '
            . 'not allowed with executor provider (the provider runs the '
            . 'tool mid-stream, there is no point to suspend before it '
            . 'runs)',
    },
    {
        name => 'server tool without location',
        conf => <<'EOF',
    agent_tool lookup {  #!
        description "Look something up";
        executor server;
    }
EOF
        error => 'agent_tool "lookup": executor server needs a "location" '
            . 'to route the call to',
    },
    {
        name => 'server tool by default, without location',
        conf => <<'EOF',
    agent_tool lookup {  #!
        approval requires_approval;
    }
EOF
        error => 'agent_tool "lookup": executor server needs a "location" '
            . 'to route the call to',
    },
    {
        name => 'provider tool without provider_definition',
        conf => <<'EOF',
    agent_tool web_search {  #!
        executor provider;
    }
EOF
        error => 'agent_tool "web_search": executor provider needs a '
            . '"provider_definition"',
    },
    {
        name => 'location on a human tool',
        conf => <<'EOF',
    agent_tool ask {
        location /tools/ask;  #!
        executor human;
    }
EOF
        error => 'agent_tool "ask": "location" is only for executor '
            . 'server, not human',
    },
    {
        name => 'location on a client tool',
        conf => <<'EOF',
    agent_tool geolocate {
        executor client;
        location /tools/geo;  #!
    }
EOF
        error => 'agent_tool "geolocate": "location" is only for executor '
            . 'server, not client',
    },
    {
        name => 'provider_definition on a server tool',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        provider_definition openai_responses '{"type":"web_search"}';  #!
    }
EOF
        error => 'agent_tool "lookup": "provider_definition" is only for '
            . 'executor provider, not server',
    },
    {
        name => 'parameters on a provider tool',
        conf => <<'EOF',
    agent_tool web_search {  #!
        executor provider;
        parameters '{"type":"object"}';
        provider_definition openai_responses '{"type":"web_search"}';
    }
EOF
        error => 'agent_tool "web_search": executor provider takes no '
            . '"parameters", its provider_definition describes it',
    },

    # values and keys

    {
        name => 'unknown executor',
        conf => <<'EOF',
    agent_tool lookup {
        executor robot;  #!
    }
EOF
        error => 'invalid value "robot" in "executor" directive, it must '
            . 'be "server", "human", "client" or "provider"',
    },
    {
        name => 'unknown approval',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        approval maybe;  #!
    }
EOF
        error => 'invalid value "maybe" in "approval" directive, it must '
            . 'be "auto" or "requires_approval"',
    },
    {
        name => 'streaming not a flag',
        conf => <<'EOF',
    agent_tool lookup {
        streaming yes;  #!
    }
EOF
        error => 'invalid value "yes" in "streaming" directive, it must be '
            . '"on" or "off"',
    },
    {
        name => 'invalid timeout',
        conf => <<'EOF',
    agent_tool ask {
        executor human;
        timeout forever;  #!
    }
EOF
        error => '"timeout" directive invalid value',
    },
    {
        name => 'unknown key in agent_tool',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        callback lookup_fn;  #!
    }
EOF
        error => 'unknown directive "callback" in agent_tool block',
    },
    {
        name => 'unknown key in agent',
        conf => <<'EOF',
    agent bot {
        provider openai_chat /provider;
        temperature 0.2;  #!
    }
EOF
        error => 'unknown directive "temperature" in agent block',
    },
    {
        name => 'a directive twice in a block',
        conf => <<'EOF',
    agent_tool lookup {
        executor server;
        executor human;  #!
    }
EOF
        error => '"executor" directive is duplicate',
    },
    {
        name => 'system and system_file',
        conf => <<'EOF',
    agent bot {
        system "Be brief.";
        system_file prompt.txt;  #!
    }
EOF
        error => '"system_file" directive is duplicate',
    },
    {
        name => 'description not UTF-8',
        conf => <<"EOF",
    agent_tool lookup {
        description "caf\xe9";  #!
    }
EOF
        error => '"description" directive is not valid UTF-8',
    },
    {
        name => 'invalid tool name',
        conf => <<'EOF',
    agent_tool "look up" {  #!
        location /tools/lookup;
    }
EOF
        error => 'invalid agent_tool name "look up", it must be 1 to 64 '
            . 'letters, digits, "_" or "-"',
    },
    {
        name => 'tool location not a URI',
        conf => <<'EOF',
    agent_tool lookup {
        location tools/lookup;  #!
    }
EOF
        error => 'agent_tool "lookup": location "tools/lookup" must be a '
            . 'URI starting with "/"',
    },
    {
        name => 'invalid retention',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        retention turns=0;  #!
    }
EOF
        error => 'invalid parameter "turns=0" in "retention" directive, it '
            . 'must be "turns=N", "count=N" or "never_evict" (N > 0)',
    },
    {
        name => 'never_evict with a bound',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        retention count=3 never_evict;  #!
    }
EOF
        error => 'agent_tool "lookup": retention never_evict cannot be '
            . 'combined with turns= or count=',
    },

    # argument counts

    {
        name => 'too many arguments inside agent_tool',
        conf => <<'EOF',
    agent_tool lookup {
        executor server human;  #!
    }
EOF
        error => 'invalid number of arguments in "executor" directive',
    },
    {
        name => 'too few arguments inside agent',
        conf => <<'EOF',
    agent bot {
        provider openai_chat;  #!
    }
EOF
        error => 'invalid number of arguments in "provider" directive',
    },
    {
        name => 'no arguments to tools',
        conf => <<'EOF',
    agent bot {
        tools;  #!
    }
EOF
        error => 'invalid number of arguments in "tools" directive',
    },
    {
        name => 'agent_tool without a name',
        conf => <<'EOF',
    agent_tool {  #!
    }
EOF
        error => 'invalid number of arguments in "agent_tool" directive',
    },
    {
        name => 'agent block inside a location',
        conf => <<'EOF',
    server {
        location / {
            agent bot {  #!
            }
        }
    }
EOF
        error => 'directive "agent" is not terminated by ";"',
    },
    {
        name => 'agent selection at http level',
        conf => <<'EOF',
    agent bot;  #!
EOF
        error => 'directive "agent" has no opening "{"',
    },
    {
        name => 'agent_tool in a server',
        conf => <<'EOF',
    server {
        agent_tool lookup {  #!
        }
    }
EOF
        error => '"agent_tool" directive is not allowed here',
    },

    # names

    {
        name => 'agent naming an undeclared tool',
        conf => <<'EOF',
    agent bot {
        provider openai_chat /provider;
        model gpt-4o;
        tools weather nope;  #!
    }
EOF
        error => 'agent "bot": unknown tool "nope" (no agent_tool "nope" '
            . 'is declared)',
    },
    {
        name => 'undeclared tool, agent in an included file',
        conf => <<'EOF',
    include agents.conf;
EOF
        files => {
            'agents.conf' => <<'EOF',
agent bot {
    provider anthropic_messages /provider;
    model claude-sonnet-4-5;

    tools weather;
    tools forecast;  #!
}
EOF
        },
        in => 'agents.conf',
        error => 'agent "bot": unknown tool "forecast" (no agent_tool '
            . '"forecast" is declared)',
    },
    {
        name => 'a tool listed twice',
        conf => <<'EOF',
    agent bot {
        tools weather;
        tools weather;  #!
    }
EOF
        error => 'agent "bot": tool "weather" is listed twice',
    },
    {
        name => 'duplicate tool name',
        conf => <<'EOF',
    agent_tool weather {  #!
        executor human;
    }
EOF
        error => 'duplicate agent_tool "weather"',
    },
    {
        name => 'duplicate agent name',
        conf => <<'EOF',
    agent bot {
        provider openai_chat /provider;
        model gpt-4o;
    }

    agent bot {  #!
        provider openai_chat /provider;
        model gpt-4o-mini;
    }
EOF
        error => 'duplicate agent "bot"',
    },
    {
        name => 'agent_agui with an unknown parameter',
        conf => <<'EOF',
    server {
        listen 127.0.0.1:%%PORT_8080%%;

        location /agui {
            agent weather_bot;
            agent_agui client_tools=maybe;  #!
        }
    }

    agent weather_bot {
        provider openai_chat /provider;
        model gpt-4o;
    }
EOF
        error => 'invalid parameter "client_tools=maybe", it must be '
            . '"client_tools=on" or "client_tools=off"',
    },
    {
        name => 'location naming an undeclared agent',
        conf => <<'EOF',
    server {
        listen 127.0.0.1:%%PORT_8080%%;

        location /chat {
            agent nope;  #!
        }
    }

    agent bot {
        provider openai_chat /provider;
        model gpt-4o;
    }
EOF
        error => 'unknown agent "nope"',
    },
    {
        name => 'agent_describe without an agent',
        conf => <<'EOF',
    server {
        listen 127.0.0.1:%%PORT_8080%%;

        location /describe {
            agent_describe;  #!
        }
    }
EOF
        error => '"agent_describe" needs an "agent" in the location',
    },

    # schemas

    {
        name => 'parameters not JSON',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        parameters '{type: "object"}';  #!
    }
EOF
        error => 'agent_tool "lookup": parameters is not valid JSON: '
            . 'lexical error: invalid string in json text at byte 2',
    },
    {
        name => 'parameters with trailing garbage',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        parameters '{"type": "object"} {}';  #!
    }
EOF
        error => 'agent_tool "lookup": parameters is not valid JSON: '
            . 'parse error: trailing garbage at byte 20',
    },
    {
        name => 'parameters truncated',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        parameters '{"type": "object"';  #!
    }
EOF
        error => 'agent_tool "lookup": parameters is not valid JSON: '
            . 'parse error: premature EOF',
    },
    {
        name => 'parameters an array',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        parameters '[{"type": "object"}]';  #!
    }
EOF
        error => 'agent_tool "lookup": parameters is not a JSON object',
    },
    {
        name => 'parameters a string',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        parameters '"object"';  #!
    }
EOF
        error => 'agent_tool "lookup": parameters is not a JSON object',
    },
    {
        name => 'parameters_file not an object',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        parameters_file schemas/lookup.json;  #!
    }
EOF
        files => { 'schemas/lookup.json' => "[1, 2]\n" },
        error => 'agent_tool "lookup": parameters_file '
            . '"%%TESTDIR%%/schemas/lookup.json" is not a JSON object',
    },
    {
        name => 'parameters_file missing',
        conf => <<'EOF',
    agent_tool lookup {
        location /tools/lookup;
        parameters_file schemas/missing.json;  #!
    }
EOF
        error => 'open() "%%TESTDIR%%/schemas/missing.json" failed '
            . '(2: No such file or directory)',
    },
    {
        name => 'provider_definition not JSON',
        conf => <<'EOF',
    agent_tool web_search {
        executor provider;
        provider_definition openai_responses '{"type": web_search}';  #!
    }
EOF
        error => 'agent_tool "web_search": provider_definition for '
            . 'openai_responses is not valid JSON: lexical error: invalid '
            . 'char in json text at byte 10',
    },

    # adapters

    {
        name => 'unknown adapter',
        conf => <<'EOF',
    agent bot {
        provider gemini /provider;  #!
    }
EOF
        error => 'invalid value "gemini" in "provider" directive, it must '
            . 'be "openai_chat", "anthropic_messages" or "openai_responses"',
    },
    {
        name => 'provider location not a URI',
        conf => <<'EOF',
    agent bot {
        provider openai_chat https://api.openai.com;  #!
    }
EOF
        error => 'agent "bot": provider location "https://api.openai.com" '
            . 'must be a URI starting with "/"',
    },
    {
        name => 'provider_definition for an adapter without hosted tools',
        conf => <<'EOF',
    agent_tool web_search {
        executor provider;
        provider_definition openai_chat '{"type":"web_search"}';  #!
    }
EOF
        error => 'agent_tool "web_search": adapter openai_chat cannot host '
            . 'provider tools, "provider_definition" is for '
            . '"anthropic_messages" or "openai_responses"',
    },
    {
        name => 'provider_definition for an unknown adapter',
        conf => <<'EOF',
    agent_tool web_search {
        executor provider;
        provider_definition gemini '{"google_search":{}}';  #!
    }
EOF
        error => 'agent_tool "web_search": unknown adapter "gemini" in '
            . '"provider_definition", it must be "anthropic_messages" or '
            . '"openai_responses"',
    },
    {
        name => 'two provider_definitions for one adapter',
        conf => <<'EOF',
    agent_tool web_search {
        executor provider;
        provider_definition openai_responses '{"type":"web_search"}';
        provider_definition openai_responses '{"type":"web_search_2"}';  #!
    }
EOF
        error => 'agent_tool "web_search": duplicate provider_definition '
            . 'for openai_responses',
    },
    {
        name => 'provider tool on openai_chat',
        conf => <<'EOF',
    agent chat {
        provider openai_chat /provider;
        model gpt-4o;
        tools weather web_search;  #!
    }

    agent_tool web_search {
        executor provider;
        provider_definition openai_responses '{"type":"web_search"}';
    }
EOF
        error => 'agent "chat": tool "web_search" has executor provider, '
            . 'which adapter openai_chat cannot host',
    },
    {
        name => 'provider tool without a definition for the adapter',
        conf => <<'EOF',
    agent_tool web_search {
        executor provider;
        provider_definition openai_responses '{"type":"web_search"}';
    }

    agent bot {
        provider anthropic_messages /provider;
        model claude-sonnet-4-5;
        tools web_search;  #!
    }
EOF
        error => 'agent "bot": tool "web_search" has no provider_definition '
            . 'for anthropic_messages',
    },

    # agents

    {
        name => 'agent without provider',
        conf => <<'EOF',
    agent bot {  #!
        model gpt-4o;
    }
EOF
        error => 'agent "bot" has no "provider"',
    },
    {
        name => 'agent without model',
        conf => <<'EOF',
    agent bot {  #!
        provider openai_responses /provider;
        tools weather;
    }
EOF
        error => 'agent "bot" has no "model"',
    },
    {
        name => 'max_model_calls 0',
        conf => <<'EOF',
    agent bot {
        max_model_calls 0;  #!
    }
EOF
        error => 'value must be equal to or greater than 1',
    },
    {
        name => 'context_budget 0',
        conf => <<'EOF',
    agent bot {
        context_budget 0;  #!
    }
EOF
        error => 'value must be equal to or greater than 1',
    },
    {
        name => 'context_budget not a number',
        conf => <<'EOF',
    agent bot {
        context_budget lots;  #!
    }
EOF
        error => '"context_budget" directive invalid number',
    },
    {
        name => 'invalid retry',
        conf => <<'EOF',
    agent bot {
        retry attempts=2 jitter=on;  #!
    }
EOF
        error => 'invalid parameter "jitter=on" in "retry" directive, it '
            . 'must be "attempts=N", "base=TIME" or "cap=TIME"',
    },
    {
        name => 'retry base above cap',
        conf => <<'EOF',
    agent bot {
        retry base=10s;  #!
    }
EOF
        error => 'agent "bot": retry base=10000ms is greater than '
            . 'cap=8000ms',
    },

    # budgets

    {
        name => 'budget zone without key',
        conf => "    agent_budget_zone zone=b:1m tokens=10/d;  #!\n",
        error => '"agent_budget_zone" must have "key=" parameter',
    },
    {
        name => 'budget zone without zone',
        conf => "    agent_budget_zone key=\$remote_user tokens=10/d;  #!\n",
        error => '"agent_budget_zone" must have "zone=" parameter',
    },
    {
        name => 'budget zone without limit',
        conf => "    agent_budget_zone key=\$remote_user zone=b:1m;  #!\n",
        error => '"agent_budget_zone" must have "tokens=" or "requests="',
    },
    {
        name => 'budget with a bad period',
        conf => "    agent_budget_zone key=\$remote_user zone=b:1m "
            . "tokens=10/fortnight;  #!\n",
        error => 'invalid period in "tokens=10/fortnight", it must be a '
            . 'time such as s, m, h, d or 12h',
    },
    {
        name => 'budget without a period',
        conf => "    agent_budget_zone key=\$remote_user zone=b:1m "
            . "requests=10;  #!\n",
        error => 'invalid limit "requests=10", it must be N/period, '
            . 'e.g. 100000/d',
    },
    {
        name => 'budget of zero',
        conf => "    agent_budget_zone key=\$remote_user zone=b:1m "
            . "requests=0/m;  #!\n",
        error => 'invalid limit "requests=0/m", it must be a positive '
            . 'number per period',
    },
    {
        name => 'budget zone with an unknown parameter',
        conf => "    agent_budget_zone key=\$remote_user zone=b:1m "
            . "requests=1/m burst=5;  #!\n",
        error => 'invalid parameter "burst=5"',
    },
    {
        name => 'duplicate budget zone',
        conf => "    agent_budget_zone key=\$remote_user zone=b:1m "
            . "requests=1/m;\n    agent_budget_zone key=\$remote_user "
            . "zone=b:1m tokens=1/m;  #!\n",
        error => 'duplicate budget zone "b"',
    },
    {
        name => 'unknown budget zone',
        conf => <<'EOF',
    server {
        location / {
            agent_budget zone=nope;  #!
        }
    }
EOF
        error => 'unknown budget zone "nope" (no "agent_budget_zone" '
            . 'declares it)',
    },
    {
        name => 'agent_budget without zone=',
        conf => "    agent_budget nope;  #!\n",
        error => 'invalid parameter "nope", it must be zone=name',
    },
    {
        name => 'agent_create without an agent',
        conf => <<'EOF',
    agent_zone zone=z:1m;
    server {
        location /new {
            agent_create;  #!
        }
    }
EOF
        error => '"agent_create" needs an "agent" in the location',
    },
    {
        name => 'agent_zone with an unknown parameter',
        conf => "    agent_zone zone=z:1m keep_everything;  #!\n",
        error => 'invalid parameter "keep_everything"',
    },
    {
        name => 'agent_trace with an unknown parameter',
        conf => "    agent_trace /otlp name=agents;  #!\n",
        error => 'invalid parameter "name=agents" of "agent_trace": '
            . 'service=name expected',
    },
    {
        name => 'agent_trace with an empty service',
        conf => "    agent_trace /otlp service=;  #!\n",
        error => 'invalid parameter "service=" of "agent_trace": '
            . 'service=name expected',
    },
    {
        name => 'agent_trace twice',
        conf => "    agent_trace /otlp;\n    agent_trace /otlp2;  #!\n",
        error => '"agent_trace" directive is duplicate',
    },
);

# the base alone is legal, so each case fails for its own lines

my $t = Test::Agent->new;

$t->write_file_expand('nginx.conf', <<"EOF");
%%TEST_GLOBALS%%

events {
}

http {
    %%TEST_GLOBALS_HTTP%%

$base
    agent bot {
        provider openai_chat /provider;
        model gpt-4o;
        tools weather;
    }
}
EOF

my ($rc, $out) = $t->test_config;
is($rc, 0, 'the base configuration is legal') or diag($out);

for my $c (@cases) {
    my $t = Test::Agent->new;

    $t->write_file_expand('nginx.conf', <<"EOF");
%%TEST_GLOBALS%%

events {
}

http {
    %%TEST_GLOBALS_HTTP%%

$base
$c->{conf}
}
EOF

    for my $name (keys %{$c->{files} || {}}) {
        $t->write_file_expand($name, $c->{files}{$name});
    }

    my $in = $c->{in} || 'nginx.conf';
    my $line = marked_line($t->read_file($in));
    my $error = $t->expand($c->{error});
    my $where = $t->testdir . "/$in:$line";

    my ($rc, $out) = $t->test_config;

    isnt($rc, 0, "$c->{name}: nginx -t fails");
    like($out, qr/\[emerg\] \Q$error\E in \Q$where\E$/m,
         "$c->{name}: message and line") or diag($out);

    # the refusal itself is the expected [emerg]; nothing else may show
    is(join("\n", grep { !/\[emerg\]/ } $t->log_problems), '',
       "$c->{name}: no sanitizer reports");
}

$t->done;


# the number of the line marked "#!"

sub marked_line {
    my ($text) = @_;

    my @lines = split /\n/, $text;
    for my $i (0 .. $#lines) {
        return $i + 1 if $lines[$i] =~ /#!/;
    }

    die "no line marked #!\n";
}
