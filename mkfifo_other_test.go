//go:build !unix

package main

import "errors"

// mkfifo makes a named pipe at path; off Unix there is none to make.
func mkfifo(string) error { return errors.New("no named pipes off Unix") }
