// Package store is the contract between idemproxy's request path and its
// record stores: the types, the errors and the semantics every store keeps.
// cache (Badger, embedded, one process) and pgstore (PostgreSQL, shared by
// replicas) implement it; storetest.Run checks an implementation against it.
//
// A record is keyed by ID and moves through these states:
//
//	(none) --Begin--> InFlight --Complete--> Final
//	                     |  \----Abandon---> (none)
//	                     \------Park------> Unknown --Begin (same fingerprint)--> InFlight
//	                                           |  \----Resolve (executed)------> Final
//	                                           \-------Resolve (not executed)--> (none)
//
// A Final record whose answer needs review (Record.AwaitsReview) is kept
// without expiry until an operator marks it Reviewed; then it expires as any
// other Final record does.
//
// An in-flight record is leased to one owner token. Owner tokens are unique
// per Begin call (a random string), so they double as fencing tokens: once
// another Begin takes the record over, the old owner's Complete, Abandon,
// Renew and Park fail with ErrNotOwner and can never overwrite the new
// owner's answer. Record.Fence counts the claims for operators and tests.
package store

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// ID names one record: the client identity (tenant) and the idempotency key.
// An empty Tenant is a valid tenant of its own; Key must not be empty.
type ID struct {
	Tenant string
	Key    string
}

// WindowAnchorPrefix begins the key of every fingerprint-window anchor (the
// route policy fingerprint:<window>, docs/routes.md): a record that only
// says when the first request of a window period arrived. The proxy writes
// it with a Begin followed at once by a Complete, under a key no client can
// send (an Idempotency-Key cannot hold a newline), and sends nothing for it.
// A store that parks the in-flight records of a dead process as Unknown
// deletes an anchor instead (IsWindowAnchor): no operation stands behind it.
const WindowAnchorPrefix = "\nfingerprint-window/"

// IsWindowAnchor reports whether id is a fingerprint-window anchor's
// (WindowAnchorPrefix).
func IsWindowAnchor(id ID) bool { return strings.HasPrefix(id.Key, WindowAnchorPrefix) }

// State is the life-cycle stage of a record. The zero State is not valid.
type State uint8

const (
	// InFlight means an upstream operation is running for the key, leased to
	// Record.Owner until Record.LeaseUntil.
	InFlight State = 1
	// Final means a final response is stored and is replayed on repeats.
	// It expires TTL after its last write, unless it is superseded or its
	// answer awaits review (Record.Expires).
	Final State = 2
	// Unknown means an attempt sequence ended without a final answer after
	// the provider may have acted (a timeout or a 5xx after sending), or
	// with a final answer the store could not take (Complete failed). The
	// record is kept, with no owner and no expiry, until the next Begin with
	// the same fingerprint resumes it: forgotten, the operation would be sent
	// again as a new one, perhaps after the provider forgot its key.
	Unknown State = 3
)

// String returns "in_flight", "final", "unknown" or "state(N)" for logs and
// the admin API.
func (s State) String() string {
	switch s {
	case InFlight:
		return "in_flight"
	case Final:
		return "final"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Response is a stored final upstream response, replayed byte for byte.
// A nil Header or Body is stored and returned as empty.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// review is what WithReview found in Body; every copy carries it
	// (see Response.NeedsReview).
	review review
}

// Record is what a store keeps for one ID.
type Record struct {
	// ID is the tenant and key Begin was given. Records written before a
	// store kept it have a zero ID.
	ID    ID
	State State
	// Unreadable, when not nil, marks a record List found but whose stored
	// value cannot be read: only ID (zero if it could not be read either),
	// State and ExpiresAt hold anything.
	Unreadable *Unreadable
	// Fingerprint identifies the request (32 bytes from the proxy); a store
	// compares it only to decide a takeover.
	Fingerprint []byte
	// Owner is the owner token of the last claim; kept on Final and Unknown
	// records for diagnostics.
	Owner string
	// Fence is 1 for the claim that created the record and grows by one with
	// every takeover (an expired lease or an Unknown record resumed).
	Fence uint64
	// LeaseUntil is the in-flight lease's end, by the store's lease clock;
	// zero unless State is InFlight. Whether the lease is still live is
	// LeaseLive's to say: a shared store's lease clock is not its caller's.
	LeaseUntil time.Time
	// ReadAt is the time by the store's lease clock when the record was
	// read or written, for a store whose lease clock is not its callers'
	// (pgstore: the database's now()), so that LeaseUntil is compared with
	// a time of that clock, never with the caller's; zero from a store whose
	// lease clock is its caller's own (cache, one process).
	ReadAt time.Time
	// CreatedAt is when the first Begin created the record.
	CreatedAt time.Time
	// Response is the final answer; set only when State is Final.
	Response Response
	// Outcome describes earlier attempt sequences that ended without a final
	// answer (see Park). Takeovers keep it; zero if there were none.
	Outcome Outcome
	// Method and Path are the request's (the path escaped, without the
	// query), and UpstreamKey the idempotency key sent upstream for it (the
	// client's key bound to the client with tenancy): what Begin was given,
	// for operators. Records written before a store kept them have them empty.
	Method, Path, UpstreamKey string
	// ExpiresAt is when the record expires by the store's clock (its TTL
	// after its last write); zero when it never does (no TTL, or not
	// Expires: InFlight, Unknown, Superseded, or AwaitsReview). Stores may
	// round it to the second.
	ExpiresAt time.Time
	// Superseded marks a final record whose order an operator moved to its
	// next key generation (see Supersede): requests for the order use the
	// next generation's key. A superseded record never expires, so that the
	// order cannot fall back to an older key.
	Superseded bool
	// Reviewed marks a final record whose answer needs review (NeedsReview)
	// as settled by an operator (see Store.Reviewed): it no longer
	// AwaitsReview, and expires as any final record does. A record a Begin
	// creates anew (after its predecessor expired) is not Reviewed.
	Reviewed bool
}

// LeaseLive reports whether r is in flight under a lease that had not run
// out, by the store's lease clock, when r was read: LeaseUntil after
// ReadAt, or after now (the caller's clock) from a store that gives no
// ReadAt. A caller whose clock is behind a shared store's by more than a
// lease would otherwise see a lease live that the store already lets
// another Begin take over, and one whose clock is ahead a live lease over.
func (r *Record) LeaseLive(now time.Time) bool {
	if r.State != InFlight {
		return false
	}
	if !r.ReadAt.IsZero() {
		now = r.ReadAt
	}
	return r.LeaseUntil.After(now)
}

// Request is what Begin is told about the operation it claims a key for.
type Request struct {
	// Fingerprint identifies the request (32 bytes from the proxy); a store
	// compares it only to decide a takeover. Begin refuses an empty one. The
	// record Begin returns may share its bytes: the caller must not change
	// them afterwards.
	Fingerprint []byte
	// Method, Path and UpstreamKey are kept on the record as given (see
	// Record; a takeover keeps the record's UpstreamKey, see Begin); a store
	// does not interpret them.
	Method, Path, UpstreamKey string
}

// MaxLastBody is the most of an ambiguous answer's body an Outcome keeps
// (Outcome.LastBody); callers cut longer bodies to it.
const MaxLastBody = 64 << 10

// Outcome is what an owner knows about an attempt sequence that ended
// without a final answer; Park stores it.
type Outcome struct {
	// FirstSentAt is when a request for the key was first sent upstream; zero
	// if it never was. The store keeps the earliest non-zero value it is given.
	// It is a time of the store's lease clock (the one ReadAt is of, for a
	// store that gives ReadAt: the database's), as Complete's sent is: the
	// proxy ties it to the claim's ReadAt (retry.StoreClock), so that the key
	// retention check never counts with the clocks of two hosts.
	FirstSentAt time.Time
	// Attempts is the number of upstream attempts; the store adds each Park's
	// count to the record's total.
	Attempts int
	// LastError says why the last attempt gave no final answer, for
	// operators ("timeout after send", "504 from upstream"). Never a secret.
	LastError string
	// LastBody is the body of the last ambiguous answer the provider gave
	// (a 504's, say), at most MaxLastBody bytes; nil if none came (a
	// timeout). A status probe reads it to find the operation, e.g. by the
	// payment id the answer carried, also when the app's next request
	// comes to another replica.
	LastBody []byte
	// SentAnew says that the provider said the operation had not happened
	// (a status probe's 404) before this sequence sent it again, at
	// FirstSentAt: Park then keeps that FirstSentAt instead of the earlier
	// one, as a resolve not_executed starts the count afresh, since the
	// provider can have kept the key only from a send it saw; and LastBody,
	// none included, instead of the earlier answer's body, which filled a
	// probe the provider answered 404 (it names nothing the provider has,
	// and a later probe filled from it would be told 404 again whatever the
	// re-send did). A store does not keep SentAnew itself; it is false in
	// every Record.
	SentAnew bool
	// Sent is the request as it was first sent upstream for the key: its
	// body's bytes and the headers that say how to read them. A resume sends
	// these bytes again, not those of the request that resumes it: that
	// request has the same fingerprint but may differ in bytes (JSON members
	// in another order, other whitespace), and a provider that compares the
	// body under its key (409 idempotency_conflict) would refuse it, so that
	// the operation could never complete. nil when none was kept (a record
	// written before stores kept it, or one too large to hold it: the
	// resume then sends its own request's bytes). Park keeps the record's
	// Sent if it has one, else takes o's; Complete and Resolve drop it.
	Sent *Sent
}

// Sent is a request body as idemproxy sent it upstream (Outcome.Sent).
type Sent struct {
	// Body is the bytes sent; nil for a request without a body.
	Body []byte
	// ContentType and ContentEncoding are the request's headers of those
	// names as sent (a repeated header's values joined with ", "); empty
	// when it had none.
	ContentType, ContentEncoding string
}

// size is what s holds in bytes (Record.Size).
func (s *Sent) size() int {
	if s == nil {
		return 0
	}
	return len(s.Body) + len(s.ContentType) + len(s.ContentEncoding)
}

// IsZero reports whether o says nothing: no attempt sequence ended unknown.
func (o Outcome) IsZero() bool {
	return o.FirstSentAt.IsZero() && o.Attempts == 0 && o.LastError == "" && len(o.LastBody) == 0 && o.Sent == nil
}

// Merge returns o with next folded in as Park does: the earliest non-zero
// FirstSentAt, the sum of Attempts, next's LastError, and next's LastBody
// unless it has none (a timeout gives no answer, so the last answer is still
// the earlier one), and o's Sent unless it has none (the bytes first sent
// are the ones the provider may hold under the key). When next was sent
// anew (Outcome.SentAnew), its FirstSentAt, if any, and its LastBody, even
// none, replace o's.
func (o Outcome) Merge(next Outcome) Outcome {
	if o.Sent == nil {
		o.Sent = next.Sent
	}
	if o.FirstSentAt.IsZero() || !next.FirstSentAt.IsZero() && (next.SentAnew || next.FirstSentAt.Before(o.FirstSentAt)) {
		o.FirstSentAt = next.FirstSentAt
	}
	o.Attempts += next.Attempts
	o.LastError = next.LastError
	if len(next.LastBody) > 0 || next.SentAnew {
		o.LastBody = next.LastBody
	}
	return o
}

// MaxListBytes bounds what one List page holds (the sum of its records'
// Size), so that an operator's listing cannot take the memory the request
// path needs: a thousand stored answers of up to 1 MiB each would be a
// gigabyte. A page of one record may hold more (a record larger than it).
const MaxListBytes = 4 << 20

// Size is what r holds in variable-length fields, in bytes: the answer's
// body and headers, the last ambiguous body, the fingerprint and the
// strings. List budgets its pages by it (MaxListBytes).
func (r *Record) Size() int {
	n := len(r.ID.Tenant) + len(r.ID.Key) + len(r.Fingerprint) + len(r.Owner) +
		len(r.Method) + len(r.Path) + len(r.UpstreamKey) +
		len(r.Response.Body) + len(r.Outcome.LastBody) + len(r.Outcome.LastError) + r.Outcome.Sent.size()
	for k, vs := range r.Response.Header {
		n += len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	if r.Unreadable != nil {
		n += len(r.Unreadable.StoreKey)
	}
	return n
}

// Filter selects the records List returns.
type Filter struct {
	// State is the state of the records listed.
	State State
	// Keep, when not nil, further selects among the records in State (for
	// example final answers that say needs_review): List leaves out those it
	// returns false for. It must not change the record. A record whose value
	// cannot be read (Record.Unreadable) is listed in its State whatever
	// Keep would say: nothing in it can be judged.
	Keep func(*Record) bool
	// Bodies asks for the records' bodies: the answer's (Response.Body),
	// the last ambiguous one (Outcome.LastBody) and the request's as sent
	// (Outcome.Sent). Without it, List gives them nil and keeps none of them in memory past judging
	// (pgstore does not fetch them, but for a final answer's body that may
	// need review, which it judges and drops); Response.NeedsReview, and so
	// Record.AwaitsReview, still answers for the stored body
	// (Response.WithoutBody), also when Keep asks it. A page's bytes
	// (MaxListBytes) are those of the records as returned, so records
	// without their bodies come many more to a page.
	Bodies bool
	// Budget, when above 0, bounds how long one List call reads past
	// records it does not list: past it, List returns the page it has,
	// short or empty, with the cursor of the last record it read (records
	// listed count towards the time, but are at most limit), so that a listing whose
	// records are few among millions (f.Keep's needs_review among every
	// final answer) answers each call in about Budget, not in a scan of the
	// whole store that outlasts the caller's timeout. Each call looks at
	// one record (PostgreSQL: one batch) at least, so paging advances.
	Budget time.Duration
}

// Sentinel errors, matched with errors.Is. Any other error from a write
// means the record could not be written: the caller answers 503
// store_unavailable and sends nothing.
var (
	// ErrNotFound is returned by Get for a missing or expired record.
	ErrNotFound = errors.New("store: record not found")
	// ErrNotOwner is returned by Complete, Abandon, Renew and Park when the
	// owner does not hold the in-flight record: its lease was taken over, the
	// record is no longer in flight, or it is gone (expired or released); and
	// by Supersede when the record is another claim's than the one the
	// caller read.
	ErrNotOwner = errors.New("store: not the owner of the in-flight record")
	// ErrTooLarge is returned by Complete when the record would exceed the
	// store's size limit (see Store.MaxBodyBytes). Nothing is written.
	ErrTooLarge = errors.New("store: record too large")
	// ErrUnavailable wraps failures to reach the store (a database down, a
	// timeout): nothing was written, and the caller may retry later.
	ErrUnavailable = errors.New("store: unavailable")
	// ErrNoSpace is returned by writes refused because the store's disk is
	// nearly full.
	ErrNoSpace = errors.New("store: not enough free disk space")
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("store: closed")
	// ErrNotFinal is returned by Supersede when the record is in flight or
	// unknown: its outcome is not settled.
	ErrNotFinal = errors.New("store: record is not final")
	// ErrSuperseded is returned by Supersede when the record is superseded
	// already: another renew moved its order on first.
	ErrSuperseded = errors.New("store: record is superseded already")
	// ErrReadable is returned by Discard when the record's stored value
	// can be read: such a record is settled by the calls for its state,
	// never discarded.
	ErrReadable = errors.New("store: the record's stored value can be read")
	// ErrBadCursor is returned by List for a cursor it did not give.
	ErrBadCursor = errors.New("store: bad list cursor")
	// ErrNotUnknown is returned by Resolve when the record is not Unknown
	// at that moment: in flight (a request resumed it) or final.
	ErrNotUnknown = errors.New("store: record's outcome is not unknown")
	// ErrNoReview is returned by Reviewed when the record is final but its
	// answer does not need review (NeedsReview).
	ErrNoReview = errors.New("store: record's answer does not need review")
)

// Store is a durable record store. Implementations are safe for concurrent
// use, by goroutines and, for a shared store, by several processes.
//
// Time: a Final record expires TTL after its last write, by the store's
// clock, if it Expires; an InFlight or Unknown one never does (its
// operation may have reached the provider, and forgotten it would be sent
// again as a new one), nor does a Superseded one, nor one whose answer
// AwaitsReview (the provider settles its operation by hand, and a retry
// that reached a provider which forgot the key would run it again). Every
// write decides the expiry afresh by Record.Expires, Complete and Resolve
// included. An expired record is
// treated exactly like a missing one by every method. Leases are measured by
// the store's lease clock (the database's for a shared store), never by the
// caller's. A lease that ran out is lost only once another Begin takes the
// record over; until then its owner may still Complete, Abandon, Renew or
// Park it. A nil error from a write means the write is durable.
type Store interface {
	// Begin claims id for owner with a lease of the given length.
	//
	// With no live record, it creates an in-flight record {req's fields,
	// owner, Fence 1, CreatedAt now} and returns (it, true, nil). It takes
	// over, returning (record, true, nil) with the new owner and lease,
	// Fence increased and req's Method and Path, a record with
	// the same fingerprint req.Fingerprint that is either in flight with its
	// lease expired, or Unknown; the takeover keeps CreatedAt and Outcome, so
	// the new owner can tell that the key may already have been sent, and
	// UpstreamKey, the key the operation may have been sent with: the new
	// owner sends that one again, whatever key it would bind now. A record
	// with no UpstreamKey, or no Method (it is no operation but names one's
	// key, as a fingerprint window's anchor does, and the new owner decides
	// that key afresh), takes req's. Any
	// other record (final, in flight under a live lease, or of another
	// fingerprint) is returned unchanged with false. Of concurrent Begins on
	// one id at most one gets true.
	Begin(ctx context.Context, id ID, req Request, owner string, lease time.Duration) (Record, bool, error)
	// Complete turns owner's in-flight record into a Final one holding resp,
	// keeping Outcome but for its LastBody and Sent, which only a resume
	// needs. It
	// expires TTL from now unless resp needs review (Record.Expires). sent,
	// when not zero, is when this sequence first sent the request upstream:
	// Outcome.FirstSentAt becomes the earlier of it and the kept one (as
	// Park does), so that a final record says when its operation was first
	// sent. ErrNotOwner if owner does not hold it (the lease was lost),
	// ErrTooLarge if it would not fit; nothing is written then.
	Complete(ctx context.Context, id ID, owner string, resp Response, sent time.Time) error
	// Abandon deletes owner's in-flight record, so the next Begin starts
	// afresh: for operations known not to have been sent. ErrNotOwner if
	// owner does not hold it.
	Abandon(ctx context.Context, id ID, owner string) error
	// Renew extends owner's lease to lease from now, while its attempts go
	// on. ErrNotOwner if owner does not hold it: the caller must stop before
	// its next upstream attempt.
	Renew(ctx context.Context, id ID, owner string, lease time.Duration) error
	// Park turns owner's in-flight record into an Unknown one: the lease ends,
	// it no longer expires, the fingerprint and CreatedAt stay, and o is
	// merged into Record.Outcome as Outcome.Merge does (earliest FirstSentAt
	// unless o.SentAnew, Attempts added, LastError replaced, LastBody replaced if o has one
	// or o.SentAnew, Sent kept if the record has one). A record that would
	// be too large for the store with o.Sent is parked without it, never
	// refused for it (ErrTooLarge): the resume then sends its own bytes.
	// The next Begin with the same fingerprint resumes it at once.
	// ErrNotOwner if owner does not hold the record. A store may do a Park
	// that failed otherwise again later, once it can be written, and only
	// while owner still holds the record (pgstore does); it never deletes
	// the record instead.
	Park(ctx context.Context, id ID, owner string, o Outcome) error
	// Get returns id's record, or ErrNotFound if it is missing or expired.
	Get(ctx context.Context, id ID) (Record, error)
	// List returns up to limit live records that f selects (all tenants),
	// in an order of the store's that is stable between calls, starting
	// after cursor ("" from the start), and the cursor to pass for the next
	// page: "" when the end was reached (a non-empty cursor may still lead
	// to an empty page). It scans on until it has limit records, or the
	// page's records, as returned (with their bodies only when f.Bodies),
	// hold MaxListBytes (Record.Size), or it reaches the
	// end, whatever f.Keep skips: it never adds a record that would take a
	// page of one or more records past MaxListBytes, so a page holds at
	// most MaxListBytes, or one record. A page may thus be short with a
	// next cursor, and every record is still reached once across the pages;
	// the cursor is the position of the page's last record (past
	// f.Budget: of the last record read). Records it
	// reads past (f.Keep's, another state's, one that does not fit) are not
	// kept meanwhile: a page's memory is bounded whatever the records'
	// sizes and limit. limit <= 0
	// means 100. For operators: it may scan every record, so it is not for
	// the request path. ErrBadCursor for a cursor List did not give. A
	// record whose stored value cannot be read is returned with
	// Record.Unreadable set, not as an error, and so is one kept in a state
	// this version does not know (a newer version's), listed with the
	// Unknown records in its own State (its operation may have reached the
	// provider, and it would be listed nowhere else).
	List(ctx context.Context, f Filter, cursor string, limit int) ([]Record, string, error)
	// Supersede marks id's final record Superseded and keeps it without
	// expiry, and returns it. owner is the
	// record's Owner as the caller read it: the check and the change are one
	// decision, so a record that expired meanwhile and was claimed anew (its
	// Owner is the new claim's) is never superseded on what was read of the
	// old one. ErrNotFound if there is no record, ErrNotOwner if it is
	// another claim's, ErrNotFinal if it is in flight or unknown,
	// ErrSuperseded if it is superseded already (two renews that read it
	// before either wrote: only the first moves the order on); nothing is
	// written then.
	Supersede(ctx context.Context, id ID, owner string) (Record, error)
	// Resolve settles id's Unknown record as an operator found its
	// operation at the provider, and only if the record is Unknown at that
	// moment: one a request resumed meanwhile (in flight) is never
	// overwritten. With resp nil (the provider has no such operation) it
	// deletes the record and returns it as it was: the next Begin creates
	// it afresh, so that request is sent as a first send, under the same
	// key. With resp (the operation happened and this was its answer) the
	// record becomes Final holding resp, as Complete would make it (no
	// lease, Outcome kept but for LastBody and Sent, expiring TTL from now unless
	// resp needs review, the fingerprint kept), and is returned. ErrNotFound if there is no
	// record, ErrNotUnknown if it is in flight or final, ErrTooLarge if
	// resp does not fit; nothing is written then.
	Resolve(ctx context.Context, id ID, resp *Response) (Record, error)
	// Reviewed marks id's final record whose answer needs review as settled
	// by an operator (the provider's event told the outcome), and returns
	// it: it is Reviewed, no longer AwaitsReview, and expires TTL from now
	// as a final record written now would (never with no TTL, nor if it is
	// Superseded). Its answer is kept and still replayed until then; marked
	// is true. One marked already is returned unchanged, its expiry kept,
	// with marked false: of two calls at once, only the one that wrote
	// first says it marked it (the operator's log line). ErrNotFound
	// if there is no record, ErrNotFinal if it is in flight or unknown,
	// ErrNoReview if its answer does not need review; nothing is written
	// then.
	Reviewed(ctx context.Context, id ID) (rec Record, marked bool, err error)
	// Discard deletes id's record only if its stored value cannot be read
	// (ErrUnreadable: a newer version's, or damaged; in any state, one this
	// version does not know included), the check and the delete one
	// decision, and returns it as List shows it (Unreadable set). An
	// operator does this after settling its operation with the provider:
	// until then the record is kept and its key refused. The next Begin
	// creates the record afresh. ErrNotFound if there is no live record,
	// ErrReadable if its value can be read; nothing is written then.
	Discard(ctx context.Context, id ID) (Record, error)
	// Ping checks that the store can be written now (readiness).
	Ping(ctx context.Context) error
	// MaxBodyBytes is the largest response body Complete accepts with
	// headers of up to 64 KiB; callers cap what they read below it.
	MaxBodyBytes() int64
	// Close releases the store; later calls fail with ErrClosed. Closing
	// twice returns nil.
	Close() error
}
