package pgstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestBatchPanicIsCallersError: a panic in a statement's code reaches its
// caller as an error, with the stack, instead of leaving it waiting or
// ending the process; the group goes on sending the next statement.
func TestBatchPanicIsCallersError(t *testing.T) {
	calls := 0
	g := &group[string, string]{timeout: time.Minute, run: func(_ context.Context, jobs []*job[string, string]) error {
		calls++
		if calls == 1 {
			panic("broken row")
		}
		for _, j := range jobs {
			j.found, j.out = true, "written "+j.in
		}
		return nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, err := g.do(ctx, store.ID{Tenant: "t", Key: "a"}, "a", 1)
	if err == nil || !strings.Contains(err.Error(), "broken row") || !strings.Contains(err.Error(), "batch.go") {
		t.Fatalf("do after a panic: err = %v; want the panic's value and its stack", err)
	}
	out, found, err := g.do(ctx, store.ID{Tenant: "t", Key: "b"}, "b", 1)
	if err != nil || !found || out != "written b" {
		t.Fatalf("do after the panicked statement = %q, %v, %v; want the next statement sent", out, found, err)
	}
}
