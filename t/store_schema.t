#!/usr/bin/perl

# The store's schema is versioned and migrates itself: a version 1 file
# (the log only) gets the derived tables, filled from its log, when the
# configuration is loaded, and its conversations are served as before; a
# version 2 file (no owners) gets its conversations' owner, empty; a
# version 3 file gets the audit of model calls, empty; a version 4 file
# gets the trigger that knows turn_halted ends a turn; a version 5 file
# gets the trigger that writes a conversation's state only when it
# changes; a version 6 file gets the trigger that tests a turn's end
# without a list; a version 7 file loses its trigger (the writer derives
# the tables: t/store_derived.t); a version 8 file gets the events'
# derived column and the trigger that derives the others' events; a
# version 9 file gets each conversation's count of queue ids, taken
# from its log, and a trigger that keeps it for the others' events.
# Every file migrated has the schema a new file gets.  A file newer
# than the module is refused at nginx -t.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(time);

use Test::Agent;
use Test::Agent::Engine;
use Test::Agent::MockProvider;

plan(skip_all => 'no sqlite3 command') unless `sqlite3 -version 2>&1` =~ /^3/;

my $t = Test::Agent->new;
my $mock = Test::Agent::MockProvider->new(default => sub {
    return { text => 'after the migration' };
});

my $db = $t->testdir . '/agent.db';

# the audit is written after the turn: polled

sub wait_sql {
    my ($q, $want) = @_;
    my $deadline = time + 10;
    my $got;
    while (time < $deadline) {
        $got = sql($q);
        return $got if $got =~ $want;
        select undef, undef, undef, 0.05;
    }
    return $got;
}

sub sql {
    my ($q, $file) = @_;
    $file //= $db;
    my $r = `sqlite3 -cmd '.timeout 5000' -separator '|' '$file' "$q" 2>&1`;
    chomp $r;
    return $r;
}

# the schema as SQLite keeps it (a column added by ALTER TABLE is spelled
# as the statement said: the tables' columns are compared instead)

my $SCHEMA = "SELECT type || ' ' || name || ' ' || CASE type"
    . " WHEN 'table' THEN (SELECT group_concat(name || ' ' || type || ' '"
    . " || [notnull] || ' ' || ifnull(dflt_value, '') || ' ' || pk, ', ')"
    . " FROM pragma_table_info(m.name))"
    . " ELSE replace(replace(sql, char(10), ' '), '  ', ' ') END"
    . " FROM sqlite_master m ORDER BY type, name";

# version 1, as the module wrote it: a finished turn and one that waits

my @events = (
    [ 'a', 1, 'user_msg', '{"type":"user_msg","seq":1,"turn":1,"ts":1,'
        . '"content":"hi"}' ],
    [ 'a', 2, 'assistant_msg', '{"type":"assistant_msg","seq":2,"turn":1,'
        . '"ts":2,"content":"hello","tool_calls":[],"status":"completed"}' ],
    [ 'a', 3, 'turn_completed', '{"type":"turn_completed","seq":3,"turn":1,'
        . '"ts":3}' ],
    [ 'b', 1, 'user_msg', '{"type":"user_msg","seq":1,"turn":1,"ts":1,'
        . '"content":"ask me"}' ],
    [ 'b', 2, 'assistant_msg', '{"type":"assistant_msg","seq":2,"turn":1,'
        . '"ts":2,"content":"","tool_calls":[{"id":"q1","name":"ask_user",'
        . '"arguments":"{}"}],"status":"completed"}' ],
    [ 'b', 3, 'tool_call', '{"type":"tool_call","seq":3,"turn":1,"ts":3,'
        . '"tool_call_id":"q1","name":"ask_user","arguments":"{}",'
        . '"executor":"human"}' ],
    [ 'b', 4, 'suspension', '{"type":"suspension","seq":4,"turn":1,"ts":4,'
        . '"tool_call_id":"q1","name":"ask_user","executor":"human",'
        . '"kind":"elicitation","arguments":{},"deadline":4102444800000}' ],
);

my $v1 = "PRAGMA journal_mode=WAL;"
    . "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    . "INSERT INTO meta VALUES ('schema_version', '1');"
    . "CREATE TABLE conversations (id TEXT PRIMARY KEY, agent TEXT NOT NULL,"
    . " last_seq INTEGER NOT NULL, updated INTEGER NOT NULL);"
    . "CREATE TABLE events (conversation TEXT NOT NULL, seq INTEGER NOT NULL,"
    . " type TEXT NOT NULL, data TEXT NOT NULL,"
    . " PRIMARY KEY (conversation, seq)) WITHOUT ROWID;"
    . "INSERT INTO conversations VALUES ('a', 'chat', 3, 0),"
    . " ('b', 'chat', 4, 0);";

for my $e (@events) {
    (my $data = $e->[3]) =~ s/'/''/g;
    $v1 .= "INSERT INTO events VALUES ('$e->[0]', $e->[1], '$e->[2]',"
        . " '$data');";
}

open my $fh, '|-', "sqlite3 '$db' > /dev/null" or die "sqlite3: $!\n";
print $fh $v1;
close $fh;

is(sql("SELECT value FROM meta"), '1', 'a version 1 file');

my $tools = <<'EOF';
    agent_tool ask_user {
        executor human;
        timeout 1h;
    }
EOF

$t->write_file_expand('nginx.conf', engine_conf($mock, workers => 2,
    tools => $tools, agent => 'tools ask_user;',
    http => "agent_store $db;"));

# the schema of a new file, made by nginx -t

my $conf = $t->read_file('nginx.conf');
(my $other = $conf) =~ s/\Q$db\E/$db.new/;
$t->write_file('nginx.conf', $other);
$t->test_config;
$t->write_file('nginx.conf', $conf);

my $fresh = sql($SCHEMA, "$db.new");
like($fresh, qr/^table events conversation /m, 'a new file\'s schema');
like($fresh, qr/^trigger events_derive .* WHEN new\.derived = 0 BEGIN/m,
     'with the trigger for the events of other writers');

$t->run;

is(sql("SELECT value FROM meta"), '11', 'migrated to version 11');
is(sql($SCHEMA), $fresh, 'version 1: the schema a new file gets');
is(sql("SELECT count(*) FROM events"), scalar @events, 'the log kept');
is(sql("SELECT id, name, executor, kind, status, deadline FROM tool_calls"),
   'q1|ask_user|human|elicitation|suspended|4102444800000',
   'tool calls derived from the log');
is(sql("SELECT id, state FROM conversations ORDER BY id"),
   "a|idle\nb|awaiting_input", 'states derived from the log');
is(sql("SELECT count(*) FROM conversations WHERE owner = ''"), 2,
   'owned by no one');
like($t->read_file('error.log'), qr/migrating the schema from version 1/,
     'migration logged');

my $c = inspect($t, 'a')->{json};
is(log_types($c), 'user_msg assistant_msg turn_completed',
   'a migrated conversation is served');

is(send_message($t, 'a', 'again')->{status}, 202, 'and goes on');
$c = wait_state($t, 'a', 'idle');
is($c->{messages}[-2]{content}, 'after the migration', 'a new turn');
is(wait_sql("SELECT max(seq) FROM events WHERE conversation = 'a'",
            qr/^6$/), 6, 'written after the old log');
is(wait_sql("SELECT call, turn, attempt, status FROM model_calls"
            . " WHERE conversation = 'a'", qr/\|ok$/), '1|2|1|ok',
   'its model call audited, the first of the conversation');

$c = inspect($t, 'b')->{json};
is($c->{state}, 'awaiting_input', 'the waiting call is back');
is($c->{pending}[0]{deadline}, 4102444800000, 'with its deadline');
is(resolve($t, 'b', 'q1', { result => 'fine' })->{status}, 200,
   'and resolvable');
is(wait_state($t, 'b', 'idle')->{messages}[-1]{type}, 'turn_completed',
   'its turn finished');
is(wait_sql("SELECT status, ok FROM tool_calls WHERE id = 'q1'", qr/^done/),
   'done|1', 'the derived row follows');

$t->done(more => 1);

# a file of an older version, as the module wrote it ($sql takes the
# current one back there), is taken by nginx -t and migrated

sub migrated {
    my ($from, $sql) = @_;

    # no version before 9 had the events' derived column, nor before 10
    # the conversations' count of queue ids, nor before 11 their count of
    # take-overs; every one from 2 to 7 had a trigger deriving the tables
    sql("DROP TRIGGER IF EXISTS events_derive;"
        . "ALTER TABLE events DROP COLUMN derived;"
        . "ALTER TABLE conversations DROP COLUMN queue_id;"
        . "ALTER TABLE conversations DROP COLUMN takeovers;"
        . "ALTER TABLE conversations DROP COLUMN takeover_seq;"
        . "CREATE TRIGGER events_derive AFTER INSERT ON events"
        . " BEGIN SELECT 1; END;" . $sql
        . "UPDATE meta SET value = '$from' WHERE key = 'schema_version'");

    my ($rc, $out) = $t->test_config;
    is($rc, 0, "a version $from file is taken") or diag($out);
    is(sql("SELECT value FROM meta"), '11', 'migrated to version 11');
    like($t->read_file('error.log'),
         qr/migrating the schema from version $from to 11/,
         'migration logged');
    is(sql($SCHEMA), $fresh, "version $from: the schema a new file gets");
}

# version 2, as the module wrote it: conversations without an owner

migrated(2, "ALTER TABLE conversations DROP COLUMN owner;"
    . " DROP TABLE model_calls;");
is(sql("SELECT id, owner, state FROM conversations ORDER BY id"),
   "a||idle\nb||idle", 'the conversations kept, owned by no one');

# version 3, as the module wrote it: no audit of model calls

my $nevents = sql("SELECT count(*) FROM events");

migrated(3, "DROP TABLE model_calls;");
is(sql("SELECT count(*) FROM model_calls"), 0, 'with an empty audit');
is(sql("SELECT count(*) FROM events"), $nevents, 'the log kept');

# versions 4 to 7, as the module wrote them: each its trigger (its state
# part here: version 4's did not know turn_halted and took a summary for
# a turn running, version 5's wrote the conversation's row for every
# event, version 6's tested a turn's end against a list, version 7's
# derived the tables the writer now derives)

my $ends6 = "new.type IN ('turn_completed', 'turn_failed', 'cancelled',"
    . " 'turn_halted')";
my $ends7 = "new.type = 'turn_completed' OR new.type = 'turn_failed'"
    . " OR new.type = 'cancelled' OR new.type = 'turn_halted'";

for my $v ([ 4, "CASE WHEN new.type IN ('turn_completed', 'turn_failed',"
                . " 'cancelled') THEN 'idle' ELSE 'running' END"
                . " WHERE id = new.conversation" ],
           [ 5, "CASE WHEN $ends6 THEN 'idle' ELSE 'running' END"
                . " WHERE id = new.conversation AND new.type <> 'summary'" ],
           [ 6, "CASE WHEN $ends6 THEN 'idle' ELSE 'running' END"
                . " WHERE id = new.conversation AND new.type <> 'summary'"
                . " AND state <> CASE WHEN $ends6 THEN 'idle'"
                . " ELSE 'running' END" ],
           [ 7, "CASE WHEN $ends7 THEN 'idle' ELSE 'running' END"
                . " WHERE id = new.conversation AND new.type <> 'summary'"
                . " AND state <> CASE WHEN $ends7 THEN 'idle'"
                . " ELSE 'running' END" ])
{
    my ($from, $state) = @$v;

    migrated($from, "DROP TRIGGER IF EXISTS events_derive;"
        . "CREATE TRIGGER events_derive AFTER INSERT ON events BEGIN"
        . "  UPDATE conversations SET state = $state;"
        . "END;");

    like(sql("SELECT sql FROM sqlite_master WHERE name = 'events_derive'"),
         qr/WHEN new\.derived = 0/, "version $from: the trigger for others");
}

# version 8, as the module wrote it: no trigger, no derived column

migrated(8, "DROP TRIGGER events_derive;");

is(sql("SELECT count(*) FROM events"), $nevents, 'the log kept');

# version 9, as the module wrote it: no count of queue ids, and a
# trigger for the others' events that kept none; a queued message of b
# had queue id 3 (its user_msg is written as the writer writes it)

sql("DROP TRIGGER events_derive;"
    . "ALTER TABLE conversations DROP COLUMN queue_id;"
    . "ALTER TABLE conversations DROP COLUMN takeovers;"
    . "ALTER TABLE conversations DROP COLUMN takeover_seq;"
    . "CREATE TRIGGER events_derive AFTER INSERT ON events"
    . " WHEN new.derived = 0 BEGIN SELECT 1; END;"
    . "INSERT INTO events VALUES ('b', 9, 'user_msg',"
    . ' \'{\"type\":\"user_msg\",\"seq\":9,\"turn\":2,\"ts\":9,'
    . '\"content\":\"later\",\"queue_id\":3}\', 1);'
    . "UPDATE meta SET value = '9' WHERE key = 'schema_version'");

my ($rc, $out) = $t->test_config;
is($rc, 0, 'a version 9 file is taken') or diag($out);
is(sql("SELECT value FROM meta"), '11', 'migrated to version 11');
is(sql($SCHEMA), $fresh, 'version 9: the schema a new file gets');
is(sql("SELECT id, queue_id FROM conversations ORDER BY id"), "a|0\nb|3",
   'the count of queue ids taken from the log');

# the trigger keeps it for a writer that derives nothing

sql("INSERT INTO events VALUES ('b', 10, 'user_msg',"
    . ' \'{\"type\":\"user_msg\",\"seq\":10,\"turn\":3,\"ts\":10,'
    . '\"content\":\"more\",\"queue_id\":4}\', 0)');
is(sql("SELECT queue_id FROM conversations WHERE id = 'b'"), 4,
   'and the trigger keeps it for other writers');

# version 10 kept no count of take-overs: both columns come, at 0

sql("ALTER TABLE conversations DROP COLUMN takeovers;"
    . "ALTER TABLE conversations DROP COLUMN takeover_seq;"
    . "UPDATE meta SET value = '10' WHERE key = 'schema_version'");

($rc, $out) = $t->test_config;
is($rc, 0, 'a version 10 file is taken') or diag($out);
is(sql("SELECT value FROM meta"), '11', 'migrated to version 11');
is(sql($SCHEMA), $fresh, 'version 10: the schema a new file gets');
is(sql("SELECT id, takeovers, takeover_seq FROM conversations ORDER BY id"),
   "a|0|0\nb|0|0", 'no take-over counted');

# a newer schema than the module's is refused

sql("UPDATE meta SET value = '12' WHERE key = 'schema_version'");

($rc, $out) = $t->test_config;
isnt($rc, 0, 'nginx -t fails on a newer schema');
like($out, qr/schema version 12, newer than this module's 11/,
     'and says why');

# SQLite writes its WAL files beside the database as the workers' user:
# a directory they cannot write is refused at once

SKIP: {
    skip 'needs root to start workers as another user', 2 if $> != 0;

    my $dir = $t->testdir . '/locked';
    mkdir $dir, 0755;

    $t->write_file_expand('nginx.conf', engine_conf($mock,
        http => "agent_store $dir/agent.db;"));

    my $conf = $t->read_file('nginx.conf');
    $conf =~ s/^user root;$/user nobody nogroup;/m;
    $t->write_file('nginx.conf', $conf);

    ($rc, $out) = $t->test_config;
    isnt($rc, 0, 'nginx -t fails on a directory the workers cannot write');
    like($out, qr/the directory "\Q$dir\E" must be writable by the/,
         'and says why') or diag($out);
}

$mock->stop;
done_testing;
