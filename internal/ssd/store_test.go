package ssd

import (
	"bytes"
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
)

// TestStoreSpillsAndPromotes: a pool of 8 blocks takes 32 puts; the
// evicted ones land on the tier, and pinning any of the 32 finds it with
// its bytes (from DRAM or read back), counted per tier.
func TestStoreSpillsAndPromotes(t *testing.T) {
	const n = 256 << 10
	p, err := pool.New(pool.Options{Size: 8 * n, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	st := store.New(p, metricstest.New())
	e := newEnv(t, 1, 32<<20, 0)
	tr := e.open(t)
	st.SetLower(tr, e.m)

	put := func(i int) {
		t.Helper()
		if _, err := st.Put(key(i), sizes2(n), func(b []byte) error { copy(b, pattern(i, n)); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 32; i++ {
		put(i)
	}
	waitIdle(t, tr)
	if got := tr.Stats().Blocks; got < 24 {
		t.Fatalf("%d blocks on the tier, want the 24+ evicted", got)
	}
	for i := 0; i < 32; i++ {
		var got bytes.Buffer
		if _, err := st.Read(key(i), func(c []byte) error { got.Write(c); return nil }); err != nil {
			t.Fatalf("block %d: %v", i, err)
		}
		if !bytes.Equal(got.Bytes(), pattern(i, n)) {
			t.Fatalf("block %d: wrong bytes", i)
		}
	}
	if ssd := testutil.ToFloat64(e.m.Hits.WithLabelValues(metrics.TierSSD)); ssd < 24 {
		t.Fatalf("ssd hits %v, want >= 24", ssd)
	}
	if pr := testutil.ToFloat64(e.m.Promotions); pr < 24 {
		t.Fatalf("promotions %v", pr)
	}
	// Delete reaches the tier too.
	waitIdle(t, tr)
	var onlySSD store.Key
	for i := 0; i < 32; i++ {
		if !st.Has(key(i)) && tr.Has(key(i)) {
			onlySSD = key(i)
			break
		}
	}
	if onlySSD.Hash == "" {
		t.Fatal("no block only on the tier")
	}
	if _, err := st.Delete(onlySSD); err != nil {
		t.Fatal(err)
	}
	if pinned, _ := st.Pin([]store.Key{onlySSD}); len(pinned) != 0 || tr.Has(onlySSD) {
		t.Fatal("deleted block still served")
	}
}

// TestFlushLower: a clean stop's flush puts the pool's blocks (none
// evicted) on the tier, waiting for queue room, so all of them survive.
func TestFlushLower(t *testing.T) {
	const n = 256 << 10
	p, err := pool.New(pool.Options{Size: 8 * n, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	st := store.New(p, metricstest.New())
	e := newEnv(t, 1, 32<<20, 0)
	e.o.QueueBytes = 2 * (n + 2*Align) // room for two records: the flush waits for room
	tr := e.open(t)
	st.SetLower(tr, e.m)
	for i := 0; i < 6; i++ {
		if _, err := st.Put(key(i), sizes2(n), func(b []byte) error { copy(b, pattern(i, n)); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, tr)
	got, err := st.FlushLower(context.Background())
	if err != nil || got != 6 {
		t.Fatalf("flushed %d: %v", got, err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	tr = e.open(t)
	for i := 0; i < 6; i++ {
		mustLoad(t, tr, i, n)
	}
}
