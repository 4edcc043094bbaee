package adminapi

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// listable are the states GET /admin/v1/records?state= takes, as store
// filters: needs_review is the final records whose answer says so and that
// no operator has marked reviewed yet (store.Record.AwaitsReview).
var listable = map[string]store.Filter{
	"in_flight":    {State: store.InFlight},
	"unknown":      {State: store.Unknown},
	"needs_review": {State: store.Final, Keep: (*store.Record).AwaitsReview},
}

// maxLimit bounds one page.
const maxLimit = 1000

// listBudget bounds how long the store looks for one page's records
// (store.Filter.Budget): a page of needs_review answers, few among every
// final answer kept, was one scan of the whole store, 6.5 s for 500,000
// answers on PostgreSQL, past the operator commands' 10 s timeout on a
// larger one. Past it the page is short, or empty, with a next cursor.
const listBudget = 2 * time.Second

// listRecords is GET /admin/v1/records?state=in_flight|unknown|needs_review&limit=N&cursor=C[&client=][&body=1].
// A page holds limit records, or fewer once its records hold
// store.MaxListBytes (4 MiB of what the page keeps of them: the
// stored answers only with body=1; the store stops there, so an operator's
// listing cannot take the memory of the payment path), and a next cursor
// whenever more may follow; only the last page has none.
func (h *Handler) listRecords(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	state := q.Get("state")
	f, ok := listable[state]
	if !ok {
		writeError(w, http.StatusBadRequest, codeBadRequest, "state must be in_flight, unknown or needs_review")
		return
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			writeError(w, http.StatusBadRequest, codeBadRequest, "limit must be 1 to 1000")
			return
		}
		limit = n
	}
	// ?client= lists that client's records only (with client tokens on, one
	// of theirs); without it, every client's.
	listing := state
	var noToken error // the client named has no token (noTokenError)
	if q.Has("client") {
		client, err := h.client(q.Get("client"))
		if errors.As(err, new(noTokenError)) {
			// Perhaps a client whose token was removed: its records are
			// listed, and a name with none in this listing refused below.
			noToken, err = err, nil
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
			return
		}
		listing += "@" + hex.EncodeToString([]byte(client))
		keep := f.Keep
		f.Keep = func(rec *store.Record) bool {
			return rec.ID.Tenant == client && (keep == nil || keep(rec))
		}
	}
	// A cursor names its listing (state and client): the store's is a
	// position among all records, which the listing of another state or
	// client would take too and silently start after. It ends with a check
	// of both: a cursor cut short (to "unknown.", or to a shorter position
	// the store takes too) or with something after it restarted the listing
	// at or before the position, and a script paging with it looped.
	cursor := q.Get("cursor")
	if cursor != "" {
		from, rest, _ := strings.Cut(cursor, ".")
		pos, check, _ := strings.Cut(rest, ".")
		if from != listing {
			writeError(w, http.StatusBadRequest, codeBadRequest, "cursor is not one this API gave for state "+state+
				" and this client (a cursor is for the listing of the state and client it came from)")
			return
		}
		if pos == "" || check != cursorCheck(listing, pos) {
			writeError(w, http.StatusBadRequest, codeBadRequest, "cursor is not one this API gave: cut short or with "+
				"something after it; pass next_cursor whole, as given")
			return
		}
		cursor = pos
	}
	// The bodies are read only when shown: without them a page holds
	// limit records whatever the answers' sizes, and the store neither
	// fetches nor keeps them.
	withBody := q.Get("body") == "1"
	f.Bodies = withBody
	if noToken == nil {
		// A name with no token is refused unless the listing finds a
		// record of it, which takes reading the listing whole: a page
		// cut short could not tell a mistyped name from a removed
		// client's records further on.
		f.Budget = listBudget
	}
	recs, next, err := h.opt.Store.List(r.Context(), f, cursor, limit)
	switch {
	case errors.Is(err, store.ErrBadCursor):
		writeError(w, http.StatusBadRequest, codeBadRequest, "cursor is not one this API gave")
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, codeStoreUnavailable, "the record store cannot be read")
		return
	}
	out := struct {
		Records    []Record `json:"records"`
		NextCursor string   `json:"next_cursor"`
	}{Records: []Record{}}
	if noToken != nil && cursor == "" && next == "" && len(recs) == 0 {
		// Nothing listed for a name without a token: most likely a
		// mistyped one, which must not read as "nothing to settle".
		writeError(w, http.StatusBadRequest, codeBadRequest, noToken.Error()+
			", and no "+state+" record is kept under it (a removed client's records are listed under its name)")
		return
	}
	if next != "" {
		out.NextCursor = listing + "." + next + "." + cursorCheck(listing, next)
	}
	for _, rec := range recs {
		out.Records = append(out.Records, view(rec.ID, rec, withBody))
	}
	writeJSON(w, http.StatusOK, out)
}

// cursorCheck is the end of a listing's cursor: 8 bytes of the SHA-256 of
// the listing and the store's position, in hex. Not a secret: the store
// still checks the position; it tells a cursor given whole from one cut
// short or added to.
func cursorCheck(listing, pos string) string {
	sum := sha256.Sum256([]byte(listing + "." + pos))
	return hex.EncodeToString(sum[:8])
}

// Order is an order's current key as GET /admin/v1/orders shows it.
type Order struct {
	Key        string  `json:"key"`
	Generation int     `json:"generation"`
	Record     *Record `json:"record"`
}

// Renewed is the answer of POST /admin/v1/orders/renew: the key and
// generation the order's next request uses (nothing was sent under it yet).
type Renewed struct {
	Key        string `json:"key"`
	Generation int    `json:"generation"`
}

// orderQuery names an order: the request's method and path and the value of
// its key source (the order_id), and its client.
type orderQuery struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Value  string `json:"value"`
	Client string `json:"client"`
}

// maxGenerations bounds the walk along an order's renewed generations.
const maxGenerations = 1000

// current returns the order's current generation: the first whose record is
// not superseded (nil when it has none yet), and which of its route's key
// sources the order's requests have (src, an index into OrderKeys' keys).
//
// The source is the first whose generation 1 key has a record: the proxy
// derives a request's key from the first source the request has, so an
// order posted as a form is under the form source's key though a JSON source
// comes first. With no record under any, it is the first source.
func (h *Handler) current(r *http.Request, o orderQuery) (id store.ID, gen, src int, rec *store.Record, err error) {
	keys, err := h.opt.OrderKeys(o.Method, o.Path, o.Value, o.Client, 1)
	if errors.Is(err, store.ErrUnavailable) { // read for a path's earlier spelling
		return store.ID{}, 0, 0, nil, errStore
	}
	if err != nil {
		return store.ID{}, 0, 0, nil, err
	}
	for i, key := range keys {
		_, err := h.opt.Store.Get(r.Context(), store.ID{Tenant: o.Client, Key: key})
		if err == nil {
			src = i
			break
		}
		if errors.Is(err, store.ErrUnreadable) {
			return store.ID{}, 0, 0, nil, err
		}
		if !errors.Is(err, store.ErrNotFound) {
			return store.ID{}, 0, 0, nil, errStore
		}
	}
	for gen := 1; gen <= maxGenerations; gen++ {
		if gen > 1 {
			if keys, err = h.opt.OrderKeys(o.Method, o.Path, o.Value, o.Client, gen); err != nil {
				return store.ID{}, 0, 0, nil, err
			}
		}
		id := store.ID{Tenant: o.Client, Key: keys[src]}
		rec, err := h.opt.Store.Get(r.Context(), id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return id, gen, src, nil, nil
		case errors.Is(err, store.ErrUnreadable):
			return store.ID{}, 0, 0, nil, err
		case err != nil:
			return store.ID{}, 0, 0, nil, errStore
		case !rec.Superseded:
			return id, gen, src, &rec, nil
		}
	}
	return store.ID{}, 0, 0, nil, errors.New("too many generations")
}

var errStore = errors.New("store unavailable")

// orderFrom checks the order a call names, and writes the error when it
// cannot be looked up. noToken is set when its client has no client token:
// the call takes it for a client whose token was removed only when the order
// has records kept under it (orderCurrent), as the calls on records do.
func (h *Handler) orderFrom(w http.ResponseWriter, o orderQuery) (_ orderQuery, noToken error, ok bool) {
	// A person types "post": methods are upper case in every request the
	// proxy takes, so no order has a lower-case one.
	o.Method = strings.ToUpper(o.Method)
	if o.Method == "" || o.Path == "" || o.Value == "" {
		writeError(w, http.StatusBadRequest, codeBadRequest, "method, path and value are required")
		return o, nil, false
	}
	client, err := h.client(o.Client)
	if errors.As(err, new(noTokenError)) {
		noToken, err = err, nil
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return o, nil, false
	}
	o.Client = client
	return o, noToken, true
}

// orderCurrent is current for the order an orders call names (orderFrom),
// writing the error when it fails. A client with no token (noToken) is
// refused unless the order has a record kept under it: generation 1 has
// none only when nothing was ever sent for the order under that name, most
// likely a mistyped one, which must not read as "nothing sent".
func (h *Handler) orderCurrent(w http.ResponseWriter, r *http.Request, o orderQuery, noToken error) (id store.ID, gen, src int, rec *store.Record, ok bool) {
	id, gen, src, rec, err := h.current(r, o)
	if err != nil {
		h.orderError(w, err)
		return id, gen, src, rec, false
	}
	if noToken != nil && rec == nil && gen == 1 {
		writeError(w, http.StatusBadRequest, codeBadRequest, noToken.Error()+
			", and no record of this order is kept under it (a removed client's orders are found under its name)")
		return id, gen, src, rec, false
	}
	return id, gen, src, rec, true
}

// getOrder is GET /admin/v1/orders?method=POST&path=/cards&value=F-1[&client=].
func (h *Handler) getOrder(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	o, noToken, ok := h.orderFrom(w, orderQuery{Method: q.Get("method"), Path: q.Get("path"), Value: q.Get("value"), Client: q.Get("client")})
	if !ok {
		return
	}
	id, gen, _, rec, ok := h.orderCurrent(w, r, o, noToken)
	if !ok {
		return
	}
	out := Order{Key: id.Key, Generation: gen}
	if rec != nil {
		v := view(id, *rec, q.Get("body") == "1")
		out.Record = &v
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) orderError(w http.ResponseWriter, err error) {
	if errors.Is(err, store.ErrUnreadable) {
		writeUnreadable(w, err)
		return
	}
	if errors.Is(err, errStore) {
		writeError(w, http.StatusServiceUnavailable, codeStoreUnavailable, "the record store cannot be read")
		return
	}
	writeError(w, http.StatusBadRequest, codeBadRequest, "no key can be derived for this method and path: "+err.Error())
}

// renewOrder is POST /admin/v1/orders/renew {method, path, value, client}:
// the order's next request derives the next generation's key. Only an order
// whose result is final and not a success may be renewed (a 4xx, or a body
// saying failed): a new key for an operation in flight or unknown could be a
// second charge, and one that succeeded must not run again.
func (h *Handler) renewOrder(w http.ResponseWriter, r *http.Request) {
	var in orderQuery
	if err := decodeBody(w, r, 64<<10, &in); err != nil {
		writeBodyError(w, "{method, path, value, client}", err)
		return
	}
	o, noToken, ok := h.orderFrom(w, in)
	if !ok {
		return
	}
	id, gen, src, rec, ok := h.orderCurrent(w, r, o, noToken)
	if !ok {
		return
	}
	if reason := refusal(rec); reason != "" {
		writeError(w, http.StatusConflict, codeRenewRefused, reason)
		return
	}
	// The next generation's key before the change: once the order is moved
	// on, a failure to derive it (a read for a path's earlier spelling)
	// answered an error for a renew that was made, and logged nothing.
	keys, err := h.opt.OrderKeys(o.Method, o.Path, o.Value, o.Client, gen+1)
	if err != nil {
		h.orderError(w, err)
		return
	}
	next := keys[src]
	args := []any{"who", who(r), "method", o.Method, "path", o.Path, "client", o.Client,
		"from_key", id.Key, "from_generation", gen, "key", next, "generation", gen + 1,
		"status", rec.Response.Status}
	// Only the record just judged: one that expired since and was claimed
	// anew (a success, or an operation in flight) is another claim's.
	if _, err := h.opt.Store.Supersede(r.Context(), id, rec.Owner); err != nil {
		if errors.Is(err, store.ErrSuperseded) {
			// Another renew that read the same record wrote first: it moved
			// the order on, and only it answers 200 and is logged.
			writeError(w, http.StatusConflict, codeRenewRefused, "the order was renewed by another call meanwhile; look it up again")
			return
		}
		if errors.Is(err, store.ErrNotFinal) || errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrNotOwner) {
			writeError(w, http.StatusConflict, codeRenewRefused, "the order's record changed; look it up again")
			return
		}
		if errors.Is(err, store.ErrUnreadable) {
			writeUnreadable(w, err)
			return
		}
		h.unconfirmed(w, "renew", err, args...)
		return
	}
	h.opt.Logger.Warn("admin: order renewed to its next key generation", args...)
	writeJSON(w, http.StatusOK, Renewed{Key: next, Generation: gen + 1})
}

// refusal says why rec cannot be renewed; "" when it can.
func refusal(rec *store.Record) string {
	switch {
	case rec == nil:
		return "the order has no record: nothing was sent for it under its current key"
	case rec.State == store.InFlight:
		return "the order is in flight; wait for its result"
	case rec.State == store.Unknown:
		return "the order's outcome is unknown: a new key could charge twice; check with the provider and resolve it first (idemproxy records resolve)"
	case retry.NeedsReview(rec.Response.Body):
		return "the order needs review: the provider reports its outcome by an event; never retry it"
	case rec.Response.Status >= 400 || retry.Failed(rec.Response.Body):
		return ""
	}
	return "the order's result was a success; it must not run again"
}

// unconfirmed answers a change (call) whose store call failed otherwise than
// by refusing it: its answer was lost (the connection cut after the COMMIT
// was sent, or the call's time ran out), so the change may have been made,
// on any replica's view. It is logged at WARN like the change itself, with
// the same fields (args: who, what, before and after), so that the audit
// trail holds every change that may have been made, and answered 503
// store_unavailable saying so. Before, such a call answered 503 and logged
// nothing.
func (h *Handler) unconfirmed(w http.ResponseWriter, call string, err error, args ...any) {
	h.opt.Logger.Warn("admin: "+call+" by an operator not confirmed by the record store: it may have been made; look the record up",
		append(args, "result", "unknown", "err", err.Error())...)
	writeError(w, http.StatusServiceUnavailable, codeStoreUnavailable,
		"the record store did not confirm the "+call+": it may have been made; look the record up (records get, orders get) before repeating it")
}

// who names the caller of a change for the log: the address it came from
// (the API has one shared token, so there is no user name).
func who(r *http.Request) string {
	if u := r.Header.Get("X-Forwarded-For"); u != "" {
		return r.RemoteAddr + " (for " + bounded(u) + ")"
	}
	return r.RemoteAddr
}

// maxLogged bounds what a caller sent that a log line repeats (a forwarded
// address list, a path): enough for any real one, and a header of a
// megabyte does not make a log line of a megabyte.
const maxLogged = 256

// bounded is s cut to maxLogged bytes at a rune's start, marked when cut.
func bounded(s string) string {
	if len(s) <= maxLogged {
		return s
	}
	i := maxLogged
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}
