package imagetest

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestImageWarnsOfADataDirInTheContainerLayer: IDEMPROXY_DATA_DIR set blank
// (an env file's `IDEMPROXY_DATA_DIR=` left empty: the default ./data, in the
// image's working directory) or to a directory no volume is mounted on puts
// the store in the container's own writable layer; `docker run` with no -v
// for /data puts it on an anonymous volume, which the next container (an
// upgrade: docker rm, docker run) does not get. Either starts and serves,
// and every stored answer goes with the container; repeats of those orders
// then reach the provider again. The start logs it at WARN, naming the
// variable and the directory; the image's /data on a named volume is not
// warned of.
func TestImageWarnsOfADataDirInTheContainerLayer(t *testing.T) {
	t.Parallel()
	img := need(t)
	for _, c := range []struct {
		name string
		args []string
		dir  string // "" = no warning
		says string // in the message
	}{
		{"blank", []string{"-e", "IDEMPROXY_DATA_DIR="}, "/home/nonroot/data", "writable layer"},
		{"no volume there", []string{"-e", "IDEMPROXY_DATA_DIR=/tmp/idemproxy"}, "/tmp/idemproxy", "writable layer"},
		{"anonymous volume", []string{"--read-only"}, "/data", "anonymous volume"},
		{"tmpfs on /data", []string{"--read-only", "--tmpfs", "/data:rw,mode=1777"}, "/data", "in memory"},
		{"named volume on /data", []string{"--read-only", "-v", volume(t) + ":/data"}, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"--cap-drop", "ALL", "-e", "IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1"}, c.args...)
			name := container(t, "layer", append(args, img.proxy)...)
			waitLog(t, name, `"msg":"idemproxy listening"`, 1)
			var warned []string
			for _, line := range strings.Split(logs(name), "\n") {
				if strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, "IDEMPROXY_DATA_DIR") {
					warned = append(warned, line)
				}
			}
			if c.dir == "" {
				if len(warned) > 0 {
					t.Fatalf("a data directory on a named volume was warned of: %s", warned)
				}
				return
			}
			if len(warned) != 1 {
				t.Fatalf("%d WARN lines naming IDEMPROXY_DATA_DIR, want 1:\n%s", len(warned), logs(name))
			}
			var l struct {
				Msg, Variable, Dir string
			}
			if err := json.Unmarshal([]byte(warned[0]), &l); err != nil || l.Variable != "IDEMPROXY_DATA_DIR" ||
				l.Dir != c.dir || !strings.Contains(l.Msg, c.says) || !strings.Contains(l.Msg, "lost") || !strings.Contains(l.Msg, "-v idemproxy-data:/data") {
				t.Fatalf("WARN line %s (%v); want variable IDEMPROXY_DATA_DIR, dir %s, and a message saying %q, what is lost and what to mount", warned[0], err, c.dir, c.says)
			}
		})
	}
}
