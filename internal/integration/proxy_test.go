package integration

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// TestPeerPortFaults: a requester reaches the holder's peer port through a
// fault proxy (no root, no namespaces). Delay slows a fetch but it lands;
// a blackhole or a cut makes a fetch fail within its timeout, with no byte
// stored and nothing left locked on the holder; after Restore, fetches
// work again and every byte matches.
func TestPeerPortFaults(t *testing.T) {
	const ns = "proxy"
	rng := rand.New(rand.NewPCG(7, 7))
	h := start(t, baseConfig(t, "holder"))
	r := start(t, baseConfig(t, "requester"))
	bs := randomBlocks(rng, "p", 5, 1<<20, 1<<20)
	putAll(t, h, ns, bs)
	p := cluster.NewProxy(t, h.d.PeerAddr())
	ctx := ctxT(t, 90*time.Second)

	fetch := func(b block, timeout time.Duration) (time.Duration, error) {
		start := time.Now()
		resp, err := r.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: p.Addr(), Namespace: ns,
			Hashes: [][]byte{b.hash}, Timeout: durationpb.New(timeout)})
		took := time.Since(start)
		if err != nil {
			return took, err
		}
		if st := resp.GetBlocks()[0]; st.GetStatus() != statusFetched {
			return took, fmt.Errorf("%v: %s", st.GetStatus(), st.GetError())
		}
		got, err := get(ctx, r, ns, b.hash)
		if err != nil || !bytes.Equal(got, b.body) {
			t.Fatalf("block %s after a fetch: %d bytes, %v; want its %d bytes", b.hash, len(got), err, len(b.body))
		}
		return took, nil
	}
	notStored := func(b block) {
		t.Helper()
		if got, err := get(ctx, r, ns, b.hash); err == nil {
			t.Fatalf("block %s stored (%d bytes) by a fetch that failed", b.hash, len(got))
		}
	}

	if _, err := fetch(bs[0], 10*time.Second); err != nil {
		t.Fatalf("through the proxy: %v\n%s", err, r.logs)
	}

	p.Delay(40 * time.Millisecond)
	if took, err := fetch(bs[1], 10*time.Second); err != nil || took < 80*time.Millisecond {
		t.Fatalf("delayed peer port: %v after %v (want a fetch of ≥ 80ms)", err, took)
	}
	p.Restore()

	for _, fault := range []struct {
		name string
		set  func()
	}{
		{"blackhole", p.Blackhole},
		{"cut", p.Cut},
	} {
		fault.set()
		took, err := fetch(bs[2], 2*time.Second)
		if err == nil {
			t.Fatalf("%s: a fetch succeeded", fault.name)
		}
		if took > 6*time.Second {
			t.Fatalf("%s: the fetch failed only after %v (timeout 2s): %v", fault.name, took, err)
		}
		t.Logf("%s: failed after %v: %v", fault.name, took.Round(time.Millisecond), err)
		notStored(bs[2])
		p.Restore()
	}

	// Working again (the requester may back off a failed peer first).
	eventually(t, "fetches through the restored proxy", 20*time.Second, func() error {
		_, err := fetch(bs[3], 5*time.Second)
		return err
	})
	if _, err := fetch(bs[4], 10*time.Second); err != nil {
		t.Fatalf("after restore: %v", err)
	}
	eventually(t, "no session or lock left on the holder", 10*time.Second, func() error {
		m := h.cn.Scrape(t)
		if m[mSessionsActive] != 0 || m[mLockActive] != 0 {
			return fmt.Errorf("%s=%v %s=%v", mSessionsActive, m[mSessionsActive], mLockActive, m[mLockActive])
		}
		if m := r.cn.Scrape(t); m[mFetchesInFlight] != 0 {
			return fmt.Errorf("requester %s=%v", mFetchesInFlight, m[mFetchesInFlight])
		}
		return nil
	})
}
