package tcp

import (
	"net"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

// TestPrewarm: Prewarm dials the data connection before any work request
// (a holder then sees a live requester's connection open from the start),
// and a prewarm dial that fails fails nothing: the QP stays RTS, no
// completion appears, and the first work request dials again.
func TestPrewarm(t *testing.T) {
	t.Run("dials before the first work request", func(t *testing.T) {
		_, d := newProvider(t)
		req, peer := ibvtest.Pair(t, d[0], d[1], ibvtest.DefaultCap())
		req.QP.(*qp).Prewarm()
		deadline := time.Now().Add(5 * time.Second)
		for {
			open, _, used := peer.QP.(*qp).DataActivity()
			if open == 1 && used {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("holder side: %d data connections open, used %v; want 1 after Prewarm", open, used)
			}
			time.Sleep(2 * time.Millisecond)
		}
		src, rmr := ibvtest.Region(t, peer, 64<<10, accRead, 1)
		dst, lmr := ibvtest.Region(t, req, 64<<10, accRead, 2)
		post(t, req.QP, readWR(1, lmr, rmr, 0, 64<<10))
		expect(t, ibvtest.Collect(t, req.CQ, 1)[0], 1, ibv.WCSuccess)
		if string(dst) != string(src) {
			t.Fatal("READ after Prewarm: data differs")
		}
		if open, _, _ := peer.QP.(*qp).DataActivity(); open != 1 {
			t.Fatalf("%d data connections after the READ, want the prewarmed one only", open)
		}
	})
	t.Run("a failed dial fails nothing", func(t *testing.T) {
		_, d := newProvider(t)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gone := ln.Addr().String()
		ln.Close() // nothing listens there any more
		req := ibvtest.NewSide(t, d[0], ibvtest.DefaultCap())
		ep := ibv.Endpoint{QPN: peerQPNStart, PSN: 1, Addr: gone}
		if err := req.QP.Connect(ep, ibv.DefaultConnectAttr()); err != nil {
			t.Fatal(err)
		}
		req.QP.(*qp).Prewarm()
		// Past the retry budget (about 0.5 s) of the dial.
		ibvtest.ExpectIdle(t, req.CQ, 2*ibv.DefaultConnectAttr().RetryBudget())
		if st := req.QP.State(); st != ibv.QPSRTS {
			t.Fatalf("QP state %s after a failed prewarm dial, want RTS", st)
		}
	})
}
