#!/usr/bin/perl

# The audit of model calls: with agent_store every model call is a row of
# model_calls (conversation, call, turn, attempt, adapter, model, status,
# error, tokens, time to first token, duration, start), numbered in its
# conversation without a gap or a repeat across a worker killed mid-call
# and a restart; agent_inspect pages through them (?view=model_calls).
# Rows go in the log writer's batches: those that cannot be written are
# undone, and a batch that fails gives its rows back for the next.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use JSON::PP;

use Test::Agent;
use Test::Agent::HTTP;
use Test::Agent::Engine;
use Test::Agent::MockProvider;
use Test::Agent::Store;

plan(skip_all => Test::Agent::Store->missing) if Test::Agent::Store->missing;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new;

my $store = Test::Agent::Store->for_test($t);
my $db = $store->directive;

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    http => "agent_store $db;",
    server => 'location ~ ^/o/(?<ocid>[^/]+)$ {
            agent chat;
            agent_owner $http_x_user;
            agent_conversation $ocid;
            agent_inspect;
        }
        location = /metrics { agent_metrics; }'));
$t->run;

sub sql { $store->sql(@_) }
sub wait_sql { $store->wait_sql(@_) }

my $rows = "SELECT call, turn, attempt, status FROM model_calls"
           . " WHERE conversation = 'a1' ORDER BY call";

# a reply; then a 500 retried before a reply

$mock->script({ text => 'one' });
send_message($t, 'a1', 'first');
wait_state($t, 'a1', 'idle');

$mock->script({ status => 500 }, { text => 'two',
    usage => { prompt_tokens => 30, completion_tokens => 4,
               cached_tokens => 20 } });
send_message($t, 'a1', 'second');
wait_state($t, 'a1', 'idle');

# a call's row is done once its end is written
sub ended { my ($n) = @_; qr/^$n\|\d+\|\d+\|(?!running)\w+$/m }

is(wait_sql($rows, ended(3)), "1|1|1|ok\n2|2|1|retry\n3|2|2|ok",
   'a row per call: the retry is an attempt of its own');

like(sql("SELECT error FROM model_calls WHERE conversation = 'a1'"
         . " AND call = 2"), qr/"status":500/, 'the retry says why');
is(sql("SELECT adapter, model, input_tokens, output_tokens, cached_tokens"
       . " FROM model_calls WHERE conversation = 'a1' AND call = 3"),
   'openai_chat|gpt-test|30|4|20', 'the adapter, the model, the usage');
is(sql("SELECT count(*) FROM model_calls WHERE conversation = 'a1'"
       . " AND status = 'ok' AND time_to_first_token_ms >= 0"
       . " AND duration_ms >= time_to_first_token_ms"
       . " AND started > 1700000000000 AND error IS NULL"),
   2, 'the calls that came through: times and start');

# a worker killed mid-call: the call is lost, the next one numbered on

$mock->reset;
$mock->script({ text => 'cut off', chunks => 4, pause_after => 2 },
              { text => 'three' });
send_message($t, 'a1', 'third');
ok($mock->wait_paused(0), 'streaming');
is(wait_sql($rows, qr/\|running$/), "1|1|1|ok\n2|2|1|retry\n3|2|2|ok\n"
   . "4|3|1|running", 'the call in flight is recorded as running');

my $lease = inspect($t, 'a1')->{json}{lease};
ok($lease, 'a worker runs it');
$t->kill_worker($lease);
is(wait_state($t, 'a1', 'idle', 10)->{messages}[-2]{content}, 'three',
   'the turn was taken over');

is(wait_sql($rows, qr/5\|3\|1\|ok$/), "1|1|1|ok\n2|2|1|retry\n3|2|2|ok\n"
   . "4|3|1|lost\n5|3|1|ok", 'the killed call lost, the next one numbered on');
is(sql("SELECT worker FROM model_calls WHERE conversation = 'a1'"
       . " AND call = 4"), $lease, 'the lost call was the killed worker\'s');
isnt(sql("SELECT worker FROM model_calls WHERE conversation = 'a1'"
         . " AND call = 5"), $lease, 'the next one another\'s');

# the metrics agree: the lost call ended nowhere, so it is not counted


is(metric($t, 'agent_model_calls_total'), 4, 'four model calls ended');
is(metric($t, 'agent_takeovers_total'), 1, 'one take-over');

# a restart: numbering goes on from the store

$t->stop;
$mock->reset;
$mock->script({ text => 'four' }, { text => 'other' });
$t->run;

send_message($t, 'a1', 'after the restart');
wait_state($t, 'a1', 'idle');
send_message($t, 'b1', 'another conversation');
wait_state($t, 'b1', 'idle');

is(wait_sql($rows, ended(6)), "1|1|1|ok\n2|2|1|retry\n3|2|2|ok\n"
   . "4|3|1|lost\n5|3|1|ok\n6|4|1|ok", 'after a restart: 6, no gap');
is(wait_sql("SELECT call, status FROM model_calls WHERE conversation = 'b1'",
            qr/ok/), '1|ok', 'another conversation numbers its own');

# the store's series, for this nginx: every event since the start
# written once, in batches, nothing left behind

my $events = sql("SELECT count(*) FROM events WHERE conversation = 'b1'"
                 . " OR (conversation = 'a1'"
                 . " AND CAST(json_extract(data, '\$.turn') AS INTEGER)"
                 . " = 4)");
is($events, 6, 'six events since the start');
is(metric($t, 'agent_store_batch_events_sum'), $events,
   'the batches wrote them, once');
cmp_ok(metric($t, 'agent_store_batch_events_count'), '>=', 2,
       'in a batch or more each');
is(metric($t, 'agent_store_lag_events'), 0, 'nothing left to write');
is(metric($t, 'agent_store_errors_total'), 0, 'no error');

# inspect pages through them

sub page {
    my ($cid, $args, %h) = @_;
    my $r = http_get("/c/$cid?view=model_calls$args", port => $t->port(8080),
                     headers => \%h);
    $r->{json} = eval { decode_json($r->{body}) };
    return $r;
}

my $p = page('a1', '&limit=2');
is($p->{status}, 200, 'a page');
is(join(' ', map { $_->{call} } @{$p->{json}{model_calls}}), '1 2',
   'the first two');
is($p->{json}{next_after}, 2, 'and where the next starts');
is($p->{json}{model_calls}[1]{status}, 'retry', 'each row as stored');
is($p->{json}{model_calls}[1]{error}{status}, 500,
   'the error as the JSON object it is');

$p = page('a1', '&after=2&limit=2');
is(join(' ', map { "$_->{call}:$_->{status}" } @{$p->{json}{model_calls}}),
   '3:ok 4:lost', 'the next two');
is($p->{json}{model_calls}[0]{cached_tokens}, 20, 'with their usage');

$p = page('a1', '&after=4');
is(join(' ', map { $_->{call} } @{$p->{json}{model_calls}}), '5 6',
   'the rest, by default up to 100');
ok(!exists $p->{json}{next_after}, 'and no more');
is($p->{json}{model_calls}[1]{turn}, 4, 'the turn after the restart');

$p = page('a1', '&after=6');
is_deeply($p->{json}{model_calls}, [], 'past the end: none');

is(page('nobody', '')->{status}, 404, 'an unknown conversation: 404');
is(page('a1', '&limit=0')->{status}, 400, 'limit 0: 400');
my $bad = http_get('/c/a1?view=other', port => $t->port(8080));
is($bad->{status}, 400, 'another view: 400');

# the owner's alone: a conversation made for no one is no one's to read
# where an owner is asked for

my $o = http_get('/o/a1?view=model_calls', port => $t->port(8080),
                 headers => { 'X-User' => 'mallory' });
is($o->{status}, 404, 'another owner: 404, as unknown');

# a row that comes after a later call's (another worker wrote that one
# first): it takes its place by start time, and the later one moves up

sql("INSERT INTO model_calls (conversation, call, started, worker, turn,"
    . " attempt, adapter, model, status) VALUES ('late', 1,"
    . " 4102444800000, 1, 9, 1, 'openai_chat', 'gpt-test', 'ok')");

$mock->script({ text => 'before it' });
send_message($t, 'late', 'an earlier call');
wait_state($t, 'late', 'idle');

is(wait_sql("SELECT call, turn, status FROM model_calls"
            . " WHERE conversation = 'late' ORDER BY call", qr/^1\|1\|ok$/m),
   "1|1|ok\n2|9|ok", 'an earlier call goes before a later one written first');

# rows go in the log writer's transaction, under a savepoint: rows that
# cannot be written (their table gone) are undone and logged, and the
# batch's events are committed all the same

sql("ALTER TABLE model_calls RENAME TO model_calls_away");

# SQLite's words, or PostgreSQL's
my $gone = 'no such table: model_calls'
           . '|relation "model_calls" does not exist';

$mock->script({ text => 'not audited' });
send_message($t, 'u1', 'no table');
wait_state($t, 'u1', 'idle');

is(wait_sql("SELECT type FROM events WHERE conversation = 'u1'"
            . " ORDER BY seq DESC LIMIT 1", qr/turn_completed/),
   'turn_completed', 'no audit table: the turn is written');
like($t->read_file('error.log'),
     qr/could not write \d+ model call rows: (?:$gone)/,
     'the rows that could not be written are logged');

sql("ALTER TABLE model_calls_away RENAME TO model_calls");

$mock->script({ text => 'audited again' });
send_message($t, 'u2', 'table back');
wait_state($t, 'u2', 'idle');

is(wait_sql("SELECT status FROM model_calls WHERE conversation = 'u2'",
            qr/^ok$/), 'ok', 'the table back: rows are written again');

# a batch that cannot be written at all (another process holds the
# database) gives its rows back, with its events: the call's end is
# written once the lock goes, not lost

my $index = scalar @{$mock->requests};
$mock->script({ text => 'written late', pause_after => 1 });
is(send_message($t, 'k1', 'behind a lock')->{status}, 202,
   'a message acknowledged');
ok($mock->wait_paused($index, 5), 'its reply is paused');
ok($store->lock, 'the database is locked by another process');
$mock->release($index);
wait_state($t, 'k1', 'idle');

my $failed;
for (1 .. 150) {
    $failed = $t->read_file('error.log')
              =~ /could not write \d+ model call rows, they are tried again/;
    last if $failed;
    select(undef, undef, undef, 0.1);
}
ok($failed, 'the batch with the call\'s end failed');
$store->unlock;

is(wait_sql("SELECT status FROM model_calls WHERE conversation = 'k1'",
            qr/^ok$/, 15), 'ok', 'the call\'s end is written after the lock');
is(wait_sql("SELECT type FROM events WHERE conversation = 'k1'"
            . " ORDER BY seq DESC LIMIT 1", qr/turn_completed/),
   'turn_completed', 'and the turn\'s events');

$mock->stop;
$t->allow_alert(qr/exited on signal 9|lost its worker|taken over/);
$t->done;
