package adminapi

import (
	"errors"
	"net/http"

	"github.com/idemproxy/idemproxy/store"
)

// Discarded is the answer of POST /admin/v1/records/discard: the record
// removed, as the listings showed it (state unreadable, with its stored
// state, store key and the reason it could not be read).
type Discarded struct {
	Key    string `json:"key"`
	Client string `json:"client"`
	Record Record `json:"record"`
}

// discardRecord is POST /admin/v1/records/discard {key, client}: an operator
// removes a record whose stored value cannot be read (a newer version's,
// after a downgrade, or damaged), after settling its operation with the
// provider. Until then every request with its key is refused 503
// store_unavailable, and an unknown or in-flight one never expires. The
// app's next request with the key is sent as a new operation, under the same
// key, as after resolve not_executed. A record that can be read, in any
// state, is refused (409 discard_refused): it is settled by the calls for
// its state, never removed blind.
func (h *Handler) discardRecord(w http.ResponseWriter, r *http.Request) {
	var in recordQuery
	id, ok := h.decodeRecordCall(w, r, 64<<10, "{key, client}", &in, &in.Key, &in.Client)
	if !ok {
		return
	}
	rec, err := h.opt.Store.Discard(r.Context(), id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, codeNotFound, "no record for this key and client")
		return
	case errors.Is(err, store.ErrReadable):
		writeError(w, http.StatusConflict, codeDiscardRefused,
			"the record can be read: only a record whose stored value cannot be read is discarded; "+
				"look it up (records get) and settle it by its state (records resolve, records reviewed, orders renew)")
		return
	case err != nil:
		h.unconfirmed(w, "discard", err, "who", who(r), "client", id.Tenant, "key", id.Key)
		return
	}
	v := view(id, rec, false)
	h.opt.Logger.Warn("admin: record whose value could not be read discarded by an operator; the next request with its key is sent as a new operation, same key",
		"who", who(r), "client", id.Tenant, "key", id.Key, "stored_state", v.StoredState, "store_key", v.StoreKey, "reason", v.Reason)
	writeJSON(w, http.StatusOK, Discarded{Key: id.Key, Client: id.Tenant, Record: v})
}
