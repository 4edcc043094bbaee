package metrics

import (
	"sync"
	"testing"
)

// TestChildrenAreTheVectors: a kept child is the vector's own series,
// made on first use only (a label value never used shows no series), and
// concurrent first uses make one series.
func TestChildrenAreTheVectors(t *testing.T) {
	m := New("test")
	vec := m.counterVec("children_test_total", "test", "a", "b")
	c := newChildren(vec.WithLabelValues, 2)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				c.get("x", "y").Inc()
			}
		})
	}
	wg.Wait()
	c.get("x", "z").Add(2)
	if got := value(t, m, "idemproxy_children_test_total", "a", "x", "b", "y"); got != 800 {
		t.Errorf("a=x,b=y: %v, want 800", got)
	}
	if got := value(t, m, "idemproxy_children_test_total", "a", "x", "b", "z"); got != 2 {
		t.Errorf("a=x,b=z: %v, want 2", got)
	}
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "idemproxy_children_test_total" && len(f.Metric) != 2 {
			t.Errorf("%d series, want the 2 used", len(f.Metric))
		}
	}

	hist := m.histogramVec("children_test_seconds", "test", []float64{1}, "op")
	h := newChildren(hist.WithLabelValues, 1)
	h.get("begin", "").Observe(0.5)
	if got := value(t, m, "idemproxy_children_test_seconds", "op", "begin"); got != 1 {
		t.Errorf("op=begin: %v observations, want 1", got)
	}
}
