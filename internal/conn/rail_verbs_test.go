//go:build linux && cgo && !noverbs && pegad_fakeverbs

package conn

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
	"github.com/pegaflow/pegad/internal/ibv/verbs"
)

// twoRails is a holder and a requester on the fake HCA's pegadfake0 and
// pegadfake1, each its own rail; both open the same two devices, so a port
// event on one (a cable pulled) reaches both sides, as on a real fabric.
func twoRails(t *testing.T, memBytes int) (holder, req *fakeNode) {
	t.Helper()
	t.Cleanup(verbs.FakeResetPorts)
	sysfs := fakeSysfs(t, nil)
	names := []string{"pegadfake0", "pegadfake1"}
	holder = newFakeNode(t, "holder", sysfs, names, memBytes, nil)
	ibvtest.Fill(holder.mem, 5)
	req = newFakeNode(t, "requester", sysfs, names, memBytes, holder)
	return holder, req
}

// wholeOps reads all of the holder's memory into the requester's, in bs
// pieces.
func wholeOps(holder, req *fakeNode, bs int) []ReadOp {
	ops := make([]ReadOp, len(req.mem)/bs)
	for i := range ops {
		off := uint64(i * bs)
		ops[i] = ReadOp{LocalAddr: base(req.mem) + off, RemoteAddr: base(holder.mem) + off, Len: uint64(bs), NUMA: -1}
	}
	return ops
}

func nicBytes(n *fakeNode, nic string) float64 {
	return testutil.ToFloat64(n.met.NICReadBytes.WithLabelValues(nic))
}

// TestFakeVerbsRailDownMidRead: a port goes down under a READ in flight.
// The READs through it hang (the fake holds them, as rxe retries forever),
// and the port-down event must end them: the NIC's QPs are flushed, so the
// Read fails at once with a flush, which the requester treats as innocent
// (it reads again on a fresh connection); that connection leaves the NIC
// out, so the next Read completes over the other rail, byte for byte. On
// the old code the event only invalidated the connection, which waits for
// its in-flight READs: the Read hung until its deadline.
func TestFakeVerbsRailDownMidRead(t *testing.T) {
	const bs = 64 << 10
	holder, req := twoRails(t, 64*bs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := req.dial.Get(ctx, "holder:1")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.nics) != 2 {
		t.Fatalf("connection over %d NICs, want 2", len(c.nics))
	}

	// The cable is out, the HCA has not said so yet: READs on rail 1 hang.
	verbs.FakePortState("pegadfake1", ibv.PortDown)
	done := make(chan error, 1)
	go func() { done <- c.Read(ctx, wholeOps(holder, req, bs)) }()
	select {
	case err := <-done:
		t.Fatalf("Read through a down port returned before the port event: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	start := time.Now()
	verbs.FakePortEvent("pegadfake1", ibv.PortDown)
	var rerr error
	select {
	case rerr = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Read still hangs 5s after the port-down event: its READs on the down NIC were not flushed")
	}
	t.Logf("Read ended %v after the port-down event: %v", time.Since(start), rerr)
	var se *ibv.StatusError
	if !errors.Is(rerr, ErrConnectionBroken) || (errors.As(rerr, &se) && se.Status != ibv.WCWRFlushErr) {
		t.Fatalf("Read error %v: want connection broken by a flush (innocent: the requester retries)", rerr)
	}
	if !c.Invalid() {
		t.Fatal("connection through the down NIC still valid")
	}
	for _, n := range []*fakeNode{req, holder} {
		if up := testutil.ToFloat64(n.met.NICUp.WithLabelValues("pegadfake1")); up != 0 {
			t.Fatalf("pegadfake1 nic_up = %v after port down, want 0", up)
		}
	}

	// The retry: a fresh connection over the NIC that is up only.
	clear(req.mem)
	c2, err := req.dial.Get(ctx, "holder:1")
	if err != nil {
		t.Fatal(err)
	}
	if len(c2.nics) != 1 || c2.nics[0].nic.info.Name != "pegadfake0" {
		t.Fatalf("connection after port down over %d NICs, want pegadfake0 only", len(c2.nics))
	}
	down := nicBytes(req, "pegadfake1")
	if err := c2.Read(ctx, wholeOps(holder, req, bs)); err != nil {
		t.Fatalf("Read over the remaining rail: %v", err)
	}
	if !bytes.Equal(req.mem, holder.mem) {
		t.Fatal("bytes read over the remaining rail differ from the holder's")
	}
	if got := nicBytes(req, "pegadfake1"); got != down {
		t.Fatalf("the down NIC was given %v more bytes", got-down)
	}

	// Port up: the connection made without the NIC is replaced, and the
	// next one carries bytes on both rails again.
	verbs.FakePortEvent("pegadfake1", ibv.PortUp)
	waitFor(t, "connection without pegadfake1 replaced", c2.Invalid)
	c3, err := req.dial.Get(ctx, "holder:1")
	if err != nil {
		t.Fatal(err)
	}
	clear(req.mem)
	if err := c3.Read(ctx, wholeOps(holder, req, bs)); err != nil {
		t.Fatalf("Read after port up: %v", err)
	}
	if !bytes.Equal(req.mem, holder.mem) {
		t.Fatal("bytes read after port up differ from the holder's")
	}
	if got := nicBytes(req, "pegadfake1"); got == down {
		t.Fatal("pegadfake1 carried nothing after its port came back")
	}
	if up := testutil.ToFloat64(req.met.NICUp.WithLabelValues("pegadfake1")); up != 1 {
		t.Fatalf("pegadfake1 nic_up = %v after port up, want 1", up)
	}
}

// TestFakeVerbsHolderPairsNoDownNIC: the holder's rail 1 is down while the
// requester's is up (a switch port on the holder's side): the holder pairs
// both requester NICs with its NIC that is up, so no READ is sent toward a
// dead port. The fake fabric is rail-isolated, so the requester's rail-1
// READs then fail; what matters is the pairing the holder answered with.
func TestFakeVerbsHolderPairsNoDownNIC(t *testing.T) {
	holder, req := twoRails(t, 1<<20)
	verbs.FakePortEvent("pegadfake1", ibv.PortDown)
	waitFor(t, "holder saw its port go down", func() bool {
		return testutil.ToFloat64(holder.met.NICUp.WithLabelValues("pegadfake1")) == 0
	})
	// The requester's side comes back (only the holder's stays down).
	req.nics.curNICs()[1].down.Store(false)
	nics := []remoteNIC{{name: "pegadfake0"}, {name: "pegadfake1"}}
	for i, n := range holder.nics.pairNICs(nics, holder.nics.log) {
		if n.info.Name != "pegadfake0" {
			t.Fatalf("requester NIC %d paired with %s, whose port is down", i, n.info.Name)
		}
	}
}

// TestFakeVerbsAllNICsDown: with every port down a handshake fails at once
// with a connection error naming the cause, instead of building QPs that
// could only hang.
func TestFakeVerbsAllNICsDown(t *testing.T) {
	_, req := twoRails(t, 1<<20)
	for _, n := range []string{"pegadfake0", "pegadfake1"} {
		verbs.FakePortEvent(n, ibv.PortDown)
		waitFor(t, n+" down", func() bool { return testutil.ToFloat64(req.met.NICUp.WithLabelValues(n)) == 0 })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := req.dial.Get(ctx, "holder:1")
	if !errors.Is(err, ErrNoActiveNIC) || !errors.Is(err, ErrConnectionBroken) {
		t.Fatalf("Get with every port down: %v, want ErrNoActiveNIC (connection class)", err)
	}
}

// TestInFlightBytesSettle: a NIC's bytes in flight (what placement
// balances) go back to 0 when its Read ends, so a rail is weighed by what
// it has outstanding, not by all it ever carried (issue 27 item 4c); a
// NIC with bytes outstanding gets the next op.
func TestInFlightBytesSettle(t *testing.T) {
	const bs = 64 << 10
	holder, req := twoRails(t, 16*bs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := req.dial.Get(ctx, "holder:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Read(ctx, wholeOps(holder, req, bs)); err != nil {
		t.Fatal(err)
	}
	for _, cn := range c.nics {
		if b := cn.bytes.Load(); b != 0 {
			t.Fatalf("%s has %d bytes in flight after its Read ended, want 0", cn.nic.info.Name, b)
		}
	}
	// A slow rail: 8 MiB still outstanding on NIC 0. The next ops all go
	// to NIC 1 until it has as much.
	slow := []uint64{8 << 20, 0}
	c.commitNICBytes(slow)
	defer c.settleNICBytes(slow)
	pending := make([]uint64, len(c.nics))
	for i := range 8 {
		if j := c.pickNIC(-1, -1, bs, pending, nil); j != 1 {
			t.Fatalf("op %d went to NIC %d, which has 8 MiB outstanding; want the idle NIC 1", i, j)
		}
	}
}

// TestFakeVerbsRailFailsBeforeEvent: rxe fails READs through a NIC whose
// netdev went down at once (local QP operation error), before the port's
// event arrives; seen in the verbs-e2e guest, where the fetch in flight
// then failed. The Read's error must say the rail went down (ErrRailDown,
// which the requester retries on a fresh connection) and the NIC must be
// out of placement already, without the event.
func TestFakeVerbsRailFailsBeforeEvent(t *testing.T) {
	const bs = 64 << 10
	holder, req := twoRails(t, 32*bs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := req.dial.Get(ctx, "holder:1")
	if err != nil {
		t.Fatal(err)
	}
	verbs.FakeNetdevDown("pegadfake1")
	rerr := c.Read(ctx, wholeOps(holder, req, bs))
	if !errors.Is(rerr, ErrRailDown) {
		t.Fatalf("Read through a NIC whose netdev went down: %v, want ErrRailDown", rerr)
	}
	if up := testutil.ToFloat64(req.met.NICUp.WithLabelValues("pegadfake1")); up != 0 {
		t.Fatalf("pegadfake1 nic_up = %v, want 0 before any event", up)
	}
	c2, err := req.dial.Get(ctx, "holder:1")
	if err != nil {
		t.Fatal(err)
	}
	clear(req.mem)
	if err := c2.Read(ctx, wholeOps(holder, req, bs)); err != nil {
		t.Fatalf("Read over the remaining rail: %v", err)
	}
	if !bytes.Equal(req.mem, holder.mem) {
		t.Fatal("bytes differ after the retry")
	}
}

// TestFakeVerbsDeviceFatalReopen is issue 27 item 2's last part: a device
// that reports IBV_EVENT_DEVICE_FATAL is taken out of placement (its READs
// fail at once, as a dead HCA's do; fetches go on over the other rail), and
// opened again once it is back: the new NIC takes its place, carries bytes
// from the next connection on, and the dead one is released once its QPs
// are gone. On the old code the event was acked and dropped: every
// connection kept its QPs on the dead device.
func TestFakeVerbsDeviceFatalReopen(t *testing.T) {
	const bs = 64 << 10
	t.Cleanup(verbs.FakeResetPorts)
	sysfs := fakeSysfs(t, nil)
	names := []string{"pegadfake0", "pegadfake1"}
	prov := verbs.NewWithOptions(verbs.Options{Library: verbs.FakeLibrary, SysfsRoot: sysfs})
	reopen := func(o *stackOptions) { o.Reopen = func(i int) (ibv.Device, error) { return prov.Open(names[i]) } }
	holder := newProviderNode(t, "holder", prov, names, nil, 64*bs, nil, nil, reopen)
	ibvtest.Fill(holder.mem, 5)
	req := newProviderNode(t, "requester", prov, names, nil, 64*bs, holder, nil, reopen)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	read := func(t *testing.T) *AddrConnection {
		t.Helper()
		for range 3 { // a Read cut by the fatal event fails flushed: read again on a fresh connection
			c, err := req.dial.Get(ctx, "holder:1")
			if err != nil {
				t.Fatal(err)
			}
			clear(req.mem)
			if err = c.Read(ctx, wholeOps(holder, req, bs)); err == nil {
				if !bytes.Equal(req.mem, holder.mem) {
					t.Fatal("bytes differ")
				}
				return c
			}
			if !IsConnectionClass(err) {
				t.Fatalf("Read: %v", err)
			}
		}
		t.Fatal("no Read completed in 3 tries")
		return nil
	}
	read(t)
	dead := req.nics.curNICs()[1]

	if told := verbs.FakePortEvent("pegadfake1", ibv.DeviceFatal); told < 2 {
		t.Fatalf("fatal event told %d contexts, want both nodes'", told)
	}
	waitFor(t, "requester takes the dead NIC out", func() bool { return dead.down.Load() })
	before := nicBytes(req, "pegadfake0")
	if c := read(t); len(c.nics) != 1 || c.nics[0].nic.info.Name != "pegadfake0" {
		t.Fatalf("connection while pegadfake1 is dead over %d NICs", len(c.nics))
	}
	if nicBytes(req, "pegadfake0")-before != float64(len(req.mem)) {
		t.Fatal("the live rail did not carry the whole read")
	}
	if got := testutil.ToFloat64(req.met.NICUp.WithLabelValues("pegadfake1")); got != 0 {
		t.Fatalf("nic_up of the dead NIC = %v, want 0", got)
	}
	if got := testutil.ToFloat64(req.met.NICEvents.WithLabelValues("pegadfake1", "device_fatal")); got != 1 {
		t.Fatalf("device_fatal events counted %v, want 1", got)
	}

	// The device is back (reset done): the reopen loop brings it in.
	verbs.FakePortState("pegadfake1", ibv.PortUp)
	waitFor(t, "requester reopens pegadfake1", func() bool {
		n := req.nics.curNICs()[1]
		return n != dead && !n.down.Load()
	})
	waitFor(t, "holder reopens pegadfake1", func() bool { return !holder.nics.curNICs()[1].down.Load() })
	before = nicBytes(req, "pegadfake1")
	if c := read(t); len(c.nics) != 2 {
		t.Fatalf("connection after the reopen over %d NICs, want 2", len(c.nics))
	}
	if nicBytes(req, "pegadfake1") == before {
		t.Fatal("the reopened NIC carried no bytes")
	}
	waitFor(t, "dead NIC released", dead.released.Load)
}
