#!/usr/bin/perl

# With agent_store and agent_busy queue, a queued message is answered
# 202 only once the store holds it.  Its queue id names it in the store
# until its user_msg is written, and is never given again in its
# conversation, however the conversation left the zone and came back:
#
# - after a full restart, a message queued behind a turn is written
#   (not taken for the earlier message its id would have repeated), and
#   survives a SIGKILL of the whole server before its turn;
# - after an idle eviction, likewise, and survives nginx -s stop;
# - a store whose count of queue ids was set back (edited by hand) does
#   not make the enqueue claim what it did not write: 503 not_durable,
#   and the error log says why.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::HTTP;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => 'no sqlite3 command') unless Test::Agent::Store->available;

my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'default reply' };
});

my $t = Test::Agent->new;
my $db = Test::Agent::Store->for_test($t);
my $path = $db->directive;

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store $path; agent_busy queue; agent_evict_idle 1s;",
    server => <<'EOF'));
        location = /zone {
            agent_zone_status;
        }
EOF
$t->run;

sub zone_count {
    my $r = http_get('/zone', port => $t->port(8080));
    return eval { decode_json($r->{body})->{conversations} } // -1;
}

sub types {
    my ($cid) = @_;
    return join ' ', split /\n/, $db->sql("SELECT type FROM events"
                                          . " WHERE conversation = '$cid'"
                                          . " ORDER BY seq");
}

sub user_msgs {
    my ($cid, $content) = @_;
    return $db->sql("SELECT count(*) FROM events WHERE conversation ="
                    . " '$cid' AND type = 'user_msg' AND"
                    . " data LIKE '%:_${content}_%'");
}

# a turn held in its model call, and a message queued behind it

sub queue_behind {
    my ($cid, $first, $second) = @_;

    $mock->reset;
    $mock->script({ text => "reply to $first", chunks => 2,
                    pause_after => 1 });

    is(send_message($t, $cid, $first)->{status}, 202, "$cid: '$first'");
    ok($mock->wait_paused(0, 10), "$cid: its turn streams");

    my $r = send_message($t, $cid, $second);
    is($r->{status}, 202, "$cid: '$second' acknowledged");
    ok($r->{json}{queued}, "$cid: said queued");

    return $r;
}

# a first queued message runs: its user_msg carries queue id 1

sub first_queued {
    my ($cid) = @_;

    queue_behind($cid, 'one', 'two');
    $mock->release;

    is($db->wait_sql("SELECT count(*) FROM events WHERE conversation ="
                     . " '$cid' AND type = 'turn_completed'", qr/^2$/, 10),
       2, "$cid: both turns ran");
    like($db->sql("SELECT data FROM events WHERE conversation = '$cid'"
                  . " AND type = 'user_msg' AND seq > 1"),
         qr/"queue_id":1\b/, "$cid: the queued one named by queue id 1");
}

# the message queued after the conversation came back, in the store

sub queued_again {
    my ($cid) = @_;

    queue_behind($cid, 'three', 'four');

    like($db->sql("SELECT data FROM queued WHERE conversation = '$cid'"),
         qr/"content":"four"/,
         "$cid: the acknowledged message is in the store");
    is(user_msgs($cid, 'four'), 0, "$cid: and has not run yet");
}

# after its turn, the queued message runs once

sub ran_once {
    my ($cid) = @_;

    is($db->wait_sql("SELECT count(*) FROM events WHERE conversation ="
                     . " '$cid' AND type = 'user_msg' AND"
                     . " json_extract(data, '\$.content') = 'four'",
                     qr/^1$/, 15),
       1, "$cid: the queued message ran once nginx was back");
    like($db->wait_sql("SELECT type FROM events WHERE conversation ="
                       . " '$cid' ORDER BY seq DESC LIMIT 1",
                       qr/turn_completed/, 10),
         qr/^turn_completed$/, "$cid: its turn completed");
    is($db->sql("SELECT count(*) FROM queued WHERE conversation = '$cid'"),
       0, "$cid: no longer queued");
    is(user_msgs($cid, 'three'), 1, "$cid: the cut-off message, once");
}

# after a full restart; then the whole server is killed before the
# queued message's turn

first_queued('r1');

$t->stop;
$t->run;

queued_again('r1');

$t->crash;
$mock->release;

$t->run;

ran_once('r1');

# after an idle eviction; then nginx -s stop before its turn

first_queued('e1');

my $n = -1;
for (1 .. 100) {
    $n = zone_count();
    last if $n == 0;
    sleep 0.1;
}
is($n, 0, 'e1: evicted at rest');

queued_again('e1');

$t->stop('TERM');
delete $t->{unclean};
$mock->release;

$t->run;

ran_once('e1');

# a count of queue ids set back in the store: the id given again is
# one a user_msg of e1 carries, and the enqueue says it did not write

$t->stop;
$db->sql("UPDATE conversations SET queue_id = 0 WHERE id = 'e1'");
$t->run;

$mock->reset;
$mock->script({ text => 'five', chunks => 2, pause_after => 1 });

is(send_message($t, 'e1', 'five')->{status}, 202, 'e1: revived, a turn');
ok($mock->wait_paused(0, 10), 'e1: it streams');

my $r = send_message($t, 'e1', 'six');
is($r->{status}, 503, 'e1: a queued message not written: 503');
is($r->{json}{error}{code}, 'not_durable', 'error code not_durable');
like($t->read_file('error.log'),
     qr/queue id 1 of "e1" is taken by another message/,
     'the error log says why');

$mock->release;
wait_state($t, 'e1', 'idle');

$mock->stop;
$t->allow_alert(qr/lost its worker|exited on signal|cut off/);
$t->done;
