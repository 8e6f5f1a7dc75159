//go:build linux && cgo && !noverbs

package verbs

import (
	"bytes"
	"os"
	"testing"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

// mwEnv: holder h with a 64 KiB region and a window bound over
// [4096, 4096+8192) on its QP toward requester a; requester c is connected
// to a second holder QP on the same PD (another peer).
type mwEnv struct {
	a, h, c   *ibvtest.Side
	hqp2      ibv.QP
	hmem      []byte
	hmr       ibv.MR
	amr, cmr  ibv.MR
	amem      []byte
	w         ibv.MW
	rkey      uint32
	winOff    uint64
	winLength uint64
}

func newMWEnv(t *testing.T, p *Provider, name string) *mwEnv {
	t.Helper()
	open := func() ibv.Device {
		d, err := p.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	e := &mwEnv{winOff: 4096, winLength: 8192}
	e.a = ibvtest.NewSide(t, open(), ibvtest.DefaultCap())
	e.h = ibvtest.NewSide(t, open(), ibvtest.DefaultCap())
	e.c = ibvtest.NewSide(t, open(), ibvtest.DefaultCap())
	if !e.h.Dev.Info().MemWindows {
		t.Fatalf("%s does not report type-2 memory windows", name)
	}
	ibvtest.Connect(t, e.a, e.h, ibv.DefaultConnectAttr())
	q2, err := e.h.PD.CreateQP(e.h.CQ, ibvtest.DefaultCap())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q2.Destroy() })
	e.hqp2 = q2
	if err := q2.Connect(e.c.QP.Endpoint(), ibv.DefaultConnectAttr()); err != nil {
		t.Fatal(err)
	}
	if err := e.c.QP.Connect(q2.Endpoint(), ibv.DefaultConnectAttr()); err != nil {
		t.Fatal(err)
	}
	e.hmem, e.hmr = ibvtest.Region(t, e.h, 65536, ibv.AccessLocalWrite|ibv.AccessRemoteRead|ibv.AccessMWBind, 7)
	e.amem, e.amr = ibvtest.Region(t, e.a, 65536, ibv.AccessLocalWrite, 8)
	_, e.cmr = ibvtest.Region(t, e.c, 65536, ibv.AccessLocalWrite, 9)
	w, err := e.h.PD.(ibv.MWPD).AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Dealloc() })
	e.w = w
	e.rkey = e.bind(t, e.h.QP, ibv.WCSuccess)
	return e
}

// bind binds e.w over the window range on q and checks the completion.
func (e *mwEnv) bind(t *testing.T, q ibv.QP, want ibv.WCStatus) uint32 {
	t.Helper()
	rkey, err := q.(ibv.MWQP).PostBindMW(e.w, e.hmr, e.hmr.Addr()+e.winOff, e.winLength, ibv.AccessRemoteRead, 100, true)
	if err != nil {
		t.Fatal(err)
	}
	wc := ibvtest.Collect(t, e.h.CQ, 1)[0]
	if wc.Status != want || (want == ibv.WCSuccess && wc.Op != ibv.OpBindMW) {
		t.Fatalf("bind completion %+v, want status %s", wc, want)
	}
	return rkey
}

func (e *mwEnv) invalidate(t *testing.T) {
	t.Helper()
	if err := e.h.QP.(ibv.MWQP).PostLocalInv(e.rkey, 101, true); err != nil {
		t.Fatal(err)
	}
	if wc := ibvtest.Collect(t, e.h.CQ, 1)[0]; wc.Status != ibv.WCSuccess || wc.Op != ibv.OpLocalInv {
		t.Fatalf("local inv completion %+v", wc)
	}
}

// read READs n bytes at window-relative off with rkey from side s.
func (e *mwEnv) read(t *testing.T, s *ibvtest.Side, lmr ibv.MR, rkey uint32, off int64, n uint32) ibv.WCStatus {
	t.Helper()
	wr := ibv.SendWR{ID: 1, Op: ibv.OpRDMARead, Signaled: true, LocalAddr: lmr.Addr(), Length: n, LKey: lmr.LKey(),
		RemoteAddr: uint64(int64(e.hmr.Addr()+e.winOff) + off), RKey: rkey}
	if _, err := s.QP.PostSend([]ibv.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	return ibvtest.Collect(t, s.CQ, 1)[0].Status
}

// TestMemoryWindowDevice runs the same cases on a real device,
// PEGAD_TEST_MW_DEVICE (the verbs-e2e guest sets it to rxe0); it skips
// where that is unset. PEGAD_TEST_MW_NO_BOUNDS=1 says the device does not
// enforce a window's bounds (rxe on Linux 6.1 lets a READ outside the
// window through): those cases then report what happened and skip.
func TestMemoryWindowDevice(t *testing.T) {
	name := os.Getenv("PEGAD_TEST_MW_DEVICE")
	if name == "" {
		t.Skip("PEGAD_TEST_MW_DEVICE unset")
	}
	testMemoryWindow(t, New(), name, os.Getenv("PEGAD_TEST_MW_NO_BOUNDS") != "1")
}

func testMemoryWindow(t *testing.T, p *Provider, dev string, bounds bool) {
	tests := []struct {
		name   string
		prep   func(t *testing.T, e *mwEnv) uint32 // returns the rkey to read with
		other  bool                                // read from the other peer's QP
		off    int64
		n      uint32
		want   ibv.WCStatus
		bounds bool // the case needs the device to enforce the window's range
	}{
		{name: "inside", off: 0, n: 8192, want: ibv.WCSuccess},
		{name: "tail", off: 8192 - 100, n: 100, want: ibv.WCSuccess},
		{name: "before", bounds: true, off: -64, n: 64, want: ibv.WCRemAccessErr},
		{name: "after", bounds: true, off: 8192, n: 64, want: ibv.WCRemAccessErr},
		{name: "straddles end", bounds: true, off: 8192 - 32, n: 64, want: ibv.WCRemAccessErr},
		{name: "other peer's QP", other: true, off: 0, n: 64, want: ibv.WCRemAccessErr},
		{name: "after invalidate", off: 0, n: 64, want: ibv.WCRemAccessErr,
			prep: func(t *testing.T, e *mwEnv) uint32 { e.invalidate(t); return e.rkey }},
		{name: "after dealloc", off: 0, n: 64, want: ibv.WCRemAccessErr,
			prep: func(t *testing.T, e *mwEnv) uint32 {
				if err := e.w.Dealloc(); err != nil {
					t.Fatal(err)
				}
				return e.rkey
			}},
		{name: "stale rkey after rebind", off: 0, n: 64, want: ibv.WCRemAccessErr,
			prep: func(t *testing.T, e *mwEnv) uint32 {
				e.invalidate(t)
				if nk := e.bind(t, e.h.QP, ibv.WCSuccess); nk == e.rkey {
					t.Fatalf("rebind kept rkey %#x", nk)
				}
				return e.rkey
			}},
		{name: "new rkey after rebind", off: 0, n: 64, want: ibv.WCSuccess,
			prep: func(t *testing.T, e *mwEnv) uint32 { e.invalidate(t); return e.bind(t, e.h.QP, ibv.WCSuccess) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newMWEnv(t, p, dev)
			rkey := e.rkey
			if tc.prep != nil {
				rkey = tc.prep(t, e)
			}
			s, lmr := e.a, e.amr
			if tc.other {
				s, lmr = e.c, e.cmr
			}
			got := e.read(t, s, lmr, rkey, tc.off, tc.n)
			if tc.bounds && !bounds {
				t.Skipf("%s does not enforce window bounds: READ status %s (want %s where it does)", dev, got, tc.want)
			}
			if got != tc.want {
				t.Fatalf("READ status %s, want %s", got, tc.want)
			}
			if tc.want == ibv.WCSuccess && !tc.other {
				src := e.hmem[int64(e.winOff)+tc.off:][:tc.n]
				if !bytes.Equal(e.amem[:tc.n], src) {
					t.Fatal("READ through the window: bytes differ")
				}
			}
		})
	}
}
