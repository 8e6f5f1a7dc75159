//go:build linux && cgo && !noverbs

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/pegaflow/pegad/internal/ibv"
)

// Lifetimes: every object holds a reference on its parent (PD and CQ on the
// device, MR and QP on the PD, QP on the CQ) and its parent refuses to close
// with ErrInvalidState while references remain, so no C pointer is freed
// under a live child. Each object's mutex guards its C pointer, which is
// nil once destroyed (methods then return ErrClosed).

// device is an open ibv_context on one chosen port.
type device struct {
	lib  *lib
	name string
	opts Options
	lim  devLimits
	spin time.Duration // CQ busy-poll budget (Options.CQSpin)
	// st is the port as last resolved: at Open, and again after an async
	// event changed its GID or LID (events.go). Each QP keeps the state
	// it was created with.
	st  atomic.Pointer[devState]
	evs *asyncEvents // the async-event loop; nil for none

	mu   sync.Mutex // guards ctx, refs and nextVector
	ctx  *C.struct_ibv_context
	refs int // live PDs and CQs
	// nextVector: the comp_vector of the next CQ, round-robin.
	nextVector uint64
}

// devState is what a device says about its port, swapped whole.
type devState struct {
	info ibv.DeviceInfo
	port localPort
}

var _ ibv.Device = (*device)(nil)

func (d *device) state() *devState { return d.st.Load() }

func (d *device) Info() ibv.DeviceInfo { return d.state().info }

func (d *device) AllocPD() (ibv.PD, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return nil, fmt.Errorf("alloc pd on %s: %w", d.name, ibv.ErrClosed)
	}
	var errno C.int
	p := C.pv_alloc_pd(d.lib.c, d.ctx, &errno)
	if p == nil {
		return nil, verbsErr("ibv_alloc_pd", syscall.Errno(errno))
	}
	d.refs++
	return &pd{dev: d, p: p}, nil
}

func (d *device) CreateCQ(depth int) (ibv.CQ, error) {
	if depth <= 0 || (d.lim.maxCQE > 0 && depth > d.lim.maxCQE) {
		return nil, fmt.Errorf("cq depth %d (device max %d): %w", depth, d.lim.maxCQE, ibv.ErrInvalidArgument)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return nil, fmt.Errorf("create cq on %s: %w", d.name, ibv.ErrClosed)
	}
	var errno, fd C.int
	var ch *C.struct_ibv_comp_channel
	// Spread CQs over the device's completion vectors (its interrupt
	// lines, each steerable to its own CPU) instead of all on vector 0.
	vector := 0
	if nv := int(d.ctx.num_comp_vectors); nv > 1 {
		vector = int(d.nextVector % uint64(nv))
		d.nextVector++
	}
	c := C.pv_create_cq(d.lib.c, d.ctx, C.int(depth), C.int(vector), &ch, &fd, &errno)
	if c == nil {
		return nil, verbsErr("ibv_create_cq", syscall.Errno(errno))
	}
	// The dup'd channel fd is non-blocking, so os.NewFile puts it in the
	// netpoller: a blocked Wait parks its goroutine, no thread, no timer.
	f := os.NewFile(uintptr(fd), "ibv_comp_channel")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		C.pv_destroy_cq(d.lib.c, c)
		C.pv_destroy_comp_channel(d.lib.c, ch)
		return nil, fmt.Errorf("completion channel of %s: %w", d.name, err)
	}
	d.refs++
	return &cq{dev: d, c: c, ch: ch, file: f, raw: raw, spin: d.spin,
		done: make(chan struct{}), waiter: make(chan struct{}, 1)}, nil
}

func (d *device) release() {
	d.mu.Lock()
	d.refs--
	d.mu.Unlock()
}

func (d *device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return fmt.Errorf("close %s: %w", d.name, ibv.ErrClosed)
	}
	if d.refs > 0 {
		return fmt.Errorf("close %s: %d PDs/CQs still open: %w", d.name, d.refs, ibv.ErrInvalidState)
	}
	d.evs.stop() // before the context its loop reads goes
	if rc := C.pv_close_device(d.lib.c, d.ctx); rc != 0 {
		return verbsErr("ibv_close_device", syscall.Errno(rc))
	}
	d.ctx = nil
	return nil
}

// pd is a protection domain.
type pd struct {
	dev *device

	mu   sync.Mutex // guards p and refs
	p    *C.struct_ibv_pd
	refs int // live MRs and QPs
}

var _ ibv.PD = (*pd)(nil)

func (p *pd) acquire() (*C.struct_ibv_pd, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.p == nil {
		return nil, fmt.Errorf("pd: %w", ibv.ErrClosed)
	}
	p.refs++
	return p.p, nil
}

func (p *pd) release() {
	p.mu.Lock()
	p.refs--
	p.mu.Unlock()
}

// RegMR registers buf, which must be memory the Go GC does not own (the
// pool's mmap'd region): the HCA keeps using the address after the call.
func (p *pd) RegMR(buf []byte, access ibv.Access) (ibv.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("register empty buffer: %w", ibv.ErrInvalidArgument)
	}
	if access&^(ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead|ibv.AccessMWBind|ibv.AccessRelaxedOrdering) != 0 {
		return nil, fmt.Errorf("access flags %#x: %w", uint32(access), ibv.ErrInvalidArgument)
	}
	if lim := p.dev.lim.maxMRSize; lim > 0 && uint64(len(buf)) > lim {
		return nil, fmt.Errorf("register %d bytes on %s: above the device's max_mr_size %d (split the pool): %w",
			len(buf), p.dev.name, lim, ibv.ErrInvalidArgument)
	}
	pp, err := p.acquire()
	if err != nil {
		return nil, err
	}
	// The address crosses as an integer: it is not a Go pointer C may keep.
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	var errno C.int
	m := C.pv_reg_mr(p.dev.lib.c, pp, C.uintptr_t(addr), C.size_t(len(buf)), C.int(access), &errno)
	if m == nil {
		p.release()
		return nil, verbsErr("ibv_reg_mr", syscall.Errno(errno))
	}
	return &mr{pd: p, m: m, addr: uint64(addr), length: uint64(len(buf)), lkey: uint32(m.lkey), rkey: uint32(m.rkey)}, nil
}

func (p *pd) CreateQP(c ibv.CQ, qc ibv.QPCap) (ibv.QP, error) {
	vc, ok := c.(*cq)
	if !ok || vc.dev != p.dev {
		return nil, fmt.Errorf("create qp: cq is not of device %s: %w", p.dev.name, ibv.ErrInvalidArgument)
	}
	lim := p.dev.lim
	if qc.MaxSendWR <= 0 || (lim.maxQPWR > 0 && (qc.MaxSendWR > lim.maxQPWR || qc.MaxRecvWR > lim.maxQPWR)) {
		return nil, fmt.Errorf("create qp: max_send_wr %d / max_recv_wr %d (device max %d): %w", qc.MaxSendWR, qc.MaxRecvWR, lim.maxQPWR, ibv.ErrInvalidArgument)
	}
	if lim.maxSGE > 0 && qc.MaxSendSGE > lim.maxSGE {
		return nil, fmt.Errorf("create qp: max_send_sge %d (device max %d): %w", qc.MaxSendSGE, lim.maxSGE, ibv.ErrInvalidArgument)
	}
	pp, err := p.acquire()
	if err != nil {
		return nil, err
	}
	cp, err := vc.acquire()
	if err != nil {
		p.release()
		return nil, err
	}
	l := p.dev.lib.c
	var errno C.int
	// At least one receive WR and SGE: some providers reject an empty RQ.
	q := C.pv_create_qp(l, pp, cp, C.uint32_t(qc.MaxSendWR), C.uint32_t(max(1, qc.MaxRecvWR)), C.uint32_t(max(1, qc.MaxSendSGE)), &errno)
	if q == nil {
		vc.release()
		p.release()
		return nil, verbsErr("ibv_create_qp", syscall.Errno(errno))
	}
	st := p.dev.state()
	if rc := C.pv_qp_init(l, q, C.uint8_t(st.port.Num), C.uint16_t(st.port.PKeyIndex)); rc != 0 {
		C.pv_destroy_qp(l, q)
		vc.release()
		p.release()
		return nil, fmt.Errorf("qp to INIT: %w", verbsErr("ibv_modify_qp", syscall.Errno(rc)))
	}
	return &qp{pd: p, cq: vc, st: st, p: q, qpn: uint32(q.qp_num), psn: rand.Uint32() & psnMask,
		maxRd: qc.MaxRdAtomic, state: ibv.QPSInit}, nil
}

func (p *pd) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.p == nil {
		return fmt.Errorf("close pd: %w", ibv.ErrClosed)
	}
	if p.refs > 0 {
		return fmt.Errorf("close pd: %d MRs/QPs still open: %w", p.refs, ibv.ErrInvalidState)
	}
	if rc := C.pv_dealloc_pd(p.dev.lib.c, p.p); rc != 0 {
		return verbsErr("ibv_dealloc_pd", syscall.Errno(rc))
	}
	p.p = nil
	p.dev.release()
	return nil
}

// mr is a registered memory region.
type mr struct {
	pd           *pd
	addr, length uint64
	lkey, rkey   uint32

	mu sync.Mutex // guards m
	m  *C.struct_ibv_mr
}

var _ ibv.MR = (*mr)(nil)

func (m *mr) Addr() uint64 { return m.addr }
func (m *mr) Len() uint64  { return m.length }
func (m *mr) LKey() uint32 { return m.lkey }
func (m *mr) RKey() uint32 { return m.rkey }

func (m *mr) Dereg() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		return fmt.Errorf("dereg mr: %w", ibv.ErrClosed)
	}
	if rc := C.pv_dereg_mr(m.pd.dev.lib.c, m.m); rc != 0 {
		return verbsErr("ibv_dereg_mr", syscall.Errno(rc))
	}
	m.m = nil
	m.pd.release()
	return nil
}

// cq is a completion queue with its own completion channel. Wait busy-polls
// for up to spin, then arms the CQ and parks on the channel's fd in Go's
// netpoller until the HCA signals a completion: no timer on the path (Go
// fires sub-millisecond timers about 1 ms late once the runtime idles).
// Completions found by Wait are kept and handed out by the next Poll, in
// order.
type cq struct {
	dev  *device
	spin time.Duration // busy-poll budget of Wait before it blocks
	// ch, file and raw are set at creation; Close closes file (waking a
	// parked Wait and waiting for its callback) before it frees ch.
	ch     *C.struct_ibv_comp_channel
	file   *os.File // dup of ch's fd, in the netpoller
	raw    syscall.RawConn
	done   chan struct{} // closed by Close; wakes Waits queued on waiter
	waiter chan struct{} // one token: the Wait that may block on the channel
	// beforeArm, when set (tests), runs in Wait just before it arms the CQ.
	beforeArm func()

	mu       sync.Mutex // guards c, fileShut, stash, buf and refs
	c        *C.struct_ibv_cq
	fileShut bool      // file and done are closed
	stash    []C.pv_wc // polled by Wait, not yet returned by Poll
	buf      []C.pv_wc // scratch for Poll
	refs     int       // QPs created on this CQ
	// unacked: events taken from the channel and not yet acked
	// (ackBatch). Added to by Wait and its park callback; acked, under
	// mu, by Wait once it reaches ackBatch and by Close before destroy
	// (ibv_destroy_cq waits for every event to be acked).
	unacked atomic.Uint32
}

// ackBatch is how many completion events a CQ takes before it acks them
// in one ibv_ack_cq_events call (a mutex in libibverbs per call).
const ackBatch = 32

// ackLocked acks the events taken so far once there are at least min.
// c.mu held, c.c live.
func (c *cq) ackLocked(min uint32) {
	if n := c.unacked.Load(); n > 0 && n >= min {
		C.pv_ack_cq_events(c.dev.lib.c, c.c, C.uint(n))
		c.unacked.Add(-n)
	}
}

var _ ibv.CQ = (*cq)(nil)

func (c *cq) acquire() (*C.struct_ibv_cq, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == nil {
		return nil, fmt.Errorf("cq: %w", ibv.ErrClosed)
	}
	c.refs++
	return c.c, nil
}

func (c *cq) release() {
	c.mu.Lock()
	c.refs--
	c.mu.Unlock()
}

// pollLocked polls up to n completions into dst's tail. c.mu held.
func (c *cq) pollLocked(dst []C.pv_wc, n int) ([]C.pv_wc, error) {
	start := len(dst)
	dst = slices.Grow(dst, n)[:start+n] // allocates only when the buffer is too small
	r := C.pv_poll_cq(c.c, C.int(n), &dst[start])
	if r < 0 {
		return dst[:start], pollErr(int(r))
	}
	return dst[:start+int(r)], nil
}

func (c *cq) Poll(wcs []ibv.WorkCompletion) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == nil {
		return 0, fmt.Errorf("poll cq: %w", ibv.ErrClosed)
	}
	n := copyWCs(wcs, c.stash)
	c.stash = c.stash[:copy(c.stash, c.stash[n:])]
	if n == len(wcs) {
		return n, nil
	}
	var err error
	c.buf, err = c.pollLocked(c.buf[:0], len(wcs)-n)
	n += copyWCs(wcs[n:], c.buf)
	if err != nil && n == 0 {
		return 0, err
	}
	return n, nil
}

func copyWCs(dst []ibv.WorkCompletion, src []C.pv_wc) int {
	n := min(len(dst), len(src))
	for i := range n {
		w := &src[i]
		st := ibv.WCStatus(w.status)
		op := wcOpcode(int(w.opcode))
		if st != ibv.WCSuccess {
			op = -1 // undefined for failed completions in libibverbs
		}
		dst[i] = ibv.WorkCompletion{ID: uint64(w.wr_id), Status: st, Op: op, Bytes: uint32(w.byte_len),
			QPN: uint32(w.qp_num), VendorErr: uint32(w.vendor_err)}
	}
	return n
}

const waitBatch = 64

// Wait returns once a completion is stashed for Poll, ctx is done or the CQ
// is closed. It follows ibv_get_cq_event(3): arm (ibv_req_notify_cq), then
// poll again, since a CQE added between the last poll and the arm raises
// no event; block on the channel only when that poll is empty; after an
// event (acked at once) re-arm and poll again. An event can come with no
// CQE (one polled after the arm): the loop simply re-arms.
func (c *cq) Wait(ctx context.Context) error {
	if ready, err := c.pollStash(); ready || err != nil {
		return err
	}
	for deadline := time.Now().Add(c.spin); time.Now().Before(deadline); {
		if err := ctx.Err(); err != nil {
			return err
		}
		runtime.Gosched()
		if ready, err := c.pollStash(); ready || err != nil {
			return err
		}
	}
	// One Wait at a time parks on the channel: an event wakes one reader.
	select {
	case c.waiter <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return fmt.Errorf("wait cq: %w", ibv.ErrClosed)
	}
	defer func() { <-c.waiter }()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if c.beforeArm != nil {
			c.beforeArm()
		}
		c.mu.Lock()
		if c.c == nil {
			c.mu.Unlock()
			return fmt.Errorf("wait cq: %w", ibv.ErrClosed)
		}
		// Events of earlier arms nobody blocked for (the poll after the
		// arm found the CQE) would pile up in the kernel and wake later
		// Waits for nothing: take them first. c.mu keeps Close from
		// freeing the channel meanwhile.
		for {
			rc := C.pv_get_cq_event(c.dev.lib.c, c.ch)
			if rc == C.EAGAIN {
				break
			}
			if rc != 0 {
				c.mu.Unlock()
				return verbsErr("ibv_get_cq_event", syscall.Errno(rc))
			}
			c.unacked.Add(1)
		}
		c.ackLocked(ackBatch)
		if rc := C.pv_req_notify_cq(c.c); rc != 0 {
			c.mu.Unlock()
			return verbsErr("ibv_req_notify_cq", syscall.Errno(rc))
		}
		ready, err := c.pollStashLocked()
		c.mu.Unlock()
		if ready || err != nil {
			return err
		}
		if err := c.block(ctx); err != nil {
			return err
		}
	}
}

// pollStash polls into the stash unless it holds completions already.
func (c *cq) pollStash() (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == nil {
		return false, fmt.Errorf("wait cq: %w", ibv.ErrClosed)
	}
	return c.pollStashLocked()
}

func (c *cq) pollStashLocked() (bool, error) {
	var err error
	if len(c.stash) == 0 {
		c.stash, err = c.pollLocked(c.stash, waitBatch)
	}
	return len(c.stash) > 0, err
}

// block parks until the channel has an event, takes and acks it. ctx ends
// the park through a read deadline.
func (c *cq) block(ctx context.Context) error {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = c.file.SetReadDeadline(time.Unix(1, 0))
		close(fired)
	})
	var rc C.int
	err := c.raw.Read(func(uintptr) bool {
		// Runs with the file referenced: Close waits for it to return
		// before it frees the channel and the CQ the ack touches.
		rc = C.pv_get_cq_event(c.dev.lib.c, c.ch)
		if rc == 0 {
			c.unacked.Add(1) // acked by the next Wait or Close
		}
		return rc != C.EAGAIN
	})
	if !stop() {
		<-fired
		_ = c.file.SetReadDeadline(time.Time{})
	}
	if err == nil {
		if rc != 0 {
			return verbsErr("ibv_get_cq_event", syscall.Errno(rc))
		}
		return nil
	}
	select {
	case <-c.done: // Close closes done before the file
		return fmt.Errorf("wait cq: %w", ibv.ErrClosed)
	default:
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("wait cq: completion channel: %w", err)
}

func (c *cq) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == nil {
		return fmt.Errorf("close cq: %w", ibv.ErrClosed)
	}
	if c.refs > 0 {
		return fmt.Errorf("close cq: %d QPs still use it: %w", c.refs, ibv.ErrInvalidState)
	}
	// Closing the file wakes a parked Wait and returns once its
	// ibv_get_cq_event/ack callback has finished.
	if !c.fileShut {
		c.fileShut = true
		close(c.done)
		if err := c.file.Close(); err != nil {
			return fmt.Errorf("close cq: completion channel: %w", err)
		}
	}
	c.ackLocked(1) // no callback runs any more: the count is final
	l := c.dev.lib.c
	if rc := C.pv_destroy_cq(l, c.c); rc != 0 {
		return verbsErr("ibv_destroy_cq", syscall.Errno(rc))
	}
	c.c = nil
	c.stash = nil
	if rc := C.pv_destroy_comp_channel(l, c.ch); rc != 0 {
		c.dev.release()
		return verbsErr("ibv_destroy_comp_channel", syscall.Errno(rc))
	}
	c.ch = nil
	c.dev.release()
	return nil
}

// qp is an RC queue pair.
type qp struct {
	pd    *pd
	cq    *cq
	st    *devState // the port as resolved when the QP was created
	qpn   uint32
	psn   uint32 // our initial send PSN, sent in the endpoint
	maxRd int    // QPCap.MaxRdAtomic; 0: ConnectAttr decides

	// mu guards p and state. PostSend holds it shared across the C call so
	// Destroy (exclusive) never frees the QP under a post.
	mu    sync.RWMutex
	p     *C.struct_ibv_qp
	state ibv.QPState // the last state this process moved the QP to
}

var _ ibv.QP = (*qp)(nil)

func (q *qp) QPN() uint32 { return q.qpn }

// State asks the HCA (a QP moves to ERROR by itself after a failed work
// request) and falls back to the last state set here. A destroyed QP
// reports ERROR.
func (q *qp) State() ibv.QPState {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.p == nil {
		return ibv.QPSError
	}
	var s C.int
	if C.pv_qp_state(q.pd.dev.lib.c, q.p, &s) == 0 {
		return ibv.QPState(s)
	}
	return q.state
}

func (q *qp) Endpoint() ibv.Endpoint {
	info := q.st.info
	return ibv.Endpoint{GID: info.GID, LID: info.LID, QPN: q.qpn, PSN: q.psn, MTU: info.MTU,
		MaxDestRd: clampRd(0, q.st.port.MaxRdAtom)}
}

func (q *qp) Connect(remote ibv.Endpoint, attr ibv.ConnectAttr) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p == nil {
		return fmt.Errorf("connect qp %d: %w", q.qpn, ibv.ErrClosed)
	}
	if q.state != ibv.QPSInit {
		return fmt.Errorf("connect qp %d in state %v: %w", q.qpn, q.state, ibv.ErrInvalidState)
	}
	if q.maxRd > 0 && (attr.MaxRdAtomic == 0 || int(attr.MaxRdAtomic) > q.maxRd) {
		attr.MaxRdAtomic = uint8(min(q.maxRd, 255))
	}
	params, err := buildConnParams(q.st.port, q.psn, remote, attr)
	if err != nil {
		return fmt.Errorf("connect qp %d to qpn %d: %w", q.qpn, remote.QPN, err)
	}
	cp := toC(params)
	l := q.pd.dev.lib.c
	if rc := C.pv_qp_rtr(l, q.p, &cp); rc != 0 {
		return fmt.Errorf("qp %d to RTR: %w", q.qpn, verbsErr("ibv_modify_qp", syscall.Errno(rc)))
	}
	q.state = ibv.QPSRTR
	if rc := C.pv_qp_rts(l, q.p, &cp); rc != 0 {
		return fmt.Errorf("qp %d to RTS: %w", q.qpn, verbsErr("ibv_modify_qp", syscall.Errno(rc)))
	}
	q.state = ibv.QPSRTS
	return nil
}

// wrBuf is PostSend's scratch: the C view of a chain and the bad index.
// Pooled so a post allocates nothing in steady state.
type wrBuf struct {
	wrs []C.pv_wr
	bad C.int
}

var wrPool = sync.Pool{New: func() any { return new(wrBuf) }}

// IBV_SEND_SIGNALED of enum ibv_send_flags.
const sendSignaled = 1 << 1

func (q *qp) PostSend(wrs []ibv.SendWR) (int, error) {
	if len(wrs) == 0 {
		return -1, nil
	}
	// A malformed WR fails where the HCA would: the ones before it are
	// posted, it and the rest are not.
	badIdx, badErr := checkWRs(wrs)
	if badIdx >= 0 {
		wrs = wrs[:badIdx]
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.p == nil {
		return -1, fmt.Errorf("post on qp %d: %w", q.qpn, ibv.ErrClosed)
	}
	// ERROR accepts posts (they complete with WR_FLUSH_ERR); RESET, INIT
	// and RTR have no send queue running.
	if q.state != ibv.QPSRTS && q.state != ibv.QPSError {
		return -1, fmt.Errorf("post on qp %d in state %v: %w", q.qpn, q.state, ibv.ErrInvalidState)
	}
	if len(wrs) > 0 {
		bp := wrPool.Get().(*wrBuf)
		defer wrPool.Put(bp)
		bp.wrs = slices.Grow(bp.wrs[:0], len(wrs))[:len(wrs)]
		cw := bp.wrs
		for i, w := range wrs {
			var flags C.uint32_t
			if w.Signaled {
				flags = sendSignaled
			}
			cw[i] = C.pv_wr{wr_id: C.uint64_t(w.ID), laddr: C.uint64_t(w.LocalAddr), raddr: C.uint64_t(w.RemoteAddr),
				len: C.uint32_t(w.Length), lkey: C.uint32_t(w.LKey), rkey: C.uint32_t(w.RKey),
				opcode: C.uint32_t(w.Op), flags: flags}
		}
		if rc := C.pv_post_send(q.p, &cw[0], C.int(len(cw)), &bp.bad); rc != 0 {
			return int(bp.bad), fmt.Errorf("post on qp %d: %w", q.qpn, verbsErr("ibv_post_send", syscall.Errno(rc)))
		}
	}
	return badIdx, badErr
}

func (q *qp) ToError() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p == nil {
		return fmt.Errorf("qp %d to ERROR: %w", q.qpn, ibv.ErrClosed)
	}
	if rc := C.pv_qp_to_error(q.pd.dev.lib.c, q.p); rc != 0 {
		return fmt.Errorf("qp %d to ERROR: %w", q.qpn, verbsErr("ibv_modify_qp", syscall.Errno(rc)))
	}
	q.state = ibv.QPSError
	return nil
}

// Destroy releases the QP. libibverbs flushes its outstanding work
// requests; once ibv_destroy_qp returns the HCA no longer touches their
// memory, and their completions may never be polled.
func (q *qp) Destroy() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p == nil {
		return fmt.Errorf("destroy qp %d: %w", q.qpn, ibv.ErrClosed)
	}
	if rc := C.pv_destroy_qp(q.pd.dev.lib.c, q.p); rc != 0 {
		return fmt.Errorf("destroy qp %d: %w", q.qpn, verbsErr("ibv_destroy_qp", syscall.Errno(rc)))
	}
	q.p = nil
	q.state = ibv.QPSError
	q.cq.release()
	q.pd.release()
	return nil
}
