package integration

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"
)

// TestHolderRestartReconnectsBeforeRead: a holder restarts on the same
// port while the requester still holds a connection handshaken with the old
// incarnation. The query answer carries the new incarnation, so the very
// first fetch after the restart reconnects before it reads and succeeds —
// without the check it fails (memory outside the stale snapshot) or waits
// out the retry budget on dead QPs.
func TestHolderRestartReconnectsBeforeRead(t *testing.T) {
	const ns = "restart"
	rng := rand.New(rand.NewPCG(9, 9))
	blocks := randomBlocks(rng, "r", 4, 64<<10, 256<<10)

	hc := baseConfig(t, "holder")
	h := start(t, hc)
	addr := h.d.PeerAddr()
	putAll(t, h, ns, blocks[:2])

	r := start(t, baseConfig(t, "requester"))
	ctx := ctxT(t, 60*time.Second)
	if _, err := prefetch(ctx, r, addr, ns, blocks[0].hash, blocks[1].hash); err != nil {
		t.Fatalf("first prefetch: %v\n%s", err, r.logs)
	}
	before := r.cn.Scrape(t)

	// Same port, same node id, a new incarnation and a new pool.
	if err := h.close(); err != nil {
		t.Fatal(err)
	}
	hc.Listen = addr
	h2 := start(t, hc)
	if h2.d.Incarnation() == h.d.Incarnation() {
		t.Fatal("restarted holder kept its incarnation")
	}
	putAll(t, h2, ns, blocks[2:])

	start := time.Now()
	resp, err := prefetch(ctx, r, addr, ns, blocks[2].hash, blocks[3].hash)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("first prefetch after the holder restarted: %v\n%s", err, r.logs)
	}
	for _, b := range resp.GetBlocks() {
		if b.GetStatus() != statusFetched {
			t.Fatalf("block %x: %v %s\n%s", b.GetHash(), b.GetStatus(), b.GetError(), r.logs)
		}
	}
	for _, b := range blocks[2:] {
		got, err := get(ctx, r, ns, b.hash)
		if err != nil || !bytes.Equal(got, b.body) {
			t.Fatalf("block %x: %d bytes, %v; want %d identical bytes", b.hash, len(got), err, len(b.body))
		}
	}
	after := r.cn.Scrape(t)
	const restarted = `pegaflow_rdma_connection_invalidations_total{reason="peer_restarted"}`
	if got := after[restarted] - before[restarted]; got != 1 {
		t.Fatalf("%s went up by %v, want 1", restarted, got)
	}
	// Reconnecting is one handshake, not a retry budget of silence.
	if took > 3*time.Second {
		t.Fatalf("fetch after restart took %v", took)
	}
	hm := h2.cn.Scrape(t)
	if hm[mSessionsActive] != 0 || hm[mQueryOK] != hm[mReleaseOK] {
		t.Fatalf("restarted holder: sessions %v, query ok %v, release ok %v",
			hm[mSessionsActive], hm[mQueryOK], hm[mReleaseOK])
	}
}
