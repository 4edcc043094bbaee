package adminapi

import (
	"errors"
	"net/http"

	"github.com/idemproxy/idemproxy/store"
)

// recordQuery is the body of the calls that name one record and nothing
// else: POST /admin/v1/records/reviewed and /admin/v1/records/discard.
type recordQuery struct {
	Key    string `json:"key"`
	Client string `json:"client"`
}

// Reviewed is the answer of POST /admin/v1/records/reviewed: the record as
// it is now, marked reviewed, with the time it expires at (null when
// records never expire).
type Reviewed struct {
	Key    string `json:"key"`
	Client string `json:"client"`
	Record Record `json:"record"`
}

// reviewedRecord is POST /admin/v1/records/reviewed {key, client}: an
// operator says that an operation whose answer was needs_review is settled
// (the provider's event told its outcome). Until then the record is kept
// without expiry and listed; from now on it is no longer listed and expires
// after IDEMPROXY_RECORD_TTL like any final record. Its answer is kept, so
// the app's retries still get the same needs_review answer with nothing
// sent until it expires. Only a final record whose answer says
// needs_review can be marked; marking it again changes nothing.
func (h *Handler) reviewedRecord(w http.ResponseWriter, r *http.Request) {
	var in recordQuery
	id, ok := h.decodeRecordCall(w, r, 64<<10, "{key, client}", &in, &in.Key, &in.Client)
	if !ok {
		return
	}
	client := id.Tenant
	before, ok := h.lookup(w, r, id)
	if !ok {
		return
	}
	if reason := reviewRefusal(&before); reason != "" {
		writeError(w, http.StatusConflict, codeReviewRefused, reason)
		return
	}
	rec, marked, err := h.opt.Store.Reviewed(r.Context(), id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, codeNotFound, "no record for this key and client")
		return
	case errors.Is(err, store.ErrNotFinal), errors.Is(err, store.ErrNoReview):
		writeError(w, http.StatusConflict, codeReviewRefused, "the record changed; look it up again")
		return
	case errors.Is(err, store.ErrUnreadable):
		writeUnreadable(w, err)
		return
	case err != nil:
		h.unconfirmed(w, "reviewed", err, "who", who(r), "client", client, "key", id.Key, "upstream_key", before.UpstreamKey,
			"method", before.Method, "path", before.Path, "status", before.Response.Status)
		return
	}
	if marked { // not a call that found it marked, nor one of two at once that wrote second
		h.opt.Logger.Warn("admin: answer that needed review marked reviewed by an operator; it expires from now",
			"who", who(r), "client", client, "key", id.Key, "upstream_key", rec.UpstreamKey,
			"method", rec.Method, "path", rec.Path, "status", rec.Response.Status, "expires_at", rec.ExpiresAt)
	}
	writeJSON(w, http.StatusOK, Reviewed{Key: id.Key, Client: client, Record: view(id, rec, false)})
}

// reviewRefusal says why rec cannot be marked reviewed; "" when it can.
func reviewRefusal(rec *store.Record) string {
	switch {
	case rec.State == store.InFlight:
		return "the operation is in flight; wait for its result"
	case rec.State != store.Final:
		return "the record is " + rec.State.String() + ", not final: there is no answer to review (an unknown outcome is settled with records resolve)"
	case !store.NeedsReview(rec.Response.Body):
		return "the record's answer does not say needs_review: there is nothing to review"
	}
	return ""
}
