package conn

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// nodeOpts shape one test node.
type nodeOpts struct {
	id          string
	incarnation string
	nics        int
	qps         int
	qpnStart    uint32
	mem         int
	sqDepth     int
	// disconnectTimeout is Options.DisconnectTimeout (0: the default).
	disconnectTimeout time.Duration
	// idleTimeout and reconnectDrain are Options.IdleTimeout and
	// Options.ReconnectDrain (0: the defaults).
	idleTimeout, reconnectDrain time.Duration
	// wrapDevice lets a test inject failures into the verbs calls.
	wrapDevice func(ibv.Device) ibv.Device
	// noRelaxedOrdering is Options.NoRelaxedOrdering.
	noRelaxedOrdering bool
	// probeInterval is Options.ProbeInterval (0: no keepalive).
	probeInterval time.Duration
	// connectAttr replaces testConnectAttr() when set.
	connectAttr *ibv.ConnectAttr
	// sliceBytes is Options.SliceBytes (0: the default).
	sliceBytes uint64
	// log is Options.Log (nil: none).
	log *zerolog.Logger
}

// node is one in-process pegad as far as conn is concerned: tcp devices,
// an mmap'd pool, a NIC set with a Dialer and an Acceptor over it, and a
// gRPC peer server whose RdmaHandshake calls the Acceptor's Accept.
type node struct {
	id   string
	prov *tcp.Provider
	devs []*tcp.Device
	mem  []byte
	met  *metrics.Metrics
	nics *NICs
	dial *Dialer
	acc  *Acceptor
	addr string // peer gRPC address

	handshakes  atomic.Int32 // RdmaHandshake calls served
	disconnects atomic.Int32 // RdmaDisconnect calls served
	// stallDisconnect makes RdmaDisconnect hang until its caller gives up
	// (a holder that is alive on TCP but no longer answers).
	stallDisconnect atomic.Bool
	srv             *grpc.Server
	// abandoned: a test found a worker that never exits; the cleanup
	// must not close the node (Close waits for every worker, so it
	// would hang the package until go test's timeout, hiding the failure
	// message). goleak then reports the stuck goroutine.
	abandoned atomic.Bool
	// reply, when set, replaces Accept (a misbehaving peer).
	reply atomic.Pointer[func(*pegadv1.RdmaHandshakeRequest) (*pegadv1.RdmaHandshakeResponse, error)]
}

type peerServer struct {
	pegadv1.UnimplementedPeerServiceServer
	n *node
}

func (s *peerServer) RdmaHandshake(ctx context.Context, req *pegadv1.RdmaHandshakeRequest) (*pegadv1.RdmaHandshakeResponse, error) {
	s.n.handshakes.Add(1)
	if f := s.n.reply.Load(); f != nil {
		return (*f)(req)
	}
	// As the holder's RPC layer does: status errors pass through.
	resp, err := s.n.acc.Accept(ctx, req)
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return nil, err
	}
	return resp, nil
}

func (s *peerServer) RdmaDisconnect(ctx context.Context, req *pegadv1.RdmaDisconnectRequest) (*pegadv1.RdmaDisconnectResponse, error) {
	s.n.disconnects.Add(1)
	if s.n.stallDisconnect.Load() {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return s.n.acc.Disconnect(ctx, req)
}

// dialers share gRPC client connections per test and close them at cleanup.
type dialers struct {
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

func newDialers(t testing.TB) *dialers {
	d := &dialers{conns: make(map[string]*grpc.ClientConn)}
	t.Cleanup(func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, c := range d.conns {
			c.Close()
		}
	})
	return d
}

func (d *dialers) dial(peer string) (pegadv1.PeerServiceClient, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.conns[peer]
	if c == nil {
		var err error
		c, err = grpc.NewClient(peer, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		d.conns[peer] = c
	}
	return pegadv1.NewPeerServiceClient(c), nil
}

func mapMemory(t testing.TB, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

func newNode(t testing.TB, d *dialers, o nodeOpts) *node {
	t.Helper()
	if o.nics == 0 {
		o.nics = 1
	}
	if o.qps == 0 {
		o.qps = 1
	}
	if o.mem == 0 {
		o.mem = 4 << 20
	}
	if o.incarnation == "" {
		o.incarnation = "inc-1"
	}
	n := &node{id: o.id, met: metricstest.New()}
	n.mem = mapMemory(t, o.mem) // unmapped last (cleanups run LIFO)
	var dos []tcp.DeviceOptions
	for i := 0; i < o.nics; i++ {
		dos = append(dos, tcp.DeviceOptions{ListenAddr: "127.0.0.1:0", QPNStart: o.qpnStart, NUMANode: i})
	}
	prov, err := tcp.NewProvider(dos...)
	if err != nil {
		t.Fatalf("tcp provider: %v", err)
	}
	n.prov = prov
	t.Cleanup(func() { prov.Close() })
	infos, _ := prov.Devices()
	var devs []ibv.Device
	for _, info := range infos {
		dev, err := prov.Open(info.Name)
		if err != nil {
			t.Fatalf("open %s: %v", info.Name, err)
		}
		n.devs = append(n.devs, dev.(*tcp.Device))
		if o.wrapDevice != nil {
			dev = o.wrapDevice(dev)
		}
		devs = append(devs, dev)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.addr = ln.Addr().String()
	srv := grpc.NewServer()
	n.srv = srv
	pegadv1.RegisterPeerServiceServer(srv, &peerServer{n: n})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	log := zerolog.Nop()
	if o.log != nil {
		log = *o.log
	}
	attr := testConnectAttr()
	if o.connectAttr != nil {
		attr = *o.connectAttr
	}
	var so stackOptions
	so.NICOptions = NICOptions{
		NodeID: o.id, Incarnation: o.incarnation, Transport: "tcp", Devices: devs,
		Memory: n.mem, SQDepth: o.sqDepth, Metrics: n.met, Log: log,
		ConnectAttr:       attr,
		NoRelaxedOrdering: o.noRelaxedOrdering,
	}
	so.DialerOptions = DialerOptions{
		QPsPerPeer: o.qps, Dial: d.dial, HandshakeTimeout: 5 * time.Second,
		DisconnectTimeout: o.disconnectTimeout,
		SliceBytes:        o.sliceBytes,
		ProbeInterval:     o.probeInterval,
	}
	so.AcceptorOptions = AcceptorOptions{IdleTimeout: o.idleTimeout, ReconnectDrain: o.reconnectDrain}
	st, err := openStack(so)
	if err != nil {
		t.Fatalf("openStack: %v", err)
	}
	n.nics, n.dial, n.acc = st.nics, st.dial, st.acc
	t.Cleanup(func() {
		if !n.abandoned.Load() {
			_ = n.close()
		}
	})
	return n
}

// stackOptions are one node's conn options: its NIC set's and both
// halves' (their fields do not overlap, so each is promoted).
type stackOptions struct {
	NICOptions
	DialerOptions
	AcceptorOptions
}

// stack is one node's conn as the daemon wires it: a NIC set and both
// halves over it.
type stack struct {
	nics *NICs
	dial *Dialer
	acc  *Acceptor
}

// openStack makes the NIC set and both halves (Keepalive follows
// ProbeInterval, as in the daemon); on error nothing is left open.
func openStack(o stackOptions) (*stack, error) {
	o.Keepalive = o.Keepalive || o.ProbeInterval > 0
	nics, err := NewNICs(o.NICOptions)
	if err != nil {
		return nil, err
	}
	st := &stack{nics: nics}
	if st.dial, err = NewDialer(nics, o.DialerOptions); err == nil {
		st.acc, err = NewAcceptor(nics, o.AcceptorOptions)
	}
	if err != nil {
		_ = st.close()
		return nil, err
	}
	return st, nil
}

// close closes the halves, then the NIC set (the daemon's order).
func (st *stack) close() error {
	var errs []error
	if st.dial != nil {
		errs = append(errs, st.dial.Close())
	}
	if st.acc != nil {
		errs = append(errs, st.acc.Close())
	}
	errs = append(errs, st.nics.Close())
	return errors.Join(errs...)
}

// list is both halves' rows, as pegactl lists them.
func (st *stack) list() []ConnInfo { return Listing{Dialer: st.dial, Acceptor: st.acc}.List() }

func (n *node) stack() *stack { return &stack{nics: n.nics, dial: n.dial, acc: n.acc} }

// close closes n's halves and NIC set.
func (n *node) close() error { return n.stack().close() }

// list is both halves' rows of n.
func (n *node) list() []ConnInfo { return n.stack().list() }

// abandon gives up on closing n at cleanup; see node.abandoned.
func (n *node) abandon() { n.abandoned.Store(true) }

// sumOf adds up every series of a counter or gauge vector.
func sumOf(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 16)
	go func() { c.Collect(ch); close(ch) }()
	var sum float64
	for m := range ch {
		sum += metrics.Value(m)
	}
	return sum
}

func (n *node) base() uint64 { return n.nics.memBase }

func (n *node) fillRandom(seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(n.mem); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			n.mem[i+j] = byte(v >> (8 * j))
		}
	}
}

// checkQPs asserts the live QP count, by QPs() and by the gauge.
func (n *node) checkQPs(t *testing.T, want int) {
	t.Helper()
	if got := n.nics.QPs(); got != want {
		t.Errorf("%s: QPs() = %d, want %d", n.id, got, want)
	}
	if got := testutil.ToFloat64(n.met.RDMAQPs); int(got) != want {
		t.Errorf("%s: pegaflow_rdma_qps = %v, want %d", n.id, got, want)
	}
}

func (n *node) workers() int { return int(testutil.ToFloat64(n.met.SessionWorkers)) }

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !eventually(5*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// eventually polls cond for up to d and reports whether it held.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// faultyDevice wraps a device whose PD fails CreateQP on the calls that
// failQP says so.
type faultyDevice struct {
	ibv.Device
	failQP func(call int) bool
	calls  *atomic.Int32
}

func (d faultyDevice) AllocPD() (ibv.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return faultyPD{PD: pd, d: d}, nil
}

type faultyPD struct {
	ibv.PD
	d faultyDevice
}

var errInjected = errors.New("injected create qp failure")

func (p faultyPD) CreateQP(cq ibv.CQ, c ibv.QPCap) (ibv.QP, error) {
	if p.d.failQP(int(p.d.calls.Add(1))) {
		return nil, errInjected
	}
	return p.PD.CreateQP(cq, c)
}

// testConnectAttr widens the retry budget to ~4 s (timeout exponent 17):
// this 2-core machine runs other packages' tests at the same time, and
// the default ~0.5 s budget can expire spuriously under that load.
func testConnectAttr() ibv.ConnectAttr {
	a := ibv.DefaultConnectAttr()
	a.Timeout = 17
	return a
}

// holdRef takes a reference on c (a connection of n's dialer) as an
// in-flight Read would, so that c outlives its invalidation. The returned
// release is idempotent and also runs at cleanup (before the nodes
// close), even on failure, unless n was abandoned: with a stuck worker the
// last release would wait for it forever.
func holdRef(t *testing.T, n *node, c *AddrConnection) (release func()) {
	t.Helper()
	if err := c.acquire(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(c.release) }
	t.Cleanup(func() {
		if !n.abandoned.Load() {
			release()
		}
	})
	return release
}
