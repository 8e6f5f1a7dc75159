//go:build linux && cgo && !noverbs

package verbs

import (
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pegaflow/pegad/internal/ibv"
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

// TestFakeHCAOnlyWithTag: the fake HCA (fakeverbs.c) answers to
// FakeLibrary's name only in a build with -tags pegad_fakeverbs; without
// the tag that name is dlopen'ed like any other and is not found. cmd/pegad's
// TestProductionBuildHasNoFakeHCA checks the daemon binary's symbols.
func TestFakeHCAOnlyWithTag(t *testing.T) {
	const name = "pegad-fake-libibverbs" // FakeLibrary, which only the tagged build declares
	if got := fakeLib(name) != nil; got != fakeBuilt {
		t.Fatalf("fakeLib(%q) found %v, want %v (fakeBuilt)", name, got, fakeBuilt)
	}
	if fakeLib(DefaultLibrary) != nil {
		t.Fatalf("fakeLib(%q) is the fake", DefaultLibrary)
	}
	_, err := NewWithOptions(Options{Library: name, SysfsRoot: "/nonexistent"}).Devices()
	if fakeBuilt && err != nil {
		t.Fatalf("the fake's devices: %v", err)
	}
	if !fakeBuilt && (!errors.Is(err, ibv.ErrUnavailable) || !strings.Contains(err.Error(), name+" not found")) {
		t.Fatalf("the fake library's name without the fake: %v, want %s not found", err, name)
	}
	if !fakeBuilt {
		t.Skip("built without -tags pegad_fakeverbs: the fake HCA's tests (here, in conn and in requester) did not run; make test passes the tag")
	}
}
