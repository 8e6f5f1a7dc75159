//go:build linux && cgo && !noverbs && pegad_fakeverbs

package verbs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

// These tests drive the provider's own logic (lifetimes, chain splitting,
// bad indexes, Wait's stash) over the loopback stand-in of fakeverbs.c.

func openFake(t *testing.T) ibv.Device {
	t.Helper()
	d, err := fakeProvider().Open("pegadfake0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestFakeLifetimes(t *testing.T) {
	d, err := fakeProvider().Open("pegadfake0:1")
	if err != nil {
		t.Fatal(err)
	}
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := d.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	mem := ibvtest.MapMemory(t, 4096)
	mr, err := pd.RegMR(mem, ibv.AccessLocalWrite|ibv.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(cq, ibvtest.DefaultCap())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); !errors.Is(err, ibv.ErrInvalidState) {
		t.Fatalf("close device with PD and CQ open: %v, want ErrInvalidState", err)
	}
	if err := pd.Close(); !errors.Is(err, ibv.ErrInvalidState) {
		t.Fatalf("close PD with MR and QP: %v, want ErrInvalidState", err)
	}
	if err := cq.Close(); !errors.Is(err, ibv.ErrInvalidState) {
		t.Fatalf("close CQ with QP: %v, want ErrInvalidState", err)
	}
	steps := []struct {
		name string
		fn   func() error
	}{
		{"destroy qp", qp.Destroy}, {"dereg mr", mr.Dereg}, {"close cq", cq.Close}, {"close pd", pd.Close}, {"close device", d.Close},
	}
	for _, s := range steps {
		if err := s.fn(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if err := s.fn(); !errors.Is(err, ibv.ErrClosed) {
			t.Fatalf("second %s: %v, want ErrClosed", s.name, err)
		}
	}
	if _, err := qp.PostSend([]ibv.SendWR{{Op: ibv.OpRDMARead, Length: 1}}); !errors.Is(err, ibv.ErrClosed) {
		t.Fatalf("post on destroyed QP: %v", err)
	}
	if err := qp.Connect(ibv.Endpoint{}, ibv.DefaultConnectAttr()); !errors.Is(err, ibv.ErrClosed) {
		t.Fatalf("connect destroyed QP: %v", err)
	}
	if err := qp.ToError(); !errors.Is(err, ibv.ErrClosed) {
		t.Fatalf("ToError on destroyed QP: %v", err)
	}
	if _, err := cq.Poll(make([]ibv.WorkCompletion, 1)); !errors.Is(err, ibv.ErrClosed) {
		t.Fatalf("poll closed CQ: %v", err)
	}
	if _, err := d.AllocPD(); !errors.Is(err, ibv.ErrClosed) {
		t.Fatalf("alloc PD on closed device: %v", err)
	}
	if _, err := d.CreateCQ(4); !errors.Is(err, ibv.ErrClosed) {
		t.Fatalf("create CQ on closed device: %v", err)
	}
	if _, err := pd.RegMR(mem, ibv.AccessLocalWrite); !errors.Is(err, ibv.ErrClosed) {
		t.Fatalf("reg MR on closed PD: %v", err)
	}
}

func TestFakeInvalidArguments(t *testing.T) {
	d1, d2 := openFake(t), openFake(t)
	pd, err := d1.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd.Close() })
	cq2, err := d2.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cq2.Close() })
	cq1, err := d1.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cq1.Close() })
	tests := []struct {
		name string
		fn   func() error
	}{
		{"cq of another device", func() error { _, err := pd.CreateQP(cq2, ibvtest.DefaultCap()); return err }},
		{"send queue too deep", func() error { _, err := pd.CreateQP(cq1, ibv.QPCap{MaxSendWR: 1 << 20}); return err }},
		{"empty send queue", func() error { _, err := pd.CreateQP(cq1, ibv.QPCap{}); return err }},
		{"too many SGEs", func() error { _, err := pd.CreateQP(cq1, ibv.QPCap{MaxSendWR: 4, MaxSendSGE: 64}); return err }},
		{"zero CQ depth", func() error { _, err := d1.CreateCQ(0); return err }},
		{"CQ too deep", func() error { _, err := d1.CreateCQ(1 << 30); return err }},
		{"empty MR", func() error { _, err := pd.RegMR(nil, ibv.AccessLocalWrite); return err }},
		{"unknown access flag", func() error { _, err := pd.RegMR(make([]byte, 1), 1<<10); return err }},
	}
	for _, tc := range tests {
		if err := tc.fn(); !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", tc.name, err)
		}
	}
}

func TestFakeEndpointAndConnect(t *testing.T) {
	a := ibvtest.NewSide(t, openFake(t), ibvtest.DefaultCap())
	b := ibvtest.NewSide(t, openFake(t), ibvtest.DefaultCap())
	ep := a.QP.Endpoint()
	info := a.Dev.Info()
	if ep.QPN != a.QP.QPN() || ep.GID != info.GID || ep.MTU != 1024 || ep.PSN > psnMask || ep.LID != 0 {
		t.Fatalf("endpoint %+v (device %+v)", ep, info)
	}
	// A refused connect leaves the QP in INIT, ready for a good one.
	bad := b.QP.Endpoint()
	bad.GID = ibv.GID{}
	if err := a.QP.Connect(bad, ibv.DefaultConnectAttr()); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Fatalf("connect to a zero GID: %v, want ErrInvalidArgument", err)
	}
	if st := a.QP.State(); st != ibv.QPSInit {
		t.Fatalf("state after refused connect %s", st)
	}
	ibvtest.Connect(t, a, b, ibv.DefaultConnectAttr())
}

// TestFakeChainSplit: chains longer than the C side's 64-WR batch keep
// verbs semantics: a queue-full in the second batch reports the index in
// the whole chain, and everything before it is posted.
func TestFakeChainSplit(t *testing.T) {
	qc := ibvtest.DefaultCap()
	qc.MaxSendWR = 100
	a := ibvtest.NewSide(t, openFake(t), qc)
	b := ibvtest.NewSide(t, openFake(t), ibvtest.DefaultCap())
	ibvtest.Connect(t, a, b, ibv.DefaultConnectAttr())
	_, rmr := ibvtest.Region(t, b, 4096, ibv.AccessRemoteRead, 1)
	_, lmr := ibvtest.Region(t, a, 4096, ibv.AccessLocalWrite, 2)
	wrs := make([]ibv.SendWR, 150)
	for i := range wrs {
		wrs[i] = ibv.SendWR{ID: uint64(i), Op: ibv.OpRDMARead, Signaled: true, LocalAddr: lmr.Addr(), Length: 8,
			LKey: lmr.LKey(), RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
	}
	bad, err := a.QP.PostSend(wrs)
	if !errors.Is(err, ibv.ErrQueueFull) || bad != 100 {
		t.Fatalf("post 150 on a 100-deep queue: bad=%d err=%v, want 100 and ErrQueueFull", bad, err)
	}
	for i, wc := range ibvtest.Collect(t, a.CQ, 100) {
		if wc.ID != uint64(i) || wc.Status != ibv.WCSuccess || wc.Op != ibv.OpRDMARead || wc.Bytes != 8 {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	// A malformed WR: the ones before it are posted, it and the rest not.
	chain := append([]ibv.SendWR(nil), wrs[:8]...)
	chain[5].Length = 0
	bad, err = a.QP.PostSend(chain)
	if !errors.Is(err, ibv.ErrInvalidArgument) || bad != 5 {
		t.Fatalf("chain with zero-length WR 5: bad=%d err=%v", bad, err)
	}
	for i, wc := range ibvtest.Collect(t, a.CQ, 5) {
		if wc.ID != uint64(i) || wc.Status != ibv.WCSuccess {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	ibvtest.ExpectIdle(t, a.CQ, 10*time.Millisecond)
	if bad, err := a.QP.PostSend(nil); bad != -1 || err != nil {
		t.Fatalf("empty post: %d %v", bad, err)
	}
}

// TestFakeWaitStash: completions Wait finds are returned by Poll, in order,
// and failed completions carry no opcode.
func TestFakeWaitStash(t *testing.T) {
	a := ibvtest.NewSide(t, openFake(t), ibvtest.DefaultCap())
	b := ibvtest.NewSide(t, openFake(t), ibvtest.DefaultCap())
	ibvtest.Connect(t, a, b, ibv.DefaultConnectAttr())
	_, rmr := ibvtest.Region(t, b, 4096, ibv.AccessRemoteRead, 1)
	_, lmr := ibvtest.Region(t, a, 4096, ibv.AccessLocalWrite, 2)
	wr := func(id uint64, rkey uint32) ibv.SendWR {
		return ibv.SendWR{ID: id, Op: ibv.OpRDMARead, Signaled: true, LocalAddr: lmr.Addr(), Length: 16,
			LKey: lmr.LKey(), RemoteAddr: rmr.Addr(), RKey: rkey}
	}
	if _, err := a.QP.PostSend([]ibv.SendWR{wr(1, rmr.RKey()), wr(2, rmr.RKey()), wr(3, rmr.RKey()+7)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := a.CQ.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	var wcs [2]ibv.WorkCompletion
	n, err := a.CQ.Poll(wcs[:1])
	if err != nil || n != 1 || wcs[0].ID != 1 {
		t.Fatalf("first poll %d %v %+v", n, err, wcs[0])
	}
	n, err = a.CQ.Poll(wcs[:])
	if err != nil || n != 2 || wcs[0].ID != 2 || wcs[1].ID != 3 {
		t.Fatalf("second poll %d %v %+v", n, err, wcs)
	}
	if w := wcs[1]; w.Status != ibv.WCRemAccessErr || w.Op != -1 || w.VendorErr != 0x99 || w.QPN != a.QP.QPN() {
		t.Fatalf("failed completion %+v", w)
	}
	if st := a.QP.State(); st != ibv.QPSError {
		t.Fatalf("state %s after REM_ACCESS_ERR, want ERROR (queried from the QP)", st)
	}
}

// BenchmarkPostPollFake measures the provider's per-WR glue cost (Go→C
// chain building, the cgo calls, completion conversion) over the loopback
// stand-in, whose own work is a 64-byte memmove per WR.
func BenchmarkPostPollFake(b *testing.B) {
	for _, chain := range []int{1, 16, 64} {
		b.Run("chain="+itoa(chain), func(b *testing.B) {
			d, err := fakeProvider().Open("pegadfake0")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { d.Close() })
			peer, err := fakeProvider().Open("pegadfake0")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { peer.Close() })
			x, y := ibvtest.NewSide(b, d, ibvtest.DefaultCap()), ibvtest.NewSide(b, peer, ibvtest.DefaultCap())
			ibvtest.Connect(b, x, y, ibv.DefaultConnectAttr())
			_, rmr := ibvtest.Region(b, y, 4096, ibv.AccessRemoteRead, 1)
			_, lmr := ibvtest.Region(b, x, 4096, ibv.AccessLocalWrite, 2)
			wrs := make([]ibv.SendWR, chain)
			for i := range wrs {
				wrs[i] = ibv.SendWR{ID: uint64(i), Op: ibv.OpRDMARead, Signaled: true, LocalAddr: lmr.Addr(), Length: 64,
					LKey: lmr.LKey(), RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
			}
			wcs := make([]ibv.WorkCompletion, chain)
			b.ResetTimer()
			for range b.N {
				if _, err := x.QP.PostSend(wrs); err != nil {
					b.Fatal(err)
				}
				for got := 0; got < chain; {
					n, err := x.CQ.Poll(wcs[got:])
					if err != nil {
						b.Fatal(err)
					}
					got += n
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chain), "ns/wr")
		})
	}
}
