// Package conn owns pegad's RDMA connections to peers: one AddrConnection
// per peer address (requester side) and one accepted connection per
// requester (holder side), each owning its per-NIC state (queue pairs, the
// remote memory snapshot from its handshake, a round-robin counter) and the
// session workers that drive its QPs.
//
// There is no map keyed by QPN anywhere: QPNs are unique only within one
// remote HCA. Invalidating a connection is one atomic removal from the
// manager's map; work in flight keeps its QPs until it finishes.
//
// The package must never know about blocks, transfer sessions (locks) or
// the pool's allocator: it moves bytes between registered memory ranges it
// is given, and nothing else.
//
// Ownership at a glance:
//   - Manager owns the per-NIC protection domains and memory registrations
//     (one MR of Options.Memory per NIC, registered in NewManager) and the
//     two connection maps.
//   - AddrConnection (requester side) owns its QPs, one CQ per QP, and one
//     session worker goroutine per QP. Workers stop when the connection is
//     invalidated (its done channel closes); QPs and CQs are destroyed once
//     the last in-flight Read has returned; then a best-effort
//     RdmaDisconnect goroutine (tracked, bounded by DisconnectTimeout)
//     tells the holder to free its side.
//   - acceptedConn (holder side) owns its QPs and CQs; it runs no worker,
//     since a holder posts nothing (READs are one-sided).
package conn

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/logging"
	"github.com/pegaflow/pegad/internal/metrics"
)

// Error classes of the data path; callers branch with errors.Is.
var (
	// ErrConnectionBroken: the connection cannot carry more work (QP in
	// ERROR, peer dead, handshake failed). Only this class invalidates.
	ErrConnectionBroken = errors.New("conn: connection broken")
	// ErrSessionInvalidated: the QP's session was dropped before the batch
	// ran ("session invalidated before batch execution"). Connection class.
	ErrSessionInvalidated = errors.New("session invalidated before batch execution")
	// ErrRemoteMemory: an address is outside the peer's handshake snapshot.
	ErrRemoteMemory = errors.New("conn: remote memory not found in handshake snapshot")
	// ErrPeerRestarted: the peer answers with another incarnation than the
	// one this connection handshook with; its QPs and memory snapshot are
	// gone. Connection class: the caller invalidates and reconnects.
	ErrPeerRestarted = errors.New("conn: peer restarted since handshake")
	// ErrHandshakeRejected: the peer refused the handshake (retryable).
	ErrHandshakeRejected = errors.New("conn: handshake rejected")
	// ErrClosed: the manager is shut down.
	ErrClosed = errors.New("conn: manager closed")
	// ErrInvalidHandshake: handshake metadata is malformed (a request in
	// Accept, or a response in Get). The holder's RPC layer maps it to
	// codes.InvalidArgument. It is not connection class on the holder.
	ErrInvalidHandshake = errors.New("conn: invalid handshake")
	// ErrInvalidOp: a ReadOp is malformed (zero length, local range outside
	// Options.Memory). A caller bug or local error: never invalidates.
	ErrInvalidOp = errors.New("conn: invalid read op")
	// ErrNoActiveNIC: every local NIC's port is down, so no handshake can
	// build a QP that would carry a READ (wrapped in ErrConnectionBroken).
	ErrNoActiveNIC = errors.New("conn: no local NIC has an active port")
	// ErrRailDown: a READ failed because the port of the NIC it went
	// through is down (found by querying the port, as the failure can come
	// before the port's event). Like a flush it says nothing of the other
	// rails or the peer: a fresh connection, without that NIC, can carry
	// the READ again. Wraps the work completion's error.
	ErrRailDown = errors.New("conn: the NIC's port went down under the read")
)

// IsConnectionClass reports whether err means the connection it came from
// must be invalidated (and a new handshake made before more work).
func IsConnectionClass(err error) bool {
	return errors.Is(err, ErrConnectionBroken) || errors.Is(err, ErrSessionInvalidated) ||
		errors.Is(err, ErrPeerRestarted)
}

// Dialer returns a peer-service client for a peer address.
type Dialer func(peer string) (pegadv1.PeerServiceClient, error)

// Options configure a Manager.
type Options struct {
	NodeID      string
	Incarnation string
	// Advertise is this node's advertised peer address, sent in handshakes
	// so that holders can name it (conns list); informational.
	Advertise string
	Transport string       // provider name, sent in handshakes
	Devices   []ibv.Device // opened NICs, in order
	// Memory is the local pool, registered on every NIC.
	Memory     []byte
	QPsPerPeer int
	SQDepth    int // send queue depth per QP (default 256)
	Dial       Dialer
	Metrics    *metrics.Metrics
	Log        zerolog.Logger
	// HandshakeTimeout bounds one handshake (default 10s).
	HandshakeTimeout time.Duration
	// DisconnectTimeout bounds one best-effort RdmaDisconnect sent to a
	// holder when a connection to it is torn down (default 2s); Close
	// waits at most about this long for them.
	DisconnectTimeout time.Duration
	// ConnectAttr are the RC attributes of every QP; the zero value means
	// ibv.DefaultConnectAttr() (max_rd_atomic is further capped by the
	// device). Its Timeout/RetryCnt set the retry budget after which a
	// silent peer fails READs with RETRY_EXC_ERR: about 0.5 s by default,
	// which a loaded host running the tcp provider may exceed spuriously.
	ConnectAttr ibv.ConnectAttr
	// IdleTimeout (holder side): an accepted connection whose data
	// connections (once opened) have all been closed for this long is torn
	// down, its requester being gone (default 60s). Only providers that
	// see their data connections (tcp) report that; see activityReporter.
	// Others (verbs) are torn down once their requester has held no
	// transfer session for this long (SetRequesterActivity).
	IdleTimeout time.Duration
	// ReconnectDrain (holder side) bounds how long the previous accepted
	// connection of a requester that handshook again keeps serving the
	// READs in flight on it (default 30s); its requester's disconnect
	// usually ends it sooner.
	ReconnectDrain time.Duration
	// NoRelaxedOrdering registers the pool without
	// IBV_ACCESS_RELAXED_ORDERING (on by default: READ responses land
	// faster on AMD, Grace and PCIe-switch hosts; libibverbs drops it where
	// unsupported).
	NoRelaxedOrdering bool
	// Rails names the rail of each device (same order as Devices; nil:
	// none named). Handshakes carry them and NICs pair by rail first.
	Rails []string
	// Placement says which NUMA node each part of Memory is on (the
	// pool); nil: unknown. When Memory has a part on the node of every NIC
	// and the NICs are on two or more nodes, a READ is carried by a NIC on
	// its local memory's node and StagingPlan spreads staging over the
	// nodes; otherwise READs spread over all NICs.
	Placement Placement
	// ProbeInterval (requester side): a connection no Read has used for
	// this long gets one small keepalive READ per NIC, and again every
	// interval while idle. A dead holder fails it within the QP's retry
	// budget (ConnectAttr), which invalidates the connection: it stops
	// being listed as connected. 0: no keepalive (a dead holder is then
	// noticed by the next fetch).
	ProbeInterval time.Duration
	// MemoryWindows (holder side): register the pool without remote read
	// and serve each transfer lock through type-2 memory windows over its
	// blocks (BindWindows). A device without them turns it off, with a
	// warning: then the pool's rkey serves every READ.
	MemoryWindows bool
	// SliceBytes splits a READ larger than it into slices, each placed on
	// its own NIC and QP (as Mooncake slices a transfer), so that one
	// large segment does not ride one NIC (default 1 MiB: large enough for
	// line rate per WR, small enough that an 8 MiB segment spreads over 8).
	SliceBytes uint64
	// Reopen opens Devices[i] again after it reported
	// IBV_EVENT_DEVICE_FATAL (the provider's Open of the name it was
	// opened with); nil: a fatal device stays out of placement until
	// restart.
	Reopen func(i int) (ibv.Device, error)
}

// Placement is where local memory is, by NUMA node (*pool.Pool).
type Placement interface {
	// NodeOf is the node of the memory at a virtual address, -1 unknown.
	NodeOf(addr uint64) int
	// Nodes are the nodes the memory is on.
	Nodes() []int
}

const (
	defaultSQDepth           = 256
	defaultHandshakeTimeout  = 10 * time.Second
	defaultDisconnectTimeout = 2 * time.Second
	// maxQPsPerPeer bounds what a handshake may ask a holder to create.
	maxQPsPerPeer = limits.MaxQPsPerPeer
	// defaultSliceBytes: Options.SliceBytes.
	defaultSliceBytes = 1 << 20
	// drainTimeout bounds waiting for a QP in ERROR to flush; past it the
	// QP is destroyed, which guarantees no WR touches memory afterwards.
	drainTimeout = 30 * time.Second
	// invalidLogEvery: at most one "rejected malformed rdma handshake"
	// line per this, after the first (Manager.invalidLog).
	invalidLogEvery = 10 * time.Second
)

// ReadOp is one RDMA READ: Len bytes from the peer's RemoteAddr into local
// pool memory at LocalAddr (a virtual address inside Options.Memory).
type ReadOp struct {
	LocalAddr  uint64
	RemoteAddr uint64
	Len        uint64
	// NUMA of the remote segment (used to prefer a NIC); -1 unknown.
	NUMA int
	// Grant: the memory windows of the lock that covers RemoteAddr (nil:
	// the holder serves it through its pool rkey). READs then go on the
	// NICs and QPs the grant names, with its keys.
	Grant *Grant
}

// localNode is the NUMA node of local memory at addr when READs are placed
// by it (Manager.placed), else -1.
func (m *Manager) localNode(addr uint64) int {
	if !m.placed {
		return -1
	}
	return m.opts.Placement.NodeOf(addr)
}

// ConnInfo is a row of `pegactl conns list`.
type ConnInfo struct {
	Peer         string
	RemoteNodeID string
	// RemoteAdvertise: holder rows, the requester's advertised address.
	RemoteAdvertise string
	Role            string // "requester" or "holder"
	State           string // "connecting", "connected", "invalidated"
	NICs            []NICInfo
	QPs             int
	Since           time.Time
}

// NICInfo is per-NIC detail of a connection.
type NICInfo struct {
	Name      string
	QPs       int
	LocalQPNs []uint32
}

// Roles and states, as labels of the Conns gauge and in ConnInfo.
const (
	RoleRequester     = "requester"
	RoleHolder        = "holder"
	StateConnecting   = "connecting"
	StateConnected    = "connected"
	StateInvalidated  = "invalidated"
	resultOK          = "ok"
	resultError       = "error"
	resultInvalid     = "invalid"
	resultRejected    = "rejected"
	resultUnreachable = "unreachable"
)

// localNIC is one opened device with the pool registered on it.
type localNIC struct {
	dev  ibv.Device
	info ibv.DeviceInfo
	pos  int // in Options.Devices
	// ownDev: the manager opened dev (a reopen after DEVICE_FATAL) and
	// closes it; the caller's devices are the caller's to close.
	ownDev bool
	// fatal: the device reported DEVICE_FATAL; it is out of placement for
	// good and retired once its QPs and windows are gone (fatal.go).
	fatal atomic.Bool
	// users counts the QPs and memory windows made on it: the NIC's PD,
	// MR and device are released only once none is left.
	users atomic.Int64
	// life is held shared while a QP or window is made on the NIC
	// (acquireUse), exclusively while it is released: a release never
	// pulls the PD from under one being made.
	life sync.RWMutex
	// released: releaseNIC has run (under life).
	released atomic.Bool
	rail     string // Options.Rails; "" when not named
	pd       ibv.PD
	mr       ibv.MR
	// probeMR: Manager.probeMem registered here (keepalive READs land in
	// it); nil when probing is off.
	probeMR ibv.MR
	// probeTargetMR: Manager.probeTarget registered here for remote read
	// (peers' keepalives); nil without memory windows.
	probeTargetMR ibv.MR
	// readBytes is this NIC's series of NICReadBytes, looked up once: the
	// planner adds to it per work request.
	readBytes prometheus.Counter
	// subnet is what handshakes name for this NIC (nicSubnet of the
	// device as last resolved): set at registration, refreshed by the
	// device's address and port-up events, since info's GID goes stale
	// when an address is removed and re-added. nil: nicSubnet(info).
	subnet atomic.Pointer[string]
	// down: the port left ACTIVE (a PortDown event) and has not come back;
	// handshakes leave the NIC out and the holder pairs no requester NIC
	// with it (rail.go).
	down atomic.Bool
	// up is this NIC's series of NICUp, looked up once.
	up prometheus.Gauge
	// windows is this NIC's series of MemoryWindows, looked up once.
	windows prometheus.Gauge

	// holdMu guards holdCQ: the one CQ of every holder-side QP on this
	// NIC, one per NIC, not one per QP. A holder posts nothing but window
	// binds (windows.go), so without memory windows nothing completes on
	// it and nobody polls it. Created by the first Accept, closed by
	// releaseNICs once every QP is gone.
	holdMu sync.Mutex
	holdCQ ibv.CQ
	// win routes the bind completions of holdCQ (memory windows only).
	win windowWaiters
}

// holderCQ returns the NIC's shared holder-side CQ, creating it with
// depth entries.
func (n *localNIC) holderCQ(depth int) (ibv.CQ, error) {
	n.holdMu.Lock()
	defer n.holdMu.Unlock()
	if n.holdCQ == nil {
		cq, err := n.dev.CreateCQ(depth)
		if err != nil {
			return nil, err
		}
		n.holdCQ = cq
	}
	return n.holdCQ, nil
}

// holderCQNow is the holder CQ as it is (nil: no Accept made it yet).
func (n *localNIC) holderCQNow() ibv.CQ {
	n.holdMu.Lock()
	defer n.holdMu.Unlock()
	return n.holdCQ
}

// Manager is safe for concurrent use.
type Manager struct {
	opts Options
	log  zerolog.Logger
	met  *metrics.Metrics
	// invalidLog limits "rejected malformed rdma handshake" lines (anyone
	// who reaches the peer port can send them); every one is still
	// counted in pegaflow_rdma_handshakes_total{result="invalid"}.
	invalidLog *logging.Limiter
	// nicSet is the NICs by position in Options.Devices; a fatal device's
	// NIC is replaced by its reopened one (fatal.go), copy on write under
	// mu. Read it with curNICs.
	nicSet  atomic.Pointer[[]*localNIC]
	memBase uint64
	memLen  uint64
	// probeMem: the keepalive's scratch page (probe.go); nil when
	// ProbeInterval is 0. Immutable after NewManager until Close.
	probeMem []byte
	// probeTarget: the zero page peers' keepalives READ when memory
	// windows are on (probe.go); nil otherwise. Immutable like probeMem.
	probeTarget []byte
	// placed: READs go through NICs on their local memory's node
	// (placedNUMA). Immutable after NewManager.
	placed bool

	// ctx is canceled by Close; handshakes run under it, not under a
	// caller's context, because singleflight shares them between callers.
	ctx    context.Context
	cancel context.CancelFunc

	sf singleflight.Group

	// mu guards peers, accepted, retired, connecting and closed. It is never held across an
	// RPC, a verbs call that may block, or a wait for another goroutine.
	// The requester map and the holder map are independent: Get/Invalidate
	// touch only peers, Accept only accepted (two managers handshaking
	// with each other have nothing to race on).
	mu       sync.Mutex
	peers    map[string]*AddrConnection // requester side, by peer address
	accepted map[string]*acceptedConn   // holder side, by requester node_id
	// retired: holder-side generations replaced by a reconnect of the same
	// requester process, draining, with the time they were retired.
	retired map[*acceptedConn]time.Time
	// activity: the holder's requester sessions (SetRequesterActivity),
	// by which the reaper judges QPs that do not report activity.
	activity atomic.Pointer[RequesterActivity]
	// connecting: handshakes in flight (requester side), by peer address;
	// informational only (List), singleflight does the deduplication.
	connecting map[string]time.Time
	closed     bool

	liveQPs atomic.Int64 // actual live QPs, both roles
	// windows: locks are served through memory windows (windows.go);
	// immutable after NewManager. windowTurn rotates their QPs.
	windows    bool
	windowTurn atomic.Uint64
	handshake  sync.WaitGroup // running handshakes (requester side)
	accepts    sync.WaitGroup // running Accepts and Disconnects (holder side)
	conns      sync.WaitGroup // requester connections not yet torn down
	workers    sync.WaitGroup // session worker goroutines
	// disconnects: RdmaDisconnect goroutines (goDisconnect). Adds happen
	// only in connect (under handshake) and in teardown (under conns), so
	// Close, which waits for those first, waits for every one.
	disconnects sync.WaitGroup
	reaping     sync.WaitGroup // the reaper and prober goroutines
	nicEvents   sync.WaitGroup // NIC event watchers (nic.go); stop with ctx
	reopening   sync.WaitGroup // reopens of fatal devices and their retirements (fatal.go); stop with ctx
	closeOnce   sync.Once

	// drainTimeout bounds waiting for a QP in ERROR to flush (the
	// drainTimeout constant; tests shorten it).
	drainTimeout time.Duration
	// probeTimeout: an unanswered keepalive READ fails after this long,
	// in nanoseconds (the retry budget + probeSlack; atomic so that tests
	// can change it while the prober runs).
	probeTimeout atomic.Int64

	// Test hooks (nil in production), set by the package's tests before
	// the manager is used.
	hookBeforeRPC func(peer string)
	hookAccept    func(req *pegadv1.RdmaHandshakeRequest)
	// hookInvalidated runs in AddrConnection.invalidate right after the
	// connection is marked invalid (c.mu released).
	hookInvalidated func(c *AddrConnection)
	// hookAbort runs in Read's abort, after queued batches were canceled
	// and before running ones are told to stop.
	hookAbort func(batches []*batch)
}

// NewManager registers Options.Memory on every device and returns a
// Manager with no connections. Devices stay owned by the caller.
func NewManager(opts Options) (m *Manager, err error) {
	if len(opts.Devices) == 0 {
		return nil, errors.New("conn: no devices")
	}
	if opts.Rails != nil && len(opts.Rails) != len(opts.Devices) {
		return nil, fmt.Errorf("conn: %d rails for %d devices", len(opts.Rails), len(opts.Devices))
	}
	if len(opts.Memory) == 0 {
		return nil, errors.New("conn: no memory to register")
	}
	if opts.Dial == nil {
		return nil, errors.New("conn: Options.Dial is required")
	}
	if opts.QPsPerPeer <= 0 {
		opts.QPsPerPeer = 1
	}
	if opts.QPsPerPeer > maxQPsPerPeer {
		return nil, fmt.Errorf("conn: qps per peer %d exceeds %d", opts.QPsPerPeer, maxQPsPerPeer)
	}
	if opts.SQDepth <= 0 {
		opts.SQDepth = defaultSQDepth
	}
	if opts.SliceBytes == 0 {
		opts.SliceBytes = defaultSliceBytes
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = defaultHandshakeTimeout
	}
	if opts.DisconnectTimeout <= 0 {
		opts.DisconnectTimeout = defaultDisconnectTimeout
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = defaultIdleTimeout
	}
	if opts.ReconnectDrain <= 0 {
		opts.ReconnectDrain = defaultReconnectDrain
	}
	if opts.ConnectAttr == (ibv.ConnectAttr{}) {
		opts.ConnectAttr = ibv.DefaultConnectAttr()
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.NewForTest()
	}
	m = &Manager{
		opts:       opts,
		log:        opts.Log,
		met:        opts.Metrics,
		invalidLog: logging.NewLimiter(invalidLogEvery),
		memBase:    uint64(uintptr(unsafe.Pointer(&opts.Memory[0]))),
		memLen:     uint64(len(opts.Memory)),
		peers:      make(map[string]*AddrConnection),
		accepted:   make(map[string]*acceptedConn),
		retired:    make(map[*acceptedConn]time.Time),

		connecting: make(map[string]time.Time),

		drainTimeout: drainTimeout,
	}
	m.probeTimeout.Store(int64(opts.ConnectAttr.RetryBudget() + probeSlack))
	defer func() {
		if err != nil {
			m.releaseNICs()
		}
	}()
	m.windows = m.memoryWindows(opts)
	for _, r := range []string{resultOK, resultError, resultQuarantined} {
		m.met.WindowBinds.WithLabelValues(r) // exported at 0 from the start
	}
	if err := m.registerNICs(opts); err != nil {
		return nil, err
	}
	if opts.ProbeInterval > 0 {
		if err := m.registerProbe(); err != nil {
			return nil, err
		}
	}
	if m.windows {
		if err := m.registerProbeTarget(); err != nil {
			return nil, err
		}
	}
	m.placed = placedNUMA(m.curNICs(), opts.Placement)
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.reaping.Add(1)
	go m.reaper()
	if opts.ProbeInterval > 0 {
		m.reaping.Add(1)
		go m.prober()
	}
	m.watchNICEvents()
	return m, nil
}

func (m *Manager) releaseNICs() {
	for _, n := range m.curNICs() {
		if n != nil {
			m.releaseNIC(n)
		}
	}
	m.releaseProbe()
}

// Get returns a connected AddrConnection to peer, handshaking if needed
// (at most one handshake per peer in flight; concurrent callers wait).
func (m *Manager) Get(ctx context.Context, peer string) (*AddrConnection, error) {
	if c, err := m.lookup(peer); c != nil || err != nil {
		return c, err
	}
	ch := m.sf.DoChan(peer, func() (any, error) {
		// Re-check: a handshake that finished between lookup and DoChan
		// already published its connection.
		if c, err := m.lookup(peer); c != nil || err != nil {
			return c, err
		}
		return m.connect(peer)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*AddrConnection), nil
	case <-ctx.Done():
		// The handshake goes on (bounded by HandshakeTimeout) for the
		// other callers; its result is published for the next Get.
		return nil, ctx.Err()
	}
}

func (m *Manager) lookup(peer string) (*AddrConnection, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	return m.peers[peer], nil
}

// Invalidate removes c (if it is still the current connection to its peer)
// and tears it down once in-flight work is done.
func (m *Manager) Invalidate(c *AddrConnection, reason error) {
	if c == nil {
		return
	}
	m.mu.Lock()
	if m.peers[c.peer] == c {
		delete(m.peers, c.peer)
	}
	m.mu.Unlock()
	c.invalidate(reason)
}

// List returns the live connections of both roles and the handshakes in
// flight (state connecting). Requester-side connections that were
// invalidated and still drain in-flight work are not listed; holder-side
// generations draining after a reconnect are, as invalidated.
func (m *Manager) List() []ConnInfo {
	m.mu.Lock()
	var out []ConnInfo
	for peer, since := range m.connecting {
		out = append(out, ConnInfo{Peer: peer, Role: RoleRequester, State: StateConnecting, Since: since})
	}
	peers := make([]*AddrConnection, 0, len(m.peers))
	for _, c := range m.peers {
		peers = append(peers, c)
	}
	acc := make([]*acceptedConn, 0, len(m.accepted))
	for _, a := range m.accepted {
		acc = append(acc, a)
	}
	retired := make([]*acceptedConn, 0, len(m.retired))
	for a := range m.retired {
		retired = append(retired, a)
	}
	m.mu.Unlock()
	for _, c := range peers {
		out = append(out, c.info())
	}
	for _, a := range acc {
		out = append(out, a.info())
	}
	for _, a := range retired {
		ci := a.info()
		ci.State = StateInvalidated // draining after a reconnect
		out = append(out, ci)
	}
	return out
}

// QPs is the actual number of live QPs across all connections.
func (m *Manager) QPs() int { return int(m.liveQPs.Load()) }

// Close invalidates every connection and waits for their workers.
// In-flight Reads are aborted (their QPs moved to ERROR and drained).
func (m *Manager) Close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		peers := m.peers
		acc := m.accepted
		retired := m.retired
		m.peers = make(map[string]*AddrConnection)
		m.accepted = make(map[string]*acceptedConn)
		m.retired = make(map[*acceptedConn]time.Time)
		m.mu.Unlock()
		m.cancel()       // aborts running handshakes, stops the reaper and prober
		m.reaping.Wait() // the reaper may be destroying what it reaped

		for _, c := range peers {
			c.invalidate(ErrClosed)
			c.abortInFlight()
		}
		for _, a := range acc {
			a.destroy("shutdown")
		}
		for a := range retired {
			a.destroy("shutdown")
		}
		m.handshake.Wait()
		m.accepts.Wait()
		m.conns.Wait()
		m.workers.Wait()
		m.disconnects.Wait() // each bounded by DisconnectTimeout
		m.reopening.Wait()   // before nicEvents: a reopen starts a watcher
		m.nicEvents.Wait()
		m.releaseNICs()
	})
	return nil
}

// goDisconnect tells peer, from a goroutine the manager waits for at
// Close, that the connection of handshake hsID is abandoned, so the holder
// frees its QPs now. Best effort and bounded by DisconnectTimeout: the
// holder may well be dead (that is often why the connection was
// invalidated), so a failure is only logged at debug. It never blocks its
// caller. Its context is not m.ctx: Close cancels that first, and the
// disconnects of Close's own teardowns must still go out.
func (m *Manager) goDisconnect(client pegadv1.PeerServiceClient, peer, hsID string, log zerolog.Logger) {
	if client == nil || hsID == "" {
		return
	}
	m.disconnects.Add(1)
	go func() {
		defer m.disconnects.Done()
		ctx, cancel := context.WithTimeout(context.Background(), m.opts.DisconnectTimeout)
		defer cancel()
		resp, err := client.RdmaDisconnect(ctx, &pegadv1.RdmaDisconnectRequest{
			Requester:   &pegadv1.Requester{NodeId: m.opts.NodeID, Incarnation: m.opts.Incarnation},
			HandshakeId: hsID,
		})
		if err != nil {
			log.Debug().Err(err).Str("peer", peer).Msg("rdma disconnect not delivered")
			return
		}
		log.Debug().Str("peer", peer).Uint32("qps_released", resp.GetQpsReleased()).Msg("rdma disconnect delivered")
	}()
}

// qpPair is one QP. A requester's has its own CQ: completions never mix
// across QPs or connections. A holder's shares its NIC's holdCQ, on which
// nothing completes (sharedCQ).
type qpPair struct {
	nic      *localNIC
	qp       ibv.QP
	cq       ibv.CQ
	sharedCQ bool // cq is nic.holdCQ: not this QP's to close
	qpn      uint32
	// binds keeps the memory-window binds in flight on this (holder) QP
	// within its send queue (windows.go).
	binds *semaphore.Weighted

	// mu guards destroyed: ToError must never reach a destroyed QP (with
	// verbs that is a use after free), and destroy happens once.
	mu        sync.Mutex
	destroyed bool
}

// toError moves the QP to ERROR unless it is already destroyed.
func (p *qpPair) toError() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.destroyed {
		_ = p.qp.ToError()
	}
}

// newQPPair creates an RC QP (INIT) on nic and counts it live: a
// requester's (holder false) on a CQ of its own, a holder's on the NIC's
// shared holder CQ.
func (m *Manager) newQPPair(nic *localNIC, holder bool) (*qpPair, error) {
	if !nic.acquireUse() {
		return nil, fmt.Errorf("create qp on %s: %w", nic.info.Name, ErrNICReleased)
	}
	var (
		cq  ibv.CQ
		err error
	)
	made := false
	defer func() {
		if made {
			nic.endUse()
		} else {
			nic.releaseUse()
		}
	}()
	if holder {
		depth := 1
		if m.windows {
			depth = holdCQDepthWindows
		}
		cq, err = nic.holderCQ(depth)
	} else {
		cq, err = nic.dev.CreateCQ(m.opts.SQDepth)
	}
	if err != nil {
		return nil, fmt.Errorf("create cq on %s: %w", nic.info.Name, err)
	}
	qcap := ibv.QPCap{MaxSendWR: m.opts.SQDepth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRdAtomic: m.maxRdAtomic(nic)}
	qp, err := nic.pd.CreateQP(cq, qcap)
	if err != nil {
		if !holder {
			_ = cq.Close()
		}
		return nil, fmt.Errorf("create qp on %s: %w", nic.info.Name, err)
	}
	made = true
	m.liveQPs.Add(1)
	m.met.RDMAQPs.Inc()
	return &qpPair{nic: nic, qp: qp, cq: cq, sharedCQ: holder, qpn: qp.QPN(), binds: semaphore.NewWeighted(int64(m.opts.SQDepth))}, nil
}

// destroy releases the QP then its CQ, exactly once.
func (p *qpPair) destroy(m *Manager) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return
	}
	p.destroyed = true
	{
		if err := p.qp.Destroy(); err != nil {
			m.log.Warn().Err(err).Uint32("qpn", p.qpn).Msg("destroy qp")
		}
		if !p.sharedCQ {
			if err := p.cq.Close(); err != nil {
				m.log.Warn().Err(err).Uint32("qpn", p.qpn).Msg("close cq")
			}
		}
		m.liveQPs.Add(-1)
		p.nic.users.Add(-1)
		m.met.RDMAQPs.Dec()
	}
}

func (m *Manager) maxRdAtomic(nic *localNIC) int {
	n := int(m.opts.ConnectAttr.MaxRdAtomic)
	if n <= 0 {
		n = int(ibv.DefaultConnectAttr().MaxRdAtomic)
	}
	if nic.info.MaxRdAtomic > 0 && nic.info.MaxRdAtomic < n {
		n = nic.info.MaxRdAtomic
	}
	return n
}

func (m *Manager) connectAttr(nic *localNIC) ibv.ConnectAttr {
	a := m.opts.ConnectAttr
	n := uint8(m.maxRdAtomic(nic))
	a.MaxRdAtomic, a.MaxDestRd = n, n
	return a
}

func newHandshakeID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// reasonLabel turns an invalidation reason into a low-cardinality label.
func reasonLabel(err error) string {
	var se *ibv.StatusError
	switch {
	case err == nil:
		return "manual"
	case errors.Is(err, ErrClosed):
		return "shutdown"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &se):
		return "completion_error"
	case errors.Is(err, ErrSessionInvalidated):
		return "session_invalidated"
	case errors.Is(err, ErrConnectionBroken):
		return "connection_broken"
	case errors.Is(err, ErrPeerRestarted):
		return "peer_restarted"
	case errors.Is(err, ErrRemoteMemory):
		return "remote_memory"
	}
	return "other"
}

// wcLabel is the status label of WorkCompletions.
func wcLabel(s ibv.WCStatus) string {
	switch s {
	case ibv.WCSuccess:
		return "success"
	case ibv.WCWRFlushErr:
		return "wr_flush_err"
	case ibv.WCRemAccessErr:
		return "rem_access_err"
	case ibv.WCLocProtErr:
		return "loc_prot_err"
	case ibv.WCRetryExcErr:
		return "retry_exc_err"
	case ibv.WCRemInvReqErr:
		return "rem_inv_req_err"
	case ibv.WCLocLenErr:
		return "loc_len_err"
	}
	return fmt.Sprintf("status_%d", int(s))
}
