package conn

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/semaphore"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/metrics"
)

// NICOptions configure a NIC set: the node's devices, the pool registered
// on them, and what every QP made on them (by either half) is like.
type NICOptions struct {
	// NodeID and Incarnation name this node in both halves' handshakes.
	NodeID      string
	Incarnation string
	// Transport is the provider name: requests carry it, and accepts
	// refuse a requester on another.
	Transport string
	Devices   []ibv.Device // opened NICs, in order
	// Memory is the local pool, registered on every NIC.
	Memory []byte
	// SQDepth is the send queue depth of every QP (default 256).
	SQDepth int
	// ConnectAttr are the RC attributes of every QP; the zero value means
	// ibv.DefaultConnectAttr() (max_rd_atomic is further capped by the
	// device). Its Timeout/RetryCnt set the retry budget after which a
	// silent peer fails READs with RETRY_EXC_ERR: about 0.5 s by default,
	// which a loaded host running the tcp provider may exceed spuriously.
	ConnectAttr ibv.ConnectAttr
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
	// MemoryWindows (the Acceptor's): register the pool without remote
	// read and serve each transfer lock through type-2 memory windows over
	// its blocks (Acceptor.BindWindows). A device without them turns it
	// off, with a warning: then the pool's rkey serves every READ.
	MemoryWindows bool
	// Keepalive registers the scratch page the Dialer's keepalive READs
	// land in (probe.go) on every NIC; a Dialer with a ProbeInterval
	// needs it.
	Keepalive bool
	// Reopen opens Devices[i] again after it reported
	// IBV_EVENT_DEVICE_FATAL (the provider's Open of the name it was
	// opened with); nil: a fatal device stays out of placement until
	// restart.
	Reopen func(i int) (ibv.Device, error)
	// Metrics are the daemon's (required: tests pass a private registry);
	// both halves count through them.
	Metrics *metrics.Metrics
	Log     zerolog.Logger
}

// NICs is the node's NIC set, the one thing the Dialer and the Acceptor
// share: the per-NIC protection domains and memory registrations (one MR
// of NICOptions.Memory per NIC, registered in NewNICs), the keepalive
// pages, the holder CQ of each NIC, the live-QP count of both halves, the
// watchers of the NICs' port events and the reopening of a device that
// reported DEVICE_FATAL. It owns no connection: a port going down or a
// NIC coming back is passed to the Dialer, which replaces its
// connections. Safe for concurrent use.
//
// Lock order: NICs.mu is never held while a half's mutex is taken, nor a
// half's while NICs.mu is: each is taken alone. localNIC.life and a QP's
// mu are taken under neither.
type NICs struct {
	opts NICOptions
	log  zerolog.Logger
	met  *metrics.Metrics
	// nicSet is the NICs by position in NICOptions.Devices; a fatal
	// device's NIC is replaced by its reopened one (fatal.go), copy on
	// write under mu. Read it with curNICs.
	nicSet  atomic.Pointer[[]*localNIC]
	memBase uint64
	memLen  uint64
	// probeMem: the keepalive's scratch page (probe.go); nil without
	// Keepalive. Immutable after NewNICs until Close.
	probeMem []byte
	// probeTarget: the zero page peers' keepalives READ when memory
	// windows are on (probe.go); nil otherwise. Immutable like probeMem.
	probeTarget []byte
	// placed: READs go through NICs on their local memory's node
	// (placedNUMA). Immutable after NewNICs.
	placed bool
	// windows: locks are served through memory windows (windows.go);
	// immutable after NewNICs.
	windows bool

	// ctx is canceled by Close: the NIC event watchers and the reopen
	// loops stop with it.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards closed and the copy-on-write swaps of nicSet. It is never
	// held across a verbs call that may block or a wait for another
	// goroutine.
	mu     sync.Mutex
	closed bool
	// dialer and acceptor are the halves made over this set (at most one
	// of each), until their Close: port events go to the dialer, and Close
	// refuses while either is open.
	dialer   atomic.Pointer[Dialer]
	acceptor atomic.Pointer[Acceptor]

	liveQPs   atomic.Int64   // actual live QPs, both halves
	nicEvents sync.WaitGroup // NIC event watchers (nic.go); stop with ctx
	reopening sync.WaitGroup // reopens of fatal devices and their retirements (fatal.go); stop with ctx
	closeOnce sync.Once

	// drainTimeout bounds waiting for a QP in ERROR to flush (the
	// drainTimeout constant; tests shorten it).
	drainTimeout time.Duration
}

// NewNICs registers NICOptions.Memory on every device and starts watching
// their events. Devices stay owned by the caller. Close it after the
// Dialer and Acceptor made over it.
func NewNICs(opts NICOptions) (s *NICs, err error) {
	if len(opts.Devices) == 0 {
		return nil, errors.New("conn: no devices")
	}
	if opts.Rails != nil && len(opts.Rails) != len(opts.Devices) {
		return nil, fmt.Errorf("conn: %d rails for %d devices", len(opts.Rails), len(opts.Devices))
	}
	if len(opts.Memory) == 0 {
		return nil, errors.New("conn: no memory to register")
	}
	if opts.Metrics == nil {
		return nil, errors.New("conn: NICOptions.Metrics is required")
	}
	if opts.SQDepth <= 0 {
		opts.SQDepth = defaultSQDepth
	}
	if opts.ConnectAttr == (ibv.ConnectAttr{}) {
		opts.ConnectAttr = ibv.DefaultConnectAttr()
	}
	s = &NICs{
		opts:         opts,
		log:          opts.Log,
		met:          opts.Metrics,
		memBase:      uint64(uintptr(unsafe.Pointer(&opts.Memory[0]))),
		memLen:       uint64(len(opts.Memory)),
		drainTimeout: drainTimeout,
	}
	defer func() {
		if err != nil {
			s.releaseNICs()
		}
	}()
	s.windows = s.memoryWindows(opts)
	for _, r := range []string{resultOK, resultError, resultQuarantined} {
		s.met.WindowBinds.WithLabelValues(r) // exported at 0 from the start
	}
	if err := s.registerNICs(opts); err != nil {
		return nil, err
	}
	if opts.Keepalive {
		if err := s.registerProbe(); err != nil {
			return nil, err
		}
	}
	if s.windows {
		if err := s.registerProbeTarget(); err != nil {
			return nil, err
		}
	}
	s.placed = placedNUMA(s.curNICs(), opts.Placement)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.watchNICEvents()
	return s, nil
}

// QPs is the actual number of live QPs, of both halves.
func (s *NICs) QPs() int { return int(s.liveQPs.Load()) }

// WindowsEnabled reports whether locks are served through memory windows
// (NICOptions.MemoryWindows and every NIC binds type-2 windows).
func (s *NICs) WindowsEnabled() bool { return s.windows }

// Close stops the event watchers and reopen loops and releases every NIC.
// The Dialer and Acceptor made over s must be closed first (their QPs
// use the NICs' PDs): until they are, Close refuses and releases nothing.
func (s *NICs) Close() error {
	if s.dialer.Load() != nil || s.acceptor.Load() != nil {
		return errors.New("conn: NICs closed before the Dialer or Acceptor made over them")
	}
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.cancel()
		s.reopening.Wait() // before nicEvents: a reopen starts a watcher
		s.nicEvents.Wait()
		s.releaseNICs()
	})
	return nil
}

// begin counts one reopen in wg, which Close waits for (before it
// releases the PDs); ErrClosed once s is closed.
func (s *NICs) begin(wg *sync.WaitGroup) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	wg.Add(1) // under mu: Close sets closed before it Waits
	return nil
}

func (s *NICs) releaseNICs() {
	for _, n := range s.curNICs() {
		if n != nil {
			s.releaseNIC(n)
		}
	}
	s.releaseProbe()
}

// localNode is the NUMA node of local memory at addr when READs are placed
// by it (NICs.placed), else -1.
func (s *NICs) localNode(addr uint64) int {
	if !s.placed {
		return -1
	}
	return s.opts.Placement.NodeOf(addr)
}

// localNIC is one opened device with the pool registered on it.
type localNIC struct {
	dev  ibv.Device
	info ibv.DeviceInfo
	pos  int // in NICOptions.Devices
	// ownDev: the NIC set opened dev (a reopen after DEVICE_FATAL) and
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
	rail     string // NICOptions.Rails; "" when not named
	pd       ibv.PD
	mr       ibv.MR
	// probeMR: NICs.probeMem registered here (keepalive READs land in
	// it); nil when probing is off.
	probeMR ibv.MR
	// probeTargetMR: NICs.probeTarget registered here for remote read
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
	// releaseNIC once every QP is gone.
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
func (s *NICs) newQPPair(nic *localNIC, holder bool) (*qpPair, error) {
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
		if s.windows {
			depth = holdCQDepthWindows
		}
		cq, err = nic.holderCQ(depth)
	} else {
		cq, err = nic.dev.CreateCQ(s.opts.SQDepth)
	}
	if err != nil {
		return nil, fmt.Errorf("create cq on %s: %w", nic.info.Name, err)
	}
	qcap := ibv.QPCap{MaxSendWR: s.opts.SQDepth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRdAtomic: s.maxRdAtomic(nic)}
	qp, err := nic.pd.CreateQP(cq, qcap)
	if err != nil {
		if !holder {
			_ = cq.Close()
		}
		return nil, fmt.Errorf("create qp on %s: %w", nic.info.Name, err)
	}
	made = true
	s.liveQPs.Add(1)
	s.met.RDMAQPs.Inc()
	return &qpPair{nic: nic, qp: qp, cq: cq, sharedCQ: holder, qpn: qp.QPN(), binds: semaphore.NewWeighted(int64(s.opts.SQDepth))}, nil
}

// destroy releases the QP then its CQ, exactly once.
func (p *qpPair) destroy(s *NICs) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return
	}
	p.destroyed = true
	{
		if err := p.qp.Destroy(); err != nil {
			s.log.Warn().Err(err).Uint32("qpn", p.qpn).Msg("destroy qp")
		}
		if !p.sharedCQ {
			if err := p.cq.Close(); err != nil {
				s.log.Warn().Err(err).Uint32("qpn", p.qpn).Msg("close cq")
			}
		}
		s.liveQPs.Add(-1)
		p.nic.users.Add(-1)
		s.met.RDMAQPs.Dec()
	}
}

func (s *NICs) maxRdAtomic(nic *localNIC) int {
	n := int(s.opts.ConnectAttr.MaxRdAtomic)
	if n <= 0 {
		n = int(ibv.DefaultConnectAttr().MaxRdAtomic)
	}
	if nic.info.MaxRdAtomic > 0 && nic.info.MaxRdAtomic < n {
		n = nic.info.MaxRdAtomic
	}
	return n
}

func (s *NICs) connectAttr(nic *localNIC) ibv.ConnectAttr {
	a := s.opts.ConnectAttr
	n := uint8(s.maxRdAtomic(nic))
	a.MaxRdAtomic, a.MaxDestRd = n, n
	return a
}
