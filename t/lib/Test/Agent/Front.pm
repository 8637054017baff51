package Test::Agent::Front;

# The front tier of several nginx nodes that share a PostgreSQL store:
# an nginx that routes by conversation, the http block's content.
# t/scaleout.t's and bench/cluster.pl's (Test::Agent::Cluster) and
# bin/cluster's.
#
#   Test::Agent::Front::http(port => 8080, prefix => '/chat/',
#                            nodes => ['127.0.0.1:8091', ...],
#                            log => 'front/access.log',
#                            read_timeout => '3s');
#
# The conversation is the path's segment after prefix; a request for it
# goes to the node its consistent hash picks; a 421 from a node is
# followed to the node X-Agent-Owner names (the request's body goes
# again); a node that refuses the connection or does not answer within
# read_timeout (3s) is passed over for the next; event streams are not
# buffered; anything else (a page, a status) goes to any node.  The
# access log names the nodes each request went to, and their answers
# ("421 : 202": the retry at the owner).

use strict;
use warnings;

sub http {
    my (%o) = @_;

    my $servers = join '', map { "        server $_ max_fails=1"
                                 . " fail_timeout=2s;\n" } @{$o{nodes}};
    my $timeout = $o{read_timeout} // '3s';
    my $p = $o{prefix};

    return <<"EOF";
    # the conversation of ${p}ID/...: the key the nodes are chosen by
    map \$uri \$conversation {
        ~^$p([^/]+) \$1;
        default "";
    }

    log_format agents_front '\$remote_addr [\$time_local] "\$request"'
                            ' \$status "\$upstream_addr" "\$upstream_status"';

    upstream agents {
        hash \$conversation consistent;
$servers    }

    server {
        listen 127.0.0.1:$o{port};

        access_log $o{log} agents_front;

        # the error page of a 421 may meet an error of its own
        recursive_error_pages on;

        # event streams: unbuffered; a node's heartbeat comments keep an
        # idle stream under proxy_read_timeout, a paused node does not
        location ~ ^$p\[^/]+/events\$ {
            proxy_pass http://agents;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_connect_timeout 1s;
            proxy_read_timeout $timeout;
            proxy_next_upstream error timeout;
            proxy_intercept_errors on;
            error_page 421 = \@owner;
        }

        # the rest: a message carries its source_id, and sent again to
        # another node it is taken once, so a POST may go on to the next
        # node too
        location / {
            proxy_pass http://agents;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_connect_timeout 1s;
            proxy_read_timeout $timeout;
            proxy_next_upstream error timeout non_idempotent;
            proxy_intercept_errors on;
            error_page 421 = \@owner;
        }

        # the node that owns the conversation, as the 421 named it
        location \@owner {
            set \$owner \$upstream_http_x_agent_owner;

            # a node that found it had lost the conversation names none:
            # the client asks again, and the node its hash picks then
            # knows the owner
            if (\$owner = "") {
                return 503;
            }

            proxy_pass http://\$owner;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_connect_timeout 1s;
            proxy_read_timeout $timeout;
            error_page 502 503 504 = \@unreachable;
        }

        # an owner that does not answer: dead or paused, its heartbeat
        # not yet older than its ttl; the conversation is taken over
        # after that, and the client asks again (or none was named)
        location \@unreachable {
            default_type application/json;
            add_header Retry-After 1 always;
            return 503 '{"error":{"code":"owner_unreachable","message":"the node that owns the conversation does not answer; another takes it over once the heartbeat of the owner is older than its ttl"}}';
        }
    }
EOF
}

1;
