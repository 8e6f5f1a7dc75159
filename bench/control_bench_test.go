package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// BenchmarkControlPlane: QueryBlocksForTransfer (n blocks found, pinned,
// session opened) + ReleaseTransferLock pairs against the holder over a
// real store, issued by r concurrent requesters (distinct node ids), next
// to the same number of pairs of calls to a bare echo service answering
// the same responses on the same gRPC server and client connection. Each
// iteration runs one round of r holder pairs, then one round of r echo
// pairs (each round waits for all r). Reports per pair (wall time of a
// round / r): lock-ns/op, echo-ns/op and lock-ratio (lower is better; the
// issue's target is echo/lock ≥ 0.7, i.e. lock-ratio ≤ 1.43).
func BenchmarkControlPlane(b *testing.B) {
	for _, blocks := range []int{16, 150} {
		for _, reqs := range []int{1, 64} {
			b.Run(fmt.Sprintf("blocks=%d/requesters=%d", blocks, reqs), func(b *testing.B) {
				benchControlPlane(b, blocks, reqs)
			})
		}
	}
}

func benchControlPlane(b *testing.B, blocks, reqs int) {
	st, hashes := newStore(b, 32<<20, blocks, 64<<10)
	svc, cc, e := holderWithEcho(b, st)
	pc := pegadv1.NewPeerServiceClient(cc)
	ctx := context.Background()

	who := make([]*pegadv1.Requester, reqs)
	qreqs := make([]*pegadv1.QueryBlocksForTransferRequest, reqs)
	for i := range who {
		who[i] = &pegadv1.Requester{NodeId: fmt.Sprintf("bench-requester-%d", i), Incarnation: "r1"}
		qreqs[i] = &pegadv1.QueryBlocksForTransferRequest{Namespace: "bench", Hashes: hashes, Requester: who[i]}
	}
	lock := func(i int) (*pegadv1.QueryBlocksForTransferResponse, *pegadv1.ReleaseTransferLockResponse) {
		q, err := pc.QueryBlocksForTransfer(ctx, qreqs[i])
		if err != nil || len(q.GetBlocks()) != blocks {
			b.Errorf("query: %d blocks, %v", len(q.GetBlocks()), err)
			return nil, nil
		}
		r, err := pc.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{SessionId: q.GetSessionId(), Requester: who[i]})
		if err != nil || !r.GetWasLive() {
			b.Errorf("release: was_live %v, %v", r.GetWasLive(), err)
		}
		return q, r
	}
	e.query, e.release = lock(0) // the echo answers the holder's bytes
	rreq := &pegadv1.ReleaseTransferLockRequest{SessionId: e.query.GetSessionId(), Requester: who[0]}
	echoPair := func(i int) {
		q, r := new(pegadv1.QueryBlocksForTransferResponse), new(pegadv1.ReleaseTransferLockResponse)
		if err := cc.Invoke(ctx, "/"+echoService+"/Query", qreqs[i], q); err != nil || len(q.GetBlocks()) != blocks {
			b.Errorf("echo query: %v", err)
		}
		if err := cc.Invoke(ctx, "/"+echoService+"/Release", rreq, r); err != nil {
			b.Errorf("echo release: %v", err)
		}
	}
	round := func(f func(int)) {
		if reqs == 1 {
			f(0)
			return
		}
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Go(func() { f(i) })
		}
		wg.Wait()
	}
	round(echoPair) // warm up
	var subj, base clock
	for b.Loop() {
		subj.time(func() { round(func(i int) { lock(i) }) })
		base.time(func() { round(echoPair) })
	}
	per := func(c *clock) *clock { return &clock{total: c.total, n: c.n * reqs} }
	reportLatency(b, "lock", "echo", per(&subj), per(&base))
	if n := svc.Locks().Len(); n != 0 {
		b.Fatalf("%d sessions left live", n)
	}
}
