package verbs

import (
	"errors"
	"testing"

	"github.com/pegaflow/pegad/internal/ibv"
)

func TestMTUMapping(t *testing.T) {
	tests := []struct{ enum, bytes int }{{1, 256}, {2, 512}, {3, 1024}, {4, 2048}, {5, 4096}}
	for _, tc := range tests {
		if got := mtuBytes(tc.enum); got != tc.bytes {
			t.Errorf("mtuBytes(%d) = %d, want %d", tc.enum, got, tc.bytes)
		}
		if got := mtuEnum(tc.bytes); got != tc.enum {
			t.Errorf("mtuEnum(%d) = %d, want %d", tc.bytes, got, tc.enum)
		}
	}
	for _, e := range []int{-1, 0, 6, 100} {
		if got := mtuBytes(e); got != 0 {
			t.Errorf("mtuBytes(%d) = %d, want 0", e, got)
		}
	}
	for _, b := range []int{0, 128, 1500, 9000, 8192} {
		if got := mtuEnum(b); got != 0 {
			t.Errorf("mtuEnum(%d) = %d, want 0", b, got)
		}
	}
}

func TestPathMTU(t *testing.T) {
	tests := []struct {
		name                     string
		local, remote, requested int
		want                     int
		wantErr                  bool
	}{
		{"equal", 4096, 4096, 0, 4096, false},
		{"remote smaller", 4096, 1024, 0, 1024, false},
		{"local smaller", 1024, 4096, 0, 1024, false},
		{"remote unknown", 2048, 0, 0, 2048, false},
		{"requested caps", 4096, 4096, 2048, 2048, false},
		{"requested above path", 1024, 4096, 4096, 1024, false},
		{"bad requested", 4096, 4096, 1500, 0, true},
		{"bad remote", 4096, 9000, 0, 0, true},
		{"bad local", 0, 4096, 0, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pathMTU(tc.local, tc.remote, tc.requested)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ibv.ErrInvalidArgument) {
				t.Fatalf("err %v, want ErrInvalidArgument", err)
			}
			if got != tc.want {
				t.Fatalf("got %d, want %d", got, tc.want)
			}
		})
	}
}

func TestClampRd(t *testing.T) {
	tests := []struct {
		req  uint8
		dev  int
		want uint8
	}{
		{16, 16, 16}, {16, 4, 4}, {2, 16, 2}, {0, 16, 16}, {0, 0, 1}, {8, 0, 8}, {0, 1000, 255},
	}
	for _, tc := range tests {
		if got := clampRd(tc.req, tc.dev); got != tc.want {
			t.Errorf("clampRd(%d, %d) = %d, want %d", tc.req, tc.dev, got, tc.want)
		}
	}
}

var (
	testGIDv4 = ibv.GID{10: 0xff, 11: 0xff, 12: 192, 13: 168, 14: 1, 15: 7}
	testGIDll = ibv.GID{0: 0xfe, 1: 0x80, 8: 0x02, 15: 0x01}
)

func roceLocal() localPort {
	return localPort{Num: 1, Ethernet: true, GIDIndex: 3, MTU: 4096, MaxRdAtom: 16, MaxInitRd: 16}
}

func TestBuildConnParamsRoCE(t *testing.T) {
	remote := ibv.Endpoint{GID: testGIDv4, QPN: 0x1234, PSN: 0xabcdef, MTU: 1024}
	a := ibv.DefaultConnectAttr()
	a.TrafficCls = 106
	a.SL = 3
	p, err := buildConnParams(roceLocal(), 0x123456, remote, a)
	if err != nil {
		t.Fatal(err)
	}
	want := connParams{
		PathMTU: mtu1024, DestQPN: 0x1234, RqPSN: 0xabcdef, SqPSN: 0x123456,
		MaxDestRdAtomic: 16, MinRNRTimer: 12, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16,
		Port: 1, IsGlobal: true, SGIDIndex: 3, HopLimit: 64, TrafficClass: 106, SL: 3, DGID: testGIDv4,
	}
	if p != want {
		t.Fatalf("got  %+v\nwant %+v", p, want)
	}
}

func TestBuildConnParamsIB(t *testing.T) {
	lp := localPort{Num: 2, MTU: 2048, MaxRdAtom: 4, MaxInitRd: 8}
	remote := ibv.Endpoint{LID: 0x17, QPN: 77, PSN: 5, MTU: 4096, GID: testGIDll}
	p, err := buildConnParams(lp, 9, remote, ibv.DefaultConnectAttr())
	if err != nil {
		t.Fatal(err)
	}
	want := connParams{
		PathMTU: mtu2048, DestQPN: 77, RqPSN: 5, SqPSN: 9,
		MaxDestRdAtomic: 4, MinRNRTimer: 12, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 8,
		Port: 2, DLID: 0x17,
	}
	if p != want {
		t.Fatalf("got  %+v\nwant %+v", p, want)
	}
}

// TestBuildConnParamsIBGRHRequired: an InfiniBand port flagged
// IBV_QPF_GRH_REQUIRED addresses the peer by LID and GRH both.
func TestBuildConnParamsIBGRHRequired(t *testing.T) {
	lp := localPort{Num: 1, MTU: 4096, MaxRdAtom: 16, MaxInitRd: 16, GRHRequired: true, GIDIndex: 0}
	remote := ibv.Endpoint{LID: 0x17, QPN: 77, PSN: 5, MTU: 4096, GID: testGIDll}
	a := ibv.DefaultConnectAttr()
	a.TrafficCls = 8
	p, err := buildConnParams(lp, 9, remote, a)
	if err != nil {
		t.Fatal(err)
	}
	want := connParams{
		PathMTU: mtu4096, DestQPN: 77, RqPSN: 5, SqPSN: 9,
		MaxDestRdAtomic: 16, MinRNRTimer: 12, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16,
		Port: 1, DLID: 0x17, IsGlobal: true, DGID: testGIDll, HopLimit: 64, TrafficClass: 8,
	}
	if p != want {
		t.Fatalf("got  %+v\nwant %+v", p, want)
	}
	remote.GID = ibv.GID{}
	if _, err := buildConnParams(lp, 9, remote, a); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Fatalf("zero peer GID on a GRH-required port: %v, want ErrInvalidArgument", err)
	}
}

func TestBuildConnParamsInvalid(t *testing.T) {
	ib := localPort{Num: 1, MTU: 4096, MaxRdAtom: 16, MaxInitRd: 16}
	good := ibv.Endpoint{GID: testGIDv4, LID: 5, QPN: 100, PSN: 1, MTU: 4096}
	tests := []struct {
		name   string
		lp     localPort
		psn    uint32
		remote func(*ibv.Endpoint)
		attr   func(*ibv.ConnectAttr)
	}{
		{"zero qpn", ib, 1, func(e *ibv.Endpoint) { e.QPN = 0 }, nil},
		{"qpn over 24 bits", ib, 1, func(e *ibv.Endpoint) { e.QPN = 1 << 24 }, nil},
		{"remote psn over 24 bits", ib, 1, func(e *ibv.Endpoint) { e.PSN = 1 << 24 }, nil},
		{"local psn over 24 bits", ib, 1 << 24, nil, nil},
		{"bad remote mtu", ib, 1, func(e *ibv.Endpoint) { e.MTU = 1500 }, nil},
		{"bad requested mtu", ib, 1, nil, func(a *ibv.ConnectAttr) { a.MTU = 9000 }},
		{"timeout", ib, 1, nil, func(a *ibv.ConnectAttr) { a.Timeout = 32 }},
		{"retry", ib, 1, nil, func(a *ibv.ConnectAttr) { a.RetryCnt = 8 }},
		{"rnr retry", ib, 1, nil, func(a *ibv.ConnectAttr) { a.RNRRetry = 8 }},
		{"rnr timer", ib, 1, nil, func(a *ibv.ConnectAttr) { a.MinRNRTimer = 32 }},
		{"sl", ib, 1, nil, func(a *ibv.ConnectAttr) { a.SL = 16 }},
		{"ib zero lid", ib, 1, func(e *ibv.Endpoint) { e.LID = 0 }, nil},
		{"ib multicast lid", ib, 1, func(e *ibv.Endpoint) { e.LID = 0xc001 }, nil},
		{"roce zero gid", roceLocal(), 1, func(e *ibv.Endpoint) { e.GID = ibv.GID{} }, nil},
		{"roce bad gid index", localPort{Num: 1, Ethernet: true, GIDIndex: -1, MTU: 4096}, 1, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, a := good, ibv.DefaultConnectAttr()
			if tc.remote != nil {
				tc.remote(&r)
			}
			if tc.attr != nil {
				tc.attr(&a)
			}
			if _, err := buildConnParams(tc.lp, tc.psn, r, a); !errors.Is(err, ibv.ErrInvalidArgument) {
				t.Fatalf("err %v, want ErrInvalidArgument", err)
			}
		})
	}
}

func TestBuildConnParamsDefaults(t *testing.T) {
	a := ibv.DefaultConnectAttr()
	a.HopLimit, a.MaxRdAtomic, a.MaxDestRd = 0, 0, 200
	p, err := buildConnParams(roceLocal(), 1, ibv.Endpoint{GID: testGIDll, QPN: 9}, a)
	if err != nil {
		t.Fatal(err)
	}
	if p.HopLimit != 64 || p.MaxRdAtomic != 16 || p.MaxDestRdAtomic != 16 || p.PathMTU != mtu4096 {
		t.Fatalf("defaults not applied: %+v", p)
	}
}

func TestWCOpcode(t *testing.T) {
	tests := []struct {
		in   int
		want ibv.Opcode
	}{{1, ibv.OpRDMAWrite}, {2, ibv.OpRDMARead}, {0, -1}, {3, -1}, {128, -1}}
	for _, tc := range tests {
		if got := wcOpcode(tc.in); got != tc.want {
			t.Errorf("wcOpcode(%d) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestCheckWRs(t *testing.T) {
	ok := ibv.SendWR{Op: ibv.OpRDMARead, Length: 1}
	tests := []struct {
		name string
		wrs  []ibv.SendWR
		bad  int
	}{
		{"empty", nil, -1},
		{"good", []ibv.SendWR{ok, {Op: ibv.OpRDMAWrite, Length: 4096}}, -1},
		{"zero length", []ibv.SendWR{ok, ok, {Op: ibv.OpRDMARead}}, 2},
		{"bad opcode", []ibv.SendWR{{Op: 1, Length: 8}, ok}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bad, err := checkWRs(tc.wrs)
			if bad != tc.bad {
				t.Fatalf("bad %d, want %d (%v)", bad, tc.bad, err)
			}
			if (bad >= 0) != errors.Is(err, ibv.ErrInvalidArgument) {
				t.Fatalf("err %v with bad %d", err, bad)
			}
		})
	}
}
