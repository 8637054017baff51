#!/usr/bin/perl

# The installed Debian package, as .ci/package runs it after
# `apt-get install ./libnginx-mod-http-agent_*.deb`: Debian's nginx loads
# the module through the package's snippet in /etc/nginx/modules-enabled
# (no load_module line of the test's own), takes a configuration that
# uses it, runs a turn through the mock provider with the SQLite store,
# and serves the package's browser client and demo page.
#
# Skipped unless TEST_AGENT_PACKAGE is set: `make test` runs against the
# module in build/, not against an installed package.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../lib";

use Test::More;

BEGIN {
    plan skip_all => 'the installed package is tested by .ci/package'
        unless $ENV{TEST_AGENT_PACKAGE};
}

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

my $ENABLED = '/etc/nginx/modules-enabled';
my $SO = '/usr/lib/nginx/modules/ngx_http_agent_module.so';
my $SHARE = '/usr/share/libnginx-mod-http-agent';

# the harness's configuration, loading the module as Debian's nginx.conf
# does; the snippet's path is relative to the prefix, as under
# /usr/share/nginx, whose modules/ links to /usr/lib/nginx/modules

{
    package Test::Agent::Installed;

    use parent -norequire, 'Test::Agent';

    sub module { $SO }

    sub globals {
        my ($self) = @_;
        my $g = $self->SUPER::globals;
        $g =~ s{^load_module [^\n]*\n}{include $ENABLED/*.conf;\n}m
            or die "no load_module line in the harness's globals\n";
        return $g;
    }
}

ok(-l "$ENABLED/50-mod-http-agent.conf", 'the package enabled its snippet');
is(readlink("$ENABLED/50-mod-http-agent.conf"),
   '/usr/share/nginx/modules-available/mod-http-agent.conf',
   'the link names the snippet in modules-available');
ok(-f $SO, 'the module is in /usr/lib/nginx/modules');

my $t = Test::Agent::Installed->new;
my $mock = Test::Agent::MockProvider->new;
my $dir = $t->testdir;

symlink('/usr/lib/nginx/modules', "$dir/modules")
    or die "symlink: $!\n";

$t->write_file_expand('nginx.conf', engine_conf($mock,
    http => "agent_store $dir/agent.db;",
    server => <<"CONF"));
        location / {
            root $SHARE/client;
            index index.html;
        }
CONF

unlike($t->read_file('nginx.conf'), qr/load_module/,
       'no load_module in the configuration');

my ($rc, $out) = $t->test_config;
is($rc, 0, 'nginx -t accepts a configuration that uses the module')
    or diag($out);

$t->run;

my ($worker) = $t->wait_workers(1);
open my $maps, '<', "/proc/$worker/maps" or die "maps: $!\n";
my $mapped = grep { m{ \Q$SO\E$} } <$maps>;
close $maps;
ok($mapped, 'the worker runs the installed module');

$mock->script({ text => 'Installed and running.', chunks => 3 });

my $r = send_message($t, 'p1', 'hello');
is($r->{status}, 202, 'message accepted');

my $c = wait_state($t, 'p1', 'idle');
is(log_types($c), 'user_msg assistant_msg turn_completed', 'a turn ran');
is($c->{messages}[1]{content}, 'Installed and running.',
   'the provider\'s reply is logged');
ok(-s "$dir/agent.db", 'the store wrote SQLite');

$r = http_get('/', port => $t->port(8080));
is($r->{status}, 200, 'the demo page is served from the package');
like($r->{body}, qr/<title>[^<]*agent/, 'the demo page');

for my $file (qw(agent.js demo.js demo.css)) {
    is(http_get("/$file", port => $t->port(8080))->{status}, 200,
       "$file is served from the package");
}

$t->done;
