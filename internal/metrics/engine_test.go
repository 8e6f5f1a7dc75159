package metrics

import (
	"fmt"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestEngineCeiling: the real ratio and the ceiling per namespace label,
// with the label bound of the other engine metrics (the ranks of a model
// share one; past the limit: other), NaN for a label nothing was looked
// up in, and the ceiling capped at 1.
func TestEngineCeiling(t *testing.T) {
	m := NewEngine(prometheus.NewRegistry())
	m.Lookup("llama@tp0", 10, 6)
	m.Lookup("llama@tp1", 10, 2) // 8 hits, 12 misses
	m.Recomputed("llama@tp0")
	m.Recomputed("llama@tp1")
	m.Recomputed("fresh") // put, never looked up: no ratio
	m.Lookup("cold", 4, 0)
	for range 5 {
		m.Recomputed("cold") // more recomputed than misses: capped
	}
	for i := range DefaultNamespaceLabels + 3 {
		m.Lookup(fmt.Sprintf("ns%d", i), 2, 1)
	}
	got := map[string]float64{}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(ratios{m})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			got[f.GetName()+"/"+s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
		}
	}
	for k, v := range map[string]float64{
		"pegaflow_prefix_hit_ratio/llama": 0.4, "pegaflow_prefix_hit_ratio_ceiling/llama": 0.5,
		"pegaflow_prefix_hit_ratio/cold": 0, "pegaflow_prefix_hit_ratio_ceiling/cold": 1,
		"pegaflow_prefix_hit_ratio/other": 0.5, "pegaflow_prefix_hit_ratio_ceiling/other": 0.5,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if v, ok := got["pegaflow_prefix_hit_ratio_ceiling/fresh"]; !ok || !math.IsNaN(v) {
		t.Errorf("a namespace never looked up: ceiling %v (exported %v), want NaN", v, ok)
	}
	// Own labels: llama, fresh, cold and 29 ns ones, and other.
	if n := len(got) / 2; n != DefaultNamespaceLabels+1 {
		t.Errorf("%d labels with ratios, want %d", n, DefaultNamespaceLabels+1)
	}
	if v := testutil.ToFloat64(m.RecomputedBlocks.WithLabelValues("llama")); v != 2 {
		t.Errorf("llama's recomputed blocks %v, want 2", v)
	}
	if n := m.RecomputedTotal(); n != 8 {
		t.Errorf("recomputed total %d, want 8", n)
	}
}
