package daemon_test

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/testutil"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// TestNamespaceQuotaSIGHUP: a namespace at its --namespace-quota evicts
// its own blocks over the local API and leaves the others' alone; a put
// its own blocks cannot make room for is ResourceExhausted; SIGHUP reads
// the configuration again and a lowered quota evicts down to it at once;
// a reload that fails keeps the quotas in force.
func TestNamespaceQuotaSIGHUP(t *testing.T) {
	const blk = 16 << 10
	cfg := testConfig(t)
	cfg.Eviction = "lru" // which of q's blocks goes is the policy's; this test names them
	cfg.NamespaceQuota = []string{"q=64KiB"}
	var mu sync.Mutex
	next, nextErr := cfg, error(nil) // what the reload reads; guarded by mu
	reload := func() (config.Config, error) {
		mu.Lock()
		defer mu.Unlock()
		return next, nextErr
	}
	n := startNode(t, cfg, daemon.WithConfigReload(reload))
	m := n.d.MetricsAddr()
	used := func(ns string) float64 {
		return cluster.Scrape(t, m)[`pegaflow_namespace_used_bytes{namespace="`+ns+`"}`]
	}
	hash := func(i int) []byte { return []byte{0xa0, byte(i)} }

	for i := range 4 {
		putBlock(t, n, "q", hash(i), pattern(blk, byte(i)), false)
		putBlock(t, n, "o", hash(i), pattern(blk, byte(i)), false)
	}
	putBlock(t, n, "q", hash(4), pattern(blk, 4), false) // over: q's oldest goes
	if v := used("q"); v != 4*blk {
		t.Fatalf("pegaflow_namespace_used_bytes{q} = %v, want %v", v, 4*blk)
	}
	if _, err := testutil.GetBlock(ctxT(t), n.local, "q", hash(0)); status.Code(err) != codes.NotFound {
		t.Errorf("q's oldest block after a put over the quota: %v, want NotFound", err)
	}
	for i := range 4 {
		getBlock(t, n, "o", hash(i)) // another namespace's blocks all still hit
	}
	if v := metric(t, m, `pegaflow_namespace_quota_evictions_total{namespace="q"}`); v != 1 {
		t.Errorf("quota evictions = %v, want 1", v)
	}

	_, err := testutil.PutBlock(ctxT(t), n.local, "q", hash(9), pattern(8*blk, 9), false)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("put larger than q's quota: %v, want ResourceExhausted", err)
	}
	if v := metric(t, m, `pegaflow_namespace_quota_refusals_total{namespace="q"}`); v != 1 {
		t.Errorf("quota refusals = %v, want 1", v)
	}
	st, err := n.admin.Stats(ctxT(t), &pegadv1.StatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if q := st.GetQuotas(); len(q) != 1 || q[0].GetPrefix() != "q" || q[0].GetLimitBytes() != 64<<10 || q[0].GetUsedBytes() != 4*blk ||
		q[0].GetBlocks() != 4 || q[0].GetEvictions() != 1 || q[0].GetRefusals() != 1 {
		t.Errorf("admin Stats quotas = %v, want q: 4 blocks of 64KiB, 1 eviction, 1 refusal", q)
	}

	mu.Lock()
	next.NamespaceQuota = []string{"q=16KiB", "o=1MiB"}
	mu.Unlock()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "SIGHUP to lower q's quota", 10*time.Second, func() bool { return used("q") == blk })
	if v := metric(t, m, `pegaflow_namespace_quota_bytes{namespace="o"}`); v != 1<<20 {
		t.Errorf("o's quota after the reload = %v, want 1MiB", v)
	}
	if v := used("o"); v != 4*blk {
		t.Errorf("o's use after the reload = %v, want %v", v, 4*blk)
	}
	getBlock(t, n, "q", hash(4)) // the newest stays

	bad := errors.New("config: invalid namespace-quota")
	mu.Lock()
	next.NamespaceQuota, nextErr = []string{"q=1KiB"}, bad
	mu.Unlock()
	if err := n.d.ReloadQuotas(); !errors.Is(err, bad) {
		t.Errorf("ReloadQuotas of a bad configuration = %v, want %v", err, bad)
	}
	if v := metric(t, m, `pegaflow_namespace_quota_bytes{namespace="q"}`); v != blk {
		t.Errorf("q's quota after a failed reload = %v, want %v (kept)", v, blk)
	}
}
