//go:build !linux

package main

// dataDirPlace is "" off Linux: no container's layer or volume is told apart
// there.
func dataDirPlace(string) string { return "" }
