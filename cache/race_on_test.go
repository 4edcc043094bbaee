//go:build race

package cache

// raceEnabled: the race detector changes what escapes, so allocation counts
// differ under it.
const raceEnabled = true
