// Command plainproxy is the benchmark's baseline B: a plain
// httputil.ReverseProxy to one upstream with a transport tuned the way
// idemproxy tunes its own (keep-alive pool large enough for the load), and
// nothing else: no keys, no store, no retries, no signing.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"

	"github.com/idemproxy/idemproxy/upstream"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	base := flag.String("upstream", "", "upstream base URL (required)")
	flag.Parse()
	target, err := url.Parse(*base)
	if err != nil || target.Host == "" {
		log.Fatalf("plainproxy: -upstream %q is not an absolute URL", *base)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr().String())
	os.Stdout.Sync()
	srv := &http.Server{Handler: newProxy(target), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	log.Fatal(srv.Serve(ln))
}

// newProxy is the baseline reverse proxy. Its transport is idemproxy's wire
// transport (upstream.NewWire), so the comparison is of what idemproxy adds,
// not of pool sizes.
func newProxy(target *url.URL) *httputil.ReverseProxy {
	tr := upstream.NewWire()
	return &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: tr,
	}
}
