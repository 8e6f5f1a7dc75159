//go:build linux && cgo && !noverbs && pegad_fakeverbs

package conn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
	"github.com/pegaflow/pegad/internal/ibv/verbs"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
)

// These tests run conn over the verbs provider's fake HCA (fakeverbs.c):
// eight RoCE NICs, each on its own isolated rail (a READ toward another
// rail fails with RETRY_EXC_ERR after a successful connect, as on a real
// rail-isolated fabric), over two NUMA nodes described in a fake sysfs.

// fakeSysfs writes <dev>/device/numa_node for each device.
func fakeSysfs(t *testing.T, numa map[string]int) string {
	t.Helper()
	root := t.TempDir()
	for dev, n := range numa {
		dir := filepath.Join(root, dev, "device")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(strconv.Itoa(n)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// directPeer is a holder's PeerService as its Acceptor answers it,
// without gRPC in between.
type directPeer struct {
	pegadv1.PeerServiceClient
	acc *Acceptor
	// tap, when set, sees every handshake and its answer.
	tap *atomic.Pointer[func(*pegadv1.RdmaHandshakeRequest, *pegadv1.RdmaHandshakeResponse)]
}

func (p directPeer) RdmaHandshake(ctx context.Context, in *pegadv1.RdmaHandshakeRequest, _ ...grpc.CallOption) (*pegadv1.RdmaHandshakeResponse, error) {
	resp, err := p.acc.Accept(ctx, in)
	if f := p.tap.Load(); f != nil {
		(*f)(in, resp)
	}
	return resp, err
}

func (p directPeer) RdmaDisconnect(ctx context.Context, in *pegadv1.RdmaDisconnectRequest, _ ...grpc.CallOption) (*pegadv1.RdmaDisconnectResponse, error) {
	return p.acc.Disconnect(ctx, in)
}

type fakeNode struct {
	nics *NICs
	dial *Dialer
	acc  *Acceptor
	mem  []byte
	met  *metrics.Metrics
	// tap: see directPeer (handshakes this node answers).
	tap atomic.Pointer[func(*pegadv1.RdmaHandshakeRequest, *pegadv1.RdmaHandshakeResponse)]
}

// newFakeNode opens names on the fake HCA, maps memBytes of pool and
// opens its NIC set and halves; dial answers handshakes with holder (nil: none).
func newFakeNode(t *testing.T, id, sysfs string, names []string, memBytes int, holder *fakeNode) *fakeNode {
	t.Helper()
	return newFakeNodeWith(t, id, verbs.Options{SysfsRoot: sysfs}, names, nil, memBytes, holder)
}

// placement is a Placement of one mapping: all on node 0, or (split) its
// first half on node 0 and the second on node 1.
type placement struct {
	mem   []byte
	split bool
}

func (p placement) NodeOf(addr uint64) int {
	if p.split && addr >= base(p.mem)+uint64(len(p.mem)/2) {
		return 1
	}
	return 0
}

func (p placement) Nodes() []int {
	if p.split {
		return []int{0, 1}
	}
	return []int{0}
}

// newFakeNodeWith is newFakeNode with the provider's options (the library
// is always the fake) and the rail of each NIC (nil: none).
func newFakeNodeWith(t *testing.T, id string, vo verbs.Options, names, rails []string, memBytes int, holder *fakeNode) *fakeNode {
	t.Helper()
	return newPlacedFakeNode(t, id, vo, names, rails, memBytes, holder, nil)
}

// newPlacedFakeNode is newFakeNodeWith with a Placement of the node's
// memory (nil: none; place gets the mapping).
func newPlacedFakeNode(t *testing.T, id string, vo verbs.Options, names, rails []string, memBytes int, holder *fakeNode,
	place func(mem []byte) Placement) *fakeNode {
	t.Helper()
	vo.Library = verbs.FakeLibrary
	return newProviderNode(t, id, verbs.NewWithOptions(vo), names, rails, memBytes, holder, place)
}

// newProviderNode is a node on prov's devices names (the fake, or a real
// device in the verbs-e2e guest); with sets its options.
func newProviderNode(t *testing.T, id string, prov *verbs.Provider, names, rails []string, memBytes int, holder *fakeNode,
	place func(mem []byte) Placement, with ...func(*stackOptions)) *fakeNode {
	t.Helper()
	var devs []ibv.Device
	for _, name := range names {
		d, err := prov.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := d.Close(); err != nil {
				t.Errorf("close %s: %v", name, err)
			}
		})
		devs = append(devs, d)
	}
	n := &fakeNode{mem: ibvtest.MapMemory(t, memBytes), met: metricstest.New()}
	var pl Placement
	if place != nil {
		pl = place(n.mem)
	}
	var opts stackOptions
	opts.NICOptions = NICOptions{
		NodeID: id, Incarnation: id + "-1", Transport: "verbs", Devices: devs, Memory: n.mem,
		Metrics: n.met, Log: zerolog.Nop(), Rails: rails, Placement: pl,
	}
	opts.DialerOptions = DialerOptions{
		QPsPerPeer: 1, HandshakeTimeout: 5 * time.Second,
		Dial: func(string) (pegadv1.PeerServiceClient, error) {
			return directPeer{acc: holder.acc, tap: &holder.tap}, nil
		},
	}
	for _, f := range with {
		f(&opts)
	}
	n.open(t, id, opts)
	return n
}

// open opens n's NIC set and halves, closed at cleanup.
func (n *fakeNode) open(t *testing.T, id string, opts stackOptions) {
	t.Helper()
	st, err := openStack(opts)
	if err != nil {
		t.Fatal(err)
	}
	n.nics, n.dial, n.acc = st.nics, st.dial, st.acc
	t.Cleanup(func() {
		if err := st.close(); err != nil {
			t.Errorf("close %s: %v", id, err)
		}
	})
}

func base(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// eightNICsTwoNodes names the fake HCA's eight NICs, pegadfake0..7, the
// first four on NUMA node 0 and the rest on node 1 (a two-socket GPU node).
func eightNICsTwoNodes() (names []string, numa map[string]int) {
	numa = map[string]int{}
	for i := range 8 {
		name := "pegadfake" + strconv.Itoa(i)
		names = append(names, name)
		numa[name] = i / 4
	}
	return names, numa
}

// TestFakeVerbsEightNICs: a 64-block fetch from a holder whose NICs are
// listed in another order (pegadfake7..0) over 8 NICs on 2 NUMA nodes.
// NICs pair by rail (the handshake carries each NIC's subnet), not by
// position, which on this rail-isolated fabric connects and then fails
// every READ; and every NIC carries bytes, the segment's NUMA node's
// NICs a little more, none more than 1.5x another.
func TestFakeVerbsEightNICs(t *testing.T) {
	names, numa := eightNICsTwoNodes()
	sysfs := fakeSysfs(t, numa)
	const blocks, bs = 64, 256 << 10
	reversed := slices.Clone(names)
	slices.Reverse(reversed)
	holder := newFakeNode(t, "holder", sysfs, reversed, blocks*bs, nil)
	ibvtest.Fill(holder.mem, 7)
	req := newFakeNode(t, "requester", sysfs, names, blocks*bs, holder)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := req.dial.Get(ctx, "holder:1")
	if err != nil {
		t.Fatal(err)
	}
	ops := make([]ReadOp, blocks)
	for i := range ops {
		off := uint64(i * bs)
		ops[i] = ReadOp{LocalAddr: base(req.mem) + off, RemoteAddr: base(holder.mem) + off, Len: bs, NUMA: 0}
	}
	if err := c.Read(ctx, ops); err != nil {
		t.Fatalf("64-block read: %v", err)
	}
	if !bytes.Equal(req.mem, holder.mem) {
		t.Fatal("fetched bytes differ from the holder's")
	}
	per := map[string]float64{}
	for _, name := range names {
		per[name] = testutil.ToFloat64(req.met.NICReadBytes.WithLabelValues(name))
	}
	t.Logf("bytes per NIC: %v", per)
	lo, hi := slices.Min(mapValues(per)), slices.Max(mapValues(per))
	if lo == 0 || hi > 1.5*lo {
		t.Fatalf("bytes per NIC %v: want every NIC used, none above 1.5x another", per)
	}
	var local, remote float64
	for name, b := range per {
		if numa[name] == 0 {
			local += b
		} else {
			remote += b
		}
	}
	if local <= remote {
		t.Fatalf("NUMA-0 NICs carried %v bytes, NUMA-1 %v: want the segment's node preferred", local, remote)
	}
}

func mapValues(m map[string]float64) []float64 {
	var out []float64
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// TestFakeVerbsMixedFleet: the holder's older HCA has 8 responder
// resources; the handshake carries them and the requester's 16-deep
// initiator is clamped, else its READs are NAKed (Remote Invalid Request).
func TestFakeVerbsMixedFleet(t *testing.T) {
	sysfs := fakeSysfs(t, nil)
	holder := newFakeNode(t, "holder", sysfs, []string{"pegadfakeold0"}, 1<<20, nil)
	ibvtest.Fill(holder.mem, 3)
	req := newFakeNode(t, "requester", sysfs, []string{"pegadfake0"}, 1<<20, holder)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := req.dial.Get(ctx, "holder:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Read(ctx, []ReadOp{{LocalAddr: base(req.mem), RemoteAddr: base(holder.mem), Len: 1 << 20, NUMA: -1}}); err != nil {
		t.Fatalf("read toward an older HCA: %v", err)
	}
	if !bytes.Equal(req.mem, holder.mem) {
		t.Fatal("fetched bytes differ from the holder's")
	}
}

// TestFakeVerbsGIDChangeRefreshesSubnet: after an address change moves a
// NIC's GID to another subnet, the handshakes both sides send name the new
// subnet (the one peers pair that rail by), not the one resolved at start.
func TestFakeVerbsGIDChangeRefreshesSubnet(t *testing.T) {
	t.Cleanup(verbs.FakeResetPorts)
	sysfs := fakeSysfs(t, nil)
	names := []string{"pegadfake3", "pegadfake4"}
	holder := newFakeNode(t, "holder", sysfs, []string{"pegadfake4", "pegadfake3"}, 1<<20, nil)
	req := newFakeNode(t, "requester", sysfs, names, 1<<20, holder)
	type seen struct{ req, resp map[string]string }
	got := make(chan seen, 4)
	tap := func(in *pegadv1.RdmaHandshakeRequest, out *pegadv1.RdmaHandshakeResponse) {
		s := seen{map[string]string{}, map[string]string{}}
		for _, n := range in.GetNics() {
			s.req[n.GetNic()] = n.GetSubnet()
		}
		for _, n := range out.GetNics() {
			s.resp[n.GetNic()] = n.GetSubnet()
		}
		got <- s
	}
	holder.tap.Store(&tap)
	handshake := func() seen {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := req.dial.Get(ctx, "holder:1")
		if err != nil {
			t.Fatal(err)
		}
		req.dial.Invalidate(c, errors.New("test: handshake again"))
		return <-got
	}
	first := handshake()
	if first.req["pegadfake3"] != "10.0.3.0/24" || first.resp["pegadfake3"] != "10.0.3.0/24" {
		t.Fatalf("subnets before the change: request %v, response %v", first.req, first.resp)
	}
	// Both managers hold a context of pegadfake3 (one fake device).
	if n := verbs.FakePortEvent("pegadfake3", ibv.AddressChange); n != 2 {
		t.Fatalf("address change told %d contexts, want 2", n)
	}
	for _, n := range []*fakeNode{holder, req} {
		waitFor(t, "address change seen", func() bool {
			return testutil.ToFloat64(n.met.NICEvents.WithLabelValues("pegadfake3", "address_change")) == 1
		})
	}
	after := handshake()
	if after.req["pegadfake3"] != "10.1.3.0/24" || after.resp["pegadfake3"] != "10.1.3.0/24" {
		t.Fatalf("subnets after the change: request %v, response %v; want pegadfake3 in 10.1.3.0/24", after.req, after.resp)
	}
	if after.req["pegadfake4"] != "10.0.4.0/24" {
		t.Fatalf("pegadfake4's subnet changed with another NIC's address: %v", after.req)
	}
}

// TestFakeVerbsPairByRail: when subnets say nothing (link-local RoCE GIDs,
// GID index 0) and the holder's NIC on one rail has another name
// (pegadfakeold0 is on rail 0 like pegadfake0), the rails the operators
// named (--nics r0=...,r1=...) pair the NICs, whatever order the holder
// lists them in. Paired by position instead, the requester's rail-0 NIC
// would READ through the holder's rail-1 NIC, which the fake fabric drops.
func TestFakeVerbsPairByRail(t *testing.T) {
	vo := verbs.Options{SysfsRoot: fakeSysfs(t, nil), ForceGIDIndex: true, GIDIndex: 0}
	holder := newFakeNodeWith(t, "holder", vo, []string{"pegadfake1", "pegadfakeold0"}, []string{"r1", "r0"}, 1<<20, nil)
	ibvtest.Fill(holder.mem, 5)
	req := newFakeNodeWith(t, "requester", vo, []string{"pegadfake0", "pegadfake1"}, []string{"r0", "r1"}, 1<<20, holder)
	var paired []string
	tap := func(_ *pegadv1.RdmaHandshakeRequest, out *pegadv1.RdmaHandshakeResponse) {
		for _, n := range out.GetNics() {
			paired = append(paired, n.GetNic()+"/"+n.GetSubnet())
		}
	}
	holder.tap.Store(&tap)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := req.dial.Get(ctx, "holder:1")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"pegadfakeold0/", "pegadfake1/"}; !slices.Equal(paired, want) {
		t.Fatalf("holder paired the requester's NICs with %v, want %v (by rail)", paired, want)
	}
	ops := make([]ReadOp, 16)
	for i := range ops {
		off := uint64(i) << 16
		ops[i] = ReadOp{LocalAddr: base(req.mem) + off, RemoteAddr: base(holder.mem) + off, Len: 1 << 16, NUMA: -1}
	}
	if err := c.Read(ctx, ops); err != nil {
		t.Fatalf("read over rail-paired NICs: %v", err)
	}
	if !bytes.Equal(req.mem, holder.mem) {
		t.Fatal("fetched bytes differ from the holder's")
	}
	for _, name := range []string{"pegadfake0", "pegadfake1"} {
		if testutil.ToFloat64(req.met.NICReadBytes.WithLabelValues(name)) == 0 {
			t.Fatalf("%s carried no bytes", name)
		}
	}
}

// TestFakeVerbsPlacement: with memory on both NICs' nodes, each READ goes
// through a NIC on its local memory's node; with memory on node 0 only (a
// binding that failed), READs still spread over all 8 NICs rather than
// leaving node 1's idle.
func TestFakeVerbsPlacement(t *testing.T) {
	names, numa := eightNICsTwoNodes()
	vo := verbs.Options{SysfsRoot: fakeSysfs(t, numa)}
	const blocks, bs = 64, 128 << 10
	for _, split := range []bool{true, false} {
		t.Run(fmt.Sprintf("split=%v", split), func(t *testing.T) {
			holder := newFakeNodeWith(t, "holder", vo, names, nil, blocks*bs, nil)
			ibvtest.Fill(holder.mem, 9)
			req := newPlacedFakeNode(t, "requester", vo, names, nil, blocks*bs, holder,
				func(mem []byte) Placement { return placement{mem, split} })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := req.dial.Get(ctx, "holder:1")
			if err != nil {
				t.Fatal(err)
			}
			if sp := c.StagingPlan(); (sp != nil) != split {
				t.Fatalf("StagingPlan() = %v with split=%v", sp, split)
			}
			// Each op alone, so the NIC of each is known from the counters.
			for i := range blocks {
				off := uint64(i * bs)
				before := map[string]float64{}
				for _, name := range names {
					before[name] = testutil.ToFloat64(req.met.NICReadBytes.WithLabelValues(name))
				}
				op := ReadOp{LocalAddr: base(req.mem) + off, RemoteAddr: base(holder.mem) + off, Len: bs, NUMA: 0}
				if err := c.Read(ctx, []ReadOp{op}); err != nil {
					t.Fatal(err)
				}
				for _, name := range names {
					if testutil.ToFloat64(req.met.NICReadBytes.WithLabelValues(name)) == before[name] {
						continue
					}
					want := (placement{req.mem, split}).NodeOf(op.LocalAddr)
					if split && numa[name] != want {
						t.Fatalf("op %d into node %d memory went through %s on node %d", i, want, name, numa[name])
					}
				}
			}
			if !bytes.Equal(req.mem, holder.mem) {
				t.Fatal("fetched bytes differ from the holder's")
			}
			// One op at a time, nothing else in flight: placement
			// balances bytes in flight, so an unplaced op (split=false)
			// takes a NIC on its source's node, the four of them in turn.
			for _, name := range names {
				carried := testutil.ToFloat64(req.met.NICReadBytes.WithLabelValues(name)) > 0
				if want := split || numa[name] == 0; carried != want {
					t.Fatalf("%s (node %d) carried bytes: %v, want %v", name, numa[name], carried, want)
				}
			}
		})
	}
}
