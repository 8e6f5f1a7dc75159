//go:build linux && cgo && !noverbs && pegad_fakeverbs

package requester_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/verbs"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/peer"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
	tu "github.com/pegaflow/pegad/internal/testutil"
)

// A two-socket GPU node as the fake HCA (fakeverbs.c) and a fake NUMA
// policy describe it: eight RoCE NICs, pegadfake0-3 on node 0 and
// pegadfake4-7 on node 1, and a pool split over both nodes.

// readLog records, per NIC, the local address of every RDMA READ posted.
type readLog struct {
	mu    sync.Mutex // guards reads
	reads map[string][]uint64
}

type logDevice struct {
	ibv.Device
	log *readLog
}

func (d logDevice) AllocPD() (ibv.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return logPD{PD: pd, d: d}, nil
}

type logPD struct {
	ibv.PD
	d logDevice
}

func (p logPD) CreateQP(cq ibv.CQ, c ibv.QPCap) (ibv.QP, error) {
	qp, err := p.PD.CreateQP(cq, c)
	if err != nil {
		return nil, err
	}
	return logQP{QP: qp, d: p.d}, nil
}

type logQP struct {
	ibv.QP
	d logDevice
}

func (q logQP) PostSend(wrs []ibv.SendWR) (int, error) {
	l := q.d.log
	l.mu.Lock()
	for _, wr := range wrs {
		if wr.Op == ibv.OpRDMARead {
			l.reads[q.d.Info().Name] = append(l.reads[q.d.Info().Name], wr.LocalAddr)
		}
	}
	l.mu.Unlock()
	return q.QP.PostSend(wrs)
}

type numaNode struct {
	pool   *pool.Pool
	store  *store.Store
	m      *metrics.Metrics
	engine *requester.Engine
	holder *holder.Service
	conns  *e2eConns
	addr   string
}

// newNUMANode starts a node on the fake HCA's eight NICs over two NUMA
// nodes; serve makes it a holder on 127.0.0.1:0, with memory windows when
// windows is set.
func newNUMANode(t *testing.T, id, sysfs string, serve bool, log *readLog, windows ...bool) *numaNode {
	t.Helper()
	prov := verbs.NewWithOptions(verbs.Options{Library: verbs.FakeLibrary, SysfsRoot: sysfs})
	var devs []ibv.Device
	var nodes []int
	for i := range 8 {
		d, err := prov.Open("pegadfake" + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		nodes = append(nodes, d.Info().NUMANode)
		if log != nil {
			d = logDevice{Device: d, log: log}
		}
		devs = append(devs, d)
	}
	n := &numaNode{m: metricstest.New()}
	var err error
	n.pool, err = pool.New(pool.Options{Size: 64 * mib, Log: zerolog.Nop(), Nodes: nodes, Policy: &tu.FakeNUMA{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.pool.Close() })
	n.store = store.New(n.pool, n.m)
	peers := peer.NewClientsWithOptions()
	t.Cleanup(func() { _ = peers.Close() })
	cs := openConns(t, conn.NICOptions{
		NodeID: id, Incarnation: id + "-inc", Transport: "verbs", Devices: devs,
		Memory: n.pool.Bytes(), Placement: n.pool,
		Metrics: n.m, Log: zerolog.Nop(), MemoryWindows: len(windows) > 0 && windows[0],
	}, conn.DialerOptions{QPsPerPeer: 1, Dial: peers.Get, HandshakeTimeout: 5 * time.Second},
		conn.AcceptorOptions{
			IdleTimeout: 200 * time.Millisecond, // a holder reaps a requester 200 ms after its last session
		})
	if serve {
		ho := holder.Options{Store: n.store, Acceptor: cs.acc, Metrics: n.m, Log: zerolog.Nop(),
			NodeID: id, Incarnation: id + "-inc"}
		if cs.acc.WindowsEnabled() {
			ho.Windows = cs.acc
		}
		if n.holder, err = holder.New(ho); err != nil {
			t.Fatal(err)
		}
		cs.acc.SetRequesterActivity(n.holder.Locks())
		n.conns = cs
		h := n.holder
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n.addr = ln.Addr().String()
		srv := grpc.NewServer()
		pegadv1.RegisterPeerServiceServer(srv, h)
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Stop(); <-done })
	}
	n.engine, err = requester.New(requester.Options{NodeID: id, Incarnation: id + "-inc", Store: n.store,
		Conns: cs.dial, Peers: peers.Get, Metrics: n.m, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.engine.Close() })
	return n
}

// TestFetchEveryNICOnItsNode: a 64-block fetch on a node with 8 NICs over
// 2 NUMA nodes uses all 8 NICs, none with more than 1.5x the bytes of
// another, and every READ lands in staging on the node of the NIC that
// carries it (the pool is split over both nodes and staging is spread
// over them).
func TestFetchEveryNICOnItsNode(t *testing.T) {
	root, numaOf := numaSysfs(t)
	log := &readLog{reads: map[string][]uint64{}}
	h := newNUMANode(t, "holder", root, true, nil)
	req := newNUMANode(t, "requester", root, false, log)
	if got := req.pool.Nodes(); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("requester pool parts on nodes %v, want [0 1]", got)
	}
	putAndFetch(t, h, req, 64, 256<<10)

	per := map[string]float64{}
	for name := range numaOf {
		per[name] = testutil.ToFloat64(req.m.NICReadBytes.WithLabelValues(name))
	}
	t.Logf("bytes per NIC: %v", per)
	var vals []float64
	for _, v := range per {
		vals = append(vals, v)
	}
	if lo, hi := slices.Min(vals), slices.Max(vals); lo == 0 || hi > 1.5*lo {
		t.Fatalf("bytes per NIC %v: want every NIC used, none above 1.5x another", per)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for name, addrs := range log.reads {
		for _, a := range addrs {
			if got := req.pool.NodeOf(a); got != numaOf[name] {
				t.Fatalf("a READ by %s (node %d) lands in staging on node %d", name, numaOf[name], got)
			}
		}
	}
}

// numaSysfs is a sysfs with pegadfake0-3 on node 0 and pegadfake4-7 on
// node 1, and that map.
func numaSysfs(t *testing.T) (root string, numaOf map[string]int) {
	t.Helper()
	root = t.TempDir()
	numaOf = map[string]int{}
	for i := range 8 {
		name := "pegadfake" + strconv.Itoa(i)
		numaOf[name] = i / 4
		dir := filepath.Join(root, name, "device")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(strconv.Itoa(i/4)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root, numaOf
}

// putAndFetch puts blocks random blocks of bs bytes on h and prefetches
// them to req: each must arrive byte for byte.
func putAndFetch(t *testing.T, h, req *numaNode, blocks, bs int) {
	t.Helper()
	r := rand.New(rand.NewPCG(3, 5))
	want := map[string][]byte{}
	var hashes [][]byte
	for i := range blocks {
		hash := fmt.Sprintf("numa-%02d", i)
		b := make([]byte, bs)
		for j := range b {
			b[j] = byte(r.Uint32())
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
		t.Fatal(err)
	}
	for _, b := range res.Blocks {
		if b.Status != requester.StatusFetched {
			t.Fatalf("%s: %v %v", b.Hash, b.Status, b.Err)
		}
		if !bytes.Equal(readStored(t, req.store, "ns", string(b.Hash)), want[string(b.Hash)]) {
			t.Fatalf("%s: fetched bytes differ", b.Hash)
		}
	}
}

// TestFetchThroughMemoryWindows: a holder with memory windows (its pool
// registered without remote read, so any READ with the pool rkey would
// fail) serves a 64-block fetch over 8 NICs through the windows of each
// lock window: every block arrives byte for byte, every NIC carries bytes,
// and no lock (nor its windows) is left.
func TestFetchThroughMemoryWindows(t *testing.T) {
	root, numaOf := numaSysfs(t)
	h := newNUMANode(t, "holder", root, true, nil, true)
	req := newNUMANode(t, "requester", root, false, nil)
	putAndFetch(t, h, req, 64, 256<<10)
	for name := range numaOf {
		if testutil.ToFloat64(req.m.NICReadBytes.WithLabelValues(name)) == 0 {
			t.Fatalf("%s carried no bytes", name)
		}
	}
	if n := h.holder.Locks().Len(); n != 0 {
		t.Fatalf("%d locks left on the holder", n)
	}

	// The holder reaps the idle requester's connection; the requester,
	// which has no keepalive here, still holds its side. The next lock is
	// refused (no connection to bind its windows on): the requester
	// handshakes again and asks once more. Before, that fetch failed.
	deadline := time.Now().Add(10 * time.Second)
	for holderConns(h) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the holder never reaped the idle requester's connection")
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := h.store.Put(store.Key{Namespace: "ns", Hash: "after-reap"}, []store.SlotSize{{KSize: 4096}},
		func(buf []byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
	res, err := req.engine.Prefetch(ctx, h.addr, "ns", [][]byte{[]byte("after-reap")})
	if err != nil || res.Blocks[0].Status != requester.StatusFetched {
		t.Fatalf("fetch after the holder reaped our connection: %v %+v", err, res)
	}
}

// holderConns counts the holder-side connections h accepted.
func holderConns(h *numaNode) int {
	n := 0
	for _, c := range h.conns.acc.List() {
		if c.Role == conn.RoleHolder {
			n++
		}
	}
	return n
}
