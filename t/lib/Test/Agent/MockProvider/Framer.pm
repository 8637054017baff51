package Test::Agent::MockProvider::Framer;

# What every provider API framer shares.  A framer turns a scripted reply
# into the bytes one provider API sends; the server around it owns timing,
# pauses, cuts and HTTP framing.  A framer is a package of class methods:
#
#   name                         short API name recorded with each request
#   streaming($req)              did the request ask for a stream?
#   stream_headers($reply, $req) header pairs of a 200 event stream
#   events($reply, $req)         the whole stream, one string per SSE event
#   stream_error($reply, $req)   the event sent when failing mid-stream
#   complete($reply, $req)       (headers, body) of a non-streamed 200
#   error($status, $err, $req)   (headers, body) of an HTTP error
#
# Output is built with obj()/arr() rather than JSON::PP objects: byte-exact
# tests need the provider's key order, and JSON::PP can only sort keys.
# Numbers must be passed through num(): Perl scalars do not say reliably
# whether they are numbers or strings.  A script gives any JSON text in
# a number's place as { raw => '1e999' } (a string, a fraction, a value
# out of range: what a broken provider might send).

use v5.36;
use Exporter qw(import);
use JSON::PP;

our @EXPORT_OK = qw(raw num total true false obj arr json sse split_text
                    random_id);

my $STR = JSON::PP->new->utf8->allow_nonref;
my $CANON = JSON::PP->new->utf8->canonical->allow_nonref;

sub raw ($json) { return bless \$json, 'Test::Agent::MockProvider::Raw' }

sub num ($n) { return ref $n eq 'HASH' ? raw($n->{raw}) : raw(0 + $n) }

# the sum of counts for a total, 0 if one is given as raw JSON text
sub total (@n) {
    my $sum = 0;

    for my $n (@n) {
        return 0 if ref $n;
        $sum += $n;
    }

    return $sum;
}

sub true  { return raw('true') }
sub false { return raw('false') }

sub obj (@kv) {
    my @pairs;

    while (my ($k, $v) = splice @kv, 0, 2) {
        push @pairs, $STR->encode("$k") . ':' . json($v);
    }

    return raw('{' . join(',', @pairs) . '}');
}

sub arr (@v) { return raw('[' . join(',', map { json($_) } @v) . ']') }

# JSON text of a value: raw stays raw, plain scalars are strings, and
# structures from a script (e.g. tool arguments as a hash) are canonical.
sub json ($v) {
    return 'null' unless defined $v;
    return $$v if ref $v eq 'Test::Agent::MockProvider::Raw';
    return $CANON->encode($v) if ref $v;
    return $STR->encode("$v");
}

sub sse ($data, $event = undef) {
    return (defined $event ? "event: $event\n" : '') . 'data: '
           . (ref $data ? json($data) : $data) . "\n\n";
}

# Split text into $n pieces as even as possible, longer ones first.
# Splitting is by character, so a piece never ends inside a UTF-8 sequence.
sub split_text ($text, $n) {
    my ($len, @pieces, $pos);

    $len = length($text // '');
    return () if $len == 0;

    $n = 1 if !$n || $n < 1;
    $n = $len if $n > $len;
    $pos = 0;

    for my $i (0 .. $n - 1) {
        my $size = int($len / $n) + ($i < $len % $n ? 1 : 0);
        push @pieces, substr($text, $pos, $size);
        $pos += $size;
    }

    return @pieces;
}

sub random_id ($prefix, $n) {
    my @c = ('a' .. 'z', 'A' .. 'Z', '0' .. '9');
    return $prefix . join '', map { $c[rand @c] } 1 .. $n;
}

# The default HTTP error is OpenAI's shape, which most compatible servers
# copy, so unknown paths get it too; a framer for another API overrides it.

my %DEFAULT_ERROR = (
    400 => ['Invalid request.', 'invalid_request_error', undef],
    401 => ['Incorrect API key provided.', 'invalid_request_error',
            'invalid_api_key'],
    403 => ['You are not allowed to access this resource.',
            'invalid_request_error', undef],
    404 => ['Not found.', 'invalid_request_error', undef],
    429 => ['Rate limit reached for requests.', 'requests',
            'rate_limit_exceeded'],
);

my @SERVER_ERROR = ('The server had an error while processing your request.'
                    . ' Sorry about that!', 'server_error', undef);

sub error_fields ($class, $status, $err) {
    my $d = $DEFAULT_ERROR{$status}
            // ($status >= 500 ? \@SERVER_ERROR : $DEFAULT_ERROR{400});

    return { message => $d->[0], type => $d->[1], param => undef,
             code => $d->[2], %{ $err // {} } };
}

sub error ($class, $status, $err, $req) {
    my $e = $class->error_fields($status, $err);

    # pretty-printed with a trailing newline, as OpenAI sends it
    my $body = "{\n    \"error\": {\n"
               . join(",\n", map { "        \"$_\": " . json($e->{$_}) }
                                 qw(message type param code))
               . "\n    }\n}\n";

    return ([['Content-Type', 'application/json; charset=utf-8'],
             ['x-request-id', random_id('req_', 32)]], $body);
}

1;
