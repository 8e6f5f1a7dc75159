package integration

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestPrefetchAboveThePinCap: with default flags a holder lets one peer pin
// half its pool (max-pinned-bytes-per-peer). A prefetch of more than that
// (40 MiB from a 64 MiB pool, cap 32 MiB) is fetched in lock windows that
// each fit the cap, and every byte arrives; no lock is left behind.
func TestPrefetchAboveThePinCap(t *testing.T) {
	holderCfg := baseConfig(t, "holder")
	holderCfg.PoolSize = 64 << 20
	reqCfg := baseConfig(t, "requester")
	reqCfg.PoolSize = 64 << 20
	h := start(t, holderCfg)
	r := start(t, reqCfg)

	const n, size = 40, 1 << 20 // 40 MiB, over the 32 MiB per-peer cap
	rng := rand.New(rand.NewPCG(23, 2))
	blocks := randomBlocks(rng, "win", n, size, size)
	putAll(t, h, "ns", blocks)
	hashes := make([][]byte, n)
	for i, b := range blocks {
		hashes[i] = b.hash
	}
	ctx := ctxT(t, 60*time.Second)
	resp, err := prefetch(ctx, r, h.d.PeerAddr(), "ns", hashes...)
	if err != nil {
		t.Fatalf("prefetch of %d MiB from a 64 MiB pool: %v", n*size>>20, err)
	}
	for i, b := range resp.GetBlocks() {
		if b.GetStatus() != statusFetched {
			t.Fatalf("block %d: %v %s", i, b.GetStatus(), b.GetError())
		}
	}
	for _, b := range blocks {
		got, err := get(ctx, r, "ns", b.hash)
		if err != nil {
			t.Fatalf("get %s: %v", b.hash, err)
		}
		if !bytes.Equal(got, b.body) {
			t.Fatalf("block %s: bytes differ", b.hash)
		}
	}
	eventually(t, "no lock left on the holder", 10*time.Second, func() error {
		m := h.cn.Scrape(t)
		if m[mLockActive] != 0 || m[mSessionsActive] != 0 {
			return fmt.Errorf("lock gauge %v, sessions %v", m[mLockActive], m[mSessionsActive])
		}
		if m[mQueryOK] < 2 || m[mQueryOK] != m[mReleaseOK] {
			return fmt.Errorf("queries ok %v, releases ok %v: want several windows, each released", m[mQueryOK], m[mReleaseOK])
		}
		return nil
	})
}
