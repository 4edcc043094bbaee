package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// serveRefusals runs handler behind refusalListener, as serve wires the proxy
// port, and returns its address.
func serveRefusals(t *testing.T, handler http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler, MaxHeaderBytes: 1 << 10}
	go srv.Serve(refusalListener{l})
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// exchanges writes raw to addr and reads the answers that come back, in order.
func exchanges(t *testing.T, addr, raw string, n int) []*http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(time.Minute)) // only a hung server reaches it
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	var out []*http.Response
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("reading answer %d to %q: %v", len(out)+1, raw, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(strings.NewReader(string(b)))
		out = append(out, resp)
	}
	return out
}

func errorCode(t *testing.T, resp *http.Response) string {
	t.Helper()
	var body struct {
		Error struct{ Code, Message string }
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &body); err != nil || body.Error.Message == "" {
		t.Errorf("body %q is not {\"error\":{\"code\",\"message\"}}: %v", b, err)
	}
	return body.Error.Code
}

// What net/http's server refuses before any handler runs is answered in
// idemproxy's JSON error shape, with net/http's status; net/http once
// answered these in text/plain, unlike every other refusal.
func TestRefusalsBeforeTheHandlerAreJSON(t *testing.T) {
	var handled atomic.Int64
	addr := serveRefusals(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	cases := []struct {
		name, raw string
		status    int
	}{
		{"control character in the key", "POST /p HTTP/1.1\r\nHost: x\r\nIdempotency-Key: ab\x01cd\r\nContent-Length: 2\r\n\r\n{}", http.StatusBadRequest},
		{"two Host headers", "GET /p HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", http.StatusBadRequest},
		{"two Content-Lengths", "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", http.StatusBadRequest},
		{"no Host", "GET /p HTTP/1.1\r\n\r\n", http.StatusBadRequest},
		{"headers too large", "GET /p HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 16<<10) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
		{"unknown transfer encoding", "POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", http.StatusNotImplemented},
		{"unknown HTTP version", "GET /p HTTP/3.0\r\nHost: x\r\n\r\n", http.StatusHTTPVersionNotSupported},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := exchanges(t, addr, c.raw, 1)[0]
			if resp.StatusCode != c.status {
				t.Errorf("status %d, want %d", resp.StatusCode, c.status)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			if code := errorCode(t, resp); code != "bad_request" {
				t.Errorf("code %q, want bad_request", code)
			}
		})
	}
	if n := handled.Load(); n != 0 {
		t.Errorf("handler ran %d times, want none", n)
	}
	// On a kept-alive connection, after an answer the handler gave.
	got := exchanges(t, addr, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\nGET /p HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 2)
	if got[0].StatusCode != http.StatusCreated || got[1].StatusCode != http.StatusBadRequest || errorCode(t, got[1]) != "bad_request" {
		t.Errorf("keep-alive: answers %d then %d, want 201 then 400 bad_request", got[0].StatusCode, got[1].StatusCode)
	}
}

// A handler's own answer passes untouched, even a text/plain 400 that
// closes the connection and repeats its status line in the body.
func TestRefusalsLeaveHandlerAnswers(t *testing.T) {
	addr := serveRefusals(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, "400 Bad Request")
	}))
	resp := exchanges(t, addr, "GET /p HTTP/1.1\r\nHost: x\r\n\r\n", 1)[0]
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" || string(b) != "400 Bad Request" {
		t.Errorf("handler's answer changed: %d %v %q", resp.StatusCode, resp.Header, b)
	}
}

func TestJSONRefusalOnlyNetHTTPs(t *testing.T) {
	for _, p := range []string{
		"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request!",
		"HTTP/1.1 400 Bad Request\r\nDate: x\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request",
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n200 OK",
		"HTTP/1.1 4xx Bad\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n4xx Bad",
		"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request",
		"400 Bad Request",
		"",
	} {
		if out, ok := jsonRefusal([]byte(p)); ok {
			t.Errorf("jsonRefusal(%q) rewrote it to %q", p, out)
		}
	}
}
