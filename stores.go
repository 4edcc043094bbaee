package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/metrics"
	"github.com/idemproxy/idemproxy/pgstore"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/ratelimit"
	"github.com/idemproxy/idemproxy/store"
)

// openStore opens the record store the configuration names and returns it
// with the in-flight lease to use on it: Badger in DATA_DIR (one process;
// what a crashed process left in flight is released at once), or the
// PostgreSQL database at STORE_URL shared by replicas (short leases, renewed
// while an operation runs, and taken over once they run out).
func openStore(ctx context.Context, cfg config, set settings, m *metrics.Metrics, log *slog.Logger) (store.Store, time.Duration, error) {
	if set.storeURL != "" {
		s, err := pgstore.Open(ctx, pgstore.Options{URL: set.storeURL, TTL: cfg.RecordTTL, Logger: log,
			OnOrphansParked: m.Released})
		if err != nil {
			return nil, 0, fmt.Errorf("open the store at %sSTORE_URL: %w", envPrefix, err)
		}
		log.Info("record store: PostgreSQL, shared by replicas", "lease", cfg.StoreLease.String())
		if !s.Migrated() {
			log.Warn(fmt.Sprintf("the database at %sSTORE_URL cannot be reached yet: not ready until it can be (the schema is created then)", envPrefix))
		}
		return s, cfg.StoreLease, nil
	}
	s, err := cache.Open(storeOptions(cfg, log))
	if err != nil {
		err = fmt.Errorf("open data directory %sDATA_DIR=%s: %w", envPrefix, cfg.DataDir, err)
		return nil, 0, denied(err, "write in it",
			"give the directory and everything in it to that user, with write permission (a bind mount: chown -R %[1]d:%[2]d on the host, and chmod u+rwx on the directory)")
	}
	warnDataDirPlace(cfg.DataDir, log)
	m.StoreSize(s.Size)
	m.StorePageOuts(s.PageOuts)
	if err := releaseInFlight(s, m, log); err != nil {
		s.Close()
		return nil, 0, err
	}
	return s, cfg.lease(), nil
}

// warnDataDirPlace warns of a data directory that goes with its container:
// in the container's own writable layer (DATA_DIR set blank, so ./data in
// the working directory, or a path no volume is mounted on), or on an
// anonymous volume (docker run with no -v for the image's /data), in memory
// (tmpfs), or on a Kubernetes emptyDir. The store
// works there, but every stored answer is gone once the container is, and
// the repeats of those orders reach the provider again.
func warnDataDirPlace(dir string, log *slog.Logger) {
	var where string
	switch dataDirPlace(dir) {
	case "layer":
		where = "in the container's own writable layer (the root overlay file system), not on a volume: every stored answer is lost when the container is removed or re-created"
	case "anonymous":
		where = "on an anonymous volume (docker run with no -v for it): the next container, after an upgrade or any docker rm and docker run, gets a new empty one, and docker run --rm or docker rm -v deletes it; every stored answer is lost with it"
	case "memory":
		where = "in memory (tmpfs or ramfs: docker run --tmpfs, a Kubernetes emptyDir with medium Memory, /dev/shm), not on a disk: every stored answer is lost at the next restart of the container or the machine"
	case "emptydir":
		where = "on a Kubernetes emptyDir volume, which is deleted with its pod: every stored answer is lost at the next rolling update, eviction or node drain"
	default:
		return
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	log.Warn("the data directory is "+where+", and repeats of those orders reach the provider again; "+
		"mount a named volume on it, e.g. -v idemproxy-data:/data (the image's data directory), or in Kubernetes a PersistentVolumeClaim",
		"variable", envPrefix+"DATA_DIR", "dir", dir)
}

// shareThrottle makes the gate's pause and rate limit the provider's, held
// in the database together with the other replicas: a Retry-After pause
// reaches them all, and RATE_LIMIT is their total. While the database cannot
// be reached, the gate works alone with its share of the rate (see
// ratelimit.Gate.Shared). The store's close closes the throttle.
func shareThrottle(s *pgstore.Store, gate *ratelimit.Gate, set settings, log *slog.Logger) *pgstore.Throttle {
	upstream := set.upstream
	// The provider, without credentials or query: replicas of another
	// deployment on the same database have their own throttle.
	name := (&url.URL{Scheme: upstream.Scheme, Host: upstream.Host, Path: upstream.Path}).String()
	th := s.Throttle(pgstore.ThrottleOptions{
		Name: name,
		OnPause: func(d time.Duration, from string) {
			now := time.Now()
			known := gate.PausedUntil()
			if known.Before(now) {
				known = now
			}
			// Logged when another replica named itself, or when the pause
			// read is new here (not this replica's own, read back).
			if gate.PeerPause(now.Add(d)) && (from != "" || now.Add(d).Sub(known) > time.Second) {
				log.Warn("provider pause set by another replica: all outbound attempts wait",
					"replica", from, "pause_ms", millis(d))
			}
		},
		OnReplicas:  gate.SetReplicas,
		Keying:      keySettings(set),
		OnKeying:    keyingWarner(log),
		OnProviders: providersWarner(log),
	})
	gate.Shared = th
	gate.OnSharedError = func(err error) {
		switch {
		case gate.PacesAlone():
			log.Warn("provider throttle in the database unreachable: this replica paces alone with its share of the rate limit", "err", err)
		case gate.RateLimited():
			// No heartbeat yet: the share is not known, and the attempts
			// wait (ratelimit.Gate.SetReplicas).
			log.Warn("provider throttle in the database unreachable: this replica has had no heartbeat, so it does not know its share of the rate limit; "+
				"its attempts wait for the database, until their retry budget ends", "err", err)
		default:
			log.Warn("provider throttle in the database unreachable: a pause cannot reach the other replicas", "err", err)
		}
	}
	gate.OnSharedSlow = func(err error) {
		log.Warn("provider throttle in the database slow to answer: attempts wait for it, not pacing alone", "err", err)
	}
	return th
}

// countUnknown walks the store's unknown records: how many, and the earliest
// first send among them on now's clock (for the metrics; a shared store's
// first sends are of the database's clock and are carried over to now's). A record kept unknown whose value
// cannot be read (a newer version's, or damaged) counts, without a first
// send; a warning says how many there are whenever that number changes.
// bound, if not 0, bounds one walk (a shared store's, on a hung database).
func countUnknown(s store.Store, log *slog.Logger, now func() time.Time, bound time.Duration) func(ctx context.Context) (int, time.Time, error) {
	var mu sync.Mutex
	warned := 0 // unreadable unknown records found by the last scan that ended
	return func(ctx context.Context) (int, time.Time, error) {
		if bound > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, bound)
			defer cancel()
		}
		n, oldest, cursor := 0, time.Time{}, ""
		var unreadable []string
		for {
			recs, next, err := s.List(ctx, store.Filter{State: store.Unknown}, cursor, 1000)
			if err != nil {
				return 0, time.Time{}, err
			}
			for _, r := range recs {
				n++
				if r.Unreadable != nil {
					name := "store key " + r.Unreadable.StoreKey
					if r.ID.Key != "" {
						name = keptKeys([]store.ID{r.ID})[0]
					}
					unreadable = append(unreadable, name)
					continue
				}
				t := r.Outcome.FirstSentAt
				if t.IsZero() {
					continue
				}
				// A shared store's first send is a time of its clock (the
				// database's), which ReadAt is of too: carried over to this
				// process's clock, the age is counted by the database's
				// clock, whatever this host's is off by.
				if !r.ReadAt.IsZero() {
					t = t.Add(now().Sub(r.ReadAt))
				}
				if oldest.IsZero() || t.Before(oldest) {
					oldest = t
				}
			}
			if next == "" {
				mu.Lock()
				defer mu.Unlock()
				if len(unreadable) != warned {
					warned = len(unreadable)
					if warned > 0 {
						log.Warn("unknown records whose value cannot be read are counted in idemproxy_operations_unknown without a first send: "+
							"their operations may have reached the provider, and requests with their keys get 503 store_unavailable with nothing sent",
							"count", warned, "records", unreadable[:min(len(unreadable), maxKeptKeys)])
					}
				}
				return n, oldest, nil
			}
			cursor = next
		}
	}
}

// unknownScanBound bounds a walk of the unknown records (countUnknown): 10 s
// on a shared store, whose database may hang (the walk's figures then wait
// for the next one); none on Badger, whose walk of millions of records takes
// tens of seconds and ends.
func unknownScanBound(s store.Store) time.Duration {
	if _, shared := s.(*pgstore.Store); shared {
		return 10 * time.Second
	}
	return 0
}

// releaseInFlight frees the records a crashed process left in flight. One
// process owns a Badger directory, so every in-flight record here is dead: the
// first retry then resumes at once with the same key. A shared store must not
// do this: its in-flight records may be other replicas' live operations.
//
// On a disk below the store's free-space reserve a record cannot be
// rewritten: it stays in flight (kept), never deleted, since its operation
// may have reached the provider. The start goes on, and a line names those
// records: each is taken over once its dead owner's lease has run out, by
// the app's retry with the same request, and resumed as an operation whose
// outcome is unknown, or released at the next start with space.
//
// A record whose value cannot be read (a newer version's, or damaged) is
// left as it is, neither released nor deleted, and a warning names it: the
// requests for its key are refused with nothing sent until an operator
// settles it (cache.Store.ReleaseInFlight).
func releaseInFlight(s *cache.Store, m *metrics.Metrics, log *slog.Logger) error {
	rel, err := s.ReleaseInFlight()
	n, kept := rel.Released, rel.Kept
	// The crash metric counts every in-flight record a dead process left,
	// those that could not be released included, so that its alert fires
	// for a crash found on a full disk too.
	found := n + len(kept)
	for _, d := range rel.Damaged {
		if d.State == store.InFlight {
			found++
		}
	}
	m.Released(found)
	logDamaged(rel.Damaged, log)
	if err != nil {
		return fmt.Errorf("release in-flight records: %w", err)
	}
	level := slog.LevelInfo
	if n > 0 {
		level = slog.LevelWarn // a crash or a kill left them
	}
	log.Log(context.Background(), level, "released in-flight records left by a previous process", "count", n)
	if len(kept) > 0 {
		log.Warn("in-flight records left by a previous process kept in flight: the disk is below the store's free-space reserve, "+
			"so they could not be marked unknown; their operations may have reached the provider. "+
			"Each is taken over as unknown by the app's retry once the dead process's lease has run out (the next start with space releases them); "+
			"free space, and see `idemproxy records list --state in_flight`",
			"count", len(kept), "keys", keptKeys(kept))
	}
	return nil
}

// logDamaged names the records whose value the release could not read.
func logDamaged(damaged []cache.Damaged, log *slog.Logger) {
	if len(damaged) == 0 {
		return
	}
	names := make([]string, 0, min(len(damaged), maxKeptKeys))
	for _, d := range damaged[:min(len(damaged), maxKeptKeys)] {
		name := "store key " + d.StoreKey
		if d.ID.Key != "" {
			name = keptKeys([]store.ID{d.ID})[0]
		}
		names = append(names, fmt.Sprintf("%s (%s): %v", name, d.State, d.Err))
	}
	log.Warn("records left by a previous process whose value cannot be read kept as they are, neither released nor deleted: "+
		"their operations may have reached the provider. Requests with their keys get 503 store_unavailable and nothing is sent. "+
		"A newer version wrote them if idemproxy was downgraded: start that version again; otherwise settle each operation with the provider",
		"count", len(damaged), "records", names)
}

// maxKeptKeys bounds the keys the kept-in-flight line names.
const maxKeptKeys = 20

// keptKeys names up to maxKeptKeys records for a log line: the key, and the
// client when it is not the default one.
func keptKeys(ids []store.ID) []string {
	keys := make([]string, 0, min(len(ids), maxKeptKeys))
	for _, id := range ids[:min(len(ids), maxKeptKeys)] {
		k := id.Key
		if id.Tenant != proxy.DefaultTenant {
			k += " (client " + id.Tenant + ")"
		}
		keys = append(keys, k)
	}
	return keys
}

// closeStore closes s by end, the shutdown grace's end (zero: within
// storeCloseBound), and logs "store closed" when it did.
func closeStore(s store.Store, log *slog.Logger, end time.Time) error {
	bound := storeCloseBound
	if !end.IsZero() {
		bound = max(time.Until(end), 0)
	}
	done := make(chan error, 1)
	go func() {
		if ps, ok := s.(*pgstore.Store); ok && !end.IsZero() {
			// Its connections to a hung database are cut in time.
			done <- ps.CloseBy(end)
			return
		}
		done <- s.Close()
	}()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("close store: %w", err)
		}
	case <-t.C:
		// Badger's Close retries a failing memtable flush forever (a data
		// directory removed, a dead volume). Every acknowledged write is
		// already synced in its WAL, so leaving without the flush loses
		// nothing: the next start replays the WAL.
		if !end.IsZero() {
			return errors.New("close store: not closed by the end of the shutdown grace; exiting without it")
		}
		return fmt.Errorf("close store: not closed after %s; exiting without it", storeCloseBound)
	}
	log.Info("store closed")
	return nil
}

// storeCloseBound bounds the store's Close when it closes without a
// shutdown (a listener that could not open); at shutdown it ends by the
// grace's end (see closeReserve).
const storeCloseBound = 3 * time.Second

// keySettings is a digest of the settings that decide a protected
// request's key and the records it is kept under: the protected methods,
// the key sources, the routes (a preset's included) and whether client
// tokens are on. Replicas of one provider must agree on it: a retry that
// reaches a replica deriving another key is a new operation for the
// provider. The key secret is left out (a digest of it would be a way to
// test guesses of it): a resumed operation keeps the upstream key it was
// first sent with whatever the secret.
func keySettings(set settings) string {
	methods := slices.Clone(set.protected)
	slices.Sort(methods)
	sources := make([]string, len(set.sources))
	for i, src := range set.sources {
		sources[i] = src.String()
	}
	h := sha256.New()
	fmt.Fprintf(h, "protected %q\nsources %q\nroutes %q\nclients %t\n",
		methods, sources, set.routes.String(), set.clients != nil)
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// keyingWarner is the throttle's OnKeying: an error whenever the replicas
// of this provider with other key settings change, and a note when none
// are left.
func keyingWarner(log *slog.Logger) func(others []string) {
	return mismatchWarner(log, "replicas",
		"replicas of this provider on this database derive keys with other settings: an order whose retry "+
			"reaches one of them gets another key, which the provider takes for a new operation (a second charge); give every replica "+
			"the same "+envPrefix+"KEY_SOURCES, "+envPrefix+"ROUTES, "+envPrefix+"PRESET, "+envPrefix+"PROTECTED_METHODS and "+
			envPrefix+"CLIENT_TOKENS (on or off)",
		"the replicas of this provider have the same key settings again")
}

// providersWarner is the throttle's OnProviders: an error whenever the
// other providers whose replicas use this database change, and a note when
// none are left. Records are kept by tenant and key only, so an order sent
// through both deployments with one key gets the other provider's answer.
func providersWarner(log *slog.Logger) func(others []string) {
	return mismatchWarner(log, "providers",
		"replicas in front of other providers use this database: records are shared between the providers, so an "+
			"Idempotency-Key (or a derived key) sent through both gets the other provider's stored answer and is never executed "+
			"at this one; give each provider's deployment its own database ("+envPrefix+"STORE_URL). If this is the same provider "+
			"under a new URL, ignore until the rollout ends",
		"no replicas in front of other providers use this database any more")
}

// mismatchWarner logs msg as an error, with the others under key, whenever
// the set of others a heartbeat reports changes, and gone as a note when it
// empties.
func mismatchWarner(log *slog.Logger, key, msg, gone string) func(others []string) {
	var last []string
	return func(others []string) {
		if slices.Equal(others, last) {
			return
		}
		last = others
		if len(others) == 0 {
			log.Info(gone)
			return
		}
		log.Error(msg, key, others)
	}
}
