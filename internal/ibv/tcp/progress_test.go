package tcp

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

// trickleResponder is a fake remote device: it admits one connection,
// reads one READ request and answers it with one response frame whose
// bytes it writes in pieces, gap apart (a slow link shared by other flows).
// With stopAfter > 0 it goes silent after that many pieces, the connection
// staying open (a peer that stalls mid-frame). It returns when the
// requester closes the connection.
func trickleResponder(t *testing.T, payload []byte, pieces int, gap time.Duration, stopAfter int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		<-served
	})
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
		if _, err := c.Write(appendHelloAck(nil, stOK)); err != nil {
			return
		}
		m, err := readFrame(c, buf)
		if err != nil || m.typ != tReadReq || int(m.length) != len(payload) {
			return
		}
		frame := append(appendReadResp(nil, m.seq, stOK, 0, len(payload)), payload...)
		step := (len(frame) + pieces - 1) / pieces
		for i := 0; len(frame) > 0; i++ {
			if stopAfter > 0 && i == stopAfter {
				break
			}
			if i > 0 {
				time.Sleep(gap)
			}
			n := min(step, len(frame))
			if _, err := c.Write(frame[:n]); err != nil {
				return
			}
			frame = frame[n:]
		}
		readFrame(c, buf) // until the requester closes
	}()
	return ln.Addr().String()
}

// TestSlowFrameIsProgress: a READ response frame that takes several retry
// budgets to arrive, bytes trickling in all along, is progress as on an RC
// QP (whose ACK timeout runs per packet): the READ succeeds. A responder
// that stops mid-frame still gives RETRY_EXC_ERR one budget after its last
// byte, and local memory holds at most what arrived before it.
func TestSlowFrameIsProgress(t *testing.T) {
	const (
		size   = 40 << 10
		pieces = 20
		gap    = 50 * time.Millisecond // the frame takes ~1s
	)
	attr := ibv.DefaultConnectAttr()
	attr.Timeout = 13 // 33.5ms per try, 268ms budget
	budget := attr.RetryBudget()
	tests := []struct {
		name      string
		stopAfter int // pieces sent before going silent; 0: all
		want      ibv.WCStatus
	}{
		{"trickled_frame", 0, ibv.WCSuccess},
		{"stalls_mid_frame", pieces / 2, ibv.WCRetryExcErr},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, d := newProvider(t)
			payload := bytes.Repeat([]byte("slow-link"), size/9+1)[:size]
			addr := trickleResponder(t, payload, pieces, gap, tc.stopAfter)
			req := ibvtest.NewSide(t, d[0], ibvtest.DefaultCap())
			lmem, lmr := ibvtest.Region(t, req, size, accRead, 1)
			clear(lmem)
			if err := req.QP.Connect(ibv.Endpoint{QPN: 1, Addr: addr}, attr); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			post(t, req.QP, ibv.SendWR{ID: 1, Op: ibv.OpRDMARead, Signaled: true,
				LocalAddr: lmr.Addr(), Length: size, LKey: lmr.LKey()})
			wc := ibvtest.Collect(t, req.CQ, 1)[0]
			took := time.Since(start)
			expect(t, wc, 1, tc.want)
			if tc.want == ibv.WCSuccess {
				if took < 2*budget {
					t.Fatalf("frame took %v, want > 2 budgets (%v) to test anything", took, 2*budget)
				}
				if !bytes.Equal(lmem, payload) {
					t.Fatal("data differs")
				}
				return
			}
			// The last byte left the responder after stopAfter-1 gaps.
			lastByte := time.Duration(tc.stopAfter-1) * gap
			if lo, hi := lastByte+budget, lastByte+budget+time.Second; took < lo || took > hi {
				t.Fatalf("RETRY_EXC_ERR after %v, want in [%v, %v]", took, lo, hi)
			}
			// As on an HCA, the destination of a failed READ is undefined
			// up to the failure (payload lands as it arrives, here the
			// bytes sent before the stall) and untouched after it.
			landed := bytes.Clone(lmem)
			for i, b := range landed {
				if b != 0 && b != payload[i] {
					t.Fatalf("byte %d of the stalled READ is %#x, not the payload's %#x", i, b, payload[i])
				}
			}
			time.Sleep(2 * gap)
			if !bytes.Equal(lmem, landed) {
				t.Fatal("memory changed after the RETRY_EXC_ERR completion")
			}
		})
	}
}

// TestToErrorMidPayload: READ payload lands straight in local memory as it
// arrives; a ToError while a frame is half in must still leave no late
// byte: once ToError returned, the rest of the frame (which the responder
// goes on sending) never reaches memory, and the WR flushes.
func TestToErrorMidPayload(t *testing.T) {
	const (
		size   = 40 << 10
		pieces = 20
		gap    = 30 * time.Millisecond // the frame takes ~600ms
	)
	_, d := newProvider(t)
	payload := bytes.Repeat([]byte("mid-frame"), size/9+1)[:size]
	addr := trickleResponder(t, payload, pieces, gap, 0)
	req := ibvtest.NewSide(t, d[0], ibvtest.DefaultCap())
	lmem, lmr := ibvtest.Region(t, req, size, accRead, 1)
	clear(lmem)
	if err := req.QP.Connect(ibv.Endpoint{QPN: 1, Addr: addr}, ibvtest.PairAttr()); err != nil {
		t.Fatal(err)
	}
	post(t, req.QP, ibv.SendWR{ID: 1, Op: ibv.OpRDMARead, Signaled: true,
		LocalAddr: lmr.Addr(), Length: size, LKey: lmr.LKey()})
	waitFor(t, "part of the payload landed", 5*time.Second, func() bool { return lmem[size/4] != 0 })
	if err := req.QP.ToError(); err != nil {
		t.Fatal(err)
	}
	landed := bytes.Clone(lmem)
	expect(t, ibvtest.Collect(t, req.CQ, 1)[0], 1, ibv.WCWRFlushErr)
	time.Sleep(pieces * gap) // the responder sends the rest meanwhile
	if !bytes.Equal(lmem, landed) {
		t.Fatal("payload bytes landed after ToError returned")
	}
	if bytes.Equal(lmem, payload) {
		t.Fatal("the whole payload landed: ToError came too late to test anything")
	}
}
