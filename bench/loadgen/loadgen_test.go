package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestResponseRead(t *testing.T) {
	tests := []struct {
		name     string
		raw      string
		want     response
		wantErr  error
		leftover string // what must remain unread after the response
	}{
		{"content length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloNEXT",
			response{status: 200}, nil, "NEXT"},
		{"chunked with extension and trailer",
			"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\nNEXT",
			response{status: 201}, nil, "NEXT"},
		{"connection close and replay marker", "HTTP/1.1 200 OK\r\nconnection: Close\r\nIdempotent-Replayed: true\r\nContent-Length: 0\r\n\r\n",
			response{status: 200, close: true, replayed: true}, nil, ""},
		{"no content", "HTTP/1.1 204 No Content\r\n\r\nNEXT", response{status: 204}, nil, "NEXT"},
		{"bad status line", "HTTX/1.1 200 OK\r\n\r\n", response{}, ErrMalformed, ""},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", response{status: 200}, ErrMalformed, ""},
		{"no length", "HTTP/1.1 200 OK\r\n\r\nbody", response{status: 200}, ErrMalformed, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReader(strings.NewReader(tc.raw))
			var got response
			err := got.read(br)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("response = %+v, want %+v", got, tc.want)
			}
			if tc.wantErr == nil {
				rest := make([]byte, 16)
				n, _ := br.Read(rest)
				if string(rest[:n]) != tc.leftover {
					t.Errorf("left %q unread, want %q", rest[:n], tc.leftover)
				}
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	r := &Result{}
	for i := 1; i <= 1000; i++ {
		r.Latencies = append(r.Latencies, time.Duration(i))
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500}, {0.99, 990}, {0.999, 999}, {1, 1000}, {0.0001, 1}} {
		if got := r.Percentile(tc.q); got != tc.want {
			t.Errorf("Percentile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := (&Result{}).Percentile(0.5); got != 0 {
		t.Errorf("Percentile of no samples = %v, want 0", got)
	}
}

// seen is a test upstream that records every request's sequence number and,
// every third response, asks the client to close the connection.
type seen struct {
	mu    sync.Mutex
	paths map[string]int
	n     int
}

func (s *seen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.paths[r.URL.Path]++
	s.n++
	n := s.n
	s.mu.Unlock()
	if n%3 == 0 {
		w.Header().Set("Connection", "close")
	}
	if n%2 == 0 {
		w.Header().Set("Idempotent-Replayed", "true")
		w.(http.Flusher).Flush() // forces a chunked body
	}
	fmt.Fprintf(w, "response %d", n)
}

func TestRunTotalSendsEverySequenceOnce(t *testing.T) {
	up := &seen{paths: map[string]int{}}
	srv := httptest.NewServer(up)
	defer srv.Close()
	const total = 300
	res, err := Run(context.Background(), Config{
		Addr:     strings.TrimPrefix(srv.URL, "http://"),
		Conns:    4,
		Total:    total,
		FirstSeq: 1000,
		Build: func(dst []byte, seq uint64) []byte {
			dst = append(dst, "GET /n/"...)
			dst = strconv.AppendUint(dst, seq, 10)
			return append(dst, " HTTP/1.1\r\nHost: x\r\n\r\n"...)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.OK != total || res.Failed() != 0 {
		t.Fatalf("OK = %d, failed = %d (%v), want %d and 0", res.OK, res.Failed(), res.Errors, total)
	}
	if res.Replayed != total/2 {
		t.Errorf("Replayed = %d, want %d", res.Replayed, total/2)
	}
	if res.Reconnect <= 4 {
		t.Errorf("Reconnect = %d, want more than the 4 first dials (server closes every third)", res.Reconnect)
	}
	if len(res.Latencies) != total {
		t.Errorf("%d latency samples, want %d", len(res.Latencies), total)
	}
	for i := range total {
		if p := "/n/" + strconv.Itoa(1000+i); up.paths[p] != 1 {
			t.Fatalf("%s sent %d times, want once", p, up.paths[p])
		}
	}
	if res.NextSeq < 1000+total {
		t.Errorf("NextSeq = %d, want at least %d", res.NextSeq, 1000+total)
	}
}

func TestRunCountsFailures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{
		Addr:  strings.TrimPrefix(srv.URL, "http://"),
		Total: 10,
		Build: func(dst []byte, _ uint64) []byte { return append(dst, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"...) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.OK != 0 || res.Statuses[503] != 10 || res.Failed() != 10 {
		t.Errorf("OK=%d statuses=%v failed=%d, want 0, 10×503, 10", res.OK, res.Statuses, res.Failed())
	}
}

func TestRunRequiresBuildAndEnd(t *testing.T) {
	for _, cfg := range []Config{{Addr: "x:1", Total: 1}, {Build: func(d []byte, _ uint64) []byte { return d }, Total: 1}, {Addr: "x:1", Build: func(d []byte, _ uint64) []byte { return d }}} {
		if _, err := Run(context.Background(), cfg); err == nil {
			t.Errorf("Run(%+v) = nil error, want one", cfg)
		}
	}
}

// With Addrs, the connections are spread over the targets: each gets some.
// Every target holds its first request until all three have one, so the
// workers cannot finish on one target before the others are dialled.
func TestRunSpreadsConnectionsOverAddrs(t *testing.T) {
	var hits [3]atomic.Int64
	var reached sync.WaitGroup
	reached.Add(len(hits))
	all := make(chan struct{})
	go func() { reached.Wait(); close(all) }()
	var addrs []string
	for i := range hits {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hits[i].Add(1) == 1 {
				reached.Done()
			}
			select {
			case <-all:
			case <-time.After(10 * time.Second): // a target never dialled: the test fails below
			}
		}))
		defer srv.Close()
		addrs = append(addrs, strings.TrimPrefix(srv.URL, "http://"))
	}
	res, err := Run(context.Background(), Config{
		Addr: "replicas", Addrs: addrs, Conns: 6, Total: 60,
		Build: func(dst []byte, _ uint64) []byte { return append(dst, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"...) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.OK != 60 {
		t.Fatalf("%d ok, want 60: %v", res.OK, res.Errors)
	}
	for i := range hits {
		if hits[i].Load() == 0 {
			t.Errorf("target %d got no request", i)
		}
	}
}
