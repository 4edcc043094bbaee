package main

import (
	"fmt"
	"strings"
	"testing"
)

// framing follows a connection's requests however the reads split them, and
// marks the first whose length is ambiguous by its number among the requests
// the handler sees.
func TestFramingMarksAmbiguousLength(t *testing.T) {
	const (
		chunkedPost = "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n1a\r\nContent-Length: 5\r\n\r\nabcde\r\n0\r\nTrailer-A: b\r\n\r\n"
		crlf        = "\r\n" // some clients add it after a POST's body
		get         = "GET /c HTTP/1.1\nHost: x\nContent-Length: 0\n\n"
		options     = "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"
		http10      = "POST /d HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"
		teCL        = "POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
		clTE        = "POST /e HTTP/1.1\r\nHost: x\r\ntransfer-encoding:  CHUNKED \r\ncontent-length:3\r\n\r\n0\r\n\r\n"
		te10        = "POST /f HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
		twoCL       = "POST /g HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"
		badChunk    = "POST /h HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
		gzipTE      = "POST /i HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n"
		twoLengths  = "POST /j HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n"
	)
	pad := strings.Repeat(" ", 200)
	longExt := "POST /m HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2;e=" + strings.Repeat("e", 300) + "\r\nok\r\n0\r\n\r\n"
	sixteen := "POST /m HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0000000000000002\r\nok\r\n0\r\n\r\n"
	quoted := "GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n"
	lengthPost := fmt.Sprintf("POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(quoted), quoted)
	tests := []struct {
		name   string
		stream string
		want   int64
	}{
		{"well framed", chunkedPost + crlf + lengthPost + get + options + http10 + chunkedPost, 0},
		{"Transfer-Encoding and Content-Length", teCL, 1},
		{"after well-framed requests", chunkedPost + crlf + lengthPost + get + http10 + clTE + teCL, 5},
		{"OPTIONS * is not the handler's", options + get + teCL, 2},
		{"Transfer-Encoding on HTTP/1.0", get + te10, 2},
		{"Content-Length twice", lengthPost + twoCL, 2},
		{"folded Transfer-Encoding", get + "POST /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 3\r\n\r\n", 2},
		{"folded Content-Length", "POST /k HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\t3\r\nTransfer-Encoding: chunked\r\n\r\n", 1},
		{"folded, then well framed", "POST /l HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\nContent-Length:\r\n 2\r\nX-B: 3\r\n\r\nokGET / HTTP/1.1\r\nHost: x\r\n\r\n" + teCL, 3},
		{"quoted in a body", lengthPost + lengthPost, 0},
		// Values framing cannot read whole still count as lengths.
		{"padded Transfer-Encoding", get + "POST /n HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:" + pad + "chunked\r\nContent-Length: 3\r\n\r\n", 2},
		{"padded Content-Length", "POST /n HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length:" + pad + "3" + pad + "\r\n\r\n", 1},
		{"padded Content-Length twice", "POST /n HTTP/1.1\r\nHost: x\r\nContent-Length:" + pad + "2\r\nContent-Length: 2\r\n\r\nok", 1},
		{"zero-padded Content-Length", "POST /n HTTP/1.1\r\nHost: x\r\nContent-Length: " + strings.Repeat("0", 70) + "3\r\nTransfer-Encoding: chunked\r\n\r\n", 1},
		// Chunk-size lines the server reads are followed.
		{"after a long chunk extension", longExt + teCL, 2},
		{"after a sixteen-digit chunk size", sixteen + teCL, 2},
		{"zero-padded length followed", "POST /o HTTP/1.1\r\nHost: x\r\nContent-Length: 0000000000000000000002\r\n\r\nok" + teCL, 2},
		// The server refuses these and closes the connection itself.
		{"after a malformed chunk", badChunk + teCL, 0},
		{"unsupported Transfer-Encoding", gzipTE + teCL, 0},
		{"two lengths", twoLengths + teCL, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for size := 1; size <= len(tt.stream); size++ {
				var f framing
				for s := tt.stream; s != ""; {
					n := min(size, len(s))
					f.feed([]byte(s[:n]))
					s = s[n:]
				}
				if got := f.ambiguous.Load(); got != tt.want {
					t.Fatalf("reads of %d bytes: request %d marked, want %d", size, got, tt.want)
				}
				if size == 16 {
					size = len(tt.stream) - 1 // then the stream in one read
				}
			}
		})
	}
	var f framing
	f.feed([]byte("POST /" + strings.Repeat("a", 2<<20)))
	if f.state != framingOff {
		t.Errorf("a request line of 2 MiB: state %d, want framing off", f.state)
	}
}

// BenchmarkFramingFeed is framing's cost on the path of every request: the
// head and body of the benchmark's new-key POST, read in one piece, as a
// keep-alive connection reads them.
func BenchmarkFramingFeed(b *testing.B) {
	body := `{"order_id":"o-0123456789","amount":1000,"currency":"RUB","customer":"c-42","description":"bench payment"}`
	req := []byte(fmt.Sprintf("POST /v1/payments HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: legacy-app/1.0\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	var f framing
	b.SetBytes(int64(len(req)))
	b.ReportAllocs()
	for b.Loop() {
		f.feed(req)
	}
	if f.ambiguous.Load() != 0 || f.heads != int64(b.N) {
		b.Fatalf("framing lost track: %d heads for %d requests, ambiguous %d", f.heads, b.N, f.ambiguous.Load())
	}
}

// Once framing cannot follow a connection (a padded Transfer-Encoding the
// server reads as chunked, a length it cannot read), every later request the
// handler sees is refused: where it starts cannot be told. Requests before,
// and a connection framing follows to its end, are not.
func TestFramingRefusesAfterItStops(t *testing.T) {
	get := "GET /c HTTP/1.1\r\nHost: x\r\n\r\n"
	pad := strings.Repeat(" ", 200)
	for _, c := range []struct {
		name, stream string
		first        int64 // the first request refused, 0 for none
	}{
		{"well framed", get + "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2;e=" + strings.Repeat("e", 300) + "\r\nok\r\n0\r\n\r\n" + get, 0},
		{"padded Transfer-Encoding", get + "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:" + pad + "chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n" + get + get, 3},
		{"unreadable length", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: " + strings.Repeat("0", 70) + "2\r\n\r\nok" + get, 2},
		{"a chunk size over the server's 16 digits", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n00000000000000002\r\nok\r\n0\r\n\r\n" + get, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			var f framing
			f.feed([]byte(c.stream))
			for n := int64(1); n <= 4; n++ {
				if want := c.first != 0 && n >= c.first; f.refuses(n) != want {
					t.Errorf("request %d: refuses %v, want %v", n, f.refuses(n), want)
				}
			}
		})
	}
}
