package integration

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

const mDisconnectOK = `pegaflow_holder_rpc_total{code="OK",rpc="rdma_disconnect"}`

// TestHolderQPsReleased: the holder side of TestQPCount. When the requester
// invalidates its connection (and does not handshake again), the holder's
// pegaflow_rdma_qps falls back to 0 at once (RdmaDisconnect) instead of
// holding the QPs until that requester reconnects; likewise when the
// requester daemon shuts down.
func TestHolderQPsReleased(t *testing.T) {
	const (
		ns   = "disc"
		nics = 2
		qps  = 3
	)
	rng := rand.New(rand.NewPCG(9, 9))
	hc := baseConfig(t, "holder")
	hc.NICs = fmt.Sprint(nics)
	h := start(t, hc)
	// Two sets: the requester caches what it fetched, so the second
	// fetch needs blocks it does not have yet.
	var sets [2][][]byte
	for i := range sets {
		bs := randomBlocks(rng, fmt.Sprintf("d%d", i), 4, 1<<10, 64<<10)
		putAll(t, h, ns, bs)
		for _, b := range bs {
			sets[i] = append(sets[i], b.hash)
		}
	}
	rc := baseConfig(t, "requester")
	rc.NICs = fmt.Sprint(nics)
	rc.QPsPerPeer = qps
	r := start(t, rc)
	ctx := ctxT(t, 30*time.Second)

	holderQPs := func(want float64) func() error {
		return func() error {
			m := h.cn.Scrape(t)
			if m[mRDMAQPs] != want {
				return fmt.Errorf("holder %s = %v, want %v", mRDMAQPs, m[mRDMAQPs], want)
			}
			return nil
		}
	}
	if _, err := prefetch(ctx, r, h.d.PeerAddr(), ns, sets[0]...); err != nil {
		t.Fatal(err)
	}
	if err := holderQPs(nics * qps)(); err != nil {
		t.Fatal(err)
	}

	c, err := r.d.Dialer().Get(ctx, h.d.PeerAddr())
	if err != nil {
		t.Fatal(err)
	}
	r.d.Dialer().Invalidate(c, errors.New("test: invalidate"))
	eventually(t, "holder QPs released after the requester invalidated", 3*time.Second, holderQPs(0))
	m := h.cn.Scrape(t)
	if m[mDisconnectOK] != 1 {
		t.Fatalf("%s = %v, want 1", mDisconnectOK, m[mDisconnectOK])
	}
	cs, err := h.admin.ListConns(ctx, &pegadv1.ListConnsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.GetConns()) != 0 {
		t.Fatalf("holder still lists %v", cs.GetConns())
	}

	// Reconnecting works as before; the requester's shutdown frees the
	// holder's side too, before Close returns.
	if _, err := prefetch(ctx, r, h.d.PeerAddr(), ns, sets[1]...); err != nil {
		t.Fatal(err)
	}
	if err := holderQPs(nics * qps)(); err != nil {
		t.Fatal(err)
	}
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	if err := holderQPs(0)(); err != nil {
		t.Fatalf("right after the requester's shutdown: %v", err)
	}
	if got := h.cn.Scrape(t)[mDisconnectOK]; got != 2 {
		t.Fatalf("%s = %v, want 2", mDisconnectOK, got)
	}
}
