package store

import (
	"bytes"
	"testing"
)

func TestNeedsReview(t *testing.T) {
	tests := []struct {
		body string
		want bool
	}{
		{`{"id":"c1","kind":"issue","status":"needs_review"}`, true},
		{`{"data":{"id":"c1","status":"needs_review"}}`, true},
		{`{"status":"needs\u005freview"}`, true}, // an escape spells it otherwise
		{`{"st\u0061tus":"needs_review"}`, true},
		{`{"status":"succeeded","note":"needs_review"}`, false},
		{`{"status":"failed"}`, false},
		{`{"status":["needs_review"]}`, false},
		{`{"data":"needs_review"}`, false},
		{`["needs_review"]`, false},
		{`needs_review`, false},
		{`{"status":"needs_review"`, false}, // not JSON
		{``, false},
	}
	for _, tt := range tests {
		if got := NeedsReview([]byte(tt.body)); got != tt.want {
			t.Errorf("NeedsReview(%s) = %v, want %v", tt.body, got, tt.want)
		}
	}
}

func TestExpires(t *testing.T) {
	review := Response{Body: []byte(`{"status":"needs_review"}`)}
	tests := []struct {
		name string
		rec  Record
		want bool
	}{
		{"final", Record{State: Final, Response: Response{Body: []byte(`{"status":"succeeded"}`)}}, true},
		{"final that awaits review", Record{State: Final, Response: review}, false},
		{"final reviewed", Record{State: Final, Response: review, Reviewed: true}, true},
		{"superseded", Record{State: Final, Superseded: true}, false},
		{"superseded reviewed", Record{State: Final, Response: review, Reviewed: true, Superseded: true}, false},
		{"in flight", Record{State: InFlight}, false},
		{"unknown whose last answer needed review", Record{State: Unknown, Outcome: Outcome{LastBody: review.Body}}, false},
	}
	for _, tt := range tests {
		if got := tt.rec.Expires(); got != tt.want {
			t.Errorf("%s: Expires() = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A Response scanned by WithReview answers NeedsReview, in every copy, from
// that one scan while its Body is the body scanned, and scans again for
// another body. The test writes the body in place after the scan, which
// nothing else does, to tell what the scan found from a second scan.
func TestWithReviewScansOnce(t *testing.T) {
	for _, tt := range []struct{ body, after string }{
		{`{"status":"needs_review"}`, `{"status":"xxxxxxxxxxxx"}`},
		{`{"status":"succeeded___"}`, `{"status":"needs_review"}`},
	} {
		r := Response{Status: 200, Body: []byte(tt.body)}.WithReview()
		want := NeedsReview([]byte(tt.body))
		copy(r.Body, tt.after)
		rec := Record{State: Final, Response: r}
		if c := r; c.NeedsReview() != want || rec.AwaitsReview() != want || rec.Expires() == want {
			t.Errorf("%s written over with %s: NeedsReview %v, AwaitsReview %v, Expires %v; want what the scan found, %v",
				tt.body, tt.after, c.NeedsReview(), rec.AwaitsReview(), rec.Expires(), want)
		}
		r.Body = []byte(tt.after) // another body: scanned
		if got := r.NeedsReview(); got != NeedsReview(r.Body) {
			t.Errorf("%s after %s: NeedsReview %v, a scan says %v", tt.after, tt.body, got, !got)
		}
		r.Body = r.Body[:len(r.Body)-1]
		if r.NeedsReview() {
			t.Errorf("%s cut short: needs review", tt.after)
		}
	}
	if empty := (Response{}).WithReview(); empty.NeedsReview() {
		t.Error("an empty body needs review")
	}
}

// BenchmarkFinalAnswerReview is what asking a final answer whether it needs
// review costs as it is stored through the metrics: the store's expiry and
// the metrics each scanning the body, or one scan (WithReview) both read.
func BenchmarkFinalAnswerReview(b *testing.B) {
	small := []byte(`{"id":"pay_2c4f9a1e7b3d4e8f","object":"payment","status":"succeeded","amount":1000,"currency":"RUB","created":1732900000}`)
	large := bytes.Repeat([]byte(`{"id":"pay_2c4f9a1e7b3d4e8f","status":"succeeded"},`), 320) // 16 KiB
	for _, body := range []struct {
		name string
		b    []byte
	}{{"118B", small}, {"16KiB", large}} {
		b.Run(body.name+"/two-scans", func(b *testing.B) {
			b.SetBytes(int64(len(body.b)))
			b.ReportAllocs()
			for b.Loop() {
				rec := Record{State: Final, Response: Response{Status: 200, Body: body.b}}
				if rec.Expires() == NeedsReview(rec.Response.Body) { // the store's, then the metrics'
					b.Fatal("expires and needs review")
				}
			}
		})
		b.Run(body.name+"/one-scan", func(b *testing.B) {
			b.SetBytes(int64(len(body.b)))
			b.ReportAllocs()
			for b.Loop() {
				rec := Record{State: Final, Response: Response{Status: 200, Body: body.b}.WithReview()}
				if rec.Expires() == rec.Response.NeedsReview() {
					b.Fatal("expires and needs review")
				}
			}
		})
	}
}
