package integration

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// TestSameQPNStartHolders: two holders started with the same
// --tcp-qpn-start hand out the same QPNs; one requester serving from both
// at once must keep them apart (no state keyed by QPN alone) and get every
// byte right.
func TestSameQPNStartHolders(t *testing.T) {
	const ns = "qpn"
	rng := rand.New(rand.NewPCG(2, 2))
	var holders []*node
	var blocks [][]block
	for i := range 2 {
		c := baseConfig(t, fmt.Sprintf("holder-%d", i))
		c.TCPQPNStart = 0x4000
		c.NICs = "2"
		holders = append(holders, start(t, c))
		bs := randomBlocks(rng, fmt.Sprintf("h%d", i), 24, 1, 300<<10)
		putAll(t, holders[i], ns, bs)
		blocks = append(blocks, bs)
	}
	rc := baseConfig(t, "requester")
	rc.NICs = "2"
	rc.PoolSize = 64 << 20
	r := start(t, rc)

	ctx := ctxT(t, 60*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i, h := range holders {
		for g := range 3 { // three concurrent fetchers per holder
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := g; j < len(blocks[i]); j += 6 {
					hs := [][]byte{blocks[i][j].hash}
					if j+3 < len(blocks[i]) {
						hs = append(hs, blocks[i][j+3].hash)
					}
					resp, err := prefetch(ctx, r, h.d.PeerAddr(), ns, hs...)
					if err != nil {
						errs <- fmt.Errorf("prefetch from holder %d: %w", i, err)
						return
					}
					for _, b := range resp.GetBlocks() {
						if b.GetStatus() != statusFetched {
							errs <- fmt.Errorf("holder %d block %s: %v %s", i, b.GetHash(), b.GetStatus(), b.GetError())
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	// Same QPNs on both holders: the accepted QPNs overlap, and every byte
	// still came from the right one.
	qpns := make([]map[uint32]bool, 2)
	for i, h := range holders {
		cs, err := h.admin.ListConns(ctx, &pegadv1.ListConnsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		qpns[i] = map[uint32]bool{}
		for _, c := range cs.GetConns() {
			for _, nic := range c.GetNics() {
				for _, q := range nic.GetLocalQpns() {
					qpns[i][q] = true
				}
			}
		}
	}
	overlap := 0
	for q := range qpns[0] {
		if qpns[1][q] {
			overlap++
		}
	}
	if overlap == 0 {
		t.Fatalf("holders' QPNs do not overlap (%v, %v): the test does not exercise a QPN collision", qpns[0], qpns[1])
	}
	for i := range holders {
		for _, b := range blocks[i] {
			got, err := get(ctx, r, ns, b.hash)
			if err != nil || !bytes.Equal(got, b.body) {
				t.Fatalf("block %s from holder %d: %d bytes, %v; want %d identical bytes", b.hash, i, len(got), err, len(b.body))
			}
		}
	}
	t.Logf("%d overlapping QPNs, %d+%d blocks fetched", overlap, len(blocks[0]), len(blocks[1]))
}

// TestQPCount: pegaflow_rdma_qps on a requester is peers × NICs ×
// qps_per_peer once connected, `conns list` agrees, and both fall to zero
// when the connections are invalidated.
func TestQPCount(t *testing.T) {
	const (
		ns    = "qps"
		nics  = 2
		qps   = 3
		peers = 2
	)
	rng := rand.New(rand.NewPCG(3, 3))
	var holders []*node
	var blocks [][]block
	for i := range peers {
		c := baseConfig(t, fmt.Sprintf("holder-%d", i))
		c.NICs = fmt.Sprint(nics)
		holders = append(holders, start(t, c))
		bs := randomBlocks(rng, fmt.Sprintf("h%d", i), 4, 1<<10, 64<<10)
		putAll(t, holders[i], ns, bs)
		blocks = append(blocks, bs)
	}
	rc := baseConfig(t, "requester")
	rc.NICs = fmt.Sprint(nics)
	rc.QPsPerPeer = qps
	r := start(t, rc)
	ctx := ctxT(t, 30*time.Second)

	for i, h := range holders {
		var hs [][]byte
		for _, b := range blocks[i] {
			hs = append(hs, b.hash)
		}
		if _, err := prefetch(ctx, r, h.d.PeerAddr(), ns, hs...); err != nil {
			t.Fatal(err)
		}
	}
	m := r.cn.Scrape(t)
	if got, want := m[mRDMAQPs], float64(peers*nics*qps); got != want {
		t.Fatalf("%s = %v, want peers×NICs×qps_per_peer = %v", mRDMAQPs, got, want)
	}
	if got, want := m[mSessionWorkers], float64(peers*nics*qps); got != want {
		t.Fatalf("%s = %v, want one per QP = %v", mSessionWorkers, got, want)
	}
	cs, err := r.admin.ListConns(ctx, &pegadv1.ListConnsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	seen := map[string]bool{}
	for _, c := range cs.GetConns() {
		if c.GetRole() != "requester" || c.GetState() != "connected" || c.GetQps() != nics*qps || len(c.GetNics()) != nics {
			t.Fatalf("conn row %v: want requester, connected, %d QPs over %d NICs", c, nics*qps, nics)
		}
		for _, nic := range c.GetNics() {
			if nic.GetQps() != qps || len(nic.GetLocalQpns()) != qps {
				t.Fatalf("nic row %v: want %d QPs", nic, qps)
			}
		}
		seen[c.GetPeer()] = true
		total += int(c.GetQps())
	}
	if len(cs.GetConns()) != peers || total != int(m[mRDMAQPs]) {
		t.Fatalf("conns list: %d conns with %d QPs, metric says %v", len(cs.GetConns()), total, m[mRDMAQPs])
	}
	for _, h := range holders {
		if !seen[h.d.PeerAddr()] {
			t.Fatalf("no connection to %s in %v", h.d.PeerAddr(), cs)
		}
		// Each holder's accept side has the mirror QPs of its requester.
		if got := h.cn.Scrape(t)[mRDMAQPs]; got != nics*qps {
			t.Fatalf("holder %s: %s = %v, want %d", h.cfg.NodeID, mRDMAQPs, got, nics*qps)
		}
	}

	for _, h := range holders {
		c, err := r.d.Dialer().Get(ctx, h.d.PeerAddr())
		if err != nil {
			t.Fatal(err)
		}
		r.d.Dialer().Invalidate(c, errors.New("test: invalidate"))
	}
	eventually(t, "requester QPs torn down", 10*time.Second, func() error {
		m := r.cn.Scrape(t)
		if m[mRDMAQPs] != 0 || m[mSessionWorkers] != 0 {
			return fmt.Errorf("%s=%v %s=%v", mRDMAQPs, m[mRDMAQPs], mSessionWorkers, m[mSessionWorkers])
		}
		cs, err := r.admin.ListConns(ctx, &pegadv1.ListConnsRequest{})
		if err != nil {
			return err
		}
		if len(cs.GetConns()) != 0 {
			return fmt.Errorf("conns list still has %v", cs.GetConns())
		}
		return nil
	})
	// (The holders' side of invalidation: TestHolderQPsReleased.) A fresh
	// fetch reconnects with the same count on both sides.
	if _, err := prefetch(ctx, r, holders[0].d.PeerAddr(), ns, []byte("absent")); err != nil {
		t.Fatal(err)
	}
	if got := r.cn.Scrape(t)[mRDMAQPs]; got != nics*qps {
		t.Fatalf("after reconnecting to one peer: %s = %v, want %d", mRDMAQPs, got, nics*qps)
	}
	if got := holders[0].cn.Scrape(t)[mRDMAQPs]; got != nics*qps {
		t.Fatalf("holder after the requester reconnected: %s = %v, want %d (stale accept replaced)", mRDMAQPs, got, nics*qps)
	}
}

// TestSmallPool: a requester with a 16 MiB pool prefetches, over several
// calls, blocks that total far more than its pool (LRU eviction makes room
// for each fetch's staging), then one fetch of ~12 MiB in a single call.
func TestSmallPool(t *testing.T) {
	const ns = "small"
	rng := rand.New(rand.NewPCG(4, 4))
	hc := baseConfig(t, "holder")
	hc.PoolSize = 96 << 20
	h := start(t, hc)
	bs := randomBlocks(rng, "b", 16, 2<<20, 3<<20) // 16 × 2-3 MiB ≈ 40 MiB
	big := randomBlocks(rng, "big", 3, 4<<20, 4<<20)
	putAll(t, h, ns, bs)
	putAll(t, h, ns, big)

	rc := baseConfig(t, "requester")
	rc.PoolSize = 16 << 20
	r := start(t, rc)
	ctx := ctxT(t, 60*time.Second)

	var fetched int
	for i := 0; i < len(bs); i += 2 {
		resp, err := prefetch(ctx, r, h.d.PeerAddr(), ns, bs[i].hash, bs[i+1].hash)
		if err != nil {
			t.Fatalf("prefetch %d: %v\n%s", i, err, r.logs)
		}
		for _, b := range resp.GetBlocks() {
			if b.GetStatus() != statusFetched {
				t.Fatalf("block %s: %v %s", b.GetHash(), b.GetStatus(), b.GetError())
			}
		}
		fetched += int(resp.GetBytes())
		// The blocks just fetched are intact (the next fetch may evict them).
		for _, b := range bs[i : i+2] {
			got, err := get(ctx, r, ns, b.hash)
			if err != nil || !bytes.Equal(got, b.body) {
				t.Fatalf("block %s: %d bytes, %v; want %d identical bytes", b.hash, len(got), err, len(b.body))
			}
		}
	}
	if fetched <= 16<<20 {
		t.Fatalf("fetched %d bytes in all: the test must exceed the 16 MiB pool", fetched)
	}
	m := r.cn.Scrape(t)
	if m[mEvictions] == 0 {
		t.Fatalf("no eviction after fetching %d bytes into a 16 MiB pool", fetched)
	}

	// One call, 12 MiB, staged in one extent.
	hs := [][]byte{big[0].hash, big[1].hash, big[2].hash}
	resp, err := prefetch(ctx, r, h.d.PeerAddr(), ns, hs...)
	if err != nil {
		t.Fatalf("12 MiB prefetch: %v\n%s", err, r.logs)
	}
	if resp.GetBytes() != 12<<20 {
		t.Fatalf("12 MiB prefetch fetched %d bytes: %v", resp.GetBytes(), resp)
	}
	for _, b := range big {
		got, err := get(ctx, r, ns, b.hash)
		if err != nil || !bytes.Equal(got, b.body) {
			t.Fatalf("block %s: %d bytes, %v; want %d identical bytes", b.hash, len(got), err, len(b.body))
		}
	}
	t.Logf("%d MiB fetched through a 16 MiB pool in %d calls, %v evictions; then 12 MiB in one call",
		fetched>>20, len(bs)/2, r.cn.Scrape(t)[mEvictions])
}
