package holder

import (
	"context"
	"fmt"
	"testing"

	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
)

// phaseEnv is a holder over a real store holding n one-slot 64 KiB
// blocks, and a query naming all of them (what BenchmarkControlPlane's
// requesters send, without gRPC).
func phaseEnv(b *testing.B, n int) (*Service, *store.Store, *pegadv1.QueryBlocksForTransferRequest) {
	b.Helper()
	p, err := pool.New(pool.Options{Size: 32 << 20, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	st := store.New(p, metricstest.New())
	hashes := make([][]byte, n)
	for i := range hashes {
		hashes[i] = fmt.Appendf(nil, "%032x", i)
		if _, err := st.Put(store.Key{Namespace: "bench", Hash: string(hashes[i])},
			[]store.SlotSize{{KSize: 64 << 10}}, func([]byte) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
	svc := mustNew(b, Options{Store: st, Metrics: metricstest.New(), Log: zerolog.Nop(), NodeID: "h", Incarnation: "h1"})
	b.Cleanup(func() { svc.locks.ReleaseAll("benchmark done") })
	return svc, st, &pegadv1.QueryBlocksForTransferRequest{Namespace: "bench", Hashes: hashes,
		Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "r1"}}
}

// BenchmarkQueryPhases: the holder's work for one query+release pair of
// 150 blocks, in process (no gRPC), whole (pair) and phase by phase:
// validate (checks and the repeat scan), pin+unpin (the store's two
// locked passes), locations (the answer's messages) and open+release (the
// lock table, with the pin and unpin of its blocks). With B/op and
// allocs/op; under callgrind (docs/performance.md, issue 36.3) its
// instruction counts are stable from run to run.
func BenchmarkQueryPhases(b *testing.B) {
	const n = 150
	b.Run("pair", func(b *testing.B) {
		svc, _, q := phaseEnv(b, n)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			r, err := svc.QueryBlocksForTransfer(ctx, q)
			if err != nil || len(r.GetBlocks()) != n {
				b.Fatalf("query: %d blocks, %v", len(r.GetBlocks()), err)
			}
			rel := &pegadv1.ReleaseTransferLockRequest{SessionId: r.GetSessionId(), Requester: q.Requester}
			if rr, err := svc.ReleaseTransferLock(ctx, rel); err != nil || !rr.GetWasLive() {
				b.Fatalf("release: %v", err)
			}
		}
	})
	b.Run("validate", func(b *testing.B) {
		svc, _, q := phaseEnv(b, n)
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := svc.validateQuery(q); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("pin+unpin", func(b *testing.B) {
		_, st, q := phaseEnv(b, n)
		b.ReportAllocs()
		for b.Loop() {
			p, _ := st.PinChain(q.Namespace, q.Hashes)
			st.Unpin(p)
		}
	})
	b.Run("locations", func(b *testing.B) {
		svc, st, q := phaseEnv(b, n)
		p, _ := st.PinChain(q.Namespace, q.Hashes)
		b.Cleanup(func() { st.Unpin(p) })
		isMissing := make([]bool, n)
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := svc.locations(q.Hashes, p, isMissing); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("open+release", func(b *testing.B) {
		svc, st, q := phaseEnv(b, n)
		b.ReportAllocs()
		for b.Loop() {
			p, _ := st.PinChain(q.Namespace, q.Hashes)
			s, err := svc.locks.openQuery("r", "r1", grant{blocks: p, bytes: uint64(n) << 16})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := svc.locks.Release(s.id.String(), "r", "r1"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
