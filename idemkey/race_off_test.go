//go:build !race

package idemkey

const raceEnabled = false
