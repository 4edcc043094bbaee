package main

import (
	"os"
	"strings"
	"testing"
)

// Lines of /proc/self/mountinfo as a container sees them, each with the
// place a data directory on it is: the container's layer, an anonymous or a
// named Docker volume, a tmpfs, and the kubelet's bind mounts of an emptyDir
// on the node's disk, of a persistent volume and of an emptyDir with medium
// Memory.
func TestDataDirPlaceOfMounts(t *testing.T) {
	const root = "981 803 0:88 / / rw,relatime master:420 - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/A:/var/lib/docker/overlay2/l/B,upperdir=/var/lib/docker/overlay2/x/diff\n"
	for _, c := range []struct {
		name, line, want string
	}{
		{"no mount of its own", "", "layer"},
		{"anonymous volume", "990 981 254:1 /var/lib/docker/volumes/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef/_data /data rw,relatime - ext4 /dev/vda rw\n", "anonymous"},
		{"named volume", "990 981 254:1 /var/lib/docker/volumes/idemproxy-data/_data /data rw,relatime - ext4 /dev/vda rw\n", ""},
		{"docker --tmpfs", "990 981 0:95 / /data rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=1777\n", "memory"},
		{"ramfs", "990 981 0:95 / /data rw,relatime - ramfs ramfs rw\n", "memory"},
		{"emptyDir", "990 981 259:1 /var/lib/kubelet/pods/6b0c7c1e-2f4a-4d8e-9a57-0c1f3a0b9d11/volumes/kubernetes.io~empty-dir/data /data rw,relatime - ext4 /dev/nvme0n1p1 rw\n", "emptydir"},
		{"emptyDir medium Memory", "990 981 0:96 / /data rw,relatime - tmpfs tmpfs rw,size=1048576k\n", "memory"},
		{"persistent volume", "990 981 259:5 / /data rw,relatime - ext4 /dev/nvme1n1 rw\n", ""},
		{"persistent volume, kubelet path", "990 981 259:1 /var/lib/kubelet/pods/6b0c7c1e-2f4a-4d8e-9a57-0c1f3a0b9d11/volumes/kubernetes.io~csi/pvc-1/mount /data rw - ext4 /dev/nvme0n1p1 rw\n", ""},
	} {
		m, ok := mountIn(root+c.line, "/data/idemproxy")
		if !ok {
			t.Errorf("%s: no mount found", c.name)
			continue
		}
		if got := placeOf(m); got != c.want {
			t.Errorf("%s: place %q, want %q (mount %+v)", c.name, got, c.want, m)
		}
	}
}

// A data directory on a tmpfs (here /dev/shm, a tmpfs on Linux) is lost at
// the next restart: the binary starts, serves, and logs one WARN naming the
// variable and the directory and saying the answers are in memory.
func TestBinaryWarnsOfADataDirInMemory(t *testing.T) {
	if m, ok := mountOf("/dev/shm"); !ok || m.fstype != "tmpfs" {
		t.Fatalf("/dev/shm is %+v (found %v), want a tmpfs for this test", m, ok)
	}
	dir, err := os.MkdirTemp("/dev/shm", "idemproxy-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := launch(t, launchSpec{env: baseEnv("http://127.0.0.1:1", dir)})
	line := p.waitLine(t, `"variable":"IDEMPROXY_DATA_DIR"`)
	if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, "in memory") ||
		!strings.Contains(line, "lost") || jsonField(line, "dir") != dir {
		t.Errorf("warning line %s; want WARN saying the directory %s is in memory and what is lost", line, dir)
	}
}
