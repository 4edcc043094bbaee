package store

import (
	"bytes"
	"encoding/json"
)

// NeedsReview reports whether a response body says that its operation's
// status is "needs_review" (at "status" or "data.status" of a JSON object,
// as a string): the provider resolves the operation by hand and reports the
// outcome by an event, so the answer is final and never retried. It is the
// one definition of such an answer: the retry policy, the stores (see
// Record.AwaitsReview) and the operators' listing all ask it.
func NeedsReview(body []byte) bool {
	// Most answers do not mention it at all; the text can only be spelled
	// otherwise with a \u escape. Only those that may say it are parsed.
	if !bytes.Contains(body, []byte("needs_review")) && !bytes.Contains(body, []byte(`\u`)) {
		return false
	}
	top := jsonObject(body)
	if top == nil {
		return false
	}
	return jsonString(top["status"]) == "needs_review" ||
		jsonString(jsonObject(top["data"])["status"]) == "needs_review"
}

// jsonObject is b's members if b is a JSON object, else nil.
func jsonObject(b []byte) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	if len(b) == 0 || json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

// jsonString is b's value if b is a JSON string, else "".
func jsonString(b json.RawMessage) string {
	var s string
	if len(b) == 0 || b[0] != '"' || json.Unmarshal(b, &s) != nil {
		return ""
	}
	return s
}

// review is NeedsReview of the body at body (its first byte) of n bytes,
// or, with omitted, of the body WithoutBody left out.
type review struct {
	body    *byte
	n       int
	yes     bool
	omitted bool
}

// WithReview returns r knowing whether its body needs review: NeedsReview
// scans the body once, here, and r.NeedsReview of r and of every copy of it
// reads what it found while Body is that body. A final answer is asked it
// more than once as it is stored: by the store, for its expiry
// (Record.Expires), and by the metrics. A body is never written in place
// once it is a Response's.
func (r Response) WithReview() Response {
	if len(r.Body) > 0 {
		r.review = review{body: &r.Body[0], n: len(r.Body), yes: NeedsReview(r.Body)}
	}
	return r
}

// WithoutBody returns r without its body (Body nil), still knowing
// whether the body it had needs review: r.NeedsReview of it and of every
// copy of it answers for that body while Body stays empty. It is how List
// gives a record whose bodies were not asked for (Filter.Bodies): the
// listing still tells, and Filter.Keep still judges, an answer that needs
// review.
func (r Response) WithoutBody() Response {
	yes := r.NeedsReview()
	r.Body = nil
	r.review = review{yes: yes, omitted: true}
	return r
}

// NeedsReview is NeedsReview(r.Body), as WithReview found it if it scanned
// this body, or as WithoutBody found it of the body it left out.
func (r *Response) NeedsReview() bool {
	if len(r.Body) > 0 && r.review.body == &r.Body[0] && r.review.n == len(r.Body) {
		return r.review.yes
	}
	if len(r.Body) == 0 && r.review.omitted {
		return r.review.yes
	}
	return NeedsReview(r.Body)
}

// AwaitsReview reports whether r is a final record kept for an operator: its
// answer needs review (NeedsReview), and no operator has marked it Reviewed
// yet. Such a record never expires, so that the app's retries keep getting
// the answer, and nothing is sent to the provider again, however long the
// review takes; it is listed for operators until it is marked.
func (r *Record) AwaitsReview() bool {
	return r.State == Final && !r.Reviewed && r.Response.NeedsReview()
}

// Expires reports whether r expires TTL after its last write (with a TTL):
// only a Final record does, and not one that is Superseded or AwaitsReview.
// Every store decides a record's expiry by it.
func (r *Record) Expires() bool {
	return r.State == Final && !r.Superseded && !r.AwaitsReview()
}
