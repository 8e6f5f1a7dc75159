// Package tcp is a software RC provider of the ibv model over real TCP
// sockets, for hosts without RDMA NICs and for every test of pegad.
//
// It owns per-device data listeners, QPN/PSN/key allocation, registered
// memory bookkeeping and the data connections of its queue pairs, and gives
// them verbs semantics: rkey/lkey, bounds and access checks, send queue depth
// and max outstanding READs, in-order completions, and the error behaviour of
// an RC QP (REM_ACCESS_ERR, LOC_PROT_ERR, RETRY_EXC_ERR, then ERROR and
// WR_FLUSH_ERR for everything else). A remote READ or WRITE is served by the
// remote *provider* straight from registered memory; application code on the
// remote side is never involved.
//
// It must never keep state keyed by a QPN across devices: QPNs are unique only
// within one device, and two devices (two peers) may allocate identical ones.
// A data connection names its remote by (device address, QPN, PSN).
//
// Memory safety: registered memory is memory the Go GC does not own (mmap'd).
// The provider touches it only while the MR is registered: under the MR's
// lock for a copy, or pinned (Dereg waits) while bytes move straight between
// it and a socket (READ responses and WRITE chunks are written from it, READ
// payloads are read into it, with no intermediate copy). A READ payload is
// read into local memory only while its work request is outstanding, the QP
// marked landing: moving the QP to ERROR closes the connection and waits for
// the landing to end before any flush completion is delivered. So after
// Dereg returns, after Destroy returns, and after ToError's flush
// completions are polled (by default ToError flushes before it returns; with
// Faults.AsyncFlush, as on a real HCA, the flush comes later), no byte is
// read from or written to that memory. As on an HCA, the destination of a
// READ that fails holds whatever arrived before the failure.
package tcp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/metrics"
)

const (
	qpnMask = 1<<24 - 1
	// Device limits advertised in DeviceInfo and enforced.
	maxQPWR     = 16384
	maxRdAtomic = 16
	mtu         = 4096
	// helloTimeout bounds how long an accepted connection may take to send
	// its hello, so a stray client cannot hold a goroutine forever.
	helloTimeout = 5 * time.Second
)

// DeviceOptions configure one device of a Provider.
type DeviceOptions struct {
	Name       string // default "tcp0", "tcp1", ...
	ListenAddr string // data listener, default "127.0.0.1:0"
	Advertise  string // address peers dial; default the listener's actual address
	// AdvertiseHost, when Advertise is empty, is advertised with the port
	// the listener actually bound (an ephemeral one included).
	AdvertiseHost string
	QPNStart      uint32 // first QPN this device allocates (default 0x100); QPNs are per device
	NUMANode      int
	// Logger receives debug/warn lines about data connections; default none.
	Logger *zerolog.Logger
	// Metrics, when set, counts data connections dropped before or at
	// their hello (pegaflow_tcp_data_conns_refused_total).
	Metrics *metrics.Metrics
	// MaxPreHello and MaxPreHelloPerSource bound the accepted connections
	// still waiting for their hello, in all and per source address
	// (defaults 512 and 64); see helloGate.
	MaxPreHello          int
	MaxPreHelloPerSource int
}

// Faults are injected by tests into a device. ResponseDelay and
// DropResponses act on its responder side (requests it serves);
// AsyncFlush acts on its own QPs (the requester side).
type Faults struct {
	ResponseDelay time.Duration // delay every READ response served by this device
	DropResponses bool          // serve nothing (requester sees RETRY_EXC_ERR after its retry budget)
	// AsyncFlush models a real HCA's ERROR transition: ToError on a QP of
	// this device with WRs outstanding returns at once (the QP reports
	// ERROR and sends nothing more), but READ responses already in flight
	// are still written into local memory for this long; only then are
	// the outstanding WRs completed with WR_FLUSH_ERR and the data
	// connection closed. Until those flush completions are polled (or the
	// QP is destroyed), local memory may still change. Zero: ToError
	// flushes synchronously.
	AsyncFlush time.Duration
}

// Provider is the tcp provider: a fixed set of devices, each with a data
// listener, created by NewProvider and torn down by Close.
type Provider struct {
	devs  []*Device
	byNam map[string]*Device
}

var _ ibv.Provider = (*Provider)(nil)

// NewProvider starts one listener per device (one device "tcp0" when none
// is given).
func NewProvider(devs ...DeviceOptions) (*Provider, error) {
	if len(devs) == 0 {
		devs = []DeviceOptions{{}}
	}
	p := &Provider{byNam: make(map[string]*Device)}
	for i, o := range devs {
		if o.Name == "" {
			o.Name = fmt.Sprintf("tcp%d", i)
		}
		if _, dup := p.byNam[o.Name]; dup {
			p.Close()
			return nil, fmt.Errorf("tcp: duplicate device name %q: %w", o.Name, ibv.ErrInvalidArgument)
		}
		d, err := newDevice(o)
		if err != nil {
			p.Close()
			return nil, err
		}
		p.devs = append(p.devs, d)
		p.byNam[o.Name] = d
	}
	return p, nil
}

// Name is "tcp".
func (p *Provider) Name() string { return "tcp" }

// Devices lists the provider's devices.
func (p *Provider) Devices() ([]ibv.DeviceInfo, error) {
	out := make([]ibv.DeviceInfo, 0, len(p.devs))
	for _, d := range p.devs {
		out = append(out, d.info)
	}
	return out, nil
}

// Open returns the named device (the same *Device each time).
func (p *Provider) Open(name string) (ibv.Device, error) {
	d, ok := p.byNam[name]
	if !ok {
		return nil, fmt.Errorf("tcp: open %q: %w", name, ibv.ErrNoDevice)
	}
	return d, nil
}

// Close closes every listener, queue pair and data connection, and waits
// for all goroutines of the provider to exit.
func (p *Provider) Close() error {
	for _, d := range p.devs {
		d.shutdown()
	}
	return nil
}

// Device is one tcp device: a data listener plus the PDs, MRs, CQs and QPs
// allocated on it.
type Device struct {
	info ibv.DeviceInfo
	ln   net.Listener
	log  zerolog.Logger
	met  *metrics.Metrics // nil: not counted
	gate *helloGate
	done chan struct{} // closed by shutdown: stops the accept loop and fault delays

	mu       sync.Mutex // guards qps, nextQPN, conns, pds, cqs, shut
	qps      map[uint32]*qp
	nextQPN  uint32
	qpnStart uint32
	conns    map[*dconn]struct{} // every open data connection, both directions
	pds      map[*pd]struct{}
	cqs      map[*cq]struct{}
	shut     bool

	keysMu sync.RWMutex // guards lkeys, rkeys
	lkeys  map[uint32]*mr
	rkeys  map[uint32]*mr

	faultsMu sync.Mutex // guards faults
	faults   Faults

	// wg counts the accept loop and the responder goroutine of each
	// accepted connection; requester goroutines are counted by their QP.
	wg sync.WaitGroup
}

var _ ibv.Device = (*Device)(nil)

func newDevice(o DeviceOptions) (*Device, error) {
	if o.ListenAddr == "" {
		o.ListenAddr = "127.0.0.1:0"
	}
	if o.QPNStart == 0 {
		o.QPNStart = 0x100
	}
	if o.QPNStart > qpnMask {
		return nil, fmt.Errorf("tcp: QPN start %#x over 24 bits: %w", o.QPNStart, ibv.ErrInvalidArgument)
	}
	ln, err := net.Listen("tcp", o.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("tcp: device %s: listen %s: %w", o.Name, o.ListenAddr, err)
	}
	if o.Advertise == "" && o.AdvertiseHost != "" {
		o.Advertise = net.JoinHostPort(o.AdvertiseHost, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	if o.Advertise == "" {
		o.Advertise = ln.Addr().String()
	}
	if len(o.Advertise) > maxAddrLen {
		ln.Close()
		return nil, fmt.Errorf("tcp: advertise address too long: %w", ibv.ErrInvalidArgument)
	}
	log := zerolog.Nop()
	if o.Logger != nil {
		log = *o.Logger
	}
	d := &Device{
		info: ibv.DeviceInfo{
			Name: o.Name, NUMANode: o.NUMANode, Port: 1, LinkLayer: "tcp",
			GID: gidOf(o.Advertise), MTU: mtu, MaxQPWR: maxQPWR, MaxRdAtomic: maxRdAtomic,
			Addr: o.Advertise,
		},
		ln:       ln,
		log:      log.With().Str("device", o.Name).Str("addr", o.Advertise).Logger(),
		met:      o.Metrics,
		gate:     newHelloGate(o.MaxPreHello, o.MaxPreHelloPerSource),
		done:     make(chan struct{}),
		qps:      make(map[uint32]*qp),
		nextQPN:  o.QPNStart,
		qpnStart: o.QPNStart,
		conns:    make(map[*dconn]struct{}),
		pds:      make(map[*pd]struct{}),
		cqs:      make(map[*cq]struct{}),
		lkeys:    make(map[uint32]*mr),
		rkeys:    make(map[uint32]*mr),
	}
	d.wg.Add(1)
	go d.acceptLoop()
	return d, nil
}

// gidOf maps an IP address to an IPv4-mapped or IPv6 GID, as RoCE does.
func gidOf(addr string) ibv.GID {
	var g ibv.GID
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return g
	}
	return ibv.GID(ap.Addr().As16())
}

// Info describes the device.
func (d *Device) Info() ibv.DeviceInfo { return d.info }

// SetFaults replaces the faults injected into this device's responder side.
func (d *Device) SetFaults(f Faults) {
	d.faultsMu.Lock()
	d.faults = f
	d.faultsMu.Unlock()
}

func (d *Device) currentFaults() Faults {
	d.faultsMu.Lock()
	defer d.faultsMu.Unlock()
	return d.faults
}

// CutConnections abruptly closes every data connection of this device, both
// those its QPs dialed and those its listener accepted. A QP with work in
// flight on a cut connection fails with RETRY_EXC_ERR (then ERROR and
// flush); an idle QP redials on its next post, as an RC QP rides out a link
// flap (a WR posted before the requester noticed the cut may still fail).
func (d *Device) CutConnections() {
	d.mu.Lock()
	cs := make([]*dconn, 0, len(d.conns))
	for c := range d.conns {
		cs = append(cs, c)
	}
	d.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (ibv.PD, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shut {
		return nil, ibv.ErrClosed
	}
	p := &pd{dev: d, mrs: make(map[*mr]struct{}), qps: make(map[*qp]struct{})}
	d.pds[p] = struct{}{}
	return p, nil
}

// CreateCQ creates a completion queue. depth is advisory: the queue grows.
func (d *Device) CreateCQ(depth int) (ibv.CQ, error) {
	if depth <= 0 {
		return nil, fmt.Errorf("tcp: cq depth %d: %w", depth, ibv.ErrInvalidArgument)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shut {
		return nil, ibv.ErrClosed
	}
	c := &cq{dev: d, notify: make(chan struct{}, 1), done: make(chan struct{})}
	d.cqs[c] = struct{}{}
	return c, nil
}

// Close releases every PD (with its MRs and QPs) and CQ opened on the
// device. The listener stays up until the Provider is closed, so the
// device can be used again.
func (d *Device) Close() error {
	d.mu.Lock()
	pds := slices.Collect(maps.Keys(d.pds))
	cqs := slices.Collect(maps.Keys(d.cqs))
	d.mu.Unlock()
	for _, p := range pds {
		p.Close()
	}
	for _, c := range cqs {
		c.Close()
	}
	return nil
}

// shutdown is the Provider's Close for one device.
func (d *Device) shutdown() {
	d.mu.Lock()
	if d.shut {
		d.mu.Unlock()
		return
	}
	d.shut = true
	close(d.done)
	d.mu.Unlock()
	d.ln.Close()
	d.Close()
	d.CutConnections()
	d.wg.Wait()
}

// allocQPN returns the next free 24-bit QPN of this device (d.mu held).
func (d *Device) allocQPNLocked() (uint32, error) {
	for range qpnMask {
		n := d.nextQPN
		d.nextQPN = (d.nextQPN + 1) & qpnMask
		if d.nextQPN == 0 {
			d.nextQPN = 1
		}
		if _, used := d.qps[n]; !used && n != 0 {
			return n, nil
		}
	}
	return 0, fmt.Errorf("tcp: out of QPNs: %w", ibv.ErrInvalidArgument)
}

func (d *Device) trackConn(c *dconn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shut {
		return false
	}
	d.conns[c] = struct{}{}
	return true
}

func (d *Device) untrackConn(c *dconn) {
	d.mu.Lock()
	delete(d.conns, c)
	d.mu.Unlock()
}

// lookupKey finds the MR of an lkey (local) or rkey (!local).
func (d *Device) lookupKey(key uint32, local bool) *mr {
	d.keysMu.RLock()
	defer d.keysMu.RUnlock()
	if local {
		return d.lkeys[key]
	}
	return d.rkeys[key]
}

// dconn is one data connection. Close is idempotent and also closes done, so
// a goroutine sleeping on behalf of the connection wakes up.
type dconn struct {
	c    *net.TCPConn
	once sync.Once
	done chan struct{}
	// bufs and vec are write's vector (writer goroutine only), kept here
	// so that a write allocates nothing.
	bufs [2][]byte
	vec  net.Buffers
	// writeErr is the request write error that made the requester close
	// it (sendFailed): the reader then reports that, not its own close.
	writeErr atomic.Pointer[error]
}

// keepAlive finds a data connection whose other end vanished without a
// FIN (host down, cable cut) within about 30 s, so a holder's responder
// waiting on an idle connection does not wait forever.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

func newDconn(c net.Conn) *dconn {
	tc := c.(*net.TCPConn)
	_ = tc.SetNoDelay(true)
	_ = tc.SetKeepAliveConfig(keepAlive)
	return &dconn{c: tc, done: make(chan struct{})}
}

func (c *dconn) Close() {
	c.once.Do(func() {
		close(c.done)
		_ = c.c.Close()
	})
}

// write sends a header and an optional payload in one writev. A peer that
// takes no byte for stall (0: no limit) fails it with an error wrapping
// os.ErrDeadlineExceeded: as on an RC QP, whose retry timer runs per
// packet, a slow reader that keeps taking bytes is progress, a stalled one
// is not. Only the connection's writer goroutine calls it.
func (c *dconn) write(hdr, payload []byte, stall time.Duration) error {
	c.bufs[0], c.bufs[1] = hdr, payload
	c.vec = c.bufs[:2]
	if len(payload) == 0 {
		c.vec = c.vec[:1]
	}
	defer func() { c.bufs, c.vec = [2][]byte{}, nil }()
	for {
		var dl time.Time // zero: no limit (clears an earlier write's)
		if stall > 0 {
			dl = time.Now().Add(stall)
		}
		_ = c.c.SetWriteDeadline(dl)
		n, err := c.vec.WriteTo(c.c)
		if err == nil {
			return nil
		}
		if n > 0 && len(c.vec) > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			continue // some bytes went: progress, a new stall period
		}
		return err
	}
}

// bufPool holds frame buffers of maxBody bytes, shared by all connections
// so idle QPs hold none.
var bufPool = sync.Pool{New: func() any { b := make([]byte, maxBody); return &b }}

// pd is a protection domain.
type pd struct {
	dev *Device

	mu     sync.Mutex // guards mrs, qps, closed
	mrs    map[*mr]struct{}
	qps    map[*qp]struct{}
	closed bool
}

// RegMR registers buf, which must be memory the GC does not own (mmap'd):
// remote peers address it by its virtual address, as with verbs.
func (p *pd) RegMR(buf []byte, access ibv.Access) (ibv.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("tcp: register empty buffer: %w", ibv.ErrInvalidArgument)
	}
	if access&ibv.AccessRemoteWrite != 0 && access&ibv.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("tcp: REMOTE_WRITE needs LOCAL_WRITE: %w", ibv.ErrInvalidArgument)
	}
	m := &mr{pd: p, buf: buf, addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), access: access}
	m.unpinned = sync.NewCond(&m.mu)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ibv.ErrClosed
	}
	d := p.dev
	d.keysMu.Lock()
	for {
		m.lkey = rand.Uint32()
		if _, used := d.lkeys[m.lkey]; !used && m.lkey != 0 {
			break
		}
	}
	for {
		m.rkey = rand.Uint32()
		if _, used := d.rkeys[m.rkey]; !used && m.rkey != 0 {
			break
		}
	}
	d.lkeys[m.lkey] = m
	d.rkeys[m.rkey] = m
	d.keysMu.Unlock()
	p.mrs[m] = struct{}{}
	return m, nil
}

// CreateQP creates an RC queue pair in INIT.
func (p *pd) CreateQP(c ibv.CQ, qc ibv.QPCap) (ibv.QP, error) {
	cq, ok := c.(*cq)
	if !ok || cq.dev != p.dev {
		return nil, fmt.Errorf("tcp: CQ of another device or provider: %w", ibv.ErrInvalidArgument)
	}
	if qc.MaxSendWR <= 0 || qc.MaxSendWR > maxQPWR || qc.MaxRdAtomic < 0 {
		return nil, fmt.Errorf("tcp: QP cap send_wr=%d rd_atomic=%d: %w", qc.MaxSendWR, qc.MaxRdAtomic, ibv.ErrInvalidArgument)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ibv.ErrClosed
	}
	d := p.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shut {
		return nil, ibv.ErrClosed
	}
	n, err := d.allocQPNLocked()
	if err != nil {
		return nil, err
	}
	q := newQP(p, cq, qc, n)
	d.qps[n] = q
	p.qps[q] = struct{}{}
	return q, nil
}

// Close destroys the PD's remaining QPs and deregisters its MRs (verbs
// would refuse with EBUSY; releasing is the safer choice for a daemon).
func (p *pd) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	qps := slices.Collect(maps.Keys(p.qps))
	mrs := slices.Collect(maps.Keys(p.mrs))
	p.mu.Unlock()
	for _, q := range qps {
		q.Destroy()
	}
	for _, m := range mrs {
		m.Dereg()
	}
	p.dev.mu.Lock()
	delete(p.dev.pds, p)
	p.dev.mu.Unlock()
	return nil
}

// mr is a registered memory region.
type mr struct {
	pd         *pd
	addr       uint64
	lkey, rkey uint32
	access     ibv.Access
	buf        []byte
	// mu guards dead and pins; read-held while buf is accessed by use.
	mu   sync.RWMutex
	dead bool
	// pins counts transfers that move bytes between buf and a socket
	// (pin/unpin); Dereg waits for them on unpinned (a Cond on mu).
	pins     int
	unpinned *sync.Cond
}

func (m *mr) Addr() uint64 { return m.addr }
func (m *mr) Len() uint64  { return uint64(len(m.buf)) }
func (m *mr) LKey() uint32 { return m.lkey }
func (m *mr) RKey() uint32 { return m.rkey }

// Dereg removes the keys and waits until no copy or transfer into or out
// of the region is in progress; afterwards the provider never touches the
// memory. A transfer blocked on a silent peer ends within its QP's retry
// budget (the QP fails and closes the connection), so Dereg waits at most
// about that long.
func (m *mr) Dereg() error {
	d := m.pd.dev
	d.keysMu.Lock()
	if d.lkeys[m.lkey] == m {
		delete(d.lkeys, m.lkey)
	}
	if d.rkeys[m.rkey] == m {
		delete(d.rkeys, m.rkey)
	}
	d.keysMu.Unlock()
	m.mu.Lock()
	already := m.dead
	m.dead = true
	for m.pins > 0 {
		m.unpinned.Wait()
	}
	m.mu.Unlock()
	m.pd.mu.Lock()
	delete(m.pd.mrs, m)
	m.pd.mu.Unlock()
	if already {
		return ibv.ErrClosed
	}
	return nil
}

// check reports whether [addr, addr+n) may be accessed with need through
// p (PD, access flags, bounds; not registration).
func (m *mr) check(p *pd, need ibv.Access, addr uint64, n uint64) bool {
	if m == nil || m.pd != p || m.access&need != need {
		return false
	}
	r := ibv.RemoteRegion{Base: m.addr, Length: uint64(len(m.buf))}
	return r.Contains(addr, n)
}

// use runs fn on [addr, addr+n) of the region with the registration held,
// after checking PD, access flags and bounds. It reports false (fn not run)
// when any check fails.
func (m *mr) use(p *pd, need ibv.Access, addr uint64, n uint64, fn func(b []byte)) bool {
	if !m.check(p, need, addr, n) {
		return false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.dead {
		return false
	}
	off := addr - m.addr
	fn(m.buf[off : off+n])
	return true
}

// pin returns [addr, addr+n) of the region, after the same checks as use,
// and keeps the region registered until unpin: for a transfer that moves
// the bytes straight between the region and a socket and may block on the
// network, where use's read lock would hold up every other user while a
// Dereg waits.
func (m *mr) pin(p *pd, need ibv.Access, addr uint64, n uint64) ([]byte, bool) {
	if !m.check(p, need, addr, n) {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead {
		return nil, false
	}
	m.pins++
	off := addr - m.addr
	return m.buf[off : off+n], true
}

// unpin ends a pin.
func (m *mr) unpin() {
	m.mu.Lock()
	if m.pins--; m.pins == 0 {
		m.unpinned.Broadcast()
	}
	m.mu.Unlock()
}

// maxCQKeep is the most completions whose array a drained CQ keeps.
const maxCQKeep = 4096

// cq is a completion queue.
type cq struct {
	dev    *Device
	notify chan struct{} // cap 1: a token when completions were added
	done   chan struct{} // closed by Close

	mu     sync.Mutex           // guards wcs, head, closed
	wcs    []ibv.WorkCompletion // wcs[head:] are not polled yet
	head   int
	closed bool
}

// push appends a batch of completions (every WR a response completed, in
// order). Only a push onto an empty queue wakes a waiter: a consumer that
// saw the queue non-empty polls without waiting, so completions that
// arrive while it works are taken in one Poll with no wakeup each.
func (c *cq) push(wcs []ibv.WorkCompletion) {
	if len(wcs) == 0 {
		return
	}
	c.mu.Lock()
	wake := len(c.wcs) == c.head
	if !c.closed {
		c.wcs = append(c.wcs, wcs...)
	}
	c.mu.Unlock()
	if !wake {
		return
	}
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// Poll takes up to len(wcs) completions, oldest first.
func (c *cq) Poll(wcs []ibv.WorkCompletion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, ibv.ErrClosed
	}
	n := copy(wcs, c.wcs[c.head:])
	c.head += n
	if c.head == len(c.wcs) {
		// Reuse the array (no allocation per completion), unless a burst
		// made it large: then let it go.
		c.wcs, c.head = c.wcs[:0], 0
		if cap(c.wcs) > maxCQKeep {
			c.wcs = nil
		}
	}
	return n, nil
}

// Wait returns nil as soon as completions may be available.
func (c *cq) Wait(ctx context.Context) error {
	c.mu.Lock()
	closed, ready := c.closed, len(c.wcs) > c.head
	c.mu.Unlock()
	if closed {
		return ibv.ErrClosed
	}
	if ready {
		return nil
	}
	select {
	case <-c.notify:
		return nil
	case <-c.done:
		return ibv.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the CQ; completions of QPs still attached are dropped.
func (c *cq) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.wcs, c.head = nil, 0
	close(c.done)
	c.mu.Unlock()
	c.dev.mu.Lock()
	delete(c.dev.cqs, c)
	c.dev.mu.Unlock()
	return nil
}

var errShut = errors.New("tcp: device shut down")
