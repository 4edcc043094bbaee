package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is the kernel's USER_HZ, the unit of utime and stime in
// /proc/<pid>/stat.
var clockTicks = func() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && n > 0 {
			return float64(n)
		}
	}
	return 100 // Linux's USER_HZ on every common architecture
}()

// statFields returns the fields of /proc/<pid>/stat after the command name
// (field 3, the state, is index 0).
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	// The command name is in parentheses and may contain spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	return strings.Fields(string(b[i+1:])), nil
}

// tree returns pid and every descendant (nginx runs a master and workers).
func tree(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := statFields(p)
		if err != nil || len(f) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			children[pp] = append(children[pp], p)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// cpuSeconds returns user+system CPU time of pids, in seconds.
func cpuSeconds(pids []int) float64 {
	var ticks float64
	for _, p := range pids {
		f, err := statFields(p)
		if err != nil || len(f) < 13 {
			continue
		}
		// utime and stime are fields 14 and 15 of the file.
		u, _ := strconv.ParseFloat(f[11], 64)
		s, _ := strconv.ParseFloat(f[12], 64)
		ticks += u + s
	}
	return ticks / clockTicks
}

// resetPeak resets VmHWM of pids (clear_refs 5, Linux 4.0+), so the peak
// read after a phase is that phase's. It reports whether every reset worked.
func resetPeak(pids []int) bool {
	ok := true
	for _, p := range pids {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p), []byte("5"), 0); err != nil {
			ok = false
		}
	}
	return ok
}

// statusKB returns the sum over pids of a kB field of /proc/<pid>/status
// (VmRSS, VmHWM). For several processes (nginx) shared pages count once per
// process, so the sum is an upper bound.
func statusKB(pids []int, field string) int64 {
	var sum int64
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				sum += n
			}
		}
	}
	return sum
}

// dirSize is the size of a directory tree: apparent (sum of file sizes) and
// allocated on disk (what du reports; Badger's mmapped files are sparse).
type dirSize struct {
	Apparent, Allocated int64
	Files               int
	ByExt               map[string]int64 // allocated bytes per extension (.sst, .vlog, .mem)
}

func sizeOf(dir string) dirSize {
	ds := dirSize{ByExt: map[string]int64{}}
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		ds.Files++
		ds.Apparent += info.Size()
		alloc := allocated(info)
		ds.Allocated += alloc
		ds.ByExt[filepath.Ext(path)] += alloc
		return nil
	})
	return ds
}

func (d dirSize) String() string {
	return fmt.Sprintf("%.1f MiB on disk (%.1f MiB apparent, %d files; sst %.1f, vlog %.1f, mem %.1f MiB)",
		mib(d.Allocated), mib(d.Apparent), d.Files, mib(d.ByExt[".sst"]), mib(d.ByExt[".vlog"]), mib(d.ByExt[".mem"]))
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
