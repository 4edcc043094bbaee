// Command upstream is the benchmark's minimal provider: it answers every
// request at once with a small JSON body, so that what the harness measures
// is the cost of whatever sits in front of it. POST bodies are read whole, as
// a real provider reads them.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

// payment is the answer to every request: the size of a typical provider
// reply (an id, a status and a few fields).
const payment = `{"id":"pay_2c4f9a1e7b3d4e8f","object":"payment","status":"succeeded","amount":1000,"currency":"RUB","created":1732900000}`

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	// The harness reads the chosen address from the first line of stdout.
	fmt.Println(ln.Addr().String())
	os.Stdout.Sync()
	srv := &http.Server{Handler: http.HandlerFunc(answer), ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.Serve(ln))
}

func answer(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(payment))}
	io.WriteString(w, payment)
}
