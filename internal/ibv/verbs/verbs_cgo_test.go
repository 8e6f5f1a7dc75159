//go:build linux && cgo && !noverbs

package verbs

import (
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

// skipIfRDMA skips tests of the unavailable path on hosts that have RDMA.
func skipIfRDMA(t *testing.T) {
	t.Helper()
	if devs, err := New().Devices(); err == nil {
		t.Skipf("host has RDMA devices (%s); the unavailable path is not reachable", describeDevices(devs))
	}
}

func TestDevicesUnavailable(t *testing.T) {
	skipIfRDMA(t)
	devs, err := New().Devices()
	if !errors.Is(err, ibv.ErrUnavailable) || devs != nil {
		t.Fatalf("Devices() = %v, %v; want ErrUnavailable", devs, err)
	}
	reason := err.Error()
	if !strings.HasPrefix(reason, "verbs unavailable: ") || strings.Contains(reason, "\n") {
		t.Fatalf("reason %q: want one line starting with \"verbs unavailable: \"", reason)
	}
	// On a host with libibverbs but no RDMA kernel support (this CI box),
	// device enumeration fails with ENOSYS.
	if _, statErr := os.Stat("/sys/class/infiniband_verbs"); os.IsNotExist(statErr) {
		const want = "verbs unavailable: ibv_get_device_list: function not implemented (no RDMA kernel support)"
		if _, libErr := loadLib(DefaultLibrary); libErr == nil && reason != want {
			t.Fatalf("reason %q, want %q", reason, want)
		}
	}
	t.Logf("reason: %s", reason)
	ok, line := Available()
	if ok || line != reason {
		t.Fatalf("Available() = %v, %q; want false, %q", ok, line, reason)
	}
}

func TestOpenUnavailable(t *testing.T) {
	skipIfRDMA(t)
	for _, name := range []string{"mlx5_0", "mlx5_0:1", "rxe0"} {
		d, err := New().Open(name)
		if d != nil || !errors.Is(err, ibv.ErrUnavailable) {
			t.Fatalf("Open(%q) = %v, %v; want nil, ErrUnavailable", name, d, err)
		}
	}
	if _, err := New().Open("mlx5_0:0"); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Fatalf("Open with port 0: %v, want ErrInvalidArgument", err)
	}
}

func TestLibraryProblems(t *testing.T) {
	tests := []struct {
		name, lib, want string
	}{
		{"missing", "libibverbs-pegad-missing.so.1", "verbs unavailable: libibverbs-pegad-missing.so.1 not found"},
		{"missing path", "/nonexistent/libibverbs.so.1", "verbs unavailable: /nonexistent/libibverbs.so.1 not found"},
		// A library that loads but is not libibverbs.
		{"wrong library", "libc.so.6", "verbs unavailable: libc.so.6 lacks ibv_get_device_list"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewWithOptions(Options{Library: tc.lib})
			_, err := p.Devices()
			if !errors.Is(err, ibv.ErrUnavailable) || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("Devices() error %v, want ErrUnavailable starting %q", err, tc.want)
			}
			d, err := p.Open("mlx5_0")
			if d != nil || !errors.Is(err, ibv.ErrUnavailable) {
				t.Fatalf("Open() = %v, %v; want ErrUnavailable", d, err)
			}
		})
	}
}

func TestLoadLibCached(t *testing.T) {
	a, errA := loadLib(DefaultLibrary)
	b, errB := loadLib(DefaultLibrary)
	if a != b || (errA == nil) != (errB == nil) {
		t.Fatalf("second load differs: %p %v / %p %v", a, errA, b, errB)
	}
	if errA != nil {
		t.Logf("libibverbs not loadable here: %v", errA)
	}
}

// TestNoLinkTimeLibibverbs: the binary (this test binary, built with the
// provider) must start on hosts without libibverbs, so it must not need it
// at load time.
func TestNoLinkTimeLibibverbs(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	needed, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range needed {
		if strings.Contains(l, "ibverbs") {
			t.Fatalf("DT_NEEDED has %s (all: %v)", l, needed)
		}
	}
	t.Logf("DT_NEEDED: %v", needed)
	ldd, err := exec.LookPath("ldd")
	if err != nil {
		t.Skip("ldd not installed; DT_NEEDED checked only")
	}
	out, err := exec.Command(ldd, exe).CombinedOutput()
	if err != nil {
		t.Fatalf("ldd: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "libibverbs") {
		t.Fatalf("ldd shows libibverbs:\n%s", out)
	}
}

// TestConnAttrsInC fills ibv_qp_attr in C from ConnectAttr-derived params
// and reads the structs back: what libibverbs would receive.
func TestConnAttrsInC(t *testing.T) {
	const (
		qpState         = 1 << 0
		qpAV            = 1 << 7
		qpPathMTU       = 1 << 8
		qpTimeout       = 1 << 9
		qpRetryCnt      = 1 << 10
		qpRNRRetry      = 1 << 11
		qpRqPSN         = 1 << 12
		qpMaxQPRdAtomic = 1 << 13
		qpMinRNRTimer   = 1 << 15
		qpSqPSN         = 1 << 16
		qpMaxDestRd     = 1 << 17
		qpDestQPN       = 1 << 20
		wantRTRMask     = qpState | qpAV | qpPathMTU | qpDestQPN | qpRqPSN | qpMaxDestRd | qpMinRNRTimer
		wantRTSMask     = qpState | qpTimeout | qpRetryCnt | qpRNRRetry | qpSqPSN | qpMaxQPRdAtomic
	)
	attr := ibv.DefaultConnectAttr()
	attr.TrafficCls, attr.SL = 106, 2
	tests := []struct {
		name   string
		lp     localPort
		remote ibv.Endpoint
	}{
		{"roce", roceLocal(), ibv.Endpoint{GID: testGIDv4, QPN: 0xabc, PSN: 0x10203, MTU: 2048}},
		{"ib", localPort{Num: 2, MTU: 4096, MaxRdAtom: 16, MaxInitRd: 16}, ibv.Endpoint{GID: testGIDll, LID: 0x2a, QPN: 0x77, PSN: 5, MTU: 4096}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := buildConnParams(tc.lp, 0xfedcba, tc.remote, attr)
			if err != nil {
				t.Fatal(err)
			}
			rtr, rts, rtrMask, rtsMask := inspectConn(p)
			if rtrMask != wantRTRMask || rtsMask != wantRTSMask {
				t.Fatalf("masks %#x/%#x, want %#x/%#x", rtrMask, rtsMask, wantRTRMask, wantRTSMask)
			}
			wantRTR := connParams{PathMTU: mtuEnum(tc.remote.MTU), DestQPN: tc.remote.QPN, RqPSN: tc.remote.PSN,
				MaxDestRdAtomic: 16, MinRNRTimer: 12, Port: tc.lp.Num, SL: 2}
			if tc.lp.Ethernet {
				wantRTR.IsGlobal, wantRTR.DGID, wantRTR.SGIDIndex = true, tc.remote.GID, uint8(tc.lp.GIDIndex)
				wantRTR.HopLimit, wantRTR.TrafficClass = 64, 106
			} else {
				wantRTR.DLID = tc.remote.LID
			}
			if rtr != wantRTR {
				t.Fatalf("RTR attr\n got  %+v\n want %+v", rtr, wantRTR)
			}
			wantRTS := connParams{Timeout: 14, RetryCnt: 7, RNRRetry: 7, SqPSN: 0xfedcba, MaxRdAtomic: 16}
			if rts != wantRTS {
				t.Fatalf("RTS attr\n got  %+v\n want %+v", rts, wantRTS)
			}
		})
	}
}

func fakeProvider() *Provider {
	p := NewWithOptions(Options{SysfsRoot: "/nonexistent"})
	p.fake = true
	return p
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
	p := NewWithOptions(Options{SysfsRoot: "/nonexistent", NUMANodes: map[string]int{"pegadfake1": 1, "pegadfakeib0": 0}})
	p.fake = true
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
	p := NewWithOptions(Options{SysfsRoot: "/nonexistent", ForceGIDIndex: true, GIDIndex: 0})
	p.fake = true
	devs, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 10 || devs[0].GIDIndex != 0 || devs[0].GID != (ibv.GID{0: 0xfe, 1: 0x80, 15: 1}) {
		t.Fatalf("forced GID 0: got %+v", devs[0])
	}
	p = NewWithOptions(Options{SysfsRoot: "/nonexistent", ForceGIDIndex: true, GIDIndex: 3})
	p.fake = true
	if _, err := p.Devices(); !errors.Is(err, ibv.ErrUnavailable) || !strings.Contains(err.Error(), "GID index 3 not populated") {
		t.Fatalf("forced empty GID 3: %v", err)
	}
}
