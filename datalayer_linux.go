package main

import (
	"os"
	"strings"
	"syscall"
)

// onOverlay reports whether dir is on the root file system and that is an
// overlay (kernel overlayfs, or fuse-overlayfs where Docker runs rootless or
// on a file system overlayfs cannot stack on): in a container (Docker,
// Podman, containerd), the image's writable layer, which goes with the
// container when it is removed or re-created. A volume or a bind mount is a
// mount of its own, on another device.
func onOverlay(dir string) bool {
	var d, root syscall.Stat_t
	if syscall.Stat(dir, &d) != nil || syscall.Stat("/", &root) != nil || d.Dev != root.Dev {
		return false
	}
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	fstype := ""
	// proc(5): "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw";
	// the last mount on / is the one in effect.
	for _, line := range strings.Split(string(raw), "\n") {
		fields := strings.Fields(line)
		_, after, ok := strings.Cut(line, " - ")
		if ok && len(fields) > 4 && fields[4] == "/" {
			fstype, _, _ = strings.Cut(after, " ")
		}
	}
	return strings.Contains(fstype, "overlay")
}
