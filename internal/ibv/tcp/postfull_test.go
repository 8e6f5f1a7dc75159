package tcp

import (
	"errors"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

// TestPartialPostIsSent: a chain longer than the send queue is posted up to
// the queue depth and refused from there (ErrQueueFull). The WRs it did
// post must go out even when the QP's sender is idle: they used to wait
// for a wake-up that only a fully accepted chain sent, so the fetch that
// posted them waited forever (nothing in flight, so no retry budget ran).
func TestPartialPostIsSent(t *testing.T) {
	_, d := newProvider(t)
	qc := ibvtest.DefaultCap()
	qc.MaxSendWR = 4
	req, peer := ibvtest.Pair(t, d[0], d[1], qc)
	_, rmr := ibvtest.Region(t, peer, 4096, ibv.AccessLocalWrite|ibv.AccessRemoteRead, 1)
	_, lmr := ibvtest.Region(t, req, 4096, ibv.AccessLocalWrite, 2)
	wrs := make([]ibv.SendWR, 8)
	for i := range wrs {
		wrs[i] = ibv.SendWR{ID: uint64(i), Op: ibv.OpRDMARead, Signaled: true, LocalAddr: lmr.Addr(),
			Length: 64, LKey: lmr.LKey(), RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
	}
	for round := range 3 {
		// Let the sender drain any pending wake-up and go idle first.
		time.Sleep(50 * time.Millisecond)
		bad, err := req.QP.PostSend(wrs)
		if !errors.Is(err, ibv.ErrQueueFull) || bad != qc.MaxSendWR {
			t.Fatalf("round %d: post 8 on a 4-deep queue: bad=%d err=%v", round, bad, err)
		}
		for i, wc := range ibvtest.Collect(t, req.CQ, qc.MaxSendWR) {
			if wc.Status != ibv.WCSuccess || wc.ID != uint64(i) {
				t.Fatalf("round %d: completion %d: %+v", round, i, wc)
			}
		}
	}
}
