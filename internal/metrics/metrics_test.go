package metrics

import (
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRequesterLabelsBounded: the per-requester gauge never has more than
// MaxRequesterLabels+1 series; forgotten nodes free their slot.
func TestRequesterLabelsBounded(t *testing.T) {
	m := NewForTest()
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
