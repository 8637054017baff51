package Test::Agent::HTTP;

# A raw HTTP/1.1 client for tests: whole responses, and streams read
# incrementally with the arrival time of every piece.
#
#   my $r = http_get('/x', port => $port);         # {status, headers, body}
#   my $r = http_post('/x', '{"a":1}', port => $port,
#                     headers => {'Content-Type' => 'application/json'});
#   my $s = http_stream("GET /events HTTP/1.1\r\nHost: x\r\n\r\n",
#                       port => $port);
#   $s->status;  $s->header('content-type');
#   while (my $c = $s->next_chunk(5)) { ... $c->{t}, $c->{data} ... }

use strict;
use warnings;

use Exporter qw(import);
use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(time);

our @EXPORT = qw(http http_get http_post http_request http_stream
                 http_status parse_response);

sub connect_to {
    my ($port) = @_;

    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $port, Timeout => 5)
        or die "cannot connect to 127.0.0.1:$port: $!\n";
    $s->autoflush(1);
    binmode $s;
    return $s;
}

sub http_request {
    my ($method, $uri, $body, %opts) = @_;

    my %h = (Host => 'localhost', Connection => 'close',
             %{$opts{headers} || {}});
    $h{'Content-Length'} = length $body
        if defined $body && !exists $h{'Content-Length'};

    my $req = "$method $uri HTTP/1.1\r\n";
    $req .= "$_: $h{$_}\r\n" for sort keys %h;
    $req .= "\r\n";
    $req .= $body if defined $body;

    return $req;
}

# Sends a raw request, reads until the server closes, returns the parsed
# response (undef on timeout).

sub http {
    my ($request, %opts) = @_;

    my $s = connect_to($opts{port});
    print $s $request;

    my $sel = IO::Select->new($s);
    my $deadline = time + ($opts{timeout} // 10);
    my $raw = '';

    while (1) {
        my $left = $deadline - time;
        return undef if $left <= 0;
        next unless $sel->can_read($left);
        my $n = sysread($s, my $buf, 65536);
        last unless $n;
        $raw .= $buf;
    }

    close $s;
    return $opts{raw} ? $raw : parse_response($raw);
}

# The status of the answer on a connection a request was written to, 0
# if none comes within timeout seconds

sub http_status {
    my ($s, $timeout) = @_;

    my $sel = IO::Select->new($s);
    my $raw = '';

    while ($raw !~ /\r\n/ && $sel->can_read($timeout)) {
        sysread($s, $raw, 4096, length $raw) or last;
    }

    return $raw =~ m{^HTTP/1\.\d (\d{3})} ? $1 : 0;
}

sub http_get {
    my ($uri, %opts) = @_;
    return http(http_request('GET', $uri, undef, %opts), %opts);
}

sub http_post {
    my ($uri, $body, %opts) = @_;
    return http(http_request('POST', $uri, $body, %opts), %opts);
}

sub parse_head {
    my ($head) = @_;

    return unless defined $head;

    my ($line, @lines) = split /\r\n/, $head;
    my ($status) = $line =~ m{^HTTP/\d\.\d (\d{3})} or return;
    my %h;
    for (@lines) {
        my ($k, $v) = /^([^:]+):\s*(.*)$/ or next;
        $k = lc $k;
        $h{$k} = exists $h{$k} ? "$h{$k}, $v" : $v;
    }

    return ($status, \%h);
}

sub dechunk {
    my ($data) = @_;

    my $body = '';
    while ($data =~ s/^([0-9a-fA-F]+)[^\r\n]*\r\n//) {
        my $len = hex $1;
        last if $len == 0;
        $body .= substr($data, 0, $len, '');
        $data =~ s/^\r\n//;
    }
    return $body;
}

sub parse_response {
    my ($raw) = @_;

    return undef unless defined $raw;

    my ($head, $body) = split /\r\n\r\n/, $raw, 2;
    my ($status, $h) = parse_head($head) or return undef;
    $body //= '';
    $body = dechunk($body)
        if ($h->{'transfer-encoding'} // '') =~ /chunked/i;

    return { status => $status, headers => $h, body => $body, raw => $raw };
}

sub http_stream {
    my ($request, %opts) = @_;
    return Test::Agent::HTTP::Stream->new($request, %opts);
}


package Test::Agent::HTTP::Stream;

# One response read as it arrives.  next_chunk() returns each piece of
# the body as it is decoded (one HTTP chunk of a chunked body, or one read
# otherwise) with its arrival time.

use strict;
use warnings;

use IO::Select;
use Time::HiRes qw(time);

sub new {
    my ($class, $request, %opts) = @_;

    my $s = Test::Agent::HTTP::connect_to($opts{port});
    print $s $request;

    my $self = bless { sock => $s, sel => IO::Select->new($s), buf => '',
                       eof => 0, started => time }, $class;

    $self->read_head($opts{timeout} // 10)
        or die "no response head within the timeout\n";

    return $self;
}

sub fill {
    my ($self, $timeout) = @_;

    return 0 if $self->{eof};
    return 0 unless $self->{sel}->can_read($timeout < 0 ? 0 : $timeout);

    my $n = sysread($self->{sock}, my $buf, 65536);
    if (!$n) {
        $self->{eof} = 1;
        return 0;
    }

    $self->{buf} .= $buf;
    $self->{last_read} = time;
    return 1;
}

sub read_head {
    my ($self, $timeout) = @_;

    my $deadline = time + $timeout;
    until ($self->{buf} =~ /\r\n\r\n/) {
        return 0 if $self->{eof} || time >= $deadline;
        $self->fill($deadline - time);
    }

    my ($head, $rest) = split /\r\n\r\n/, $self->{buf}, 2;
    @$self{qw(status headers)} = Test::Agent::HTTP::parse_head($head);
    $self->{buf} = $rest;
    $self->{chunked} = ($self->{headers}{'transfer-encoding'} // '')
        =~ /chunked/i;
    return 1;
}

sub status { $_[0]{status} }
sub headers { $_[0]{headers} }
sub header { $_[0]{headers}{lc $_[1]} }
sub eof { $_[0]{eof} && $_[0]{buf} eq '' }
sub socket { $_[0]{sock} }

# The next piece of body, or undef on timeout or at the end
# (check ->finished to tell the two apart).

sub next_chunk {
    my ($self, $timeout) = @_;

    my $deadline = time + ($timeout // 10);

    while (1) {
        my $c = $self->take;
        return $c if $c;
        return undef if $self->{finished};
        if ($self->{eof}) {
            $self->{finished} = 1;
            return undef;
        }
        my $left = $deadline - time;
        return undef if $left <= 0;
        $self->fill($left);
    }
}

sub take {
    my ($self) = @_;

    if (!$self->{chunked}) {
        return undef if $self->{buf} eq '';
        my $data = $self->{buf};
        $self->{buf} = '';
        return { t => $self->{last_read}, data => $data };
    }

    return undef unless $self->{buf} =~ /^([0-9a-fA-F]+)[^\r\n]*\r\n/;
    my $len = hex $1;
    my $hlen = length $&;

    if ($len == 0) {
        $self->{finished} = 1;
        $self->{buf} = '';
        return undef;
    }

    return undef if length($self->{buf}) < $hlen + $len + 2;

    my $data = substr($self->{buf}, $hlen, $len);
    substr($self->{buf}, 0, $hlen + $len + 2, '');
    return { t => $self->{last_read}, data => $data };
}

# Everything up to the end of the response (or the timeout).

sub rest {
    my ($self, $timeout) = @_;

    my $deadline = time + ($timeout // 10);
    my @chunks;
    while (time < $deadline) {
        my $c = $self->next_chunk($deadline - time) or last;
        push @chunks, $c;
    }
    return @chunks;
}

sub finished { $_[0]{finished} }

sub close {
    my ($self) = @_;
    close $self->{sock} if $self->{sock};
    $self->{sock} = undef;
}

1;
