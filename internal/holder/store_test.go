package holder

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
)

// realStore is a store over a 16 MiB pool. It skips when pool/store are
// still API skeletons (they panic "unimplemented").
func realStore(t *testing.T) (*store.Store, *pool.Pool) {
	t.Helper()
	var p *pool.Pool
	var s *store.Store
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Skipf("store/pool not implemented yet: %v", r)
			}
		}()
		var err error
		p, err = pool.New(pool.Options{Size: 16 << 20, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		s = store.New(p, metricstest.New())
	}()
	t.Cleanup(func() { _ = p.Close() })
	return s, p
}

func put(t *testing.T, s *store.Store, ns, hash string, sizes []store.SlotSize, seed byte) []byte {
	t.Helper()
	var data []byte
	if _, err := s.Put(store.Key{Namespace: ns, Hash: hash}, sizes, func(buf []byte) error {
		for i := range buf {
			buf[i] = seed + byte(i*7)
		}
		data = append([]byte(nil), buf...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return data
}

// segBytes reads a segment the way a peer's RDMA READ would: by address.
func segBytes(t *testing.T, p *pool.Pool, g *pegadv1.Segment) []byte {
	t.Helper()
	if g.Addr < p.Base() || g.Addr+g.Size > p.Base()+p.Size() {
		t.Fatalf("segment [%#x,+%d) outside the pool [%#x,+%d)", g.Addr, g.Size, p.Base(), p.Size())
	}
	off := g.Addr - p.Base()
	return p.Bytes()[off : off+g.Size]
}

func TestQueryOverRealStore(t *testing.T) {
	st, p := realStore(t)
	clock := newFakeClock()
	m := metricstest.New()
	svc := mustNew(t, Options{Store: st, Metrics: m, Log: zerolog.Nop(), LockTimeout: 10 * time.Second, Now: clock.Now})
	c := serve(t, svc)
	a := put(t, st, "ns", "a", []store.SlotSize{{KSize: 4096, VSize: 4096}, {KSize: 1000, VSize: 24}}, 1)
	b := put(t, st, "ns", "b", []store.SlotSize{{KSize: 8192}}, 2)

	resp, err := c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("b"), []byte("nope"), []byte("a")}, Requester: req("peer", "p1"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseSessionID(resp.SessionId); err != nil {
		t.Fatalf("session id %q: %v", resp.SessionId, err)
	}
	if resp.LockTimeout.AsDuration() != 10*time.Second || !resp.ExpiresAt.AsTime().Equal(clock.Now().Add(10*time.Second)) {
		t.Fatalf("lock_timeout %v expires_at %v", resp.LockTimeout.AsDuration(), resp.ExpiresAt.AsTime())
	}
	if len(resp.Missing) != 1 || string(resp.Missing[0]) != "nope" {
		t.Fatalf("missing = %q", resp.Missing)
	}
	if len(resp.Blocks) != 2 || string(resp.Blocks[0].Hash) != "b" || string(resp.Blocks[1].Hash) != "a" {
		t.Fatalf("blocks not in request order: %v", resp.Blocks)
	}
	// The addresses lead to the bytes that were put, slot by slot.
	for i, want := range [][]byte{b, a} {
		var got []byte
		for _, sl := range resp.Blocks[i].Slots {
			got = append(got, segBytes(t, p, sl.K)...)
			if sl.V != nil {
				got = append(got, segBytes(t, p, sl.V)...)
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("block %s: bytes at the returned addresses differ from what was put", resp.Blocks[i].Hash)
		}
	}
	if resp.Blocks[0].Slots[0].V != nil || len(resp.Blocks[1].Slots) != 2 || resp.Blocks[1].Slots[1].V.Size != 24 {
		t.Fatalf("slot shapes wrong: %v", resp.Blocks)
	}
	if s := svc.Locks().Sessions(); len(s) != 1 || s[0].Blocks != 2 || s[0].Bytes != uint64(len(a)+len(b)) {
		t.Fatalf("sessions = %+v", s)
	}
	if st.Stats().Pinned != 2 {
		t.Fatalf("store pinned = %d, want 2", st.Stats().Pinned)
	}

	// Deleting a locked block keeps its memory until the release.
	used := p.Stats().Used
	if deferred, err := st.Delete(store.Key{Namespace: "ns", Hash: "a"}); err != nil || !deferred {
		t.Fatalf("Delete of a pinned block: deferred=%v err=%v", deferred, err)
	}
	if p.Stats().Used != used {
		t.Fatal("memory of a locked block freed before release")
	}
	r, err := c.ReleaseTransferLock(ctxT(t), &pegadv1.ReleaseTransferLockRequest{SessionId: resp.SessionId, Requester: req("peer", "p1")})
	if err != nil || !r.WasLive || r.ReleasedBlocks != 2 {
		t.Fatalf("release: %v %v", r, err)
	}
	if st.Stats().Pinned != 0 || p.Stats().Used >= used {
		t.Fatalf("after release: pinned %d, pool used %d (was %d)", st.Stats().Pinned, p.Stats().Used, used)
	}

	// An unreleased session expires and gives its pins back.
	resp, err = c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("b")}, RequesterId: "peer",
	})
	if err != nil || resp.SessionId == "" {
		t.Fatalf("second query: %v %v", resp, err)
	}
	if n := svc.Locks().ExpireBefore(clock.Advance(time.Minute)); n != 1 {
		t.Fatalf("expired %d", n)
	}
	if st.Stats().Pinned != 0 || metrics.Value(m.LockTimeouts) != 1 {
		t.Fatalf("after expiry: pinned %d, timeouts %v", st.Stats().Pinned, metrics.Value(m.LockTimeouts))
	}
	if st.Stats().RefUnderflows != 0 {
		t.Fatalf("store saw %d unbalanced unpins", st.Stats().RefUnderflows)
	}
}

func TestQueryTooManySlotsLocksNothing(t *testing.T) {
	st, _ := realStore(t)
	m := metricstest.New()
	svc := mustNew(t, Options{Store: st, Metrics: m, Log: zerolog.Nop(), MaxResponseSlots: 2})
	c := serve(t, svc)
	put(t, st, "ns", "a", []store.SlotSize{{KSize: 64}, {KSize: 64}}, 1)
	put(t, st, "ns", "b", []store.SlotSize{{KSize: 64}}, 2)
	_, err := c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("a"), []byte("b")}, RequesterId: "peer",
	})
	wantCode(t, err, codes.ResourceExhausted, "fewer hashes")
	if st.Stats().Pinned != 0 || svc.Locks().Len() != 0 {
		t.Fatalf("refused query left pinned=%d sessions=%d", st.Stats().Pinned, svc.Locks().Len())
	}
	if got := metrics.Value(m.HolderRPC.WithLabelValues(metrics.RPCQueryBlocks, "ResourceExhausted")); got != 1 {
		t.Fatalf("holder_rpc_total{ResourceExhausted} = %v", got)
	}
}

// TestRealStorePinsBalanceUnderRace: peers query and release the same
// blocks while the sweeper and operators end sessions; the store's pins
// come back to zero with no unbalanced unpin.
func TestRealStorePinsBalanceUnderRace(t *testing.T) {
	st, _ := realStore(t)
	clock := newFakeClock()
	svc := mustNew(t, Options{Store: st, Metrics: metricstest.New(), Log: zerolog.Nop(), LockTimeout: time.Second, Now: clock.Now})
	const nblocks = 16
	var hs [][]byte
	for i := 0; i < nblocks; i++ {
		h := fmt.Sprintf("h%02d", i)
		put(t, st, "ns", h, []store.SlotSize{{KSize: 256}}, byte(i))
		hs = append(hs, []byte(h))
	}
	var wg sync.WaitGroup
	ids := make(chan string, 1024)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			node := fmt.Sprintf("peer-%d", g)
			for i := 0; i < 200; i++ {
				resp, err := svc.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
					Namespace: "ns", Hashes: hs[i%nblocks:], RequesterId: node,
				})
				if err != nil {
					t.Error(err)
					return
				}
				select {
				case ids <- resp.SessionId:
				default:
				}
				if i%3 == 0 {
					_, _ = svc.ReleaseTransferLock(ctxT(t), &pegadv1.ReleaseTransferLockRequest{SessionId: resp.SessionId, RequesterId: node})
				}
			}
		}(g)
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { // sweeper with a moving clock
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				svc.Locks().ExpireBefore(clock.Advance(100 * time.Millisecond))
			}
		}
	}()
	go func() { // operator
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			case id := <-ids:
				_, _ = svc.Locks().ForceRelease(id, "op")
			}
		}
	}()
	wg.Wait()
	close(stop)
	bg.Wait()
	svc.Locks().ReleaseAll("test")
	if s := st.Stats(); s.Pinned != 0 || s.RefUnderflows != 0 {
		t.Fatalf("store pinned %d, unbalanced unpins %d", s.Pinned, s.RefUnderflows)
	}
	if svc.Locks().Len() != 0 || svc.Locks().LockedBlocks() != 0 {
		t.Fatalf("lock table: %d sessions, %d blocks", svc.Locks().Len(), svc.Locks().LockedBlocks())
	}
}

func TestQueryCanceledCallerLeavesNoSession(t *testing.T) {
	st, _ := realStore(t)
	m := metricstest.New()
	svc := mustNew(t, Options{Store: st, Metrics: m, Log: zerolog.Nop()})
	put(t, st, "ns", "a", []store.SlotSize{{KSize: 64}}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := svc.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("a")}, RequesterId: "peer",
	})
	wantCode(t, err, codes.Canceled, "")
	if st.Stats().Pinned != 0 || svc.Locks().Len() != 0 || metrics.Value(m.SessionsActive) != 0 {
		t.Fatalf("canceled query left pinned=%d sessions=%d", st.Stats().Pinned, svc.Locks().Len())
	}
}
