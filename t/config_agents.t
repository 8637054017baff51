#!/usr/bin/perl

# A legal configuration with several agents, one per adapter, and tools of
# every legal executor and approval combination, loads and serves.
# agent_describe shows each agent as the module understands it, and the
# tool list it will send to the provider carries each declared schema and
# hosted tool definition byte for byte.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Test::Agent;
use Test::Agent::HTTP;

my $t = Test::Agent->new;

# Schemas with unusual spacing, key order, escapes, raw UTF-8 and numbers
# no JSON library would print back the same way: they must reach the
# provider exactly as written.

my $weather = <<'EOF';
{ "type" : "object",
            "required": [ "city" ],
            "properties": {
                "units": {"enum": ["c", "f"], "default": "c"},
                "city": {"type": "string", "description": "Ville, Montr\u00e9al or Zürich"},
                "days": {"type":"integer", "minimum":1, "maximum": 1.50E+1, "x": 12345678901234567890}
            }
        }
EOF
chomp $weather;

my $email = '{ "properties" :{"to":{"type":"string","format":"email"},'
    . ' "subject" : {"type":"string"},"body":{"type":"string"}},'
    . '"required":["to","subject","body"],"type":"object",'
    . '"additionalProperties":false}';

my $ask = '{"type":"object","properties":{"question":{"type":"string"}}}';
my $pick = '{"type":"object","properties":{"accept":{"type":"string"}},'
    . '"required":[]}';
my $build = '{"type":"object","properties":{"target":{"type":"string"}}}';

my $ws_anthropic = '{ "type": "web_search_20250305", "name": "web_search",'
    . ' "max_uses": 3 }';
my $ws_responses = '{"type" : "web_search"}';
my $code = '{"type":"code_interpreter","container":{"type":"auto"}}';

my $no_params = '{"type":"object","properties":{}}';

# UTF-8 bytes of an em dash
my $system = "You research carefully.\n"
    . "Cite sources \x{e2}\x{80}\x{94} always.\n";

$t->write_file('schemas/send_email.json', "\n  $email  \n");
$t->write_file('prompts/research.txt', $system);

$t->write_file_expand('nginx.conf', <<"EOF");
%%TEST_GLOBALS%%

events {
}

http {
    %%TEST_GLOBALS_HTTP%%

    # agents may come before the tools they name

    agent research {
        provider anthropic_messages /internal/anthropic;
        model claude-sonnet-4-5;
        system_file prompts/research.txt;
        tools web_search weather;
        tools ask_user;
        max_model_calls 4;
        context_budget 50000;
        summary_model claude-haiku-4-5;
        suspend_timeout 2m;
        retry attempts=5 base=250ms cap=2s;
    }

    agent_tool weather {
        description "Current weather for a city";
        parameters '$weather';
        location /tools/weather;
        retention turns=3;
    }

    agent_tool send_email {
        description "Send an email";
        parameters_file schemas/send_email.json;
        executor server;
        approval requires_approval;
        location /tools/email;
        timeout 1h;
    }

    agent_tool ask_user {
        description 'Ask the user "in words"';
        parameters '$ask';
        executor human;
        approval auto;
        timeout 10m;
        retention never_evict;
    }

    agent_tool geolocate {
        executor client;
    }

    agent_tool pick_file {
        description "Pick a file";
        parameters '$pick';
        executor client;
        approval requires_approval;
        streaming off;
        retention count=2 turns=5;
    }

    agent_tool build_log {
        description "Build and stream the log";
        parameters '$build';
        location /tools/build;
        streaming on;
    }

    agent_tool web_search {
        description "Search the web";
        executor provider;
        provider_definition anthropic_messages '$ws_anthropic';
        provider_definition openai_responses '$ws_responses';
    }

    agent_tool code_interpreter {
        executor provider;
        provider_definition openai_responses '$code';
    }

    agent support {
        provider openai_chat /internal/openai;
        model gpt-4o-mini;
        system "You help customers.";
        tools weather send_email ask_user geolocate pick_file build_log;
    }

    agent writer {
        provider openai_responses /internal/responses;
        model gpt-4.1;
        tools send_email web_search code_interpreter pick_file geolocate;
        retry attempts=0;
    }

    agent plain {
        provider openai_chat /internal/openai;
        model llama3;
    }

    server {
        listen 127.0.0.1:%%PORT_8080%%;

        location /support/describe {
            agent support;
            agent_describe;
        }

        location /research/ {
            agent research;

            location /research/describe {
                agent_describe;
            }
        }

        location /writer/describe {
            agent writer;
            agent_describe;
        }

        location /plain/describe {
            agent plain;
            agent_describe;
        }
    }
}
EOF

my ($rc, $out) = $t->test_config;
is($rc, 0, 'nginx -t accepts the agents') or diag($out);

$t->run;

my $port = $t->port(8080);
my $json = JSON::PP->new->utf8;

sub describe {
    my ($uri) = @_;

    my $r = http_get($uri, port => $port);
    is($r->{status}, 200, "GET $uri");
    is($r->{headers}{'content-type'}, 'application/json',
       "$uri content type");

    my $d = eval { $json->decode($r->{body}) };
    ok($d, "$uri is JSON") or diag($r->{body});

    # the raw bytes of the provider tool list: the last member
    my ($raw) = $r->{body} =~ /"provider_tools":(.*)\}\n?\z/s;

    return ($d || {}, $raw // '');
}

sub str { JSON::PP->new->allow_nonref->encode($_[0]) }

sub desc { defined $_[0] ? ',"description":' . str($_[0]) : '' }

sub chat_fn {
    my ($name, $desc, $params) = @_;
    return '{"type":"function","function":{"name":"' . $name . '"'
        . desc($desc) . ',"parameters":' . $params . '}}';
}

sub anthropic_fn {
    my ($name, $desc, $params) = @_;
    return '{"name":"' . $name . '"' . desc($desc)
        . ',"input_schema":' . $params . '}';
}

sub responses_fn {
    my ($name, $desc, $params) = @_;
    return '{"type":"function","name":"' . $name . '"' . desc($desc)
        . ',"parameters":' . $params . '}';
}

sub tools_by_name { return { map { $_->{name} => $_ } @{$_[0]{tools}} } }

my $retention_none = { turns => undef, count => undef,
                       never_evict => JSON::PP::false };

# openai_chat, and every default

my ($d, $raw) = describe('/support/describe');

is($d->{agent}, 'support', 'support: name');
is($d->{version}, '0.9.0', 'the module\'s version');
like($t->read_file('error.log'), qr/\[notice\] .*agent module 0\.9\.0/,
     'the version in the error log at start');
is($d->{provider}, 'openai_chat', 'support: adapter');
is($d->{provider_location}, '/internal/openai', 'support: provider location');
is($d->{model}, 'gpt-4o-mini', 'support: model');
is($d->{system}, 'You help customers.', 'support: inline system prompt');
is($d->{max_model_calls}, 10, 'default max_model_calls');
is($d->{suspend_timeout_ms}, 300000, 'default suspend_timeout');
is_deeply($d->{retry}, { attempts => 3, base_ms => 500, cap_ms => 8000 },
          'default retry');
is($d->{context}{budget}, undef, 'no context budget by default');
is($d->{context}{summary_model}, 'gpt-4o-mini',
   'summary_model: the model by default');
like($d->{context}{summary_prompt}, qr/^Summarize the conversation/,
     'the default summary prompt');

is_deeply([map { $_->{name} } @{$d->{tools}}],
          [qw(weather send_email ask_user geolocate pick_file build_log)],
          'support: tools in declared order');

my $tools = tools_by_name($d);

is_deeply($tools->{weather}, {
    name => 'weather', description => 'Current weather for a city',
    executor => 'server', approval => 'auto',
    streaming => JSON::PP::false, timeout_ms => 300000,
    location => '/tools/weather', pending => [],
    retention => { turns => 3, count => undef,
                   never_evict => JSON::PP::false },
}, 'ungated server tool: never suspends');

is_deeply($tools->{send_email}{pending}, ['approval'],
          'gated server tool: one approval suspension');
is($tools->{send_email}{timeout_ms}, 3600000, 'a tool timeout');
is($tools->{send_email}{location}, '/tools/email', 'server tool location');

is_deeply($tools->{ask_user}, {
    name => 'ask_user', description => 'Ask the user "in words"',
    executor => 'human', approval => 'auto',
    streaming => JSON::PP::false, timeout_ms => 600000,
    pending => ['elicitation'],
    retention => { turns => undef, count => undef,
                   never_evict => JSON::PP::true },
}, 'human tool: elicitation, no location');

is_deeply($tools->{geolocate}, {
    name => 'geolocate', description => undef,
    executor => 'client', approval => 'auto',
    streaming => JSON::PP::false, timeout_ms => 300000,
    pending => ['client_exec'], retention => $retention_none,
}, 'client tool: client_exec, agent suspend_timeout by default');

is_deeply($tools->{pick_file}{pending}, ['approval', 'client_exec'],
          'gated client tool suspends twice: approval, then client_exec');
is_deeply($tools->{pick_file}{retention},
          { turns => 5, count => 2, never_evict => JSON::PP::false },
          'retention by turns and count');

ok($tools->{build_log}{streaming}, 'streaming tool');
is_deeply($tools->{build_log}{pending}, [], 'streaming server tool');

is($raw, '[' . join(',',
    chat_fn('weather', 'Current weather for a city', $weather),
    chat_fn('send_email', 'Send an email', $email),
    chat_fn('ask_user', 'Ask the user "in words"', $ask),
    chat_fn('geolocate', undef, $no_params),
    chat_fn('pick_file', 'Pick a file', $pick),
    chat_fn('build_log', 'Build and stream the log', $build)) . ']',
    'openai_chat tools byte for byte');

like($raw, qr/\Q"parameters":$weather}}\E/,
     'inline multi-line schema verbatim');
like($raw, qr/\Q"parameters":$email}}\E/,
     'schema file verbatim, outer whitespace trimmed');

# anthropic_messages, a system prompt file, a hosted tool, overrides

($d, $raw) = describe('/research/describe');

is($d->{agent}, 'research', 'research: agent inherited by a nested location');
is($d->{provider}, 'anthropic_messages', 'research: adapter');
is($d->{provider_location}, '/internal/anthropic',
   'research: provider location');
is($d->{system}, "You research carefully.\nCite sources \x{2014} always.\n",
   'research: system prompt file verbatim');
is($d->{max_model_calls}, 4, 'max_model_calls');
is($d->{suspend_timeout_ms}, 120000, 'suspend_timeout');
is_deeply($d->{retry}, { attempts => 5, base_ms => 250, cap_ms => 2000 },
          'retry');
is($d->{context}{budget}, 50000, 'context_budget');
is($d->{context}{summary_model}, 'claude-haiku-4-5', 'summary_model');

$tools = tools_by_name($d);

is_deeply([map { $_->{name} } @{$d->{tools}}],
          [qw(web_search weather ask_user)],
          'research: tools from two tools lines');
is_deeply($tools->{web_search}, {
    name => 'web_search', description => 'Search the web',
    executor => 'provider', approval => 'auto',
    streaming => JSON::PP::false, timeout_ms => 120000,
    pending => [], retention => $retention_none,
}, 'provider tool: never suspends');
is($tools->{ask_user}{timeout_ms}, 600000,
   'a tool timeout overrides the agent');

is($raw, '[' . join(',',
    $ws_anthropic,
    anthropic_fn('weather', 'Current weather for a city', $weather),
    anthropic_fn('ask_user', 'Ask the user "in words"', $ask)) . ']',
    'anthropic_messages tools byte for byte, hosted definition verbatim');

# openai_responses

($d, $raw) = describe('/writer/describe');

is($d->{agent}, 'writer', 'writer: name');
is($d->{provider}, 'openai_responses', 'writer: adapter');
is($d->{system}, undef, 'writer: no system prompt');
is_deeply($d->{retry}, { attempts => 0, base_ms => 500, cap_ms => 8000 },
          'retry without retries');

is($raw, '[' . join(',',
    responses_fn('send_email', 'Send an email', $email),
    $ws_responses,
    $code,
    responses_fn('pick_file', 'Pick a file', $pick),
    responses_fn('geolocate', undef, $no_params)) . ']',
    'openai_responses tools byte for byte, hosted definitions verbatim');

# an agent without tools

($d, $raw) = describe('/plain/describe');

is_deeply($d->{tools}, [], 'plain: no tools');
is($raw, '[]', 'plain: empty provider tool list');

# a reload builds the same agents again

my (undef, $before) = describe('/research/describe');

ok($t->reload, 'reload');

($d, $raw) = describe('/research/describe');
is($raw, $before, 'the same tool list after reload');
is($d->{system}, "You research carefully.\nCite sources \x{2014} always.\n",
   'the same system prompt after reload');

# methods

my $r = http_post('/support/describe', '{"x":1}', port => $port,
                  headers => { 'Content-Type' => 'application/json' });
is($r->{status}, 405, 'POST is not allowed');
is($r->{headers}{'content-type'}, 'application/json', '405 is JSON');
is($r->{headers}{allow}, 'GET, HEAD', '405 names the allowed methods');
is(eval { $json->decode($r->{body})->{error}{code} }, 'method_not_allowed',
   '405 error code');

$r = http(http_request('HEAD', '/support/describe', undef), port => $port);
is($r->{status}, 200, 'HEAD');
is($r->{body}, '', 'HEAD has no body');
ok($r->{headers}{'content-length'} > 0, 'HEAD has the length of the GET');

$t->done;
