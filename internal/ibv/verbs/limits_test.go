//go:build linux && cgo && !noverbs && pegad_fakeverbs

package verbs

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

func openFakeNamed(t *testing.T, name string) ibv.Device {
	t.Helper()
	d, err := fakeProvider().Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestFakeMixedFleetRdAtomic: a requester whose HCA allows 16 outstanding
// READs toward a holder whose older HCA has 8 responder resources
// (pegadfakeold0) clamps max_rd_atomic to the peer's max_dest_rd_atomic,
// carried in its endpoint; left at 16, the responder NAKs the READs
// (Remote Invalid Request), which the fake reports on the first one.
func TestFakeMixedFleetRdAtomic(t *testing.T) {
	a := ibvtest.NewSide(t, openFakeNamed(t, "pegadfake0"), ibvtest.DefaultCap())
	b := ibvtest.NewSide(t, openFakeNamed(t, "pegadfakeold0"), ibvtest.DefaultCap())
	if ep := b.QP.Endpoint(); ep.MaxDestRd != 8 {
		t.Fatalf("older HCA's endpoint MaxDestRd %d, want its max_qp_rd_atom 8", ep.MaxDestRd)
	}
	ibvtest.Connect(t, a, b, ibv.DefaultConnectAttr())
	_, rmr := ibvtest.Region(t, b, 4096, ibv.AccessRemoteRead, 1)
	_, lmr := ibvtest.Region(t, a, 4096, ibv.AccessLocalWrite, 2)
	wr := ibv.SendWR{ID: 1, Op: ibv.OpRDMARead, Signaled: true, LocalAddr: lmr.Addr(), Length: 64,
		LKey: lmr.LKey(), RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
	if _, err := a.QP.PostSend([]ibv.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	if wc := ibvtest.Collect(t, a.CQ, 1)[0]; wc.Status != ibv.WCSuccess {
		t.Fatalf("READ toward fewer responder resources: %v", wc.Status)
	}

	// The fake's side of it: a peer that does not say (MaxDestRd 0, as
	// before the handshake carried it) leaves 16 and the READ fails.
	c := ibvtest.NewSide(t, openFakeNamed(t, "pegadfake0"), ibvtest.DefaultCap())
	d := ibvtest.NewSide(t, openFakeNamed(t, "pegadfakeold0"), ibvtest.DefaultCap())
	if err := d.QP.Connect(c.QP.Endpoint(), ibv.DefaultConnectAttr()); err != nil {
		t.Fatal(err)
	}
	silent := d.QP.Endpoint()
	silent.MaxDestRd = 0
	if err := c.QP.Connect(silent, ibv.DefaultConnectAttr()); err != nil {
		t.Fatal(err)
	}
	_, rmr = ibvtest.Region(t, d, 4096, ibv.AccessRemoteRead, 1)
	_, lmr = ibvtest.Region(t, c, 4096, ibv.AccessLocalWrite, 2)
	wr = ibv.SendWR{ID: 1, Op: ibv.OpRDMARead, Signaled: true, LocalAddr: lmr.Addr(), Length: 64,
		LKey: lmr.LKey(), RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
	if _, err := c.QP.PostSend([]ibv.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	if wc := ibvtest.Collect(t, c.CQ, 1)[0]; wc.Status != ibv.WCRemInvReqErr {
		t.Fatalf("READ with max_rd_atomic 16 toward 8 responder resources: %v, want remote invalid request", wc.Status)
	}
}

// TestFakeMaxMRSize: a region above the device's max_mr_size
// (ibv_query_device(3)) is refused before libibverbs with an error that
// names the limit; the fake, like the kernel, refuses it too (EINVAL).
func TestFakeMaxMRSize(t *testing.T) {
	const size = 4<<30 + 4096 // pegadfakeold0's max_mr_size is 4 GiB
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
	if err != nil {
		t.Skipf("cannot reserve %d bytes of address space: %v", size, err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	d := openFakeNamed(t, "pegadfakeold0")
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd.Close() })
	_, err = pd.RegMR(mem, ibv.AccessLocalWrite|ibv.AccessRemoteRead)
	if !errors.Is(err, ibv.ErrInvalidArgument) || !strings.Contains(err.Error(), "max_mr_size 4294967296") {
		t.Fatalf("register 4 GiB + 4 KiB on a 4 GiB max_mr_size device: %v, want ErrInvalidArgument naming max_mr_size", err)
	}
	d.(*device).lim.maxMRSize = 0 // as before the limit was kept: the call reaches the fake
	if _, err := pd.RegMR(mem, ibv.AccessLocalWrite|ibv.AccessRemoteRead); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("fake's ibv_reg_mr above max_mr_size: %v, want EINVAL", err)
	}
}

// TestFakeRegMRAccess: relaxed ordering reaches the library (through
// ibv_reg_mr_iova2, as verbs.h routes optional flags) and the fake records
// it; REMOTE_WRITE without LOCAL_WRITE is refused (ibv_reg_mr(3)).
func TestFakeRegMRAccess(t *testing.T) {
	s := ibvtest.NewSide(t, openFake(t), ibvtest.DefaultCap())
	mem := ibvtest.MapMemory(t, 4096)
	tests := []struct {
		name   string
		access ibv.Access
		errno  syscall.Errno
	}{
		{"relaxed ordering", ibv.AccessLocalWrite | ibv.AccessRemoteRead | ibv.AccessRelaxedOrdering, 0},
		{"plain", ibv.AccessLocalWrite | ibv.AccessRemoteRead, 0},
		{"remote write without local write", ibv.AccessRemoteWrite, syscall.EINVAL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mr, err := s.PD.RegMR(mem, tc.access)
			if tc.errno != 0 {
				if !errors.Is(err, tc.errno) || !errors.Is(err, ibv.ErrInvalidArgument) {
					t.Fatalf("RegMR: %v, want %v", err, tc.errno)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer mr.Dereg()
			if got := fakeMRAccess(mr.LKey()); got != int(tc.access) {
				t.Fatalf("fake registered access %#x, want %#x", got, uint32(tc.access))
			}
		})
	}
}

// TestFakePKeyIndex: QPs move to INIT with the configured P_Key index; an
// index past the port's table is refused when the device is opened (the
// fake, like the kernel, refuses it in ibv_modify_qp with EINVAL).
func TestFakePKeyIndex(t *testing.T) {
	p := fakeProvider()
	p.opts.PKeyIndex = 1
	if _, err := p.Open("pegadfake0"); !errors.Is(err, ibv.ErrInvalidArgument) || !strings.Contains(err.Error(), "P_Key index 1") {
		t.Fatalf("P_Key index 1 on a RoCE port (one entry): %v, want ErrInvalidArgument", err)
	}
	d, err := p.Open("pegadfakeib0") // two entries: index 1 exists
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	a := ibvtest.NewSide(t, d, ibvtest.DefaultCap())
	b := ibvtest.NewSide(t, openFakeNamed(t, "pegadfakeib0"), ibvtest.DefaultCap())
	ibvtest.Connect(t, a, b, ibv.DefaultConnectAttr())

	mutatePort(d, func(p *localPort) { p.PKeyIndex = 2 }) // as if Open had not checked
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd.Close() })
	cq, err := d.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cq.Close() })
	if _, err := pd.CreateQP(cq, ibvtest.DefaultCap()); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("QP to INIT with P_Key index 2 of 2: %v, want EINVAL", err)
	}
}

// mutatePort changes the port state d's new QPs use (tests that bypass
// Open's checks).
func mutatePort(d ibv.Device, f func(*localPort)) {
	dv := d.(*device)
	s := *dv.state()
	f(&s.port)
	dv.st.Store(&s)
}
