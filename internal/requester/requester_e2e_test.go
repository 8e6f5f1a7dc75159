package requester_test

// End to end over the real stack: two in-process nodes, each with a real
// pool, store and conn (NIC set, Dialer, Acceptor) over the tcp provider; the holder serves
// internal/holder on a real gRPC server on 127.0.0.1:0, and the requester
// reaches it through internal/peer clients.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
	"github.com/pegaflow/pegad/internal/lease"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/peer"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
)

const mib = 1 << 20

type e2eNode struct {
	id     string
	devs   []*tcp.Device // the tcp provider's devices (faults are set on them)
	pool   *pool.Pool
	store  *store.Store
	m      *metrics.Metrics
	conns  *e2eConns
	peers  *peer.Clients
	holder *holder.Service
	addr   string // peer gRPC address (holder nodes)
	engine *requester.Engine
}

// newE2ENode starts a node; serve makes it a holder on 127.0.0.1:0.
func newE2ENode(t *testing.T, id string, poolSize uint64, serve bool, lockTimeout time.Duration) *e2eNode {
	t.Helper()
	return startE2ENode(t, e2eOptions{id: id, poolSize: poolSize, serve: serve, lockTimeout: lockTimeout})
}

// e2eOptions configure startE2ENode.
type e2eOptions struct {
	id          string
	incarnation string // "" = id+"-inc"
	poolSize    uint64
	serve       bool          // a holder on 127.0.0.1:0, with its lock sweeper
	lockTimeout time.Duration // the holder's (0 = its default)
	// faults is the engine's fault hook (Engine.SetFaultHook).
	faults func(ctx context.Context, reqID, phase string)
	// intercept, when set, runs on the holder's gRPC server after recovery.
	intercept grpc.UnaryServerInterceptor
}

// e2eConnectAttr: the tcp provider's responder is a goroutine that a loaded
// 2-core host under -race can leave unscheduled past the verbs default
// 0.5 s retry budget; the daemon uses the same exponent for tcp (~4 s).
func e2eConnectAttr() ibv.ConnectAttr {
	a := ibv.DefaultConnectAttr()
	a.Timeout = 17
	return a
}

func startE2ENode(t *testing.T, o e2eOptions) *e2eNode {
	t.Helper()
	id, inc := o.id, o.incarnation
	if inc == "" {
		inc = id + "-inc"
	}
	n := &e2eNode{id: id, m: metricstest.New()}
	var err error
	n.pool, err = pool.New(pool.Options{Size: o.poolSize, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.pool.Close() }) // last: cleanups run LIFO
	n.store = store.New(n.pool, n.m)

	prov, err := tcp.NewProvider(tcp.DeviceOptions{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prov.Close() })
	infos, err := prov.Devices()
	if err != nil {
		t.Fatal(err)
	}
	var devs []ibv.Device
	for _, info := range infos {
		d, err := prov.Open(info.Name)
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, d)
		n.devs = append(n.devs, d.(*tcp.Device))
	}
	n.peers = peer.NewClientsWithOptions(grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 * mib)))
	t.Cleanup(func() { _ = n.peers.Close() })
	n.conns = openConns(t, conn.NICOptions{
		NodeID: id, Incarnation: inc, Transport: "tcp", Devices: devs,
		Memory: n.pool.Bytes(), Metrics: n.m, Log: zerolog.Nop(),
		ConnectAttr: e2eConnectAttr(),
	}, conn.DialerOptions{QPsPerPeer: 2, Dial: n.peers.Get, HandshakeTimeout: 5 * time.Second}, conn.AcceptorOptions{})

	if o.serve {
		n.holder, err = holder.New(holder.Options{
			Store: n.store, Acceptor: n.conns.acc, Metrics: n.m, Log: zerolog.Nop(),
			NodeID: id, Incarnation: inc, LockTimeout: o.lockTimeout,
		})
		if err != nil {
			t.Fatal(err)
		}
		// The lock sweeper, as the daemon runs it: a lock that lapses ends
		// (and is counted in pegaflow_transfer_lock_timeouts_total).
		gcCtx, gcStop := context.WithCancel(context.Background())
		gcDone := make(chan struct{})
		go func() { defer close(gcDone); lease.Sweep(gcCtx, 20*time.Millisecond, n.holder.Locks(), nil) }()
		t.Cleanup(func() { gcStop(); <-gcDone })
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n.addr = ln.Addr().String()
		ics := []grpc.UnaryServerInterceptor{holder.RecoveryInterceptor(zerolog.Nop())}
		if o.intercept != nil {
			ics = append(ics, o.intercept)
		}
		srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ics...))
		pegadv1.RegisterPeerServiceServer(srv, n.holder)
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Stop(); <-done })
	}

	n.engine, err = requester.New(requester.Options{
		NodeID: id, Incarnation: inc, Store: n.store, Conns: n.conns.dial,
		Peers: n.peers.Get, Metrics: n.m, Log: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if o.faults != nil {
		n.engine.SetFaultHook(o.faults)
	}
	t.Cleanup(func() { _ = n.engine.Close() })
	return n
}

// putRandom stores a block of the given shape with random bytes and
// returns its bytes in slot order (K0, V0, K1, ...).
func putRandom(t *testing.T, n *e2eNode, r *rand.Rand, ns, hash string, sizes []store.SlotSize) []byte {
	t.Helper()
	var total uint64
	for _, s := range sizes {
		total += s.KSize + s.VSize
	}
	want := make([]byte, total)
	var seed [32]byte
	for i := range seed {
		seed[i] = byte(r.Uint32())
	}
	_, _ = rand.NewChaCha8(seed).Read(want)
	created, err := n.store.Put(store.Key{Namespace: ns, Hash: hash}, sizes, func(buf []byte) error {
		copy(buf, want)
		return nil
	})
	if err != nil || !created {
		t.Fatalf("put %s: created %v err %v", hash, created, err)
	}
	return want
}

func readBlock(t *testing.T, n *e2eNode, ns, hash string) []byte {
	t.Helper()
	return readStored(t, n.store, ns, hash)
}

// readStored returns the bytes of the block st indexes under (ns, hash).
func readStored(t *testing.T, st *store.Store, ns, hash string) []byte {
	t.Helper()
	got := make([]byte, 0, 1<<20)
	if _, err := st.Read(store.Key{Namespace: ns, Hash: hash}, func(c []byte) error {
		got = append(got, c...)
		return nil
	}); err != nil {
		t.Fatalf("read %s: %v", hash, err)
	}
	return got
}

func counterValue(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	go func() { c.Collect(ch); close(ch) }()
	var sum float64
	for m := range ch {
		var d dto.Metric
		_ = m.Write(&d)
		sum += d.GetCounter().GetValue() + d.GetGauge().GetValue()
	}
	return sum
}

func holderRPC(n *e2eNode, rpc, code string) float64 {
	return counterValue(n.m.HolderRPC.WithLabelValues(rpc, code))
}

// checkHolderClean: no session left, and every lock taken was released.
func checkHolderClean(t *testing.T, h *e2eNode) {
	t.Helper()
	if n := h.holder.Locks().Len(); n != 0 {
		t.Errorf("holder has %d sessions left", n)
	}
	q := holderRPC(h, metrics.RPCQueryBlocks, "OK")
	r := holderRPC(h, metrics.RPCReleaseLock, "OK")
	if q != r || q == 0 {
		t.Errorf("holder query ok %v, release ok %v: want equal and non-zero", q, r)
	}
}

func TestE2EByteIdentical(t *testing.T) {
	h := newE2ENode(t, "holder", 256*mib, true, 0)
	req := newE2ENode(t, "requester", 256*mib, false, 0)
	r := rand.New(rand.NewPCG(7, 11))

	shapes := [][]store.SlotSize{
		{{KSize: 1024}},                    // 1 KiB contiguous
		{{KSize: 512, VSize: 512}},         // 1 KiB K/V
		{{KSize: 4093, VSize: 4099}},       // odd sizes
		{{KSize: 64 * mib}},                // 64 MiB contiguous
		{{KSize: 8 * mib, VSize: 8 * mib}}, // 16 MiB K/V
		{{KSize: mib, VSize: mib}, {KSize: mib, VSize: mib}, {KSize: mib, VSize: mib}, {KSize: mib, VSize: mib}},
	}
	for range 20 {
		var s []store.SlotSize
		for range 1 + r.IntN(4) {
			k := uint64(1024 + r.IntN(512*1024))
			v := uint64(0)
			if r.IntN(2) == 0 {
				v = uint64(1024 + r.IntN(512*1024))
			}
			s = append(s, store.SlotSize{KSize: k, VSize: v})
		}
		shapes = append(shapes, s)
	}
	want := map[string][]byte{}
	var hashes [][]byte
	for i, s := range shapes {
		hash := fmt.Sprintf("blk-%03d", i)
		want[hash] = putRandom(t, h, r, "ns", hash, s)
		hashes = append(hashes, []byte(hash))
	}
	hashes = append(hashes, []byte("not-there"))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := req.engine.Prefetch(ctx, h.addr, "ns", hashes)
	if err != nil {
		t.Fatal(err)
	}
	var total uint64
	for _, b := range res.Blocks {
		wb, ok := want[string(b.Hash)]
		if !ok {
			if b.Status != requester.StatusMissingOnPeer {
				t.Errorf("%s: %v, want missing", b.Hash, b.Status)
			}
			continue
		}
		if b.Status != requester.StatusFetched {
			t.Fatalf("%s: %v %v", b.Hash, b.Status, b.Err)
		}
		total += uint64(len(wb))
		if got := readBlock(t, req, "ns", string(b.Hash)); !bytes.Equal(got, wb) {
			t.Fatalf("%s: fetched bytes differ from the holder's (%d vs %d bytes)", b.Hash, len(got), len(wb))
		}
	}
	if res.Bytes != total {
		t.Errorf("result bytes %d, want %d", res.Bytes, total)
	}
	checkHolderClean(t, h)
	t.Logf("fetched %d blocks, %d bytes in %v", len(want), total, res.Duration)

	// Fetched again: already local, holder untouched.
	res, err = req.engine.Prefetch(ctx, h.addr, "ns", hashes[:3])
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range res.Blocks {
		if b.Status != requester.StatusAlreadyLocal {
			t.Errorf("%s: %v, want already local", b.Hash, b.Status)
		}
	}
}

// TestE2ESmallPool: docs/lessons.md L5, a prefetch into a 16 MiB pool.
func TestE2ESmallPool(t *testing.T) {
	h := newE2ENode(t, "holder", 64*mib, true, 0)
	req := newE2ENode(t, "requester", 16*mib, false, 0)
	r := rand.New(rand.NewPCG(3, 5))
	want := map[string][]byte{}
	var hashes [][]byte
	for i := range 6 {
		hash := fmt.Sprintf("small-%d", i)
		want[hash] = putRandom(t, h, r, "ns", hash, []store.SlotSize{{KSize: mib, VSize: mib}})
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
		if !bytes.Equal(readBlock(t, req, "ns", string(b.Hash)), want[string(b.Hash)]) {
			t.Fatalf("%s: bytes differ", b.Hash)
		}
	}
	checkHolderClean(t, h)
}

// TestE2ELocalNoSpaceKeepsConnection: docs/lessons.md L7 over the real stack. A
// fetch that does not fit the requester's pool fails as a local error and
// the connection survives for the next fetch.
func TestE2ELocalNoSpaceKeepsConnection(t *testing.T) {
	h := newE2ENode(t, "holder", 64*mib, true, 0)
	req := newE2ENode(t, "requester", 16*mib, false, 0)
	r := rand.New(rand.NewPCG(1, 2))
	putRandom(t, h, r, "ns", "huge", []store.SlotSize{{KSize: 24 * mib}})
	small := putRandom(t, h, r, "ns", "fits", []store.SlotSize{{KSize: mib}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := req.engine.Prefetch(ctx, h.addr, "ns", [][]byte{[]byte("fits")}); err != nil {
		t.Fatal(err)
	}
	handshakes := counterValue(req.m.Handshakes)
	if _, err := req.engine.Prefetch(ctx, h.addr, "ns", [][]byte{[]byte("huge")}); !errors.Is(err, requester.ErrLocalResource) {
		t.Fatalf("err = %v, want ErrLocalResource", err)
	}
	if got := counterValue(req.m.Invalidations); got != 0 {
		t.Errorf("invalidations = %v after a local error", got)
	}
	if got := counterValue(req.m.Handshakes); got != handshakes {
		t.Errorf("handshakes %v -> %v: the connection was re-established", handshakes, got)
	}
	if !bytes.Equal(readBlock(t, req, "ns", "fits"), small) {
		t.Fatal("bytes differ")
	}
	checkHolderClean(t, h)
}

// TestE2ECancelStorm: fetches cancelled at random points leave no lock on
// the holder, and a clean fetch afterwards succeeds.
func TestE2ECancelStorm(t *testing.T) {
	h := newE2ENode(t, "holder", 64*mib, true, 0)
	req := newE2ENode(t, "requester", 64*mib, false, 0)
	r := rand.New(rand.NewPCG(9, 9))
	var hashes [][]byte
	for i := range 8 {
		hash := fmt.Sprintf("c-%d", i)
		putRandom(t, h, r, "ns", hash, []store.SlotSize{{KSize: mib, VSize: mib}})
		hashes = append(hashes, []byte(hash))
	}
	for i := range 60 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(3000))*time.Microsecond)
		_, _ = req.engine.Prefetch(ctx, h.addr, "ns", hashes[i%8:i%8+1])
		cancel()
		// Drop what got indexed so later rounds fetch again.
		for _, hh := range hashes {
			_, _ = req.store.Delete(store.Key{Namespace: "ns", Hash: string(hh)})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	for range 3 { // a connection broken by a cancelled read is re-made
		if _, err = req.engine.Prefetch(ctx, h.addr, "ns", hashes); err == nil || !errors.Is(err, requester.ErrConnection) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	checkHolderClean(t, h)
	t.Logf("guard aborts %v, fetch totals %v", counterValue(req.m.GuardAborts), counterValue(req.m.FetchTotal))
}
