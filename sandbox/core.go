package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"time"
)

// core is what every provider shares: clock, randomness, ledger and hook.
type core struct {
	now    func() time.Time
	rng    *lockedRand
	ledger *ledger
	hook   func(Operation)
}

// newCore builds the shared parts from cfg.
func newCore(cfg Config) *core {
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &core{now: now, rng: newLockedRand(cfg.Seed), ledger: newLedger(), hook: cfg.ExecuteHook}
}

// execute runs the hook, then create; when create reports that it executed,
// the operation is recorded in the ledger with the reply it produced.
func (c *core) execute(op Operation, create func() (reply, bool)) reply {
	if c.hook != nil {
		c.hook(op)
	}
	rep, executed := create()
	if executed {
		c.ledger.record(op, c.now(), rep)
	}
	return rep
}

// timestamp formats t as the providers' created_at ("2026-10-07T09:13:02Z").
func (c *core) timestamp() string {
	return c.now().UTC().Format(time.RFC3339)
}

// lockedRand is a seeded generator safe for concurrent use.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

// newLockedRand returns a generator whose sequence depends only on seed.
func newLockedRand(seed int64) *lockedRand {
	s := uint64(seed)
	return &lockedRand{r: rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))}
}

// Float64 returns a number in [0, 1).
func (l *lockedRand) Float64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

// IntN returns a number in [0, n).
func (l *lockedRand) IntN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}

// hit reports whether an event of probability p happens.
func (l *lockedRand) hit(p float64) bool {
	return p > 0 && l.Float64() < p
}

// uuid returns a version 4 UUID drawn from the seeded generator, so ids
// repeat from run to run like the faults do.
func (l *lockedRand) uuid() string {
	l.mu.Lock()
	hi, lo := l.r.Uint64(), l.r.Uint64()
	l.mu.Unlock()
	hi = hi&^0xf000 | 0x4000     // version 4
	lo = lo&^(0xc<<60) | 0x8<<60 // RFC 4122 variant
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x",
		hi>>32, hi>>16&0xffff, hi&0xffff, lo>>48, lo&0xffffffffffff)
}

// flights is the set of ids whose operations are executing, guarded by the
// owning provider's mutex. Each id maps to a channel closed when it ends.
type flights map[string]chan struct{}

// busy reports whether any non-empty id is in flight.
func (f flights) busy(ids ...string) bool {
	for _, id := range ids {
		if _, ok := f[id]; ok && id != "" {
			return true
		}
	}
	return false
}

// await waits until id is not in flight. mu is held on entry and on return;
// it is released while waiting. It fails only when ctx ends first.
func (f flights) await(ctx context.Context, mu *sync.Mutex, id string) error {
	for {
		ch, ok := f[id]
		if !ok {
			return nil
		}
		mu.Unlock()
		select {
		case <-ch:
			mu.Lock()
		case <-ctx.Done():
			mu.Lock()
			return fmt.Errorf("await %q: %w", id, ctx.Err())
		}
	}
}

// start marks the non-empty ids in flight (mu held) and returns the function
// that ends the flight; that function takes mu itself.
func (f flights) start(mu *sync.Mutex, ids ...string) (end func()) {
	ch := make(chan struct{})
	var mine []string
	for _, id := range ids {
		if id != "" {
			f[id] = ch
			mine = append(mine, id)
		}
	}
	return func() {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range mine {
			delete(f, id)
		}
		close(ch)
	}
}

// fields is a request body decoded one level deep.
type fields map[string]json.RawMessage

// decodeFields decodes a JSON object; an empty body is an empty object.
func decodeFields(body []byte) (fields, error) {
	f := fields{}
	if len(strings.TrimSpace(string(body))) == 0 {
		return f, nil
	}
	if err := json.Unmarshal(body, &f); err != nil {
		return nil, fmt.Errorf("decode body: %w", err)
	}
	return f, nil
}

// str returns a string or number field as text; "" when absent or another type.
func (f fields) str(name string) string {
	raw, ok := f[name]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// amount returns a positive decimal field (a JSON string or number) as its
// text and value; ok is false when it is absent, malformed or not positive.
func (f fields) amount(name string) (text string, value *big.Rat, ok bool) {
	text = f.str(name)
	if !decimalText.MatchString(text) {
		return "", nil, false
	}
	value, _ = new(big.Rat).SetString(text)
	if value.Sign() <= 0 {
		return "", nil, false
	}
	return text, value, true
}

// decimalText is a plain decimal amount such as "25" or "57.0464"; big.Rat
// alone would also take fractions, exponents and hex.
var decimalText = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// decimal formats v with at most four decimals and no trailing zeros.
func decimal(v *big.Rat) string {
	s := v.FloatString(4)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}
