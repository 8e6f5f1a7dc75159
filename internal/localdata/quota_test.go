package localdata

import (
	"testing"

	"github.com/pegaflow/pegad/api/localwire"
	"github.com/pegaflow/pegad/internal/store"
)

// TestAllocNamespaceQuota: ALLOC names its namespace, so a namespace at
// its quota makes room from its own blocks at ALLOC, and an ALLOC its own
// blocks cannot make room for is POOL_FULL with nothing changed.
func TestAllocNamespaceQuota(t *testing.T) {
	const n = 1024
	f := newFixture(t)
	if err := f.st.SetQuotas([]store.Quota{{Prefix: "a", Bytes: 2 * n}}); err != nil {
		t.Fatal(err)
	}
	c := f.dial(t, true)
	for _, h := range []string{"0", "1", "2"} {
		_, r := c.call(localwire.OpAlloc, 1, allocBody("a", h, n))
		if r[0].Status != localwire.StatusOK {
			t.Fatalf("alloc a/%s: %+v", h, r[0])
		}
		if _, r := c.call(localwire.OpCommit, 1, ids(r[0].Lease)); r[0].Status != localwire.StatusOK || !r[0].Created {
			t.Fatalf("commit a/%s: %+v", h, r[0])
		}
	}
	if q := f.st.Quotas()[0]; q.Used != 2*n || q.Evictions != 1 {
		t.Fatalf("after three ALLOCs: %+v, want 2 blocks used, 1 evicted", q)
	}
	before, leases := f.st.Stats(), f.srv.Leases().Len()
	if _, r := c.call(localwire.OpAlloc, 1, allocBody("a", "big", 3*n)); r[0].Status != localwire.StatusPoolFull {
		t.Fatalf("alloc over the quota: %+v, want POOL_FULL", r[0])
	}
	if after := f.st.Stats(); after.Blocks != before.Blocks || after.Pool.Used != before.Pool.Used || f.srv.Leases().Len() != leases {
		t.Fatalf("refused ALLOC changed state: %+v, was %+v", after, before)
	}
}
