package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestStandardLoggerLinesAreJSON: what net/http's transport writes through
// the standard logger comes as a WARN JSON line like every other. A provider
// that answers a 204 with a body leaves bytes no request asked for on the
// upstream connection, and the transport said so in plain text
// ("2026/12/04 12:31:07 Unsolicited response received on idle HTTP
// channel ..."), a line a log pipeline reading JSON drops or chokes on.
func TestStandardLoggerLinesAreJSON(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		bw.WriteString("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
		bw.Flush()
		time.Sleep(100 * time.Millisecond)
		bw.WriteString(`{"status":"deleted"}`) // after the answer: on an idle connection
		bw.Flush()
		time.Sleep(200 * time.Millisecond)
	}))
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir())
	resp, err := http.Get("http://" + p.addr + "/v1/statements/s1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("answer %d, want the provider's 204", resp.StatusCode)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(p.logText(), "Unsolicited response") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	found := false
	for _, line := range strings.Split(strings.TrimSpace(p.logText()), "\n") {
		var rec struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("a log line is not JSON: %q", line)
			continue
		}
		if strings.Contains(rec.Msg, "Unsolicited response") {
			found = true
			if rec.Level != "WARN" {
				t.Errorf("the transport's line is at %s, want WARN: %q", rec.Level, line)
			}
		}
	}
	if !found {
		t.Errorf("no line about the unsolicited bytes:\n%s", p.logText())
	}
}
