//go:build !linux

package main

import (
	"errors"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

func pinProcesses(*pgtest.Cluster, []int) error {
	return errors.New("setting a process's CPUs is implemented on Linux only")
}
