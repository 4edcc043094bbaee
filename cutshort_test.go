package main

// A provider's answer whose body is delimited by the connection's close (no
// Content-Length, not chunked: HTTP/1.0 servers, some gateways) and that the
// connection cut short: HTTP cannot tell it from a whole one, its JSON can.

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// closeCutProvider executes each key once and replays it after. While cut is
// above zero, an answer is sent without a length and the connection closed
// after its first cutAt bytes (all of them if cutAt is -1).
type closeCutProvider struct {
	mu     sync.Mutex
	cut    int
	cutAt  int
	execs  map[string]int
	stored map[string]string
	nonces map[string]bool
	seen   []string // the key of each POST
}

func (p *closeCutProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.seen = append(p.seen, key)
	p.nonces[r.Header.Get("X-Nonce")] = true
	out, replay := p.stored[key]
	if !replay {
		p.execs[key]++
		out = fmt.Sprintf(`{"id":"pay_%d","status":"succeeded","amount":"10.00"}`, len(p.stored)+1)
		p.stored[key] = out
	}
	cut, cutAt := p.cut > 0, p.cutAt
	if cut {
		p.cut--
	}
	p.mu.Unlock()
	if !cut {
		if replay {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, out)
		return
	}
	if cutAt >= 0 {
		out = out[:cutAt]
	}
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	fmt.Fprintf(buf, "HTTP/1.1 201 Created\r\nContent-Type: application/json; charset=utf-8\r\nConnection: close\r\n\r\n%s", out)
	buf.Flush()
	conn.Close()
}

func TestCloseDelimitedAnswerCutShortIsNotStored(t *testing.T) {
	for _, c := range []struct {
		name          string
		cutAt         int
		wantAttempts  int
		wantExecs     int
		wantReplayed  string
		wantFullStore bool
	}{
		{"cut inside the JSON", 20, 2, 1, "true", true},
		{"cut right after the header", 0, 2, 1, "true", true},
		{"whole answer", -1, 1, 1, "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cp := &closeCutProvider{cut: 1, cutAt: c.cutAt, execs: map[string]int{}, stored: map[string]string{}, nonces: map[string]bool{}}
			up := httptest.NewServer(cp)
			defer up.Close()
			p := launch(t, launchSpec{env: baseEnv(up.URL, t.TempDir(),
				"IDEMPROXY_RETRY_MAX_ATTEMPTS=3", "IDEMPROXY_RETRY_BASE_DELAY=10ms", "IDEMPROXY_RETRY_MAX_DELAY=50ms",
				"IDEMPROXY_ATTEMPT_TIMEOUT=2s", "IDEMPROXY_SIGN_SECRET=s3cret-for-the-test", "IDEMPROXY_NONCE_HEADER=X-Nonce")})

			first := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
			cp.mu.Lock()
			whole := cp.stored[first.header.Get("Idempotency-Key")]
			seen, execs, nonces := append([]string(nil), cp.seen...), cp.execs[first.header.Get("Idempotency-Key")], len(cp.nonces)
			cp.mu.Unlock()
			if first.status != http.StatusCreated || first.body != whole || first.header.Get("Idempotent-Replayed") != c.wantReplayed {
				t.Fatalf("app got %d %q (replayed %q), want 201 %q (replayed %q)", first.status, first.body,
					first.header.Get("Idempotent-Replayed"), whole, c.wantReplayed)
			}
			if len(seen) != c.wantAttempts || execs != c.wantExecs || nonces != len(seen) {
				t.Fatalf("provider saw %d POSTs (%d nonces), executed %d; want %d POSTs each with its own nonce, %d executions",
					len(seen), nonces, execs, c.wantAttempts, c.wantExecs)
			}
			for _, k := range seen {
				if k != first.header.Get("Idempotency-Key") {
					t.Fatalf("a POST went with key %s, not the operation's %s", k, first.header.Get("Idempotency-Key"))
				}
			}
			again := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
			if again.status != http.StatusCreated || again.body != whole || again.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("repeat got %d %q (replayed %q), want the whole answer %q replayed", again.status, again.body,
					again.header.Get("Idempotent-Replayed"), whole)
			}
			if strings.Count(p.text(), `"msg":"operation outcome unknown`) != 0 {
				t.Fatalf("an operation was left unknown:\n%s", p.text())
			}
		})
	}
}

// TestGzipAnswerIsNotTakenForCutShort: an answer the transport asked gzip
// for and decoded has lost its length (net/http gives it none), but it was
// framed on the wire and its gzip trailer proves it whole: an empty JSON
// answer so sent is the operation's result, not an answer cut short.
func TestGzipAnswerIsNotTakenForCutShort(t *testing.T) {
	var (
		mu    sync.Mutex
		posts int
	)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		posts++
		mu.Unlock()
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Close()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Length", strconv.Itoa(gz.Len()))
		w.WriteHeader(http.StatusAccepted)
		w.Write(gz.Bytes())
	}))
	defer up.Close()
	p := launch(t, launchSpec{env: baseEnv(up.URL, t.TempDir(),
		"IDEMPROXY_RETRY_MAX_ATTEMPTS=3", "IDEMPROXY_RETRY_BASE_DELAY=10ms", "IDEMPROXY_RETRY_MAX_DELAY=50ms")})
	first := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	again := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	mu.Lock()
	n := posts
	mu.Unlock()
	if first.status != http.StatusAccepted || first.body != "" || again.status != http.StatusAccepted || again.header.Get("Idempotent-Replayed") != "true" || n != 1 {
		t.Fatalf("app got %d %q then %d (replayed %q), provider saw %d POSTs; want the empty 202 stored at the first attempt and replayed",
			first.status, first.body, again.status, again.header.Get("Idempotent-Replayed"), n)
	}
}
