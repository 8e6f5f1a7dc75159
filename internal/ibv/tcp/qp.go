package tcp

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/ibv"
)

// qp is an RC queue pair. Its requester side has two goroutines, both
// counted by wg and both gone once Destroy returns:
//   - the sender (started by Connect) dials the remote device lazily, sends
//     request frames in post order and enforces the retry budget; it exits
//     when the QP leaves RTS (ctx is cancelled then).
//   - one reader per dialed data connection applies responses; it exits when
//     its connection closes.
//
// The responder side of the QP (connections accepted by the device
// listener) is served by the device; the QP only remembers those
// connections in respConns so that ERROR and Destroy close them.
type qp struct {
	dev *Device
	pd  *pd
	cq  *cq
	cap ibv.QPCap
	qpn uint32
	psn uint32
	// secret is what a data connection to this QP presents in its hello
	// (Endpoint.Secret); immutable.
	secret [16]byte
	log    zerolog.Logger

	ctx    context.Context // cancelled when the QP leaves RTS
	cancel context.CancelFunc
	kick   chan struct{} // cap 1: wakes the sender
	wg     sync.WaitGroup
	// lastRecv is when the reader last received any byte on the data
	// connection (monotonic nanoseconds since clockBase). As on an RC QP,
	// whose ACK timeout runs per MTU-sized packet, a response arriving
	// byte by byte is progress even before a whole frame (up to 1 MiB) is
	// in: on a slow shared link one frame may take seconds. Atomic, not
	// under mu: the reader stamps it between reads without the lock.
	lastRecv atomic.Int64
	// lastActive (same clock) is when a data connection of the QP, in
	// either direction, last moved a request or response, was admitted or
	// closed: what DataActivity reports to an owner looking for QPs whose
	// peer is gone.
	lastActive atomic.Int64
	// used: a data connection was ever admitted or dialed.
	used atomic.Bool

	mu           sync.Mutex // guards everything below
	state        ibv.QPState
	destroyed    bool
	remote       ibv.Endpoint
	budget       time.Duration // retry budget: no response for this long → RETRY_EXC_ERR
	rdLimit      int           // max READs in flight
	sq           []*wqe        // posted, not yet completed, in post order
	nextSeq      uint64
	sendIdx      int // sq[:sendIdx] were sent (or completed); sq[sendIdx] is next
	rdOut        int // READs sent and not completed
	conn         *dconn
	lastProgress time.Time // last request sent with nothing in flight, or last response frame; see also lastRecv
	respConns    map[*dconn]struct{}
	// flushPending (Faults.AsyncFlush): ToError moved the QP to ERROR but
	// its outstanding WRs are not flushed yet; the reader still applies
	// responses meanwhile, as a real HCA may still DMA them. Cleared by
	// failLocked.
	flushPending bool
	// prewarm: Prewarm asked for the data connection before any work
	// request; the sender dials when idle, and a failed dial fails nothing.
	prewarm bool
	// landing: the reader is reading a READ payload into local memory
	// with mu dropped (landLocked); landed (a Cond on mu) signals its end.
	landing bool
	landed  *sync.Cond
	// Recycled storage (no allocation per work request): free wqes and
	// the completions being delivered.
	free []*wqe
	wcs  []ibv.WorkCompletion
}

// newWQELocked takes a recycled wqe (completeLocked returns them), so a
// work request allocates nothing once the QP is warm.
func (q *qp) newWQELocked() *wqe {
	if n := len(q.free); n > 0 {
		w := q.free[n-1]
		q.free = q.free[:n-1]
		return w
	}
	return new(wqe)
}

// wqe is one posted work request.
type wqe struct {
	wr     ibv.SendWR
	seq    uint64
	done   bool
	status ibv.WCStatus
	cause  error  // of a failed status, when known (WorkCompletion.Cause)
	got    uint32 // READ bytes applied so far
}

var _ ibv.QP = (*qp)(nil)

func newQP(p *pd, c *cq, qc ibv.QPCap, n uint32) *qp {
	ctx, cancel := context.WithCancel(context.Background())
	q := &qp{
		dev: p.dev, pd: p, cq: c, cap: qc, qpn: n,
		psn:       rand.Uint32() & qpnMask,
		log:       p.dev.log.With().Uint32("qpn", n).Logger(),
		ctx:       ctx,
		cancel:    cancel,
		kick:      make(chan struct{}, 1),
		state:     ibv.QPSInit,
		nextSeq:   1,
		respConns: make(map[*dconn]struct{}),
	}
	crand.Read(q.secret[:]) // never fails (Go >= 1.24)
	q.landed = sync.NewCond(&q.mu)
	q.touch()
	return q
}

// touch stamps lastActive.
func (q *qp) touch() { q.lastActive.Store(int64(time.Since(clockBase))) }

// forgetRespConn drops an accepted connection that is closing.
func (q *qp) forgetRespConn(c *dconn) {
	q.mu.Lock()
	delete(q.respConns, c)
	q.mu.Unlock()
	q.touch()
}

// DataActivity reports how many data connections the QP has open (the one
// it dialed and those its remote dialed to it), when one last carried a
// request or response, was opened or closed, and whether it ever had one.
// A holder's connection manager reaps QPs whose connections are all gone
// for a while: their requester is gone (a live requester keeps the
// connection it dialed for its first work request open while it lives).
func (q *qp) DataActivity() (open int, last time.Time, used bool) {
	q.mu.Lock()
	open = len(q.respConns)
	if q.conn != nil {
		open++
	}
	q.mu.Unlock()
	return open, clockBase.Add(time.Duration(q.lastActive.Load())), q.used.Load()
}

func (q *qp) QPN() uint32 { return q.qpn }

func (q *qp) State() ibv.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

func (q *qp) Endpoint() ibv.Endpoint {
	return ibv.Endpoint{GID: q.dev.info.GID, QPN: q.qpn, PSN: q.psn, MTU: mtu, Addr: q.dev.info.Addr, Secret: q.secret}
}

// Connect moves INIT→RTR→RTS toward remote and starts the sender. The data
// connection is dialed lazily by the first PostSend, so the remote QP may
// reach RTR after this one (as with verbs, the requester retries meanwhile).
// A Timeout of 0 (infinite in verbs) gets the default budget here.
func (q *qp) Connect(remote ibv.Endpoint, attr ibv.ConnectAttr) error {
	if remote.QPN > qpnMask || remote.PSN > qpnMask || remote.Addr == "" || len(remote.Addr) > maxAddrLen {
		return fmt.Errorf("tcp: connect qpn=%d to %+v: %w", q.qpn, remote, ibv.ErrInvalidArgument)
	}
	if attr.Timeout > 31 {
		return fmt.Errorf("tcp: connect timeout exponent %d: %w", attr.Timeout, ibv.ErrInvalidArgument)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return ibv.ErrClosed
	}
	if q.state != ibv.QPSInit {
		return fmt.Errorf("tcp: connect qpn=%d in %s: %w", q.qpn, q.state, ibv.ErrInvalidState)
	}
	if attr.Timeout == 0 {
		def := ibv.DefaultConnectAttr()
		attr.Timeout, attr.RetryCnt = def.Timeout, def.RetryCnt
	}
	q.remote = remote
	q.budget = max(attr.RetryBudget(), time.Millisecond)
	q.rdLimit = maxRdAtomic
	if q.cap.MaxRdAtomic > 0 {
		q.rdLimit = min(q.rdLimit, q.cap.MaxRdAtomic)
	}
	if attr.MaxRdAtomic > 0 {
		q.rdLimit = min(q.rdLimit, int(attr.MaxRdAtomic))
	}
	q.state = ibv.QPSRTS
	q.log = q.log.With().Str("remote", remote.Addr).Uint32("remote_qpn", remote.QPN).Logger()
	q.wg.Add(1)
	go q.sender()
	return nil
}

// Prewarm asks the sender to dial the data connection now instead of at
// the first PostSend. A requester's connection manager calls it right
// after the handshake: a live requester then holds its data connections
// open from the start, so a holder can tell a connection whose requester
// died before its first READ (none open for the idle time) from one
// whose requester is merely idle. A dial that fails (the remote is gone)
// fails nothing: the first work request dials again, as without it.
func (q *qp) Prewarm() {
	q.mu.Lock()
	if q.state != ibv.QPSRTS || q.conn != nil {
		q.mu.Unlock()
		return
	}
	q.prewarm = true
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// PostSend queues wrs in order. On an ERROR QP the post succeeds and every
// WR completes with WR_FLUSH_ERR, as with verbs. Before RTS it fails with
// ErrInvalidState (bad 0).
func (q *qp) PostSend(wrs []ibv.SendWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return 0, ibv.ErrClosed
	}
	if q.state != ibv.QPSRTS && q.state != ibv.QPSError {
		return 0, fmt.Errorf("tcp: post on qpn=%d in %s: %w", q.qpn, q.state, ibv.ErrInvalidState)
	}
	defer q.completeLocked()
	// The WRs posted before a refused one are posted (as with verbs): the
	// sender must hear of them on every return path, or they would sit in
	// the queue with nothing in flight and no retry budget running.
	posted := 0
	defer func() {
		if posted > 0 && q.state == ibv.QPSRTS {
			select {
			case q.kick <- struct{}{}:
			default:
			}
		}
	}()
	for i, wr := range wrs {
		if wr.Op != ibv.OpRDMARead && wr.Op != ibv.OpRDMAWrite {
			return i, fmt.Errorf("tcp: post wr_id=%d opcode %s: %w", wr.ID, wr.Op, ibv.ErrInvalidArgument)
		}
		if len(q.sq) >= q.cap.MaxSendWR {
			return i, fmt.Errorf("tcp: post wr_id=%d: %d outstanding: %w", wr.ID, len(q.sq), ibv.ErrQueueFull)
		}
		w := q.newWQELocked()
		w.wr, w.seq = wr, q.nextSeq
		q.nextSeq++
		if q.state == ibv.QPSError {
			w.done, w.status = true, ibv.WCWRFlushErr
		}
		q.sq = append(q.sq, w)
		posted++
	}
	return -1, nil
}

// ToError moves the QP to ERROR: every outstanding WR is completed with
// WR_FLUSH_ERR before ToError returns, and no response byte is applied to
// local memory afterwards. With Faults.AsyncFlush set on the device and WRs
// outstanding, it returns at once instead: responses in flight may still
// land until the flush completions are delivered, AsyncFlush later.
func (q *qp) ToError() error {
	delay := q.dev.currentFaults().AsyncFlush
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return ibv.ErrClosed
	}
	if q.flushPending {
		return nil // already going to ERROR; the flush is scheduled
	}
	if delay <= 0 || q.state != ibv.QPSRTS || len(q.sq) == 0 {
		q.failLocked(nil, ibv.WCWRFlushErr)
		return nil
	}
	// ERROR now for everyone else (State, PostSend, the sender, which
	// exits), but the reader keeps applying responses until the flush.
	q.state = ibv.QPSError
	q.flushPending = true
	q.log.Debug().Dur("async_flush", delay).Int("outstanding", len(q.sq)).Msg("QP to ERROR; flush delayed")
	q.wg.Add(1)
	go q.delayedFlush(delay)
	return nil
}

// delayedFlush completes ToError under Faults.AsyncFlush: after delay it
// flushes every outstanding WR, unless failLocked ran meanwhile (Destroy,
// a connection loss) or the QP was cancelled. Counted by q.wg.
func (q *qp) delayedFlush(delay time.Duration) {
	defer q.wg.Done()
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-q.ctx.Done():
		return // failLocked ran (it cancels ctx and clears flushPending)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.flushPending && !q.destroyed {
		q.failLocked(nil, ibv.WCWRFlushErr)
	}
}

// Destroy flushes outstanding WRs (their completions go to the CQ), closes
// the QP's connections and waits for its goroutines.
func (q *qp) Destroy() error {
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return ibv.ErrClosed
	}
	// destroyed first: failLocked may wait for a landing payload (mu
	// dropped), and a concurrent Destroy or post must see ErrClosed.
	q.destroyed = true
	q.failLocked(nil, ibv.WCWRFlushErr)
	q.mu.Unlock()
	q.cancel()
	q.wg.Wait()
	d := q.dev
	d.mu.Lock()
	if d.qps[q.qpn] == q {
		delete(d.qps, q.qpn)
	}
	d.mu.Unlock()
	q.pd.mu.Lock()
	delete(q.pd.qps, q)
	q.pd.mu.Unlock()
	return nil
}

// failLocked moves the QP to ERROR: w (if any) completes with st, every
// other outstanding WR with WR_FLUSH_ERR; connections are closed so the
// goroutines exit.
func (q *qp) failLocked(w *wqe, st ibv.WCStatus) { q.failCauseLocked(w, st, nil) }

// failCauseLocked is failLocked with the cause w's completion carries.
func (q *qp) failCauseLocked(w *wqe, st ibv.WCStatus, cause error) {
	if w != nil && !w.done {
		w.done, w.status, w.cause = true, st, cause
		q.log.Debug().Uint64("wr_id", w.wr.ID).Stringer("status", st).Msg("work request failed; QP to ERROR")
	}
	for _, o := range q.sq {
		if !o.done {
			o.done, o.status = true, ibv.WCWRFlushErr
		}
	}
	q.state = ibv.QPSError
	q.flushPending = false
	q.rdOut = 0
	q.sendIdx = 0
	q.cancel()
	if q.conn != nil {
		q.conn.Close() // ends a payload read in landLocked
		q.conn = nil
	}
	for c := range q.respConns {
		c.Close()
	}
	clear(q.respConns)
	// A payload may be landing in local memory (mu dropped for the read):
	// no flush completion and no return before it is over.
	for q.landing {
		q.landed.Wait()
	}
	q.completeLocked()
}

// completeLocked delivers completions from the head of the send queue
// while they are done, in post order.
func (q *qp) completeLocked() {
	if q.landing {
		return // failLocked or the reader delivers once the payload landed
	}
	wcs := q.wcs[:0]
	n := 0
	for n < len(q.sq) && q.sq[n].done {
		w := q.sq[n]
		if w.wr.Signaled || w.status != ibv.WCSuccess {
			wc := ibv.WorkCompletion{ID: w.wr.ID, Status: w.status, Op: w.wr.Op, QPN: q.qpn, Cause: w.cause}
			if w.status == ibv.WCSuccess {
				wc.Bytes = w.wr.Length
			}
			wcs = append(wcs, wc)
		}
		q.sq[n] = nil
		*w = wqe{}
		q.free = append(q.free, w)
		n++
	}
	if n == 0 {
		return
	}
	q.wcs = wcs[:0]
	// Shift down rather than reslice, so the queue keeps its array (at
	// most the send queue depth of pointers to move).
	k := copy(q.sq, q.sq[n:])
	clear(q.sq[k:])
	q.sq = q.sq[:k]
	q.sendIdx = max(0, q.sendIdx-n)
	q.cq.push(wcs)
}

// inFlightLocked reports whether a sent WR awaits its response. Responses
// are accepted only in order (applyLocked) and done WRs are popped at once,
// so in RTS every sent WR still in sq is in flight.
func (q *qp) inFlightLocked() bool { return q.sendIdx > 0 }

// firstPendingLocked is the oldest WR not yet completed (nil when none).
func (q *qp) firstPendingLocked() *wqe {
	for _, w := range q.sq {
		if !w.done {
			return w
		}
	}
	return nil
}

// sender sends posted WRs in order; see qp.
func (q *qp) sender() {
	defer q.wg.Done()
	hdr := make([]byte, 0, 64)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		q.mu.Lock()
		wait := q.sendStepLocked()
		var tick <-chan time.Time
		if wait == stepWaitInFlight {
			timer.Reset(q.tickLocked())
			tick = timer.C
		}
		switch wait {
		case stepExit:
			q.mu.Unlock()
			return
		case stepDial:
			q.mu.Unlock()
			q.dial()
			continue
		case stepSend:
			w, c := q.sq[q.sendIdx], q.conn
			if w.wr.Op == ibv.OpRDMARead {
				q.rdOut++
			}
			if !q.inFlightLocked() {
				q.lastProgress = time.Now()
			}
			q.sendIdx++
			wr, seq, stall := w.wr, w.seq, q.budget
			q.mu.Unlock()
			q.send(c, wr, seq, hdr, stall)
			continue
		}
		q.mu.Unlock()
		select {
		case <-q.ctx.Done():
			return
		case <-q.kick:
		case <-tick:
		}
	}
}

type step int

const (
	stepExit step = iota
	stepIdle
	stepWaitInFlight
	stepDial
	stepSend
)

// sendStepLocked decides the sender's next step, failing the QP when the
// retry budget ran out or the next WR's local memory is invalid.
func (q *qp) sendStepLocked() step {
	if q.state != ibv.QPSRTS {
		return stepExit
	}
	inFlight := q.inFlightLocked()
	if inFlight && time.Since(q.progressLocked()) > q.budget {
		q.log.Warn().Dur("budget", q.budget).Msg("no response within retry budget")
		q.failLocked(q.firstPendingLocked(), ibv.WCRetryExcErr)
		return stepExit
	}
	wait := stepIdle
	if inFlight {
		wait = stepWaitInFlight
	}
	if q.sendIdx >= len(q.sq) {
		if q.prewarm && q.conn == nil && !inFlight {
			q.prewarm = false
			return stepDial
		}
		return wait
	}
	w := q.sq[q.sendIdx]
	if w.wr.Op == ibv.OpRDMARead && q.rdOut >= q.rdLimit {
		return wait
	}
	if q.conn == nil {
		if inFlight {
			return wait // the reader is tearing the old connection down
		}
		q.prewarm = false
		return stepDial
	}
	need := ibv.Access(0)
	if w.wr.Op == ibv.OpRDMARead {
		need = ibv.AccessLocalWrite
	}
	m := q.dev.lookupKey(w.wr.LKey, true)
	if !m.use(q.pd, need, w.wr.LocalAddr, uint64(w.wr.Length), func([]byte) {}) {
		q.failLocked(w, ibv.WCLocProtErr)
		return stepExit
	}
	return stepSend
}

// progressLocked is when the QP last made progress: a request sent with
// nothing in flight, a response frame applied, or any response byte
// received (lastRecv). The retry budget runs from it.
func (q *qp) progressLocked() time.Time {
	last := q.lastProgress
	if r := clockBase.Add(time.Duration(q.lastRecv.Load())); r.After(last) {
		last = r
	}
	return last
}

// clockBase anchors lastRecv stamps; times derived from it keep Go's
// monotonic clock reading.
var clockBase = time.Now()

func (q *qp) tickLocked() time.Duration {
	return min(max(q.budget/8, time.Millisecond), 50*time.Millisecond)
}

// dial connects to the remote device and says hello, retrying until the
// retry budget is spent (the remote may be restarting or not yet RTR).
func (q *qp) dial() {
	q.mu.Lock()
	remote, budget := q.remote, q.budget
	q.mu.Unlock()
	deadline := time.Now().Add(budget)
	backoff := 2 * time.Millisecond
	var lastErr error
	for {
		c, err := q.dialOnce(remote, deadline)
		if err == nil {
			q.mu.Lock()
			if q.state != ibv.QPSRTS || q.conn != nil {
				q.mu.Unlock()
				c.Close()
				q.dev.untrackConn(c)
				return
			}
			q.conn = c
			q.prewarm = false
			q.used.Store(true)
			q.touch()
			q.wg.Add(1)
			go q.reader(c)
			q.mu.Unlock()
			return
		}
		lastErr = err
		if q.ctx.Err() != nil {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		select {
		case <-q.ctx.Done():
			return
		case <-time.After(min(backoff, left)):
		}
		backoff = min(backoff*2, 100*time.Millisecond)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state == ibv.QPSRTS && q.firstPendingLocked() == nil {
		// A prewarm dial with no work waiting: nothing fails, the first
		// work request dials again.
		q.log.Debug().Err(lastErr).Msg("prewarm dial failed; the first work request dials again")
		return
	}
	if q.state == ibv.QPSRTS {
		q.log.Warn().Err(lastErr).Msg("remote unreachable within retry budget")
		q.failCauseLocked(q.firstPendingLocked(), ibv.WCRetryExcErr, lastErr)
	}
}

func (q *qp) dialOnce(remote ibv.Endpoint, deadline time.Time) (*dconn, error) {
	ctx, cancel := context.WithDeadline(q.ctx, deadline)
	defer cancel()
	var nd net.Dialer
	raw, err := nd.DialContext(ctx, "tcp", remote.Addr)
	if err != nil {
		return nil, err
	}
	c := newDconn(raw)
	if !q.dev.trackConn(c) {
		c.Close()
		return nil, errShut
	}
	ok := false
	defer func() {
		if !ok {
			c.Close()
			q.dev.untrackConn(c)
		}
	}()
	stop := context.AfterFunc(ctx, c.Close) // cancel or deadline aborts the hello
	defer stop()
	hello := appendHello(nil, q.qpn, remote.QPN, q.psn, q.dev.info.GID, remote.Secret, q.dev.info.Addr)
	if err := c.write(hello, nil, 0); err != nil { // bounded by stop
		return nil, err
	}
	var buf [prefixLen + fixedHelloAck + 8]byte
	m, err := readFrame(c.c, buf[:])
	if err != nil {
		return nil, err
	}
	if m.typ != tHelloAck {
		return nil, fmt.Errorf("%w: hello answered with type %d", errFrame, m.typ)
	}
	if m.status != stOK {
		return nil, fmt.Errorf("tcp: hello rejected by %s qpn=%d: status %d", remote.Addr, remote.QPN, m.status)
	}
	if !stop() {
		return nil, ctx.Err()
	}
	ok = true
	return c, nil
}

// send writes the request frames of w on c. A write error means the
// connection is broken; the reader sees it too and fails the QP. A remote
// that takes no byte for the retry budget fails the write (as an RC QP
// whose packets go unacknowledged through all its retries): the closed
// connection then fails the QP with RETRY_EXC_ERR. Bytes taken count as
// progress for the retry budget, as ACKs of WRITE packets do.
func (q *qp) send(c *dconn, wr ibv.SendWR, seq uint64, hdr []byte, stall time.Duration) {
	if wr.Op == ibv.OpRDMARead {
		if err := c.write(appendReadReq(hdr[:0], seq, wr.RemoteAddr, wr.RKey, wr.Length), nil, stall); err != nil {
			q.sendFailed(c, err)
		}
		return
	}
	// The WRITE's chunks go from registered memory straight to the socket
	// (one writev of header and slice each), the region pinned meanwhile.
	m := q.dev.lookupKey(wr.LKey, true)
	src, ok := m.pin(q.pd, 0, wr.LocalAddr, uint64(wr.Length))
	if !ok {
		// Deregistered since sendStepLocked checked it.
		q.mu.Lock()
		if w := q.pendingLocked(seq); w != nil && q.state == ibv.QPSRTS {
			q.failLocked(w, ibv.WCLocProtErr)
		}
		q.mu.Unlock()
		return
	}
	defer m.unpin()
	for off := uint32(0); ; {
		n := min(wr.Length-off, chunkSize)
		h := appendWriteReq(hdr[:0], seq, wr.RemoteAddr, wr.RKey, wr.Length, off, int(n))
		if err := c.write(h, src[off:off+n], stall); err != nil {
			q.sendFailed(c, err)
			return
		}
		q.lastRecv.Store(int64(time.Since(clockBase)))
		q.touch()
		off += n
		if off >= wr.Length {
			return
		}
	}
}

// pendingLocked is the outstanding WR with sequence number seq, if any.
func (q *qp) pendingLocked(seq uint64) *wqe {
	for _, w := range q.sq {
		if w.seq == seq && !w.done {
			return w
		}
	}
	return nil
}

// sendFailed closes c after a failed request write; the reader, seeing
// the connection go with work in flight, fails the QP with RETRY_EXC_ERR.
func (q *qp) sendFailed(c *dconn, err error) {
	q.log.Debug().Err(err).Msg("request write failed; closing the data connection")
	c.writeErr.CompareAndSwap(nil, &err)
	c.Close()
}
