#!/usr/bin/perl

# nginx.conf.example, which `./run demo` uses, loads and serves.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Test::Agent;
use Test::Agent::HTTP;

my $t = Test::Agent->new;

open my $fh, '<', Test::Agent->root . '/nginx.conf.example' or die "$!\n";
my $conf = do { local $/; <$fh> };
close $fh;

# the module the suite tests, this test's ports, and nginx in the
# foreground under the harness

ok($conf =~ s/^load_module .*$/%%TEST_GLOBALS%%/m, 'example loads the module');
$conf =~ s/^(pid|error_log) .*$//mg;
$conf =~ s/127\.0\.0\.1:8080/127.0.0.1:%%PORT_8080%%/g;
mkdir $t->testdir . $_ for '/demo', '/demo/tmp', '/demo/logs';
$t->write_file_expand('demo/provider.conf',
    "proxy_pass http://127.0.0.1:%%PORT_8081%%/v1/responses;\n");

$t->write_file_expand('nginx.conf', $conf);

# the demo page is served from the checkout's client/
symlink(Test::Agent->root . '/client', $t->testdir . '/client')
    or die "symlink: $!\n";

my ($rc, $out) = $t->test_config;
is($rc, 0, 'nginx -t accepts the example') or diag($out);

$t->run;

my $r = http_get('/assistant/describe', port => $t->port(8080));
is($r->{status}, 200, 'describe answers');

my $d = decode_json($r->{body});
is($d->{agent}, 'assistant', 'the example agent');
is($d->{provider}, 'openai_responses', 'its provider');
is_deeply([map { $_->{name} } @{$d->{tools}}],
          [qw(get_time send_note search_docs ask_user browser_timezone
              web_search)],
          'its tools');

$r = http_get('/', port => $t->port(8080));
is($r->{status}, 200, 'the demo page');
like($r->{body}, qr{<script type="module" src="demo.js">}, 'a module');

$r = http_get('/agent.js', port => $t->port(8080));
like($r->{headers}{'content-type'}, qr{^text/javascript},
     'the client library as JavaScript, which a module must be');

$r = http_get('/agents/zone', port => $t->port(8080));
is(decode_json($r->{body})->{zone}, 'agents', 'zone status');
ok(-s $t->testdir . '/demo/agent.db', 'the store is created');

$t->done;
