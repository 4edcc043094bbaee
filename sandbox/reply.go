package sandbox

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// reply is a complete answer, built before anything is written so that the
// faults after processing can delay or drop it.
type reply struct {
	status      int
	body        []byte
	contentType string      // "" means application/json
	header      http.Header // extra headers; nil means none
	done        func()      // runs once the reply is written or dropped; nil means none
}

// apiError is the providers' error body: {"error":{"code":"...","message":"..."}}.
type apiError struct {
	Error errorDetail `json:"error"`
}

// errorDetail is the inside of apiError.
type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// jsonReply encodes v; v is always one of the sandbox's own types, so the
// encoding cannot fail.
func jsonReply(status int, v any) reply {
	body, err := json.Marshal(v)
	if err != nil {
		panic("sandbox: encode reply: " + err.Error())
	}
	return reply{status: status, body: body}
}

// errorReply is an error in the providers' shape.
func errorReply(status int, code, message string) reply {
	return jsonReply(status, apiError{Error: errorDetail{Code: code, Message: message}})
}

// replayed returns a copy of r marked "Idempotent-Replayed: true", the
// payments and payouts providers' replay marker.
func (r reply) replayed() reply {
	r.header = http.Header{"Idempotent-Replayed": {"true"}}
	return r
}

// withRetryAfter returns a copy of r with Retry-After in seconds.
func (r reply) withRetryAfter(seconds int) reply {
	r.header = http.Header{"Retry-After": {strconv.Itoa(seconds)}}
	return r
}

// write sends r.
func (r reply) write(w http.ResponseWriter) {
	h := w.Header()
	for name, values := range r.header {
		h[name] = values
	}
	ct := r.contentType
	if ct == "" {
		ct = "application/json"
	}
	h.Set("Content-Type", ct)
	h.Set("Content-Length", strconv.Itoa(len(r.body)))
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body) // a failed write means the client left; nothing to do
}

// cancelled is returned when the client left while its request waited for
// another with the same key; nobody reads it.
func cancelled() reply {
	return errorReply(http.StatusServiceUnavailable, "request_cancelled", "client went away while waiting")
}
