// Package adminapi is the operator's API on the admin listener, under
// /admin/v1/: JSON views of idempotency records, so that a person can find
// operations whose outcome is unknown or that need review.
//
// When a token is configured every call needs "Authorization: Bearer
// <token>" (401 otherwise). Bodies of stored answers are shown only with
// ?body=1; owner tokens and fingerprints never are.
package adminapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// Header is on every answer of the API (value "v1"), so that a client can
// tell them from another server's: a provider behind the proxy port may
// answer 404 not_found too.
const Header = "Idemproxy-Admin"

// Store is what the API reads of the record store.
type Store interface {
	Get(ctx context.Context, id store.ID) (store.Record, error)
	List(ctx context.Context, f store.Filter, cursor string, limit int) ([]store.Record, string, error)
	Supersede(ctx context.Context, id store.ID, owner string) (store.Record, error)
	Resolve(ctx context.Context, id store.ID, resp *store.Response) (store.Record, error)
	Reviewed(ctx context.Context, id store.ID) (store.Record, bool, error)
	Discard(ctx context.Context, id store.ID) (store.Record, error)
}

// Options configure a Handler.
type Options struct {
	// Store holds the records. Required.
	Store Store
	// Token, when not empty, is the bearer token every call needs.
	Token string
	// DefaultTenant is the client of records when ?client= is absent.
	DefaultTenant string
	// Clients, when not empty, are the clients of the client tokens: every
	// record belongs to one of them, so a call that looks up a record or an
	// order must name one (?client=, "client"); it is refused (400) without
	// one, or naming another, instead of looking under a client that has no
	// records and answering that nothing was sent. A name without a token
	// under which records are kept (a client whose token was removed) is
	// taken by the calls on records and orders: see recordID, listRecords
	// and orderCurrent.
	Clients []string
	// OrderKeys derives the keys of an order's generation gen (1 first)
	// from its request's method and path and the value of its key source,
	// for client: one per key source of its route, in their order; the
	// proxy's own derivation. Required for /admin/v1/orders.
	OrderKeys func(method, path, value, client string, gen int) ([]string, error)
	// Logger receives one WARN line per change made through the API, and
	// per change the store did not confirm (it may have been made); nil
	// discards them. The caller writes them whatever its log level.
	Logger *slog.Logger
}

// Handler serves /admin/v1/:
//
//	GET  /admin/v1/records/{key}[?client=][&body=1]      one record
//	GET  /admin/v1/records?state=S&limit=N&cursor=C       a page of records in_flight, unknown or needs_review
//	GET  /admin/v1/orders?method=&path=&value=[&client=]  an order's current key, generation and record
//	POST /admin/v1/orders/renew {method, path, value, client}  move a failed order to its next key generation
//	POST /admin/v1/records/resolve {key, client, outcome, …}   settle an operation whose outcome is unknown
//	POST /admin/v1/records/reviewed {key, client}             mark a needs_review answer settled: it expires from now
//	POST /admin/v1/records/discard {key, client}              remove a record whose stored value cannot be read
type Handler struct {
	opt   Options
	token [sha256.Size]byte
	mux   *http.ServeMux
	// refusedLog spaces the log lines of calls refused for their token
	// (one a second at most); refused counts the refusals not yet logged.
	refusedLog rate.Sometimes
	refused    atomic.Int64
}

// New builds a Handler.
func New(opt Options) *Handler {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{opt: opt, token: sha256.Sum256([]byte(opt.Token)), mux: http.NewServeMux(),
		refusedLog: rate.Sometimes{Interval: time.Second}}
	calls := []struct {
		method, path string
		serve        http.HandlerFunc
	}{
		{http.MethodGet, "/admin/v1/records/{key}", h.getRecord},
		{http.MethodGet, "/admin/v1/records", h.listRecords},
		{http.MethodGet, "/admin/v1/orders", h.getOrder},
		{http.MethodPost, "/admin/v1/orders/renew", h.renewOrder},
		{http.MethodPost, "/admin/v1/records/resolve", h.resolveRecord},
		{http.MethodPost, "/admin/v1/records/reviewed", h.reviewedRecord},
		{http.MethodPost, "/admin/v1/records/discard", h.discardRecord},
	}
	for _, c := range calls {
		h.mux.HandleFunc(c.method+" "+c.path, c.serve)
		if recordCalls[c.path] {
			// GET /admin/v1/records/resolve is the record of the key
			// "resolve"; other methods get the 405 of records/{key}.
			continue
		}
		// Another method on a call's path is 405, not 404 not_found: a
		// script must not read "DELETE /admin/v1/records/{key}" as "no
		// such record".
		h.mux.HandleFunc(c.path, methodNotAllowed(c.method))
	}
	h.mux.HandleFunc("/admin/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, codeNotFound, "no such admin call")
	})
	return h
}

// recordCalls are the POST calls whose path is also that of a record's
// GET (records/{key}).
var recordCalls = map[string]bool{"/admin/v1/records/resolve": true, "/admin/v1/records/reviewed": true,
	"/admin/v1/records/discard": true}

// methodNotAllowed answers a call made with another method than allow.
func methodNotAllowed(allow string) http.HandlerFunc {
	if allow == http.MethodGet {
		allow = "GET, HEAD" // set once: handlers run at once
	}
	return func(w http.ResponseWriter, r *http.Request) {
		allow := allow
		if recordCalls[r.URL.Path] { // also the record of the key "resolve" or "reviewed"
			allow = "GET, HEAD, POST"
		}
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, codeMethodNotAllowed, "this admin call takes "+allow)
	}
}

// ServeHTTP checks the bearer token, then serves the call.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.authorized(r) {
		h.logRefused(r)
		w.Header().Set("WWW-Authenticate", `Bearer realm="idemproxy admin"`)
		writeError(w, http.StatusUnauthorized, codeUnauthorized, "missing or wrong bearer token")
		return
	}
	if p := r.URL.EscapedPath(); p == "/admin" || p != cleanPath(p) {
		// ServeMux would answer 307 to the cleaned path (or to /admin/),
		// without this API's shape; a client following it would send a
		// change again. No call is spelt so.
		writeError(w, http.StatusNotFound, codeNotFound, "no such admin call (a call's path has no empty, . or .. segment)")
		return
	}
	h.mux.ServeHTTP(w, r)
}

// logRefused writes a WARN line for a call refused for its token, so that
// the audit trail shows who tries the API without it: the first refusal,
// then at most one line a second, each counting the refusals since the
// line before, so that a client guessing tokens cannot flood the log. The
// token sent is never written.
func (h *Handler) logRefused(r *http.Request) {
	h.refused.Add(1)
	h.refusedLog.Do(func() {
		h.opt.Logger.Warn("admin: call refused: missing or wrong bearer token",
			"who", who(r), "what", r.Method+" "+bounded(r.URL.EscapedPath()), "refused", h.refused.Swap(0))
	})
}

// cleanPath is p as ServeMux cleans it before matching: no empty, . or ..
// segment, its trailing slash kept.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	np := path.Clean(p)
	if strings.HasSuffix(p, "/") && np != "/" {
		np += "/"
	}
	return np
}

// authorized compares SHA-256 digests in constant time, so the answer's
// timing says nothing about how much of a guess matched.
func (h *Handler) authorized(r *http.Request) bool {
	if h.opt.Token == "" {
		return true
	}
	// The scheme is case-insensitive (RFC 9110, section 11.1): "bearer"
	// is "Bearer".
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	sum := sha256.Sum256([]byte(strings.TrimLeft(got, " ")))
	return ok && strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare(sum[:], h.token[:]) == 1
}

// Record is a record as the API shows it. UpstreamKey, Method and Path are
// empty for records written by builds that did not keep them; ExpiresAt is
// null for a record that never expires. Attempts counts every upstream
// attempt made for the key, those of sequences that ended unknown included.
// Body, only when asked for, is the stored answer's body (of an unknown
// record, the last ambiguous answer it keeps, if any): as it is when it is
// JSON, else a JSON string of it ("" when empty).
type Record struct {
	Key         string          `json:"key"`
	UpstreamKey string          `json:"upstream_key"`
	Client      string          `json:"client"`
	State       string          `json:"state"`
	Method      string          `json:"method"`
	Path        string          `json:"path"`
	Status      int             `json:"status,omitempty"`
	NeedsReview bool            `json:"needs_review,omitempty"`
	Reviewed    bool            `json:"reviewed,omitempty"`
	Reconciled  bool            `json:"reconciled,omitempty"`
	Superseded  bool            `json:"superseded,omitempty"`
	Attempts    int             `json:"attempts"`
	CreatedAt   time.Time       `json:"created_at"`
	FirstSentAt *time.Time      `json:"first_sent_at"`
	ExpiresAt   *time.Time      `json:"expires_at"`
	LeaseUntil  *time.Time      `json:"lease_until,omitempty"`
	LastError   string          `json:"last_error"`
	Body        json.RawMessage `json:"body,omitempty"`
	// StoredState, StoreKey and Reason are set only on a record whose stored
	// value cannot be read (State is StateUnreadable), which a listing shows
	// beside the others: the state the store keeps beside the value, the
	// record's key in the store (it names the record when Key cannot, "" as
	// Client then), and why it cannot be read.
	StoredState string `json:"stored_state,omitempty"`
	StoreKey    string `json:"store_key,omitempty"`
	Reason      string `json:"reason,omitempty"`
}

// StateUnreadable is the State of a record whose stored value cannot be
// read: written by a newer version (after a downgrade), or damaged. Nothing
// else is known of it; its operation may have reached the provider.
const StateUnreadable = "unreadable"

// MarshalJSON writes a record as it is, but for an unreadable one, which
// has only key, client, state, stored_state, store_key and reason: zero
// attempts and no first send would say nothing was sent, which is not known.
func (r Record) MarshalJSON() ([]byte, error) {
	type plain Record
	if r.State != StateUnreadable {
		return json.Marshal(plain(r))
	}
	return json.Marshal(struct {
		Key         string `json:"key"`
		Client      string `json:"client"`
		State       string `json:"state"`
		StoredState string `json:"stored_state"`
		StoreKey    string `json:"store_key"`
		Reason      string `json:"reason"`
	}{r.Key, r.Client, r.State, r.StoredState, r.StoreKey, r.Reason})
}

// view builds the API's Record for id's stored record.
func view(id store.ID, rec store.Record, withBody bool) Record {
	if u := rec.Unreadable; u != nil {
		return Record{Key: id.Key, Client: id.Tenant, State: StateUnreadable, StoredState: rec.State.String(),
			StoreKey: u.StoreKey, Reason: u.Err.Error()}
	}
	v := Record{Key: id.Key, UpstreamKey: rec.UpstreamKey, Client: id.Tenant, State: rec.State.String(),
		Method: rec.Method, Path: rec.Path, Superseded: rec.Superseded,
		Attempts: rec.Outcome.Attempts, CreatedAt: rec.CreatedAt, LastError: rec.Outcome.LastError,
		FirstSentAt: optional(rec.Outcome.FirstSentAt), ExpiresAt: optional(rec.ExpiresAt)}
	if rec.State == store.InFlight {
		t := rec.LeaseUntil
		v.LeaseUntil = &t
	}
	if rec.State == store.Final {
		v.Status = rec.Response.Status
		v.NeedsReview = rec.Response.NeedsReview() // also of a body not listed (store.Filter.Bodies)
		v.Reviewed = rec.Reviewed
		v.Reconciled = rec.Response.Header.Get(retry.ReconciledHeader) == "true"
		// The answer's header counts the attempts of the sequence that got
		// it; Outcome those of earlier sequences that ended unknown.
		if a, err := strconv.Atoi(rec.Response.Header.Get(retry.AttemptsHeader)); err == nil && a > 0 {
			v.Attempts += a
		}
		if withBody {
			v.Body = bodyJSON(rec.Response.Body)
		}
	}
	if rec.State == store.Unknown && withBody && len(rec.Outcome.LastBody) > 0 {
		// What the operator asks the provider about: the last ambiguous
		// answer (a 504 naming the payment), kept for the status probe.
		v.Body = bodyJSON(rec.Outcome.LastBody)
	}
	return v
}

// bodyJSON is a stored body as the API shows it: JSON as it is, anything
// else (text, HTML from a gateway, nothing) as a JSON string.
func bodyJSON(b []byte) json.RawMessage {
	if len(b) > 0 && json.Valid(b) {
		return b
	}
	s, _ := json.Marshal(string(b)) // invalid UTF-8 becomes U+FFFD
	return s
}

// optional is t, or nil (JSON null) for the zero time.
func optional(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// getRecord is GET /admin/v1/records/{key}[?client=][&body=1].
func (h *Handler) getRecord(w http.ResponseWriter, r *http.Request) {
	id, err := h.recordID(r.Context(), r.URL.Query().Get("client"), r.PathValue("key"))
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return
	}
	if rec, ok := h.lookup(w, r, id); ok {
		writeJSON(w, http.StatusOK, view(id, rec, r.URL.Query().Get("body") == "1"))
	}
}

// spelling returns id with its key spelt as its record is stored: an app's
// key that is a UUID is stored in lower case without braces
// (idemkey.Canonical), so the key as an operator copies it from the app's
// database (upper-cased by a uniqueidentifier column) finds it; a record
// stored by a build before that, under the key as the app sent it, is found
// under that spelling when the lower-case one has none.
func (h *Handler) spelling(ctx context.Context, id store.ID) store.ID {
	canonical := store.ID{Tenant: id.Tenant, Key: idemkey.Canonical(id.Key)}
	if canonical == id {
		return id
	}
	if _, err := h.opt.Store.Get(ctx, canonical); errors.Is(err, store.ErrNotFound) {
		if _, err := h.opt.Store.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
			return id
		}
	}
	return canonical
}

// lookup reads id's record, or answers 404 not_found (none), 500
// record_unreadable (kept, but its value cannot be read) or 503
// store_unavailable, and reports false.
func (h *Handler) lookup(w http.ResponseWriter, r *http.Request, id store.ID) (store.Record, bool) {
	rec, err := h.opt.Store.Get(r.Context(), id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, codeNotFound, "no record for this key and client")
		return rec, false
	case errors.Is(err, store.ErrUnreadable):
		writeUnreadable(w, err)
		return rec, false
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, codeStoreUnavailable, "the record store cannot be read")
		return rec, false
	}
	return rec, true
}

// client is the client a call names (?client=, "client"), or the default
// tenant when it names none; with client tokens on (Options.Clients) it must
// name one of theirs. A name that has no token is returned with an error
// wrapping errNoToken: the caller may still take it for a client whose
// token was removed when it finds records kept under it (recordID).
//
// With client tokens off every app's records are kept under the default
// tenant: another name is returned with a noTokenError too, taken only for
// a client of an earlier configuration with tokens on whose records are
// kept; a name never configured answered as if nothing was sent for it.
func (h *Handler) client(name string) (string, error) {
	switch {
	case len(h.opt.Clients) == 0 && (name == "" || name == h.opt.DefaultTenant):
		return h.opt.DefaultTenant, nil
	case len(h.opt.Clients) == 0:
		return name, noTokenError(fmt.Sprintf("client tokens are off: every app's records are kept under the default client "+
			"(name no client, or %q); no client %q has a client token", h.opt.DefaultTenant, name))
	case slices.Contains(h.opt.Clients, name):
		return name, nil
	case name == "":
		return "", fmt.Errorf("client is required with client tokens on: one of %s", strings.Join(h.opt.Clients, ", "))
	}
	return name, noTokenError(fmt.Sprintf("no client %q has a client token: one of %s", name, strings.Join(h.opt.Clients, ", ")))
}

// noTokenError is client's error for a name that has no client token.
type noTokenError string

func (e noTokenError) Error() string { return string(e) }

// recordID is the ID of the record a call on one record names: its key, as
// spelt in the store (spelling), under the client named (client). A client
// whose token was removed from IDEMPROXY_CLIENT_TOKENS still has its records:
// a name without a token is taken when a record is kept under it for this
// key, so that an operator can still read and settle them; otherwise it is
// refused as before (a mistyped name must not answer "nothing was sent").
func (h *Handler) recordID(ctx context.Context, client, key string) (store.ID, error) {
	tenant, err := h.client(client)
	var noToken noTokenError
	if err != nil && !errors.As(err, &noToken) {
		return store.ID{}, err
	}
	id := h.spelling(ctx, store.ID{Tenant: tenant, Key: key})
	if err != nil {
		if _, gerr := h.opt.Store.Get(ctx, id); errors.Is(gerr, store.ErrNotFound) {
			return store.ID{}, fmt.Errorf("%w, and no record of this key is kept under it (a removed client's records are found under its name)", err)
		}
	}
	return id, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, codeInternal, "cannot encode the answer")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set(Header, "v1")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// The admin API's error codes, each written once. Those it shares with the
// proxy's answers (bad_request, store_unavailable, unauthorized) mean the same.
const (
	codeBadRequest       = "bad_request"
	codeBodyTooLarge     = "body_too_large"
	codeStoreUnavailable = "store_unavailable"
	codeUnauthorized     = "unauthorized"
	codeNotFound         = "not_found"
	codeMethodNotAllowed = "method_not_allowed"
	codeRenewRefused     = "renew_refused"
	codeResolveRefused   = "resolve_refused"
	codeReviewRefused    = "review_refused"
	codeDiscardRefused   = "discard_refused"
	codeInternal         = "internal"
	codeRecordUnreadable = "record_unreadable"
)

// writeUnreadable answers a call that found its record kept but unreadable
// (store.ErrUnreadable, err): 500 record_unreadable, saying what that means
// for the operation and what to do.
func writeUnreadable(w http.ResponseWriter, err error) {
	writeError(w, http.StatusInternalServerError, codeRecordUnreadable,
		"the record for this key and client is kept, but its stored value cannot be read ("+err.Error()+
			"): a newer version wrote it (after a downgrade, start that version again) or it is damaged. "+
			"Its operation may have reached the provider: requests with its key get 503 store_unavailable and nothing is sent; "+
			"settle the operation with the provider, then remove the record (idemproxy records discard): the next request with its key is sent as a new operation, same key")
}

// WriteError writes an error answer of the API's shape, with its header,
// for the admin listener's own answers (a path or method it does not serve).
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	writeError(w, status, code, msg)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Error.Code, body.Error.Message = code, msg
	writeJSON(w, status, body)
}
