//go:build linux && cgo && !noverbs && pegad_fakeverbs

package requester_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
	"github.com/pegaflow/pegad/internal/ibv/verbs"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/peer"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
)

// noRoute makes a requester device's QP connects fail with the errno in
// errno while it is non-zero, as rxe's ibv_modify_qp to RTR does once its
// netdev has no route to the peer (ibvtest.FailConnect).
func noRoute(d ibv.Device, errno *atomic.Uintptr) ibv.Device {
	return ibvtest.FailConnect{Device: d, Err: func(qpn uint32) error {
		if e := syscall.Errno(errno.Load()); e != 0 {
			return fmt.Errorf("qp %d to RTR: %w", qpn, &verbs.Error{Op: "ibv_modify_qp", Errno: e})
		}
		return nil
	}}
}

// railNode is a node on the fake HCA's pegadfake0 and pegadfake1 (two
// rails); with faults, its devices are FailConnect devices (noRoute) set through it. The
// holder (serve) answers on 127.0.0.1:0.
func newRailNode(t *testing.T, id string, serve bool, faults []*atomic.Uintptr) *numaNode {
	t.Helper()
	t.Cleanup(verbs.FakeResetPorts)
	sysfs, _ := numaSysfs(t)
	prov := verbs.NewWithOptions(verbs.Options{Library: verbs.FakeLibrary, SysfsRoot: sysfs})
	var devs []ibv.Device
	for i := range 2 {
		d, err := prov.Open(fmt.Sprintf("pegadfake%d", i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		if faults != nil {
			d = noRoute(d, faults[i])
		}
		devs = append(devs, d)
	}
	n := &numaNode{m: metricstest.New()}
	var err error
	if n.pool, err = pool.New(pool.Options{Size: 32 * mib, Log: zerolog.Nop()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.pool.Close() })
	n.store = store.New(n.pool, n.m)
	peers := peer.NewClientsWithOptions()
	t.Cleanup(func() { _ = peers.Close() })
	n.conns = openConns(t, conn.NICOptions{NodeID: id, Incarnation: id + "-inc", Transport: "verbs", Devices: devs,
		Memory: n.pool.Bytes(), Metrics: n.m, Log: zerolog.Nop()},
		conn.DialerOptions{QPsPerPeer: 1, Dial: peers.Get, HandshakeTimeout: 5 * time.Second}, conn.AcceptorOptions{})
	if serve {
		if n.holder, err = holder.New(holder.Options{Store: n.store, Acceptor: n.conns.acc, Metrics: n.m,
			Log: zerolog.Nop(), NodeID: id, Incarnation: id + "-inc"}); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n.addr = ln.Addr().String()
		srv := grpc.NewServer()
		pegadv1.RegisterPeerServiceServer(srv, n.holder)
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Stop(); <-done })
	}
	if n.engine, err = requester.New(requester.Options{NodeID: id, Incarnation: id + "-inc", Store: n.store,
		Conns: n.conns.dial, Peers: peers.Get, Metrics: n.m, Log: zerolog.Nop()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.engine.Close() })
	return n
}

// TestPrefetchRailFaultAtConnect is verbs-e2e phase 5's failure: rail 2's
// link went down, and a prefetch connected a QP on that rail's NIC before
// its port-down event took the NIC out of placement; ibv_modify_qp failed
// with ENETUNREACH, and the whole fetch failed with it although rail 1
// worked. A rail fault at the connect (the port queries down, or a route
// error) must leave the NIC out and connect over the other rail: the
// prefetch completes, byte for byte, whether the connect was its first
// (cold) or the reconnect of a window whose connection broke under its
// read; and the holder keeps no lock and no QP of the failed attempts.
// On the old code each case failed in the connect phase with "network is
// unreachable".
func TestPrefetchRailFaultAtConnect(t *testing.T) {
	for _, tc := range []struct {
		name   string
		netdev bool // rail 1's port queries down (no event raised) as well
		errno  syscall.Errno
		// midRead: the first fetch connects over both rails; the fault
		// starts as a later fetch enters its read, where its connection
		// breaks (a bystander's flush), so its reconnect meets it.
		midRead bool
	}{
		{name: "cold connect, netdev down before its event", netdev: true, errno: syscall.ENETUNREACH},
		{name: "cold connect, no route, port active", errno: syscall.EHOSTUNREACH},
		{name: "reconnect in read, netdev down before its event", netdev: true, errno: syscall.ENETUNREACH, midRead: true},
		{name: "reconnect in read, no route, port active", errno: syscall.ENETUNREACH, midRead: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRailNode(t, "holder", true, nil)
			faults := []*atomic.Uintptr{new(atomic.Uintptr), new(atomic.Uintptr)}
			req := newRailNode(t, "requester", false, faults)
			fault := func() {
				if tc.netdev {
					verbs.FakeNetdevDown("pegadfake1")
				}
				faults[1].Store(uintptr(tc.errno))
			}
			if tc.midRead {
				putAndFetchNamed(t, h, req, "before-fault", 4, 256<<10) // connected over both rails
				var armed atomic.Bool
				armed.Store(true)
				req.engine.SetFaultHook(func(ctx context.Context, _, phase string) {
					if phase != requester.PhaseRead || !armed.CompareAndSwap(true, false) {
						return
					}
					fault()
					c, err := req.conns.dial.Get(ctx, h.addr)
					if err != nil {
						t.Errorf("current connection: %v", err)
						return
					}
					req.conns.dial.Invalidate(c, fmt.Errorf("%w: flushed by the test", conn.ErrConnectionBroken))
				})
			} else {
				fault()
			}
			putAndFetchNamed(t, h, req, "after-fault", 16, 256<<10)
			if n := testutil.ToFloat64(req.m.Handshakes.WithLabelValues(conn.RoleRequester, "rail_fault")); n != 1 {
				t.Fatalf("%v handshakes with a rail fault, want 1", n)
			}
			if n := h.holder.Locks().Len(); n != 0 {
				t.Fatalf("%d locks left on the holder", n)
			}
			waitCond(t, "the holder holds only the QP of the live connection", func() bool {
				return h.conns.nics.QPs() == 1 && req.conns.nics.QPs() == 1
			})
		})
	}
}

// putAndFetchNamed puts blocks blocks of bs bytes named prefix-NN on h and
// prefetches them to req: each must arrive byte for byte.
func putAndFetchNamed(t *testing.T, h, req *numaNode, prefix string, blocks, bs int) {
	t.Helper()
	want := map[string][]byte{}
	var hashes [][]byte
	for i := range blocks {
		hash := fmt.Sprintf("%s-%02d", prefix, i)
		b := make([]byte, bs)
		for j := range b {
			b[j] = byte(i*7 + j)
		}
		if _, err := h.store.Put(store.Key{Namespace: "ns", Hash: hash}, []store.SlotSize{{KSize: uint64(bs)}},
			func(buf []byte) error { copy(buf, b); return nil }); err != nil {
			t.Fatal(err)
		}
		want[hash] = b
		hashes = append(hashes, []byte(hash))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := req.engine.Prefetch(ctx, h.addr, "ns", hashes)
	if err != nil {
		t.Fatalf("prefetch: %v", err)
	}
	for _, b := range res.Blocks {
		if b.Status != requester.StatusFetched {
			t.Fatalf("%s: %v %v", b.Hash, b.Status, b.Err)
		}
		if got := readStored(t, req.store, "ns", string(b.Hash)); !bytes.Equal(got, want[string(b.Hash)]) {
			t.Fatalf("%s: fetched bytes differ", b.Hash)
		}
	}
}

// waitCond waits up to 10 s for cond.
func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
