package metrics

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRequesterLabelsBounded: the per-requester gauge never has more than
// MaxRequesterLabels+1 series; forgotten nodes free their slot.
func TestRequesterLabelsBounded(t *testing.T) {
	m := New(prometheus.NewRegistry(), false)
	for i := range MaxRequesterLabels + 50 {
		m.RequesterSessions("node-" + strconv.Itoa(i)).Inc()
	}
	if n := testutil.CollectAndCount(m.sessionsByReq); n != MaxRequesterLabels+1 {
		t.Fatalf("%d series, want %d", n, MaxRequesterLabels+1)
	}
	if v := Value(m.RequesterSessions(OtherRequester)); v != 50 {
		t.Fatalf("_other = %v, want 50", v)
	}
	// An overflowed node keeps counting under _other after a slot frees,
	// so its decrements meet its increments.
	m.ForgetRequester("node-0")
	m.RequesterSessions("node-" + strconv.Itoa(MaxRequesterLabels)).Dec()
	if v := Value(m.RequesterSessions(OtherRequester)); v != 49 {
		t.Fatalf("_other = %v after an overflowed node's decrement, want 49", v)
	}
	m.RequesterSessions("late").Inc()
	if v := Value(m.RequesterSessions("late")); v != 1 {
		t.Fatalf("a new node after a forgotten one did not get its own series (late = %v)", v)
	}
	if n := testutil.CollectAndCount(m.sessionsByReq); n != MaxRequesterLabels+1 {
		t.Fatalf("%d series after forget, want %d", n, MaxRequesterLabels+1)
	}
}

func TestEngineLabelsBounded(t *testing.T) {
	m := NewEngine(prometheus.NewRegistry())
	if got := m.Label("llama@tp3"); got != "llama" {
		t.Fatalf("rank namespace labelled %q, want its base", got)
	}
	for i := range DefaultNamespaceLabels + 10 {
		m.Lookup(fmt.Sprintf("ns%d@tp0", i), 10, 4)
	}
	if got := m.Label("llama@tp1"); got != "llama" {
		t.Fatalf("a namespace seen before the limit labelled %q", got)
	}
	if got := m.Label("late"); got != NamespaceOther {
		t.Fatalf("a namespace past the limit labelled %q", got)
	}
	n := testutil.CollectAndCount(m.Lookups)
	if n != DefaultNamespaceLabels { // llama (only labelled) has none: 31 namespaces and other
		t.Fatalf("%d lookup series, want %d", n, DefaultNamespaceLabels)
	}
	if l, h, mi := m.Totals(); l != DefaultNamespaceLabels+10 || h != 4*l || mi != 6*l {
		t.Fatalf("totals %d %d %d", l, h, mi)
	}
	if v := testutil.ToFloat64(m.HitBlocks.WithLabelValues(NamespaceOther)); v != 4*11 {
		t.Fatalf("other's hit blocks %v, want 44 (11 namespaces past the first 31 and llama)", v)
	}
}
