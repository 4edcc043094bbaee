//go:build race

package idemkey

// raceEnabled: under the race detector sync.Pool drops items at random, so
// allocation counts are not the real ones.
const raceEnabled = true
