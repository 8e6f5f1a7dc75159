//go:build linux && cgo && !noverbs && pegad_fakeverbs

package verbs

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

// Tests of the provider over the fake HCA (fakeverbs.c): devices, port and
// GID choice, the conformance suite, memory-window rules. Test builds
// only (-tags pegad_fakeverbs).

// fakeProvider is a provider over the fake HCA (fakeverbs.c).
func fakeProvider() *Provider {
	return NewWithOptions(Options{Library: FakeLibrary, SysfsRoot: "/nonexistent"})
}

// TestFakeDevices: device description through the context-op port query
// and _ibv_query_gid_ex, with GID choice (RoCE v2, IPv4-mapped at index 1).
func TestFakeDevices(t *testing.T) {
	devs, err := fakeProvider().Devices()
	if err != nil {
		t.Fatal(err)
	}
	var want []ibv.DeviceInfo
	for i := range 8 {
		want = append(want, ibv.DeviceInfo{Name: "pegadfake" + itoa(i), NUMANode: -1, Port: 1, LinkLayer: "Ethernet",
			GID: ibv.GID{10: 0xff, 11: 0xff, 12: 10, 14: byte(i), 15: 5}, GIDIndex: 1, MTU: 1024, MaxQPWR: 16384, MaxRdAtomic: 16, MemWindows: true})
	}
	want = append(want, ibv.DeviceInfo{Name: "pegadfakeold0", NUMANode: -1, Port: 1, LinkLayer: "Ethernet",
		GID: ibv.GID{10: 0xff, 11: 0xff, 12: 10, 15: 5}, GIDIndex: 1, MTU: 1024, MaxQPWR: 16384, MaxRdAtomic: 8})
	want = append(want, ibv.DeviceInfo{Name: "pegadfakeib0", NUMANode: -1, Port: 1, LinkLayer: "InfiniBand",
		GID: ibv.GID{0: 0xfe, 1: 0x80, 8: 0x02, 15: 0x11}, LID: 0x11, MTU: 4096, MaxQPWR: 16384, MaxRdAtomic: 16, MemWindows: true})
	if !slices.Equal(devs, want) {
		t.Fatalf("Devices() = %+v\nwant %+v", devs, want)
	}
	if _, err := fakeProvider().Open("nope0"); !errors.Is(err, ibv.ErrNoDevice) {
		t.Fatalf("Open(nope0): %v, want ErrNoDevice", err)
	}
	if _, err := fakeProvider().Open("pegadfake0:2"); !errors.Is(err, ibv.ErrNoDevice) {
		t.Fatalf("Open(pegadfake0:2): %v, want ErrNoDevice", err)
	}
}

// TestFakeDevicesNamedNUMA: Options.NUMANodes gives the named devices
// their NUMA node where sysfs has none (rxe, fakeverbs), both in Devices
// and in an opened device's Info; the others keep -1 (issue 27, finding b).
func TestFakeDevicesNamedNUMA(t *testing.T) {
	p := NewWithOptions(Options{Library: FakeLibrary, SysfsRoot: "/nonexistent", NUMANodes: map[string]int{"pegadfake1": 1, "pegadfakeib0": 0}})
	devs, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"pegadfake0": -1, "pegadfake1": 1, "pegadfakeib0": 0}
	for _, d := range devs {
		if w, ok := want[d.Name]; ok && d.NUMANode != w {
			t.Errorf("Devices: %s NUMANode %d, want %d", d.Name, d.NUMANode, w)
		}
	}
	d, err := p.Open("pegadfake1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	if got := d.Info().NUMANode; got != 1 {
		t.Errorf("opened pegadfake1: NUMANode %d, want 1", got)
	}
}

// TestConformanceFake runs the conformance suite over the loopback
// stand-in: it checks this package's Go and C glue, not an HCA.
func TestConformanceFake(t *testing.T) {
	for _, name := range []string{"pegadfake0", "pegadfakeib0"} {
		t.Run(name, func(t *testing.T) {
			p := fakeProvider()
			ibvtest.Run(t, func(t *testing.T) ibvtest.Env {
				open := func() ibv.Device {
					d, err := p.Open(name)
					if err != nil {
						t.Fatalf("open: %v", err)
					}
					t.Cleanup(func() {
						if err := d.Close(); err != nil {
							t.Errorf("close: %v", err)
						}
					})
					return d
				}
				return ibvtest.Env{Requester: open(), Peer1: open(), Peer2: open()}
			})
		})
	}
}

// TestFakeGRHRequired: an InfiniBand port flagged IBV_QPF_GRH_REQUIRED
// (SR-IOV VFs in cloud VMs) connects with is_global = 1 besides the LID;
// without the GRH the fake refuses RTR with EINVAL, as ibv_modify_qp(3)
// says hardware does ("If port flag IBV_QPF_GRH_REQUIRED is set then
// ah_attr ... must be passed with ... .is_global = 1").
func TestFakeGRHRequired(t *testing.T) {
	p := fakeProvider()
	open := func() ibv.Device {
		d, err := p.Open("pegadfakeib0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	da := open()
	if lp := da.(*device).state().port; !lp.GRHRequired || lp.Ethernet {
		t.Fatalf("pegadfakeib0 port %+v: want InfiniBand with GRHRequired", lp)
	}
	a := ibvtest.NewSide(t, da, ibvtest.DefaultCap())
	b := ibvtest.NewSide(t, open(), ibvtest.DefaultCap())
	ibvtest.Connect(t, a, b, ibv.DefaultConnectAttr())
	rmem, rmr := ibvtest.Region(t, b, 4096, ibv.AccessRemoteRead, 1)
	lmem, lmr := ibvtest.Region(t, a, 4096, ibv.AccessLocalWrite, 2)
	if _, err := a.QP.PostSend([]ibv.SendWR{{ID: 1, Op: ibv.OpRDMARead, Signaled: true, LocalAddr: lmr.Addr(), Length: 4096,
		LKey: lmr.LKey(), RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := ibvtest.Collect(t, a.CQ, 1)[0]; wc.Status != ibv.WCSuccess || string(lmem) != string(rmem) {
		t.Fatalf("READ over the GRH-required port: %+v, bytes equal %v", wc, string(lmem) == string(rmem))
	}

	// The same connect without the GRH, as the provider used to build it.
	dc := open()
	mutatePort(dc, func(p *localPort) { p.GRHRequired = false })
	c := ibvtest.NewSide(t, dc, ibvtest.DefaultCap())
	d := ibvtest.NewSide(t, open(), ibvtest.DefaultCap())
	if err := c.QP.Connect(d.QP.Endpoint(), ibv.DefaultConnectAttr()); !errors.Is(err, ibv.ErrInvalidArgument) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("RTR without a GRH on a GRH-required port: %v, want EINVAL", err)
	}
}

func TestFakeForcedGID(t *testing.T) {
	p := NewWithOptions(Options{Library: FakeLibrary, SysfsRoot: "/nonexistent", ForceGIDIndex: true, GIDIndex: 0})
	devs, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 10 || devs[0].GIDIndex != 0 || devs[0].GID != (ibv.GID{0: 0xfe, 1: 0x80, 15: 1}) {
		t.Fatalf("forced GID 0: got %+v", devs[0])
	}
	p = NewWithOptions(Options{Library: FakeLibrary, SysfsRoot: "/nonexistent", ForceGIDIndex: true, GIDIndex: 3})
	if _, err := p.Devices(); !errors.Is(err, ibv.ErrUnavailable) || !strings.Contains(err.Error(), "GID index 3 not populated") {
		t.Fatalf("forced empty GID 3: %v", err)
	}
}

// TestFakeMemoryWindow: a window's rkey reads its range, through its QP,
// until invalidated; everything else is a remote access error.
func TestFakeMemoryWindow(t *testing.T) {
	testMemoryWindow(t, fakeProvider(), "pegadfake0", true)
}

// TestFakeMemoryWindowBindRules: what the fake refuses to bind, as mlx5.
func TestFakeMemoryWindowBindRules(t *testing.T) {
	t.Run("bound window rebound", func(t *testing.T) {
		e := newMWEnv(t, fakeProvider(), "pegadfake0")
		e.bind(t, e.h.QP, ibv.WCMWBindErr)
	})
	t.Run("region without MW_BIND", func(t *testing.T) {
		e := newMWEnv(t, fakeProvider(), "pegadfake0")
		e.invalidate(t)
		_, e.hmr = ibvtest.Region(t, e.h, 65536, ibv.AccessLocalWrite|ibv.AccessRemoteRead, 3)
		e.bind(t, e.h.QP, ibv.WCMWBindErr)
	})
	t.Run("dereg under a bound window", func(t *testing.T) {
		e := newMWEnv(t, fakeProvider(), "pegadfake0")
		if err := e.hmr.Dereg(); err == nil {
			t.Fatalf("dereg with a bound window: %v, want an error", err)
		}
		e.invalidate(t)
		if err := e.hmr.Dereg(); err != nil {
			t.Fatalf("dereg after invalidate: %v", err)
		}
	})
	t.Run("range outside the region", func(t *testing.T) {
		e := newMWEnv(t, fakeProvider(), "pegadfake0")
		_, err := e.h.QP.(ibv.MWQP).PostBindMW(e.w, e.hmr, e.hmr.Addr()+60000, 8192, ibv.AccessRemoteRead, 1, true)
		if !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Fatalf("bind outside the region: %v, want ErrInvalidArgument", err)
		}
	})
}
