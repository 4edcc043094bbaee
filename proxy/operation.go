package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/internal/heldbody"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// result is what a protected request answers: a stored or fresh upstream response,
// or the error of a sequence that gave no final answer.
type result struct {
	resp     store.Response
	replayed bool
	err      error
	// report of the attempt sequence behind a fresh answer or error: its
	// disposition (retry.Policy.Dispose decided it) and attempts; zero for a
	// replay.
	report retry.Report
}

// superseded is obtain's error for a record whose order an operator moved to
// its next key generation: the caller derives that generation's key.
type superseded struct{ rec store.Record }

func (superseded) Error() string { return "the order was renewed to its next key generation" }

// obtain returns the answer for key id: a replay of a stored final response, the
// result of a new upstream operation this request starts, or the result of one in
// flight that it waits for. Only one operation per key runs at a time.
// *upstreamKey is the key to send upstream, kept in the record: a claim
// that resumes a record sent under another key (IDEMPROXY_KEY_SECRET
// differs between replicas, or was changed while the record was unknown or
// in flight) sets it to the record's, since the provider may have run the
// operation under that key and a new one would be a second charge.
//
// Without a request slot (t, past MaxInflight) only a stored final answer is
// replayed; anything else is refused overloaded before the key is claimed.
// A request that waits for its key in flight gives its slot back while it
// waits (it sends nothing), and takes one again before it claims the key;
// if none is free then, it is answered as one past MaxInflight.
func (h *Handler) obtain(r *http.Request, id store.ID, upstreamKey *string, fp, body []byte, t *ticket) (result, error) {
	ctx := r.Context()
	if !t.slot {
		return h.replayOnly(ctx, id, fp)
	}
	deadline := h.opt.Now().Add(h.opt.InflightWait)
	owner := newOwner()
	req := store.Request{Fingerprint: fp, Method: r.Method, Path: r.URL.EscapedPath(), UpstreamKey: *upstreamKey}
	held := false // the key was seen in flight for another request
	for {
		if !t.slot && !t.takeSlot() { // given back while it waited
			return h.replayOnly(ctx, id, fp)
		}
		if h.flights.wait(id) != nil {
			// This process runs the key: whatever the clocks say about its
			// lease (a VM resume, an NTP step), never take it over.
			held = true
			t.giveSlot()
			if err := h.awaitOwn(ctx, id, fp, deadline); err != nil {
				return result{}, err
			}
			continue
		}
		if h.graceIsOver() { // the process exits at the end of the grace: nothing more is started
			return result{}, ErrShutdownNotSent
		}
		claimed := time.Now() // the lease ends no sooner than a lease after this
		rec, created, err := h.opt.Store.Begin(ctx, id, req, owner, h.opt.Lease)
		if err != nil {
			if ctx.Err() != nil { // the client left; the store is fine
				return result{}, ctx.Err()
			}
			if held {
				// Not free: its operation was in flight for another
				// request (here or on another replica), and may still run.
				h.opt.Logger.Error("claiming the key in the store failed while waiting for its operation in flight elsewhere; nothing sent by this request, the operation may be running or done: the app's retry with the same key gets its result once the store answers (/readyz says why it does not)",
					"method", r.Method, "path", r.URL.Path, "key", id.Key, "err", err)
				return result{}, storeErrorWaiting{err}
			}
			h.opt.Logger.Error("claiming the key in the store failed; nothing sent, key left free: the app's retry proceeds once the store takes writes again (/readyz says why it does not)",
				"method", r.Method, "path", r.URL.Path, "key", id.Key, "err", err)
			return result{}, storeError{err}
		}
		if created {
			if rec.UpstreamKey != "" && rec.UpstreamKey != *upstreamKey {
				h.opt.Logger.Warn("resuming an operation under the upstream key it was first sent with, not this process's binding of its key: IDEMPROXY_KEY_SECRET differs between replicas or was changed",
					"method", r.Method, "path", r.URL.Path, "key", id.Key, "upstream_key", rec.UpstreamKey, "this_binding", *upstreamKey)
				*upstreamKey = rec.UpstreamKey
			}
			before := resumed(rec)
			before.Sent = h.firstSent(r, id, fp, before.Sent, t)
			return h.start(r, id, owner, claimed, *upstreamKey, body, before, rec.ReadAt, t), nil
		}
		if rec.State == store.Final && rec.Superseded {
			return result{}, superseded{rec}
		}
		if !bytes.Equal(rec.Fingerprint, fp) {
			return result{}, ErrConflict
		}
		if rec.State == store.Final {
			return result{resp: rec.Response, replayed: true}, nil
		}
		held = true
		t.giveSlot()
		if err := h.awaitOther(ctx, id, deadline); err != nil {
			return result{}, err
		}
	}
}

// resumed is what earlier attempt sequences left for the one a claim
// starts: the record's Outcome. A record taken over in flight (Fence past
// 1; its owner died or stalled mid-sequence, so it parked nothing) is an
// operation whose outcome is unknown too: an attempt may have reached the
// provider. Its re-send then goes through the status probe and the
// key-retention check, with the claim time as the first send, the earliest
// it may have been (so that the retention check errs towards not sending),
// also when its Outcome holds attempts or an error but no first send.
func resumed(rec store.Record) store.Outcome {
	o := rec.Outcome
	if rec.Fence > 1 && o.FirstSentAt.IsZero() {
		o.FirstSentAt = rec.CreatedAt
	}
	return o
}

// firstSent returns sent, the request as first sent for a record this
// request resumes, if it has this request's fingerprint fp: the bytes the
// resume sends (see store.Outcome.Sent). Else nil, and the resume sends
// this request's own bytes, as before stores kept them: a record that kept
// none, or one whose bytes do not give this request's fingerprint (this
// build never keeps such bytes, but a build that computed fingerprints
// otherwise may have, in a rolling update: sent with this request's key,
// another request's bytes would be another operation), or bytes that cannot
// be decoded now.
func (h *Handler) firstSent(r *http.Request, id store.ID, fp []byte, sent *store.Sent, t *ticket) *store.Sent {
	if sent == nil {
		return nil
	}
	var coding http.Header
	if sent.ContentEncoding != "" {
		coding = http.Header{"Content-Encoding": {sent.ContentEncoding}}
	}
	plain, _, err := decodedBody(coding, sent.Body, h.opt.MaxBodyBytes, t)
	if err == nil {
		got := idemkey.Fingerprint(idemkey.Request{Method: r.Method, Path: r.URL.EscapedPath(), RawQuery: r.URL.RawQuery,
			ContentType: sent.ContentType, Body: plain})
		if bytes.Equal(got[:], fp) {
			return sent
		}
		err = errors.New("the kept bytes are another request's")
	}
	h.opt.Logger.Warn("resuming an operation whose outcome is unknown with this request's bytes, not those first sent",
		"method", r.Method, "path", r.URL.Path, "key", id.Key, "reason", err.Error())
	return nil
}

// sentOf is what a record keeps of the request a sequence sent (body,
// and resend when it re-sent the bytes first sent), for its resume
// (store.Outcome.Sent): nil if the sequence sent nothing, or if the body is
// larger than a record's body may be (store.Store.MaxBodyBytes), so that
// the record can still be written.
func (h *Handler) sentOf(r *http.Request, body []byte, resend *store.Sent, attempts int) *store.Sent {
	if resend != nil {
		return resend
	}
	if attempts == 0 || int64(len(body)) > h.opt.Store.MaxBodyBytes() {
		return nil
	}
	return &store.Sent{Body: bytes.Clone(body),
		ContentType:     strings.Join(r.Header.Values("Content-Type"), ", "),
		ContentEncoding: strings.Join(r.Header.Values("Content-Encoding"), ", ")}
}

// replayOnly answers a request past MaxInflight: the stored final answer
// of its key if there is one for this request, else ErrOverloaded. It reads
// the record and writes nothing, so the key stays free.
func (h *Handler) replayOnly(ctx context.Context, id store.ID, fp []byte) (result, error) {
	rec, err := h.opt.Store.Get(ctx, id)
	if err == nil && rec.State == store.Final && !rec.Superseded && bytes.Equal(rec.Fingerprint, fp) {
		return result{resp: rec.Response, replayed: true}, nil
	}
	return result{}, ErrOverloaded
}

// awaitOwn answers a request for a key this process is running: a conflict
// at once for another body (as Begin would), else a wait for the operation.
func (h *Handler) awaitOwn(ctx context.Context, id store.ID, fp []byte, deadline time.Time) error {
	if rec, err := h.opt.Store.Get(ctx, id); err == nil && !bytes.Equal(rec.Fingerprint, fp) {
		return ErrConflict
	}
	if err := h.awaitOther(ctx, id, deadline); err != nil {
		return err
	}
	return nil
}

// awaitOther waits until the operation in flight for id (run by this process or
// another replica) may have ended, or the wait bound passes. Another replica's
// operation gives no local signal, so it polls the record with reads, which
// cost a shared store far less than claims; the caller claims again only once
// the record is no longer in flight under a live lease.
func (h *Handler) awaitOther(ctx context.Context, id store.ID, deadline time.Time) error {
	for {
		left := deadline.Sub(h.opt.Now())
		if left <= 0 {
			return h.inProgress
		}
		t := time.NewTimer(min(left, 100*time.Millisecond))
		select {
		case <-h.flights.wait(id):
			t.Stop()
			return nil
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-h.graceOver: // the process exits at the end of the grace
			t.Stop()
			return h.inProgress
		}
		rec, err := h.opt.Store.Get(ctx, id)
		// Any doubt (an error, a lease that may have run out by the store's
		// clock) goes back to Begin, which decides. The lease is judged by
		// the store's lease clock (the database's for a shared store), never
		// this process's: behind it, a dead replica's key would wait out the
		// wait bound and answer 409 though its lease was over; ahead, every
		// poll would be a claim.
		if err != nil || !rec.LeaseLive(h.opt.Now()) {
			return nil
		}
	}
}

// start runs the upstream operation for id detached from the client, on a
// goroutine of detached's (kept from an earlier operation or new): once sent, it finishes and is stored even
// if the client goes away (docs/contract.md). The caller waits for its
// result unless its own context ends first.
//
// before is what earlier sequences of this key left: non-zero when the record
// was parked with its outcome unknown, so the first attempt is a re-send.
// readAt is the claimed record's ReadAt: the store's time at the claim, for
// a store whose clock is not this process's (see run).
func (h *Handler) start(r *http.Request, id store.ID, owner string, claimed time.Time, upstreamKey string, body []byte, before store.Outcome, readAt time.Time, t *ticket) result {
	f := h.flights.open(id)
	h.ops.Add(1)
	t.hold() // the operation holds its slot and body bytes until it ends
	detached.run(func() {
		defer h.ops.Done()
		defer t.release()
		defer h.flights.close(id, f) // after f.res is set
		f.res = h.run(r, id, owner, claimed, upstreamKey, body, before, readAt, &f.lease)
	})
	select {
	case <-f.done:
		return f.res
	case <-r.Context().Done():
		return result{err: r.Context().Err()}
	case <-h.graceOver:
		select {
		case <-f.done: // ended meanwhile: its own answer
			return f.res
		default:
			return result{err: ErrShutdownRunning}
		}
	}
}

// run performs the attempt sequence and records its outcome: a final response is
// completed in the store before anyone sees it; a sequence after which the
// provider may have acted, or whose final answer could not be stored, parks
// the record as unknown; anything else releases the key. Either way the next request resumes with the same key.
func (h *Handler) run(r *http.Request, id store.ID, owner string, claimed time.Time, upstreamKey string, body []byte, before store.Outcome, readAt time.Time, l *leaseRenewal) result {
	ctx := context.WithoutCancel(r.Context())
	call := retry.Call{Mode: retry.Protected}
	if !readAt.IsZero() {
		// A shared store's clock (the database's) is not this process's:
		// the first send the record holds, which the key retention check
		// counts from, and the one this sequence records are times of the
		// store's clock, tied to this one at the claim (retry.StoreClock),
		// so that a replica whose clock is off the database's neither
		// records a first send that far off nor counts one's age by it.
		call.Store = &retry.StoreClock{At: readAt, Since: time.Since(claimed)}
	}
	if !before.IsZero() {
		call.Resume = &retry.Resume{FirstSentAt: before.FirstSentAt, LastBody: before.LastBody}
	}
	// A resume sends the bytes first sent, which the provider may hold
	// under the key, not this request's (store.Outcome.Sent).
	resend := before.Sent
	if resend != nil {
		body = resend.Body
	}
	res, lost := h.leased(ctx, l, id, owner, claimed, func(stop *retry.Stop) result {
		call.Stop = stop
		return h.roundTrip(ctx, r, upstreamKey, body, resend, call)
	})
	if lost { // the new owner answers the app's retry; this one may not write
		why := "another replica took the key over" // l.taken is settled: leased has stopped the renewals
		if !l.taken {
			why = "the lease ran out with no renewal reaching the store; another replica may take the key over"
		}
		h.opt.Logger.Warn("lease lost mid-operation: this replica stopped its attempts and stored nothing, the app answered in progress; "+
			"the replica that takes the key over resumes it with the same key",
			"method", r.Method, "path", r.URL.Path, "key", id.Key, "attempts", res.report.Attempts,
			"first_sent_at", res.report.FirstSentAt, "reason", why)
		return result{err: leaseLost{busy: h.inProgress, attempts: res.report.Attempts}}
	}
	if o, unknown := unknownOutcome(res); unknown {
		if res.report.Attempts == 0 && before.LastError != "" {
			// Nothing was sent (the key retention refused the re-send): the
			// record keeps what the provider last did, which is what an
			// operator checks with it before resolving the operation.
			o.LastError = before.LastError
			if res.err != nil {
				h.opt.Logger.Warn("operation whose outcome is unknown not re-sent",
					"method", r.Method, "path", r.URL.Path, "key", id.Key, "reason", res.err.Error())
			}
		}
		o.Sent = h.sentOf(r, body, resend, res.report.Attempts)
		h.park(ctx, r, id, owner, o)
		return res
	}
	if res.err == nil && res.report.Disposition == retry.Final {
		// Its body is scanned for needs_review once, here, not by the
		// store (its expiry) and again by the metrics.
		res.resp = res.resp.WithReview()
		err := h.opt.Store.Complete(ctx, id, owner, res.resp, res.report.FirstSentAt)
		if err == nil {
			return res
		}
		if !errors.Is(err, store.ErrTooLarge) {
			return h.unstored(ctx, r, id, owner, res, h.sentOf(r, body, resend, res.report.Attempts), err)
		}
		// Refusing it would refuse it on every retry for ever: the app gets
		// the provider's answer unstored, and its retry reaches the
		// provider again with the same key.
		h.opt.Logger.Warn("final response too large for a record (headers included); passed on unstored, key released",
			"method", r.Method, "path", r.URL.Path, "key", id.Key, "status", res.resp.Status)
	}
	if ex := (*retry.ExhaustedError)(nil); errors.As(res.err, &ex) {
		// Nothing executed: no attempt reached the provider, or every
		// answer refused it. The app's 502 says so; this line says why, so
		// that a name that does not resolve or a certificate that does not
		// verify is not taken for a provider that is down.
		h.opt.Logger.Warn("upstream request failed: nothing executed, key released",
			"method", r.Method, "path", r.URL.Path, "key", id.Key, "attempts", ex.Attempts, "err", res.err.Error())
	}
	if err := h.opt.Store.Abandon(ctx, id, owner); err != nil {
		h.opt.Logger.Error("releasing in-flight record failed: its record stays in flight until its lease ends or the next start (PostgreSQL releases it once the database answers), then the app's retry with the same key resumes it; /readyz says why the store refused",
			"method", r.Method, "path", r.URL.Path, "key", id.Key, "err", err)
	}
	return res
}

// unstored ends a sequence whose final answer the store refused (err, not
// store.ErrTooLarge): the app gets 503 store_unavailable saying the
// operation may have run, with the attempts made. The provider did run it,
// so the record is parked as unknown, never released: released, the app's
// retry would be a first send, with no status probe and no key retention
// check, and a provider that has forgotten the key by then would execute it
// again. The answer's body is kept for the status probe's {resp.…}
// placeholders (a payment id), and the request as sent (sent) for the
// resume. A lost lease (store.ErrNotOwner) writes nothing: the new owner
// answers the app's retry.
func (h *Handler) unstored(ctx context.Context, r *http.Request, id store.ID, owner string, res result, sent *store.Sent, err error) result {
	out := result{err: storeAfterSend{res.report.Attempts}}
	if errors.Is(err, store.ErrNotOwner) {
		h.opt.Logger.Error("storing the final response failed after the upstream answered: the lease was lost; the new owner resumes the key",
			"method", r.Method, "path", r.URL.Path, "key", id.Key, "status", res.resp.Status, "err", err)
		return out
	}
	h.opt.Logger.Error("storing the final response failed after the upstream answered; keeping the operation as unknown: it may have run, and the app's retry with the same key resumes it (the status probe, or the same key sent again), never a new key; /readyz says why the store refused",
		"method", r.Method, "path", r.URL.Path, "key", id.Key, "status", res.resp.Status, "err", err)
	o := store.Outcome{
		FirstSentAt: res.report.FirstSentAt,
		Attempts:    res.report.Attempts,
		LastError: "status " + strconv.Itoa(res.resp.Status) +
			" from upstream, but the answer could not be stored: " + err.Error(),
		LastBody: lastBody(res.resp.Body),
		SentAnew: res.report.SentAnew,
		Sent:     sent,
	}
	if res.resp.Header.Get(retry.ReconciledHeader) != "" {
		// The status probe's answer: the record keeps the earlier ambiguous
		// answer the probe was filled from.
		o.LastBody = lastBody(res.report.LastBody)
	}
	h.park(ctx, r, id, owner, o)
	return out
}

// unknownOutcome says whether a sequence ended with the operation's outcome
// unknown (the attempt layer's disposition, retry.Unknown), and what to keep
// of it.
func unknownOutcome(res result) (store.Outcome, bool) {
	rep := res.report
	if rep.Disposition != retry.Unknown {
		return store.Outcome{}, false
	}
	o := store.Outcome{FirstSentAt: rep.FirstSentAt, Attempts: rep.Attempts, LastBody: lastBody(rep.LastBody), SentAnew: rep.SentAnew}
	if res.err != nil {
		o.LastError = res.err.Error()
	} else {
		o.LastError = "status " + strconv.Itoa(res.resp.Status) + " from upstream"
	}
	return o, true
}

// lastBody is what the record keeps of an ambiguous answer's body for the
// status probe's {resp.…} placeholders on resume: its first
// store.MaxLastBody bytes, copied (the answer's buffer is not the record's).
func lastBody(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return bytes.Clone(b[:min(len(b), store.MaxLastBody)])
}

// park keeps the record in state unknown with what is known of the attempts.
// If that fails the record stays in flight, never deleted: a store may park
// it later (pgstore does once the database answers), else it is taken over
// once its lease ends, or released as unknown at the next start (Badger),
// and resumed with the same key like an unknown one, its claim time standing
// in for its first send.
func (h *Handler) park(ctx context.Context, r *http.Request, id store.ID, owner string, o store.Outcome) {
	if err := h.opt.Store.Park(ctx, id, owner, o); err != nil {
		h.opt.Logger.Error("keeping an operation whose outcome is unknown failed: its record stays in flight and the operation may have run; the app's retry with the same key is answered in progress until the record's lease ends or the next start, then resumes it as unknown (PostgreSQL parks it once the database answers); /readyz says why the store refused",
			"method", r.Method, "path", r.URL.Path, "key", id.Key, "err", err)
		return
	}
	h.opt.Logger.Warn("operation outcome unknown: kept for the next request with its key",
		"method", r.Method, "path", r.URL.Path, "key", id.Key, "attempts", o.Attempts,
		"first_sent_at", o.FirstSentAt, "last_error", o.LastError)
}

// leased runs op while renewing owner's lease on id every third of the lease.
// If the lease is lost (another replica took the key over after this one
// stalled), op's attempt sequence is stopped (retry.Stop, which op passes as
// retry.Call.Stop) so that no further attempt is sent, and lost is true: the
// new owner runs the operation, with the same key. So it is when no renewal
// reached the store for a whole lease (this replica cut off from the
// database, its renewals failing): no attempt starts past the end of the
// lease this replica knows it holds, a lease after the claim or the last
// renewal was sent (claimed, then each renewal's send), which comes before
// the store's own end of it, when another replica may take the key over. A retry.Stop, not a
// cancellable context: it costs an attempt a few uncontended locks, and no
// allocation, where a context would cost every attempt's context a
// registration with it.
//
// Renewals run on a timer (time.AfterFunc), not a goroutine and a ticker
// per operation: most operations end long before their first renewal. l
// holds the renewal's state; it lives in the operation's flight, which is
// allocated anyway.
func (h *Handler) leased(ctx context.Context, l *leaseRenewal, id store.ID, owner string, claimed time.Time, op func(*retry.Stop) result) (res result, lost bool) {
	*l = leaseRenewal{h: h, ctx: ctx, id: id, owner: owner, next: time.Now().Add(h.opt.Lease / 3), held: claimed.Add(h.opt.Lease)}
	l.stop.Until(l.held)
	l.mu.Lock()
	l.timer = time.AfterFunc(h.opt.Lease/3, l.renew)
	l.mu.Unlock()
	res = op(&l.stop)
	l.mu.Lock() // waits for a renewal in progress
	l.stopped = true
	l.timer.Stop()
	// Stopped by the lease's end, not only by a renewal that found it lost.
	// A lease that ran out with no renewal reaching the store, after the
	// sequence had ended (a renewal still waiting on the store when the
	// provider answered), loses nothing: nobody else holds the key unless a
	// write says so, and Complete and Park write only the owner's in-flight
	// record (store.ErrNotOwner once another replica took it over). Counted
	// as lost, the provider's answer was dropped and the app got 409
	// idempotency_in_progress, its retry sending the operation again.
	lost = l.taken || errors.Is(res.err, retry.ErrStopped)
	l.mu.Unlock()
	return res, lost
}

// leaseRenewal renews one operation's lease until stopped.
type leaseRenewal struct {
	h     *Handler
	ctx   context.Context // for the renewals
	stop  retry.Stop      // the operation's attempt sequence
	id    store.ID
	owner string

	mu      sync.Mutex // held while a renewal runs
	timer   *time.Timer
	next    time.Time // when the current renewal was due: renewals keep a third of the lease apart, as a ticker would
	held    time.Time // the end of the lease as this process knows it: a lease after the last claim or renewal that succeeded was sent
	stopped bool
	taken   bool // a renewal found the record no longer this owner's
}

func (l *leaseRenewal) renew() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	h, period := l.h, l.h.opt.Lease/3
	rctx, rcancel := context.WithTimeout(l.ctx, period)
	sent := time.Now()
	err := h.opt.Store.Renew(rctx, l.id, l.owner, h.opt.Lease)
	rcancel()
	if errors.Is(err, store.ErrNotOwner) {
		h.opt.Logger.Warn("lease lost to another owner; stopping this operation's attempts", "key", l.id.Key)
		l.taken = true
		l.stop.Stop()
		return
	}
	if err == nil {
		l.held = sent.Add(h.opt.Lease)
		l.stop.Until(l.held)
	} else if !time.Now().Before(l.held) {
		// Another replica may take the key over now: the attempt in
		// progress is cut and none follows.
		h.opt.Logger.Warn("lease ran out with no renewal reaching the store; stopping this operation's attempts",
			"key", l.id.Key, "err", err)
		l.stop.Stop()
		return
	} else {
		h.opt.Logger.Warn("renewing the lease failed; retrying", "key", l.id.Key, "err", err)
	}
	// The next renewal is due a third of the lease after this one was due,
	// however long this one took (at once if that has passed).
	l.next = l.next.Add(period)
	l.timer.Reset(max(time.Until(l.next), 0))
}

// roundTrip runs call's attempt sequence (retry.Transport.Do) and returns
// the answer with the sequence's report: its disposition
// (retry.Policy.Dispose: Final is stored, PassOn is not) and its attempts.
// Retriable failures it could not overcome are an error. No ReverseProxy and
// no recorder: the attempt layer already holds the whole answer in memory,
// so the outbound request is built here (outbound) and the answer taken as
// it comes.
func (h *Handler) roundTrip(ctx context.Context, r *http.Request, key string, body []byte, resend *store.Sent, call retry.Call) result {
	call.Body = body // every attempt sends these bytes, not a copy
	out := h.outbound(ctx, r, body, outgoingKey{value: key})
	if resend != nil { // the bytes first sent go with the headers that say how to read them
		setOrDelete(out.Header, "Content-Type", resend.ContentType)
		setOrDelete(out.Header, "Content-Encoding", resend.ContentEncoding)
	}
	resp, rep, err := h.opt.Transport.Do(out, call)
	if errors.Is(err, retry.ErrResponseTooLarge) {
		err = answerTooLarge{err: err, attempts: rep.Attempts}
	}
	if err != nil {
		return result{err: err, report: rep}
	}
	b, held := heldbody.Unread(resp.Body) // the attempt layer's bytes, not a copy
	if !held {
		b, err = io.ReadAll(resp.Body)
	}
	resp.Body.Close()
	if err != nil {
		return result{err: err, report: rep}
	}
	return result{resp: store.Response{Status: resp.StatusCode, Header: answerHeader(resp), Body: b},
		report: rep}
}

// setOrDelete sets h's name to v, or deletes it when v is empty.
func setOrDelete(h http.Header, name, v string) {
	if v == "" {
		h.Del(name)
		return
	}
	h.Set(name, v)
}

// replayedTrue is the ReplayedHeader value of every replay, shared: nothing
// writes into a header's value slice in place.
var replayedTrue = []string{"true"}

// writeResult sends res to the client.
func writeResult(w http.ResponseWriter, res result, key string, sum *Summary) {
	h := w.Header()
	set := h[KeyHeader] // serveProtected set it to key already: kept, not allocated again
	for k, v := range res.resp.Header {
		h[k] = v
	}
	// The app sees its own key, also where the provider echoes the upstream
	// one, written so that it reads back as the key (idemkey.HeaderValue).
	if v := idemkey.HeaderValue(key); len(set) == 1 && set[0] == v {
		h[KeyHeader] = set
	} else {
		h.Set(KeyHeader, v)
	}
	if res.replayed {
		h[ReplayedHeader] = replayedTrue
	}
	sum.settle(res, nil)
	w.WriteHeader(res.resp.Status)
	w.Write(res.resp.Body)
}
