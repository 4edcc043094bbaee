package proxy_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// gzipped is s gzipped with modTime in its header, as clients that write
// the time there (Python's gzip.compress) do: two tries of one body are
// other bytes.
func gzipped(t *testing.T, s string, modTime time.Time) string {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.ModTime = modTime
	io.WriteString(w, s)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func zlibbed(s string, level int) string {
	var b bytes.Buffer
	w, _ := zlib.NewWriterLevel(&b, level)
	io.WriteString(w, s)
	w.Close()
	return b.String()
}

func rawDeflated(s string) string {
	var b bytes.Buffer
	w, _ := flate.NewWriter(&b, flate.BestCompression)
	io.WriteString(w, s)
	w.Close()
	return b.String()
}

// An order whose body comes gzip- or deflate-encoded is read decoded, as a
// provider that decodes request bodies reads it: its key is the plain
// body's, and every try of it, however compressed, is one request. Before,
// its order_id could not be read: with IDEMPROXY_MISSING_KEY=generate each
// try got a random key (executed once per try), and with the app's own key
// a retry compressed into other bytes was 409 idempotency_conflict. The
// body goes upstream as it came.
func TestEncodedBodyIsOneOrder(t *testing.T) {
	for _, missing := range []proxy.MissingKey{proxy.Reject, proxy.Generate} {
		e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.MissingKey = missing })
		t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		tries := []struct{ name, coding, body string }{
			{"gzip", "gzip", gzipped(t, order, t0)},
			{"gzip a second later", "gzip", gzipped(t, order, t0.Add(time.Second))},
			{"x-gzip", "x-gzip", gzipped(t, order, t0)},
			{"deflate", "deflate", zlibbed(order, zlib.BestSpeed)},
			{"deflate, other level", "Deflate", zlibbed(order, zlib.BestCompression)},
			{"raw deflate", "deflate", rawDeflated(order)},
			{"gzip and identity", "identity, gzip", gzipped(t, order, t0)},
			{"plain", "", order},
		}
		var key string
		var upstreamBody string
		for i, c := range tries {
			a := e.do(t, "POST", "/v1/payments", c.body, "Content-Encoding", c.coding)
			if a.status != http.StatusCreated || (i > 0 && a.header.Get("Idempotent-Replayed") != "true") {
				t.Fatalf("policy %d, %s: %d %s, want 201 (a replay after the first)", missing, c.name, a.status, a.body)
			}
			if i == 0 {
				key = a.header.Get(proxy.KeyHeader)
				upstreamBody = c.body
			} else if got := a.header.Get(proxy.KeyHeader); got != key {
				t.Errorf("policy %d, %s: key %q, want the first try's %q", missing, c.name, got, key)
			}
		}
		if total, execs := e.prov.counts(); total != 1 || execs[key] != 1 {
			t.Errorf("policy %d: upstream saw %d requests %v, want one, under key %q", missing, total, execs, key)
		}
		if got := e.prov.lastBody(); got != upstreamBody {
			t.Errorf("policy %d: upstream body %q, want the gzip bytes as sent", missing, got)
		}
		// With the app's own key, a retry compressed into other bytes is
		// the same request too, replayed.
		third := strings.Replace(order, "ord-1", "ord-3", 1)
		for i := range 2 {
			a := e.do(t, "POST", "/v1/payments", gzipped(t, third, t0.Add(time.Duration(i)*time.Second)), "Content-Encoding", "gzip", proxy.KeyHeader, "app-key-3")
			if a.status != http.StatusCreated || (i > 0 && a.header.Get("Idempotent-Replayed") != "true") {
				t.Errorf("policy %d, app's key, try %d: %d %s, want 201 (a replay the second time)", missing, i+1, a.status, a.body)
			}
		}
		// Another order, gzipped, is another key.
		other := strings.Replace(order, "ord-1", "ord-2", 1)
		a := e.do(t, "POST", "/v1/payments", gzipped(t, other, t0), "Content-Encoding", "gzip")
		if a.status != http.StatusCreated || a.header.Get(proxy.KeyHeader) == key {
			t.Errorf("policy %d, other order: %d key %q, want 201 under a key of its own", missing, a.status, a.header.Get(proxy.KeyHeader))
		}
	}
}

// A body idemproxy does not decode (a coding it does not know, one that is
// corrupt, or one that decodes to more than the body cap) has key sources
// it cannot read: with no Idempotency-Key it is refused as any request
// without a key is, nothing sent, and the message says the body is encoded.
func TestKeyMissingEncodedBody(t *testing.T) {
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.MaxBodyBytes = 4096 })
	gz := gzipped(t, order, time.Time{})
	bomb := gzipped(t, `{"order_id":"ord-1","pad":"`+strings.Repeat("x", 5000)+`"}`, time.Time{})
	for _, c := range []struct{ name, coding, body string }{
		{"br", "br", gz},
		{"gzip then br", "gzip, br", gz},
		{"corrupt gzip", "gzip", gz[:len(gz)-6]},
		{"over the cap once decoded", "gzip", bomb},
		{"five codings", "gzip, identity, gzip, gzip, gzip, gzip", gz},
	} {
		a := e.do(t, "POST", "/v1/payments", c.body, "Content-Encoding", c.coding)
		if a.status != http.StatusUnprocessableEntity || errorCode(t, a) != "idempotency_key_missing" ||
			!bytes.Contains(a.body, []byte("Content-Encoding")) {
			t.Errorf("%s: %d %s, want 422 idempotency_key_missing naming the Content-Encoding", c.name, a.status, a.body)
		}
	}
	// A body that decodes, or says identity, and has no source: the plain 422.
	for _, c := range []struct{ coding, body string }{
		{"identity", `{"amount":"1"}`},
		{"gzip", gzipped(t, `{"amount":"1"}`, time.Time{})},
	} {
		a := e.do(t, "POST", "/v1/payments", c.body, "Content-Encoding", c.coding)
		if a.status != http.StatusUnprocessableEntity || bytes.Contains(a.body, []byte("Content-Encoding")) {
			t.Errorf("%s body without a source: %d %s, want the plain 422", c.coding, a.status, a.body)
		}
	}
	if total, _ := e.prov.counts(); total != 0 {
		t.Errorf("upstream saw %d requests, want 0", total)
	}
}

// Under IDEMPROXY_MISSING_KEY=generate or passthrough too, a body whose key
// sources cannot be read because of its encoding (br here) is refused with
// nothing sent: its order_id may well be in there, and a random key
// (generate) or none (passthrough) would have each blind retry of that
// order executed again. Before, each try of such an order went upstream
// under a new random key, or with none. An unencoded body with no source
// still gets what the policy says.
func TestUndecodableBodyRefusedUnderEveryPolicy(t *testing.T) {
	for _, missing := range []proxy.MissingKey{proxy.Generate, proxy.Passthrough} {
		e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.MissingKey = missing })
		for try := range 2 {
			a := e.do(t, "POST", "/v1/payments", gzipped(t, order, time.Time{}), "Content-Encoding", "br")
			if a.status != http.StatusUnprocessableEntity || errorCode(t, a) != "idempotency_key_missing" ||
				!bytes.Contains(a.body, []byte("Content-Encoding")) {
				t.Errorf("policy %d, try %d: %d %s, want 422 idempotency_key_missing naming the Content-Encoding", missing, try+1, a.status, a.body)
			}
		}
		if total, _ := e.prov.counts(); total != 0 {
			t.Errorf("policy %d: upstream saw %d requests, want 0", missing, total)
		}
		if a := e.do(t, "POST", "/v1/payments", `{"amount":"1"}`); a.status != http.StatusCreated {
			t.Errorf("policy %d, an unencoded body without a source: %d %s, want it sent (201)", missing, a.status, a.body)
		}
		// An empty body has nothing to decode, whatever its Content-Encoding
		// says: a bodyless POST follows the policy as it did before bodies
		// were decoded.
		if a := e.do(t, "POST", "/v1/payments", "", "Content-Encoding", "gzip"); a.status != http.StatusCreated {
			t.Errorf("policy %d, an empty body with Content-Encoding: gzip: %d %s, want it sent (201)", missing, a.status, a.body)
		}
	}
}
