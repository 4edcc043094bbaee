package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// machine describes where the run happened; figures mean little without it.
type machine struct {
	CPUModel   string `json:"cpu_model"`
	CPUs       int    `json:"cpus"`
	MemTotal   string `json:"mem_total"`
	Kernel     string `json:"kernel"`
	GoVersion  string `json:"go_version"`
	Nginx      string `json:"nginx"`
	DataFS     string `json:"data_fs"`
	LoadBefore string `json:"loadavg_before"`
	LoadAfter  string `json:"loadavg_after"`
}

func (m machine) String() string {
	return fmt.Sprintf("%d × %s, %s RAM, Linux %s, %s, %s; data on %s; load average before: %s",
		m.CPUs, m.CPUModel, m.MemTotal, m.Kernel, m.GoVersion, m.Nginx, m.DataFS, m.LoadBefore)
}

func describeMachine(o *options) machine {
	m := machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), LoadBefore: loadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		m.MemTotal = strings.Join(strings.Fields(strings.TrimPrefix(line, "MemTotal:")), " ")
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.Nginx = "nginx not installed"
	if o.nginx != "" {
		if out, err := exec.Command(o.nginx, "-v").CombinedOutput(); err == nil {
			m.Nginx = strings.TrimSpace(strings.TrimPrefix(string(out), "nginx version: "))
		}
	}
	if out, err := exec.Command("df", "-T", o.out).Output(); err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if f := strings.Fields(lines[len(lines)-1]); len(f) > 1 {
			m.DataFS = f[1] + " (" + f[0] + ")"
		}
	}
	return m
}

// loadAvg is the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
