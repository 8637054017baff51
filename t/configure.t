#!/usr/bin/perl

# configure stops with a clear error naming a missing library and the
# Debian package that provides it.  A missing library is simulated with a
# compiler wrapper that fails any link against it, which is exactly what
# auto/feature sees when the library is not installed.  Without
# --with-threads (nginx.org's default) it stops naming the option.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempdir);
use Test::More;
use Test::Agent;

my $src = $ENV{TEST_NGINX_SRC} || '/usr/share/nginx/src';
plan(skip_all => "no nginx source at $src") unless -x "$src/configure";

my $root = Test::Agent->root;

sub configure_without {
    my ($lib, $threads) = @_;

    $threads //= '--with-threads';

    my $dir = tempdir('agent-configure-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    system('cp', '-a', "$src/.", "$dir/nginx") == 0 or die "cp failed\n";

    open my $fh, '>', "$dir/cc" or die "$!\n";
    print $fh <<"SH";
#!/bin/sh
for a in "\$@"; do
    [ "\$a" = "-l$lib" ] && { echo "ld: cannot find -l$lib" >&2; exit 1; }
done
exec cc "\$@"
SH
    close $fh;
    chmod 0755, "$dir/cc";

    my $out = `cd $dir/nginx && ./configure --with-cc=$dir/cc \\
        --without-http_rewrite_module --without-http_gzip_module \\
        --with-compat $threads --add-dynamic-module=$root 2>&1`;

    return ($? >> 8, $out);
}

my ($rc, $out) = configure_without('yajl');
isnt($rc, 0, 'configure fails without yajl');
like($out, qr/checking for yajl library \.\.\. not found/,
     'yajl check reported');
like($out, qr/ngx_http_agent_module requires the yajl library/,
     'error names yajl');
like($out, qr/apt-get install libyajl-dev/, 'error names the package');

($rc, $out) = configure_without('sqlite3');
isnt($rc, 0, 'configure fails without sqlite3');
like($out, qr/checking for yajl library \.\.\. found/, 'yajl found');
like($out, qr/ngx_http_agent_module requires the sqlite3 library/,
     'error names sqlite3');
like($out, qr/apt-get install libsqlite3-dev/, 'error names the package');

($rc, $out) = configure_without('none', '');
isnt($rc, 0, 'configure fails without thread pools');
like($out, qr/ngx_http_agent_module requires thread pools/,
     'error says what is missing');
like($out, qr/configure nginx with --with-threads/, 'error names the option');

($rc, $out) = configure_without('none');
is($rc, 0, 'configure succeeds with both libraries')
    or diag($out);

done_testing();
