package conn

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
)

// AddrConnection is one connection to a peer address.
type AddrConnection struct {
	d            *Dialer
	client       pegadv1.PeerServiceClient // the holder's, for RdmaDisconnect
	peer         string
	remoteNodeID string
	remoteInc    string
	handshakeID  string
	since        time.Time
	log          zerolog.Logger
	nics         []*connNic
	rr           atomic.Uint64 // round-robin over NICs

	// done is closed by invalidate: workers stop taking batches and exit.
	done chan struct{}

	// mu guards refs, invalid, reason and tornDown.
	mu   sync.Mutex
	refs int // Reads in flight (probes included)
	// lastUse: when the last Read (or probe) returned, or the connection
	// was made; the prober reads it to find idle connections.
	lastUse  time.Time
	invalid  bool
	reason   error
	tornDown bool
}

// connNic is the per-NIC state of one connection: its QPs (each with its
// session worker), the peer's memory snapshot as registered on the peer's
// matching NIC, and the round-robin counter over the QPs.
type connNic struct {
	nic      *localNIC
	remote   []ibv.RemoteRegion
	probe    ibv.RemoteRegion // the keepalive's target (Length 0: remote[0])
	sessions []*session
	rr       atomic.Uint64
	bytes    atomic.Uint64 // READ bytes in flight on this NIC (pickNIC, settleNICBytes)
}

func (c *AddrConnection) Peer() string { return c.peer }

// RemoteNodeID is the holder's node id from the handshake.
func (c *AddrConnection) RemoteNodeID() string { return c.remoteNodeID }

// RemoteIncarnation is the holder's incarnation from the handshake.
func (c *AddrConnection) RemoteIncarnation() string { return c.remoteInc }

// Invalid reports whether c was invalidated (it never becomes valid again).
func (c *AddrConnection) Invalid() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.invalid
}

func (c *AddrConnection) startWorkers() {
	for _, cn := range c.nics {
		for _, s := range cn.sessions {
			c.d.workers.Add(1)
			c.d.met.SessionWorkers.Inc()
			go func() {
				defer c.d.workers.Done()
				defer c.d.met.SessionWorkers.Dec()
				s.run(c.done, c.d.nics, c.log)
			}()
		}
	}
}

// prewarm asks each QP whose provider opens its data path lazily to open
// it now (see prewarmer); it does not wait for the dials.
func (c *AddrConnection) prewarm() {
	for _, cn := range c.nics {
		for _, s := range cn.sessions {
			if pw, ok := s.p.qp.(prewarmer); ok {
				pw.Prewarm()
			}
		}
	}
}

// acquire takes a reference for one Read; it fails once c is invalidated.
func (c *AddrConnection) acquire() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.invalid {
		return fmt.Errorf("%w: %s invalidated: %v", ErrConnectionBroken, c.peer, c.reason)
	}
	c.refs++
	return nil
}

// release drops a Read's reference; the last one out of an invalidated
// connection tears it down.
func (c *AddrConnection) release() {
	c.mu.Lock()
	c.refs--
	c.lastUse = time.Now()
	last := c.invalid && c.refs == 0 && !c.tornDown
	if last {
		c.tornDown = true
	}
	c.mu.Unlock()
	if last {
		c.teardown()
	}
}

// invalidate marks c unusable (once): workers are told to stop, and the
// QPs are destroyed now or when the last in-flight Read returns. The
// caller removes c from the dialer's map first.
func (c *AddrConnection) invalidate(reason error) {
	c.mu.Lock()
	if c.invalid {
		c.mu.Unlock()
		return
	}
	c.invalid = true
	c.reason = reason
	close(c.done)
	now := c.refs == 0
	if now {
		c.tornDown = true
	}
	refs := c.refs
	c.mu.Unlock()
	if c.d.hookInvalidated != nil {
		c.d.hookInvalidated(c)
	}

	c.d.met.Conns.WithLabelValues(RoleRequester, StateConnected).Dec()
	c.d.met.Conns.WithLabelValues(RoleRequester, StateInvalidated).Inc()
	c.d.met.Invalidations.WithLabelValues(reasonLabel(reason)).Inc()
	c.log.Info().AnErr("reason", reason).Int("in_flight", refs).Msg("rdma connection invalidated")
	if now {
		c.teardown()
	}
}

// abortInFlight moves every QP to ERROR so in-flight Reads drain fast
// (shutdown only: a plain invalidation lets in-flight work finish).
func (c *AddrConnection) abortInFlight() {
	// Under mu: teardown cannot start meanwhile (it is decided under mu).
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tornDown {
		return
	}
	for _, cn := range c.nics {
		for _, s := range cn.sessions {
			s.p.toError()
		}
	}
}

// teardown waits for the workers (told to stop by done; no batch is
// running since no Read holds c), destroys the QPs and CQs, and tells the
// holder to drop its side. The disconnect goes only now, not at
// invalidation, so in-flight Reads of an invalidated connection keep a
// working peer until they return.
func (c *AddrConnection) teardown() {
	for _, cn := range c.nics {
		for _, s := range cn.sessions {
			<-s.exited
			s.p.destroy(c.d.nics)
		}
	}
	// Before conns.Done: Close waits for conns, then for disconnects.
	c.d.goDisconnect(c.client, c.peer, c.handshakeID, c.log)
	c.d.met.Conns.WithLabelValues(RoleRequester, StateInvalidated).Dec()
	c.d.conns.Done()
	c.log.Debug().Msg("rdma connection torn down")
}

func (c *AddrConnection) info() ConnInfo {
	ci := ConnInfo{Peer: c.peer, RemoteNodeID: c.remoteNodeID, Role: RoleRequester, State: StateConnected, Since: c.since}
	if c.Invalid() {
		ci.State = StateInvalidated
	}
	for _, cn := range c.nics {
		ni := NICInfo{Name: cn.nic.info.Name, QPs: len(cn.sessions)}
		for _, s := range cn.sessions {
			ni.LocalQPNs = append(ni.LocalQPNs, s.p.qpn)
		}
		ci.NICs = append(ci.NICs, ni)
		ci.QPs += len(cn.sessions)
	}
	return ci
}

// reqIDKey carries a request id into Read's logs.
type reqIDKey struct{}

// WithReqID returns ctx carrying id, logged as req_id by Read.
func WithReqID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, reqIDKey{}, id)
}

func reqID(ctx context.Context) string {
	s, _ := ctx.Value(reqIDKey{}).(string)
	return s
}

type progressKey struct{}

// WithProgress returns ctx carrying f, which Read calls with the bytes of
// each READ as its successful completion is polled (from the QP workers'
// goroutines, concurrently: f must be safe for that and quick).
func WithProgress(ctx context.Context, f func(bytes uint64)) context.Context {
	return context.WithValue(ctx, progressKey{}, f)
}

// ProgressOf is the function WithProgress put in ctx, or nil (fake readers
// in tests report their progress through it as Read does).
func ProgressOf(ctx context.Context) func(uint64) {
	f, _ := ctx.Value(progressKey{}).(func(uint64))
	return f
}

type opProgressKey struct{}

// WithOpProgress returns ctx carrying f, which Read calls as WithProgress's
// function is called, with the index (in Read's ops) of the op the
// completed READ belongs to: an op larger than one WR completes in several
// calls, possibly on several QPs at once. A caller that must know when
// each op has fully landed (a prefetch keeping the blocks read before its
// lock ended) counts the bytes per op. It takes precedence over
// WithProgress.
func WithOpProgress(ctx context.Context, f func(op int, bytes uint64)) context.Context {
	return context.WithValue(ctx, opProgressKey{}, f)
}

// OpProgressOf is the function Read reports completions to: the one
// WithOpProgress put in ctx, else WithProgress's adapted, else nil (fake
// readers in tests report through it as Read does).
func OpProgressOf(ctx context.Context) func(op int, bytes uint64) {
	if f, _ := ctx.Value(opProgressKey{}).(func(int, uint64)); f != nil {
		return f
	}
	if f := ProgressOf(ctx); f != nil {
		return func(_ int, n uint64) { f(n) }
	}
	return nil
}

// Read runs ops (spread over NICs and QPs) and returns when all completed
// or ctx is done. After an error or ctx expiry it returns only once every
// QP that could still write into the ops' local memory is in ERROR and
// drained, so the caller may reuse that memory at once.
// Errors: ErrConnectionBroken / ErrSessionInvalidated (wrapping an
// *ibv.StatusError where one applies), ErrRemoteMemory, ErrInvalidOp,
// ctx errors. Connection-class errors, and any abort that moved a QP to
// ERROR, invalidate c (an RC QP is never reused after ERROR); the others
// (ErrRemoteMemory, ErrInvalidOp, a ctx that expired before anything was
// posted) leave it healthy.
func (c *AddrConnection) Read(ctx context.Context, ops []ReadOp) error {
	if len(ops) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.acquire(); err != nil {
		return err
	}
	defer c.release()

	batches, perNIC, err := c.plan(ops)
	if err != nil {
		return err // nothing posted; the connection is untouched
	}
	defer c.settleNICBytes(perNIC)
	err = c.runBatches(ctx, batches)
	if err != nil {
		c.log.Warn().Err(err).Str("req_id", reqID(ctx)).Int("ops", len(ops)).Msg("rdma read failed")
	}
	return err
}

// runBatches submits batches to their session workers and waits for every
// one (see Read). A failure is returned wrapped with the peer; a
// connection-class one, or any that moved a QP to ERROR, invalidates c.
// The caller holds a reference (acquire).
func (c *AddrConnection) runBatches(ctx context.Context, batches []*batch) error {
	results := make(chan batchResult, len(batches))
	// The batches run under their own context, canceled by abort: a
	// running batch is stopped by its own worker (which moves its QP to
	// ERROR only if WRs are outstanding, and drains it). Read never
	// touches a QP itself: between seeing a batch running and acting on
	// its QP, that batch could end and another Read's start on the QP.
	progress := OpProgressOf(ctx)
	bctx, stopBatches := context.WithCancel(ctx)
	defer stopBatches()
	for _, b := range batches {
		b.ctx = bctx
		b.progress = progress
		b.res = results
		b.s.submit(b)
	}

	var first error
	qpErrored := false
	aborted := false
	pending := len(batches)
	// abort cancels batches that have not started (Read replies for them
	// itself) and stops running ones through their context. Running
	// batches still reply, and Read waits for them: a Read never returns
	// while one of its WRs can still land.
	abort := func() {
		if aborted {
			return
		}
		aborted = true
		for _, b := range batches {
			if b.state.CompareAndSwap(batchQueued, batchFinished) {
				pending--
			}
		}
		if c.d.hookAbort != nil {
			c.d.hookAbort(batches)
		}
		stopBatches()
	}
	ctxDone := ctx.Done()
	for pending > 0 {
		select {
		case r := <-results:
			pending--
			qpErrored = qpErrored || r.qpErrored
			if r.err != nil {
				if first == nil {
					first = r.err
				}
				abort()
			}
		case <-ctxDone:
			ctxDone = nil
			if first == nil {
				first = ctx.Err()
			}
			abort()
		}
	}
	if first == nil {
		return nil
	}
	err := fmt.Errorf("conn: read from %s: %w", c.peer, c.railCheck(first))
	if IsConnectionClass(first) || qpErrored {
		c.d.Invalidate(c, err)
	}
	return err
}

// plan validates ops and splits them into one batch per session used.
// Nothing is posted when it fails.
func (c *AddrConnection) plan(ops []ReadOp) ([]*batch, []uint64, error) {
	ns := c.d.nics
	bySession := make(map[*session]*batch)
	var out []*batch
	pending := make([]uint64, len(c.nics)) // bytes per NIC, committed at the end
	for i, op := range ops {
		if op.Len == 0 {
			return nil, nil, fmt.Errorf("%w: op %d has zero length", ErrInvalidOp, i)
		}
		if op.LocalAddr < ns.memBase || op.Len > ns.memLen || op.LocalAddr-ns.memBase > ns.memLen-op.Len {
			return nil, nil, fmt.Errorf("%w: op %d local range [%#x,+%d) outside registered memory", ErrInvalidOp, i, op.LocalAddr, op.Len)
		}
		if g := op.Grant; g != nil && g.handshakeID != c.handshakeID {
			return nil, nil, fmt.Errorf("%w: op %d: lock's windows on handshake %s, connection %s", ErrStaleGrant, i, g.handshakeID, c.handshakeID)
		}
		local := ns.localNode(op.LocalAddr)
		for off := uint64(0); off < op.Len; off += c.d.opts.SliceBytes {
			n := min(c.d.opts.SliceBytes, op.Len-off)
			k := c.pickNIC(op.NUMA, local, n, pending, op.Grant)
			if k < 0 {
				return nil, nil, fmt.Errorf("%w: peer %s op %d: the lock's windows serve none of this connection's NICs", ErrRemoteMemory, c.peer, i)
			}
			cn := c.nics[k]
			raddr := op.RemoteAddr + off
			s, rkey, ok := cn.target(op.Grant, k, raddr, n)
			if !ok || op.RemoteAddr+op.Len < op.RemoteAddr {
				return nil, nil, fmt.Errorf("%w: peer %s op %d [%#x,+%d) on nic %s", ErrRemoteMemory, c.peer, i, op.RemoteAddr, op.Len, cn.nic.info.Name)
			}
			b := bySession[s]
			if b == nil {
				b = &batch{s: s}
				bySession[s] = b
				out = append(out, b)
			}
			b.ops = append(b.ops, i)
			b.wrs = append(b.wrs, ibv.SendWR{Op: ibv.OpRDMARead, Signaled: true,
				LocalAddr: op.LocalAddr + off, Length: uint32(n), LKey: cn.nic.mr.LKey(),
				RemoteAddr: raddr, RKey: rkey})
		}
	}
	c.commitNICBytes(pending)
	return out, pending, nil
}

// target is where a READ of [addr, addr+n) on cn (c.nics[k]) goes: with
// a grant, the QP and the key of its window there; without, the next QP in
// turn and the snapshot's rkey.
func (cn *connNic) target(g *Grant, k int, addr, n uint64) (*session, uint32, bool) {
	if g == nil {
		rkey, ok := cn.rkeyFor(addr, n)
		return cn.sessions[cn.rr.Add(1)%uint64(len(cn.sessions))], rkey, ok
	}
	qp, rkey, ok := g.lookup(k, addr, n)
	if !ok || qp >= len(cn.sessions) {
		return nil, 0, false
	}
	return cn.sessions[qp], rkey, true
}

// rkeyFor finds the snapshot region holding [addr, addr+n).
func (cn *connNic) rkeyFor(addr, n uint64) (uint32, bool) {
	for _, r := range cn.remote {
		if r.Contains(addr, n) {
			return r.RKey, true
		}
	}
	return 0, false
}
