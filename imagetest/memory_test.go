package imagetest

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// TestImageWarnsOfABodyCapTooBigForTheMemory: run with --memory 128m, a
// request body cap over a quarter of it (50 MiB: one such body got the
// process killed in a 128 MiB container) is logged at WARN at start, naming
// IDEMPROXY_MAX_BODY_BYTES and the limit the process found in its cgroup; the
// default cap (1 MiB) in the same container is not.
func TestImageWarnsOfABodyCapTooBigForTheMemory(t *testing.T) {
	t.Parallel()
	img := need(t)
	const limit = 128 << 20
	for _, c := range []struct {
		name string
		cap  int64 // 0: the default
		warn bool
	}{
		{"50 MiB cap", 50 << 20, true},
		{"default cap", 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--memory", "128m",
				"-v", volume(t) + ":/data", "-e", "IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1"}
			if c.cap > 0 {
				args = append(args, "-e", "IDEMPROXY_MAX_BODY_BYTES="+strconv.FormatInt(c.cap, 10))
			}
			name := container(t, "bodycap", append(args, img.proxy)...)
			waitLog(t, name, `"msg":"idemproxy listening"`, 1)
			var warned []string
			for _, line := range strings.Split(logs(name), "\n") {
				if strings.Contains(line, "IDEMPROXY_MAX_BODY_BYTES") && strings.Contains(line, `"level":"WARN"`) {
					warned = append(warned, line)
				}
			}
			if !c.warn {
				if len(warned) > 0 {
					t.Fatalf("the default cap in a 128 MiB container was warned of: %s", warned)
				}
				return
			}
			if len(warned) != 1 {
				t.Fatalf("%d WARN lines naming IDEMPROXY_MAX_BODY_BYTES, want 1:\n%s", len(warned), logs(name))
			}
			var l struct {
				Msg       string `json:"msg"`
				Variable  string `json:"variable"`
				MaxBody   int64  `json:"max_body_bytes"`
				Container int64  `json:"container_memory_limit"`
			}
			if err := json.Unmarshal([]byte(warned[0]), &l); err != nil || l.Variable != "IDEMPROXY_MAX_BODY_BYTES" ||
				l.MaxBody != c.cap || l.Container != limit || !strings.Contains(l.Msg, "memory") {
				t.Fatalf("WARN line %s (%v); want variable IDEMPROXY_MAX_BODY_BYTES, max_body_bytes %d, container_memory_limit %d",
					warned[0], err, c.cap, limit)
			}
		})
	}
}
