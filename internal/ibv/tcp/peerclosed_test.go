package tcp

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

// TestPeerClosedCause: a data connection the responder closes or resets
// under a READ fails it with RETRY_EXC_ERR, as an HCA reports a vanished
// peer, and the completion's Cause says the peer closed the connection (a
// holder stopped with SIGINT reads "connection reset by peer" in its own
// log; the requester must not say only "transport retry counter
// exceeded"). A connection this side closed is not blamed on the peer.
func TestPeerClosedCause(t *testing.T) {
	tests := []struct {
		name       string
		end        func(c *net.TCPConn) // the responder's end of the connection
		ownCut     bool                 // this side cuts its connections instead
		peerClosed bool
		text       string
	}{
		{name: "peer closes", end: func(c *net.TCPConn) { c.Close() }, peerClosed: true, text: "EOF"},
		{name: "peer resets", end: func(c *net.TCPConn) { _ = c.SetLinger(0); c.Close() }, peerClosed: true, text: "connection reset by peer"},
		{name: "own side cuts", ownCut: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, d := newProvider(t)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			got := make(chan struct{}) // the responder read the READ request
			done := make(chan struct{})
			served := make(chan struct{})
			go func() {
				defer close(served)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				buf := make([]byte, maxBody)
				if m, err := readFrame(c, buf); err != nil || m.typ != tHello {
					return
				}
				_, _ = c.Write(appendHelloAck(nil, stOK))
				if _, err := readFrame(c, buf); err != nil {
					return
				}
				close(got)
				if tc.end != nil {
					tc.end(c.(*net.TCPConn))
					return
				}
				<-done
			}()
			req := ibvtest.NewSide(t, d[0], ibvtest.DefaultCap())
			_, lmr := ibvtest.Region(t, req, 4096, accRead, 1)
			if err := req.QP.Connect(ibv.Endpoint{QPN: 1, Addr: ln.Addr().String()}, ibvtest.PairAttr()); err != nil {
				t.Fatal(err)
			}
			post(t, req.QP, ibv.SendWR{ID: 1, Op: ibv.OpRDMARead, Signaled: true, LocalAddr: lmr.Addr(), Length: 10, LKey: lmr.LKey()})
			select {
			case <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("the READ request never reached the responder")
			}
			if tc.ownCut {
				d[0].CutConnections()
			}
			wc := ibvtest.Collect(t, req.CQ, 1)[0]
			close(done)
			<-served
			expect(t, wc, 1, ibv.WCRetryExcErr)
			se := &ibv.StatusError{Status: wc.Status, QPN: wc.QPN, WRID: wc.ID, Cause: wc.Cause}
			if errors.Is(se, ibv.ErrPeerClosed) != tc.peerClosed {
				t.Fatalf("errors.Is(%q, ErrPeerClosed) = %v, want %v", se, !tc.peerClosed, tc.peerClosed)
			}
			if s := se.Error(); !strings.Contains(s, "transport retry counter exceeded") || !strings.Contains(s, tc.text) {
				t.Errorf("completion error %q lacks the status or %q", s, tc.text)
			}
		})
	}
}
