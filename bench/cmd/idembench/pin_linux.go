package main

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// pinProcesses sets the CPUs of the cluster's running processes.
func pinProcesses(c *pgtest.Cluster, cpus []int) error {
	pids, err := c.Pids()
	if err != nil {
		return err
	}
	var set unix.CPUSet
	for _, n := range cpus {
		set.Set(n)
	}
	for _, pid := range pids {
		// A process that has exited meanwhile (an autovacuum worker) is
		// no matter.
		if err := unix.SchedSetaffinity(pid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("process %d: %w", pid, err)
		}
	}
	return nil
}
