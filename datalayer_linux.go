package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// mount is the line of /proc/self/mountinfo (proc(5)) for the mount a
// directory is on: root is the path of the mounted directory in its own file
// system (a Docker volume's is /var/lib/docker/volumes/<name>/_data), point
// where it is mounted.
type mount struct {
	root, point, fstype string
}

// mountOf returns the mount dir is on: of the mounts whose point holds dir's
// resolved absolute path, the deepest, and of those at one point the last
// mounted (the one in effect). ok is false where /proc cannot be read.
func mountOf(dir string) (m mount, ok bool) {
	path, err := filepath.Abs(dir)
	if err == nil {
		path, err = filepath.EvalSymlinks(path)
	}
	raw, rerr := os.ReadFile("/proc/self/mountinfo")
	if err != nil || rerr != nil {
		return m, false
	}
	return mountIn(string(raw), path)
}

// mountIn is mountOf on the text of a mountinfo file, for a resolved
// absolute path.
func mountIn(mountinfo, path string) (m mount, ok bool) {
	// "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw"
	for _, line := range strings.Split(mountinfo, "\n") {
		fields := strings.Fields(line)
		_, after, sep := strings.Cut(line, " - ")
		if !sep || len(fields) < 5 {
			continue
		}
		point := unescapeMountinfo(fields[4])
		if point != "/" && path != point && !strings.HasPrefix(path, point+"/") {
			continue
		}
		if ok && len(point) < len(m.point) {
			continue
		}
		fstype, _, _ := strings.Cut(after, " ")
		m, ok = mount{root: unescapeMountinfo(fields[3]), point: point, fstype: fstype}, true
	}
	return m, ok
}

// unescapeMountinfo undoes the octal escapes mountinfo writes for space,
// tab, newline and backslash.
func unescapeMountinfo(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// anonymousVolume matches the root of a volume Docker or Podman made without
// a name (a VOLUME of the image that `docker run` was given no -v for): a
// directory named by 64 hex digits.
var anonymousVolume = regexp.MustCompile(`/volumes/[0-9a-f]{64}/_data$`)

// emptyDir matches the root of a Kubernetes emptyDir volume on the node's
// disk: the kubelet's directory for it, which goes with the pod.
var emptyDir = regexp.MustCompile(`/pods/[^/]+/volumes/kubernetes\.io~empty-dir/`)

// dataDirPlace says where dir is when that place does not outlive its
// process, container or pod: "layer", the container's own writable layer
// (the root file system, an overlay: kernel overlayfs, or fuse-overlayfs
// where Docker runs rootless or on a file system overlayfs cannot stack on);
// "anonymous", a volume made without a name; "memory", a file system in
// memory (tmpfs or ramfs: docker run --tmpfs, an emptyDir with medium
// Memory, /dev/shm), gone at the next restart; "emptydir", a Kubernetes
// emptyDir on the node's disk, gone when the pod is (a rolling update, a
// node drain); "" otherwise (a named volume, a persistent volume, a bind
// mount, a host's disk).
func dataDirPlace(dir string) string {
	m, ok := mountOf(dir)
	if !ok {
		return ""
	}
	return placeOf(m)
}

func placeOf(m mount) string {
	switch {
	case m.point == "/" && strings.Contains(m.fstype, "overlay"):
		return "layer"
	case m.fstype == "tmpfs" || m.fstype == "ramfs":
		return "memory"
	case anonymousVolume.MatchString(m.root):
		return "anonymous"
	case emptyDir.MatchString(m.root + "/"):
		return "emptydir"
	}
	return ""
}
