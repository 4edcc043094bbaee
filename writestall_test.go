package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// A client that asks for an answer and does not read it makes the write
// fail once it has waited the stall, so the handler ends and gives back its
// request slot and the connection. Before, the write waited for ever:
// measured on the binary with IDEMPROXY_MAX_INFLIGHT=4, four clients that
// asked for a 64 MiB statement and read nothing held every slot, and every
// payment after them got 503 overloaded until they hung up. A client that
// reads slowly, but reads, gets its whole answer.
func TestWriteStallEndsUnreadAnswer(t *testing.T) {
	const stall = 500 * time.Millisecond
	ended := make(chan error, 2)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		size := 64 << 20
		if r.URL.Path == "/slow" {
			size = 2 << 20
		}
		w.Header().Set("Content-Length", fmt.Sprint(size))
		chunk := make([]byte, 32<<10)
		var err error
		for sent := 0; sent < size && err == nil; sent += len(chunk) {
			if _, err = w.Write(chunk); err == nil {
				err = http.NewResponseController(w).Flush()
			}
		}
		ended <- err
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, pl, _ := proxyServer(l, handler, 16, stall, slog.New(slog.DiscardHandler))
	go srv.Serve(pl)
	defer srv.Close()

	idle, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	io.WriteString(idle, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n") // and never read
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("64 MiB written to a client that reads nothing")
		}
	case <-time.After(time.Minute):
		t.Fatal("the write to a client that reads nothing still waits")
	}

	slow, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	slow.SetDeadline(time.Now().Add(time.Minute))
	io.WriteString(slow, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(slow), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got int64
	buf := make([]byte, 16<<10)
	for {
		n, err := resp.Body.Read(buf)
		got += int64(n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("slow reader, after %d bytes: %v", got, err)
		}
		time.Sleep(stall / 25)
	}
	if err := <-ended; err != nil || got != 2<<20 {
		t.Errorf("slow reader got %d bytes, the handler ended with %v; want all 2 MiB written", got, err)
	}
}
