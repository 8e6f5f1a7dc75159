package conn

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

func TestNICSubnet(t *testing.T) {
	tests := []struct {
		name string
		info ibv.DeviceInfo
		want string
	}{
		{"roce v2 ipv4", ibv.DeviceInfo{LinkLayer: "Ethernet", GID: ibv.GID{10: 0xff, 11: 0xff, 12: 10, 13: 1, 14: 2, 15: 3}}, "10.1.2.0/24"},
		{"roce ipv6", ibv.DeviceInfo{LinkLayer: "Ethernet", GID: ibv.GID{0: 0xfd, 1: 0x00, 7: 9, 15: 1}}, "fd00:0:0:9::/64"},
		{"roce link-local says nothing", ibv.DeviceInfo{LinkLayer: "Ethernet", GID: ibv.GID{0: 0xfe, 1: 0x80, 15: 1}}, ""},
		{"infiniband subnet prefix", ibv.DeviceInfo{LinkLayer: "InfiniBand", GID: ibv.GID{0: 0xfe, 1: 0x80, 8: 2, 15: 0x11}}, "fe80::/64"},
		{"no gid (tcp)", ibv.DeviceInfo{LinkLayer: "tcp"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := nicSubnet(tc.info); got != tc.want {
				t.Fatalf("nicSubnet = %q, want %q", got, tc.want)
			}
		})
	}
}

func roceNIC(name string, rail byte) *localNIC {
	return &localNIC{info: ibv.DeviceInfo{Name: name, LinkLayer: "Ethernet",
		GID: ibv.GID{10: 0xff, 11: 0xff, 12: 10, 14: rail, 15: 5}}}
}

// TestPairNICs: a holder pairs each requester NIC with its own NIC on the
// same rail (link layer and subnet), then with the same name, and only
// then by position.
func TestPairNICs(t *testing.T) {
	holder := []*localNIC{roceNIC("mlx5_3", 3), roceNIC("mlx5_2", 2), roceNIC("mlx5_1", 1), roceNIC("mlx5_0", 0)}
	for _, n := range holder {
		n.rail = "r" + n.info.Name[len("mlx5_"):]
	}
	req := func(name string, rail byte, subnet bool) remoteNIC {
		r := remoteNIC{name: name, linkLayer: "Ethernet"}
		if subnet {
			r.subnet = nicSubnet(roceNIC(name, rail).info)
		}
		return r
	}
	tests := []struct {
		name string
		req  []remoteNIC
		want []string
	}{
		{"by rail, holder listed in another order",
			[]remoteNIC{req("mlx5_0", 0, true), req("mlx5_1", 1, true), req("mlx5_2", 2, true), req("mlx5_3", 3, true)},
			[]string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}},
		{"by rail over different names",
			[]remoteNIC{req("ib0", 2, true), req("ib1", 3, true)},
			[]string{"mlx5_2", "mlx5_3"}},
		{"by name when subnets are unknown",
			[]remoteNIC{req("mlx5_1", 9, false), req("mlx5_3", 9, false)},
			[]string{"mlx5_1", "mlx5_3"}},
		{"by position last, spreading over unused NICs",
			[]remoteNIC{req("x0", 9, true), req("x1", 8, true), req("x2", 7, false)},
			[]string{"mlx5_3", "mlx5_2", "mlx5_1"}},
		{"by named rail over subnet and name",
			[]remoteNIC{{name: "mlx5_3", linkLayer: "Ethernet", subnet: nicSubnet(roceNIC("", 3).info), rail: "r0"},
				{name: "x", rail: "r2"}},
			[]string{"mlx5_0", "mlx5_2"}},
		{"more requester NICs than holder NICs on one rail share it",
			[]remoteNIC{req("a", 0, true), req("b", 0, true)},
			[]string{"mlx5_0", "mlx5_0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &NICs{opts: NICOptions{Transport: "verbs"}}
			s.nicSet.Store(&holder)
			got := s.pairNICs(tc.req, zerolog.Nop())
			for i, n := range got {
				if n.info.Name != tc.want[i] {
					t.Fatalf("requester NIC %d (%s) paired with %s, want %s", i, tc.req[i].name, n.info.Name, tc.want[i])
				}
			}
		})
	}
}

// regMRRecorder records the access flags a device's PDs register with.
type regMRRecorder struct {
	ibv.Device
	mu     *sync.Mutex // guards access
	access *[]ibv.Access
}

func (d regMRRecorder) AllocPD() (ibv.PD, error) {
	pd, err := d.Device.AllocPD()
	return regMRPD{PD: pd, d: d}, err
}

type regMRPD struct {
	ibv.PD
	d regMRRecorder
}

func (p regMRPD) RegMR(buf []byte, a ibv.Access) (ibv.MR, error) {
	p.d.mu.Lock()
	*p.d.access = append(*p.d.access, a)
	p.d.mu.Unlock()
	return p.PD.RegMR(buf, a)
}

// TestRelaxedOrderingDefault: the pool is registered with relaxed
// ordering unless Options.NoRelaxedOrdering.
func TestRelaxedOrderingDefault(t *testing.T) {
	for _, off := range []bool{false, true} {
		var mu sync.Mutex
		var access []ibv.Access
		d := newDialers(t)
		newNode(t, d, nodeOpts{id: "n", nics: 2, noRelaxedOrdering: off, wrapDevice: func(dev ibv.Device) ibv.Device {
			return regMRRecorder{Device: dev, mu: &mu, access: &access}
		}})
		mu.Lock()
		got := access
		mu.Unlock()
		if len(got) != 2 {
			t.Fatalf("%d registrations, want one per NIC", len(got))
		}
		for _, a := range got {
			if want := !off; (a&ibv.AccessRelaxedOrdering != 0) != want || a&ibv.AccessRemoteRead == 0 {
				t.Fatalf("NoRelaxedOrdering=%v: registered with %#x", off, uint32(a))
			}
		}
	}
}

// barrierDevice's RegMR waits until every device of the test is inside
// RegMR (or a second passed) and records how many were at once.
type barrierDevice struct {
	ibv.Device
	b *regBarrier
}

type regBarrier struct {
	n       int
	mu      sync.Mutex // guards in and maxIn
	in      int
	maxIn   int
	arrived chan struct{} // closed when n are inside
}

func (d barrierDevice) AllocPD() (ibv.PD, error) {
	pd, err := d.Device.AllocPD()
	return barrierPD{PD: pd, b: d.b}, err
}

type barrierPD struct {
	ibv.PD
	b *regBarrier
}

func (p barrierPD) RegMR(buf []byte, a ibv.Access) (ibv.MR, error) {
	b := p.b
	b.mu.Lock()
	b.in++
	b.maxIn = max(b.maxIn, b.in)
	if b.in == b.n {
		close(b.arrived)
	}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.in--
		b.mu.Unlock()
	}()
	select {
	case <-b.arrived:
	case <-time.After(time.Second):
	}
	return p.PD.RegMR(buf, a)
}

// TestRegisterNICsParallel: the pool is registered on every NIC at once
// (pinning a large pool takes seconds per NIC), not one after the other.
func TestRegisterNICsParallel(t *testing.T) {
	const nics = 4
	b := &regBarrier{n: nics, arrived: make(chan struct{})}
	newNode(t, newDialers(t), nodeOpts{id: "n", nics: nics, wrapDevice: func(dev ibv.Device) ibv.Device {
		return barrierDevice{Device: dev, b: b}
	}})
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.maxIn != nics {
		t.Fatalf("at most %d of %d registrations ran at once, want all", b.maxIn, nics)
	}
}

// eventDevice is a device whose port events the test sends.
type eventDevice struct {
	ibv.Device
	ch chan ibv.DeviceEvent
}

func (d eventDevice) Events() <-chan ibv.DeviceEvent { return d.ch }

// TestNICPortDownInvalidates: a NIC whose port goes down invalidates the
// connections (their QPs through it are dead) and the next Get handshakes
// again; events are counted per NIC; an address change leaves
// connections alone.
func TestNICPortDownInvalidates(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2})
	var chans []chan ibv.DeviceEvent
	req := newNode(t, d, nodeOpts{id: "req", nics: 2, wrapDevice: func(dev ibv.Device) ibv.Device {
		ch := make(chan ibv.DeviceEvent, 1)
		chans = append(chans, ch)
		return eventDevice{Device: dev, ch: ch}
	}})
	c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	chans[1] <- ibv.DeviceEvent{Kind: ibv.AddressChange}
	waitFor(t, "address_change counted", func() bool {
		return testutil.ToFloat64(req.met.NICEvents.WithLabelValues("tcp1", "address_change")) == 1
	})
	if c.Invalid() {
		t.Fatal("an address change invalidated the connection")
	}
	chans[0] <- ibv.DeviceEvent{Kind: ibv.PortDown}
	waitFor(t, "connection invalidated", c.Invalid)
	if n := testutil.ToFloat64(req.met.NICEvents.WithLabelValues("tcp0", "port_down")); n != 1 {
		t.Fatalf("port_down events of tcp0: %v, want 1", n)
	}
	c2, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil || c2 == c {
		t.Fatalf("Get after port down: %p %v, want a new connection", c2, err)
	}
}

// TestFailedPlanCountsNoBytes: a Read whose plan fails (an op outside the
// holder's memory after a valid one) counts no bytes on any NIC, neither in
// the metric nor in the balance pickNIC keeps, so the next Read still
// spreads evenly (review finding: bytes were counted before plan could
// fail, leaving phantom load on the NICs of the valid ops).
func TestFailedPlanCountsNoBytes(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2})
	req := newNode(t, d, nodeOpts{id: "req", nics: 2})
	c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	rb, hb := req.base(), hold.base()
	bad := []ReadOp{{LocalAddr: rb, RemoteAddr: hb, Len: mib, NUMA: -1}, {LocalAddr: rb + mib, RemoteAddr: hb + uint64(len(hold.mem)) - 10, Len: 100, NUMA: -1}}
	if err := c.Read(ctxT(t, 5*time.Second), bad); !errors.Is(err, ErrRemoteMemory) {
		t.Fatalf("read past the holder's memory: %v, want ErrRemoteMemory", err)
	}
	if got := sumOf(req.met.NICReadBytes); got != 0 {
		t.Fatalf("NIC read bytes after a rejected plan: %v, want 0", got)
	}
	good := []ReadOp{{LocalAddr: rb, RemoteAddr: hb, Len: mib, NUMA: -1}, {LocalAddr: rb + mib, RemoteAddr: hb + mib, Len: mib, NUMA: -1}}
	if err := c.Read(ctxT(t, 5*time.Second), good); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tcp0", "tcp1"} {
		if got := testutil.ToFloat64(req.met.NICReadBytes.WithLabelValues(name)); got != mib {
			t.Fatalf("%s read %v bytes after two 1 MiB ops, want %d (one op per NIC)", name, got, mib)
		}
	}
}

// TestLargeSegmentSpreads is issue 27 item 4b: one 8 MiB segment is sliced
// (Options.SliceBytes, 1 MiB) over every NIC and QP, as Mooncake slices a
// transfer, instead of riding one NIC: 2 NICs x 2 QPs carry 4 MiB per NIC
// over all 4 QPs, byte for byte. On the old code (8 MiB per WR) it was one
// WR on one QP of one NIC.
func TestLargeSegmentSpreads(t *testing.T) {
	const mib = 1 << 20
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2, qps: 2, mem: 16 * mib})
	req := newNode(t, d, nodeOpts{id: "req", nics: 2, qps: 2, mem: 16 * mib})
	ibvtest.Fill(hold.mem, 3)
	c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	spans := []span{{local: 4 * mib, remote: 8 * mib, n: 8 * mib}}
	batches, pending, err := c.plan(opsOf(req, hold, spans))
	if err != nil {
		t.Fatal(err)
	}
	c.settleNICBytes(pending)
	qps := map[*session]int{}
	for _, b := range batches {
		qps[b.s] += len(b.wrs)
	}
	if len(qps) != 4 {
		t.Fatalf("one 8 MiB segment planned on %d QPs, want all 4 (WRs per QP %v)", len(qps), qps)
	}
	before := map[string]float64{}
	for _, name := range []string{"tcp0", "tcp1"} {
		before[name] = testutil.ToFloat64(req.met.NICReadBytes.WithLabelValues(name))
	}
	if err := c.Read(ctxT(t, 10*time.Second), opsOf(req, hold, spans)); err != nil {
		t.Fatal(err)
	}
	checkSpans(t, req, hold, spans)
	for _, name := range []string{"tcp0", "tcp1"} {
		if got := testutil.ToFloat64(req.met.NICReadBytes.WithLabelValues(name)) - before[name]; got != 4*mib {
			t.Fatalf("%s read %v bytes of one 8 MiB segment, want 4 MiB", name, got)
		}
	}
}
