package store

import "testing"

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
