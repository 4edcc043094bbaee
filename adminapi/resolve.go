package adminapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// The outcomes an operator can give an unknown operation.
const (
	NotExecuted = "not_executed"
	Executed    = "executed"
)

// resolveQuery is the body of POST /admin/v1/records/resolve.
type resolveQuery struct {
	Key     string          `json:"key"`
	Client  string          `json:"client"`
	Outcome string          `json:"outcome"`
	Status  int             `json:"status"`
	Body    json.RawMessage `json:"body"`
	Headers answerHeaders   `json:"headers"`
}

// answerHeaders is a resolve's headers: a JSON object of strings, each
// name given once. encoding/json alone kept the last value of a name given
// twice ({"Content-Type":"text/plain","Content-Type":"application/xml"})
// and the resolve stored it; names differing in case only are refused in
// answer.
type answerHeaders map[string]string

// UnmarshalJSON decodes b as a map[string]string, and refuses a member
// named twice.
func (h *answerHeaders) UnmarshalJSON(b []byte) error {
	if err := json.Unmarshal(b, (*map[string]string)(h)); err != nil || *h == nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil { // the opening brace
		return err
	}
	seen := make(map[string]bool, len(*h))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name, _ := tok.(string)
		if seen[name] {
			return fmt.Errorf("header %s given twice: give it once", name)
		}
		seen[name] = true
		if _, err := dec.Token(); err != nil { // its value, a string
			return err
		}
	}
	return nil
}

// Resolved is the answer of POST /admin/v1/records/resolve: the record
// stored now, null after not_executed (the next request for the key is
// sent, and its answer stored as usual).
type Resolved struct {
	Key     string  `json:"key"`
	Client  string  `json:"client"`
	Outcome string  `json:"outcome"`
	Record  *Record `json:"record"`
}

// decodeRecordCall decodes the JSON body of a call on one record (at most
// limit bytes) into in, whose key and client fields are at key and client,
// and returns the record's ID. Unknown fields are refused: a mistyped
// "statsu" must not store an empty answer; so is anything but one JSON
// object (decodeBody). When ok is false, w has the 400,
// its message naming shape, the body's fields.
func (h *Handler) decodeRecordCall(w http.ResponseWriter, r *http.Request, limit int64, shape string, in any, key, client *string) (id store.ID, ok bool) {
	if err := decodeBody(w, r, limit, in); err != nil {
		writeBodyError(w, shape, err)
		return store.ID{}, false
	}
	if *key == "" {
		writeError(w, http.StatusBadRequest, codeBadRequest, "key is required")
		return store.ID{}, false
	}
	id, err := h.recordID(r.Context(), *client, *key)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return store.ID{}, false
	}
	return id, true
}

// maxResolveBody bounds the body of a resolve call, the answer given in it
// included.
const maxResolveBody = 1 << 20

// resolveRecord is POST /admin/v1/records/resolve {key, client, outcome,
// status, body, headers}: an operator's verdict on an operation whose
// outcome is unknown, after asking the provider by hand. not_executed: the
// provider has no such operation; the record is removed, and the app's next
// request is sent again with the same key, as a first send (no key-retention
// check, no probe). executed: it happened; the answer given becomes the
// final record, marked reconciled, and is replayed to the next request.
// Only an unknown record is changed: one a request resumed meanwhile is in
// flight and is refused, as is a final one.
func (h *Handler) resolveRecord(w http.ResponseWriter, r *http.Request) {
	var in resolveQuery
	id, ok := h.decodeRecordCall(w, r, maxResolveBody, "{key, client, outcome, status, body, headers}", &in, &in.Key, &in.Client)
	if !ok {
		return
	}
	client := id.Tenant
	var (
		resp *store.Response
		err  error
	)
	switch in.Outcome {
	case NotExecuted:
		if in.Status != 0 || !isNull(in.Body) || in.Headers != nil {
			writeError(w, http.StatusBadRequest, codeBadRequest, "status, body and headers are for outcome executed only")
			return
		}
	case Executed:
		if resp, err = answer(in); err != nil {
			writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
			return
		}
	default:
		writeError(w, http.StatusBadRequest, codeBadRequest, "outcome must be not_executed or executed")
		return
	}
	rec, ok := h.lookup(w, r, id)
	switch {
	case !ok:
		return
	case rec.State == store.InFlight:
		writeError(w, http.StatusConflict, codeResolveRefused, "the operation is in flight (a request resumed it); wait for its result")
		return
	case rec.State != store.Unknown:
		writeError(w, http.StatusConflict, codeResolveRefused, "the record is "+rec.State.String()+", not unknown: there is nothing to resolve")
		return
	}
	// What the record was (unknown) and what the operator made of it.
	args := []any{"who", who(r), "outcome", in.Outcome, "client", client, "key", id.Key,
		"upstream_key", rec.UpstreamKey, "method", rec.Method, "path", rec.Path,
		"attempts", rec.Outcome.Attempts, "first_sent_at", rec.Outcome.FirstSentAt, "last_error", rec.Outcome.LastError}
	if resp != nil {
		args = append(args, "status", resp.Status)
	}
	rec, err = h.opt.Store.Resolve(r.Context(), id, resp)
	switch {
	case errors.Is(err, store.ErrNotUnknown):
		writeError(w, http.StatusConflict, codeResolveRefused, "the record changed (a request resumed it); look it up again")
		return
	case errors.Is(err, store.ErrNotFound):
		// It was unknown when read: another call removed it since (a
		// resolve not_executed, a discard). 404 read as a wrong key.
		writeError(w, http.StatusConflict, codeResolveRefused, "the record changed (another call resolved it as not_executed meanwhile); look it up again")
		return
	case errors.Is(err, store.ErrTooLarge):
		writeError(w, http.StatusBadRequest, codeBadRequest, "the answer is too large for a record")
		return
	case errors.Is(err, store.ErrUnreadable):
		writeUnreadable(w, err)
		return
	case err != nil:
		h.unconfirmed(w, "resolve", err, args...)
		return
	}
	out := Resolved{Key: id.Key, Client: client, Outcome: in.Outcome}
	if resp != nil {
		v := view(id, rec, false)
		out.Record = &v
	}
	h.opt.Logger.Warn("admin: operation whose outcome was unknown resolved by an operator", args...)
	writeJSON(w, http.StatusOK, out)
}

// answer is the final answer an executed resolve stores: the status (2xx
// or 4xx), the body (a JSON string's text, or any other JSON value as
// given) and the headers given, with Content-Type application/json unless
// given (text/plain for a text that is not JSON), and marked as not the
// operation's own answer (reconciled).
func answer(in resolveQuery) (*store.Response, error) {
	if in.Status < 200 || in.Status > 299 && in.Status < 400 || in.Status > 499 {
		return nil, errors.New("status must be the provider's answer, 2xx or 4xx")
	}
	resp := &store.Response{Status: in.Status, Header: http.Header{"Content-Type": {"application/json"}}}
	if !isNull(in.Body) {
		var text string
		if json.Unmarshal(in.Body, &text) == nil {
			resp.Body = []byte(text)
			// A person's note is text: as application/json the app's
			// next request got a body no JSON parser reads.
			if !json.Valid(resp.Body) {
				resp.Header.Set("Content-Type", "text/plain; charset=utf-8")
			}
		} else {
			resp.Body = bytes.Clone(in.Body)
		}
	}
	given := map[string]string{}
	for name, value := range in.Headers {
		if err := checkHeader(name, value); err != nil {
			return nil, err
		}
		// Names differing in case only are one header: which value was
		// stored depended on the map's order, so it is refused.
		canon := http.CanonicalHeaderKey(name)
		if other, ok := given[canon]; ok {
			return nil, fmt.Errorf("header %s given twice (%q and %q): give it once", canon, other, name)
		}
		given[canon] = name
		resp.Header.Set(name, value)
	}
	resp.Header.Set(retry.ReconciledHeader, "true")
	return resp, nil
}

// isNull reports whether a JSON field was absent or null.
func isNull(b json.RawMessage) bool { return len(b) == 0 || string(b) == "null" }

// checkHeader refuses a header that is not a valid field, or one that
// idemproxy or the HTTP framing sets: a stored Content-Length would not
// match the body sent.
func checkHeader(name, value string) error {
	if !httpguts.ValidHeaderFieldName(name) {
		return fmt.Errorf("header name %q is not valid", name)
	}
	if !httpguts.ValidHeaderFieldValue(value) {
		return fmt.Errorf("header %s: the value holds a line break or another control byte", name)
	}
	canon := http.CanonicalHeaderKey(name)
	switch canon {
	case "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade",
		"Idempotency-Key", "Idempotent-Replayed":
		return fmt.Errorf("header %s cannot be stored: idemproxy or HTTP sets it", canon)
	}
	if strings.HasPrefix(canon, "Idemproxy-") {
		return fmt.Errorf("header %s cannot be stored: idemproxy sets it", canon)
	}
	return nil
}
