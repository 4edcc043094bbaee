package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// largeBodySize is the size of the bodies below: the ~1 MiB payment calls
// of the overload report.
const largeBodySize = 1 << 20

// largePost is a protected POST whose JSON body is about largeBodySize
// bytes, generated as it is read so that the test itself holds none of it.
func largePost(host, orderID string) *http.Request {
	prefix := `{"order_id":"` + orderID + `","note":"`
	suffix := `"}`
	pad := int64(largeBodySize - len(prefix) - len(suffix))
	body := io.MultiReader(strings.NewReader(prefix), io.LimitReader(filler{}, pad), strings.NewReader(suffix))
	n := int64(len(prefix)+len(suffix)) + pad
	return &http.Request{
		Method: http.MethodPost, URL: &url.URL{Path: "/v1/payments"}, RequestURI: "/v1/payments",
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Host: host, RemoteAddr: "127.0.0.1:50000",
		Header: http.Header{"Content-Type": {"application/json"}, "Content-Length": {strconv.FormatInt(n, 10)}},
		Body:   io.NopCloser(body), ContentLength: n,
	}
}

// filler reads as an endless run of 'x'.
type filler struct{}

func (filler) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// TestProtectedBodyHeldOnce parks requests with 1 MiB bodies at an upstream
// that has read them, and measures the live heap they hold: the proxy, the
// retry loop, the signer (which hashes the body) and the wire must share one
// copy of each body, not hold two or three.
func TestProtectedBodyHeldOnce(t *testing.T) {
	const parked = 8
	arrived := make(chan struct{}, parked)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Park") != "" {
			io.Copy(io.Discard, r.Body)
			arrived <- struct{}{}
			<-release
		}
		benchUpstream(w, r)
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	h := idemproxy(t, target, false, paymentsSigning(t))
	serveOnce(t, h, largePost(target.Host, "warm"), false) // pools, connections, the store

	before := liveHeap()
	var wg sync.WaitGroup
	for i := range parked {
		r := largePost(target.Host, fmt.Sprint("held-", i))
		r.Header.Set("X-Park", "1")
		wg.Go(func() {
			if err := serveCheck(h, r, false); err != nil {
				t.Error(err)
			}
		})
	}
	for range parked {
		<-arrived
	}
	held := liveHeap() - before
	close(release)
	wg.Wait()

	perRequest := float64(held) / parked
	t.Logf("live heap per parked request: %.0f bytes, %.2f× its %d-byte body", perRequest, perRequest/largeBodySize, largeBodySize)
	if perRequest > 1.25*largeBodySize {
		t.Errorf("each parked request holds %.2f× its body; want one copy (≤ 1.25×)", perRequest/largeBodySize)
	}
}

func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// BenchmarkLargeBody sends protected POSTs with 1 MiB JSON bodies through
// the whole proxy, signed over the body, and reports the bytes allocated per
// request as a multiple of the body size ("body-x"): reading the body once
// into one slice costs 1×, fingerprinting its JSON one more transient copy.
func BenchmarkLargeBody(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(benchUpstream))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	h := idemproxy(b, target, false, paymentsSigning(b))
	b.ReportAllocs()
	b.SetBytes(largeBodySize)
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	n := 0
	for b.Loop() {
		n++
		serveOnce(b, h, largePost(target.Host, "large-"+strconv.Itoa(n)), false)
	}
	runtime.ReadMemStats(&ms1)
	b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(n)/largeBodySize, "body-x")
}
