package requester

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/store"
)

// stagingAlign aligns every segment placed in a staging extent.
const stagingAlign = 64

func alignUp(n uint64) uint64 { return (n + stagingAlign - 1) &^ (stagingAlign - 1) }

// fetchOut is the outcome of one fetch, aligned with the keys it was given.
type fetchOut struct {
	status  []Status
	errs    []error
	bytes   uint64
	session string
}

func newFetchOut(n int) fetchOut {
	return fetchOut{status: make([]Status, n), errs: make([]error, n)}
}

// failRest marks every block without a final status as failed (or
// discarded) with err.
func (o *fetchOut) failRest(st Status, err error) {
	for i := range o.status {
		if o.status[i] == 0 || o.status[i] == StatusFailed {
			o.status[i], o.errs[i] = st, err
		}
	}
}

// planBlock is one found block: where it lives on the holder and where it
// is staged here.
type planBlock struct {
	idx    int // index into the fetch's keys
	key    store.Key
	loc    *pegadv1.BlockLocation
	numa   int    // remote NUMA node of its first segment
	size   uint64 // bytes it takes in staging (segments aligned)
	bytes  uint64 // payload bytes
	ext    extent
	layout []store.SlotLayout
}

// runFetch is the Prefetch boundary of the fetch path: a panic below it is
// recovered and turned into a failed fetch (the guard has already released
// the lock by then), never a crashed daemon.
func (e *Engine) runFetch(ctx context.Context, st *fetchState, keys []store.Key) (out fetchOut, err error) {
	out = newFetchOut(len(keys))
	defer func() {
		if r := recover(); r != nil {
			e.log.Error().Str("req_id", st.reqID).Str("remote", st.peer).Str("session", out.session).
				Str("phase", st.getPhase()).Interface("panic", r).Str("stack", string(debug.Stack())).
				Msg("panic in fetch path recovered; the fetch fails")
			err = &FetchError{Peer: st.peer, Phase: st.getPhase(), Err: fmt.Errorf("%w: %v", ErrPanic, r)}
			out.failRest(StatusFailed, err)
		}
	}()
	err = e.fetch(ctx, st, keys, &out)
	if err != nil {
		status := StatusFailed
		if errors.Is(err, ErrDiscarded) {
			status = StatusDiscarded
		}
		out.failRest(status, err)
	}
	return out, err
}

// defaultReconnectWait bounds how long a fetch waits for the peer's
// channel to be ready before its lock query, and before its one handshake
// retry.
const defaultReconnectWait = 2 * time.Second

// connect runs the connect phase: the connection and the peer client.
// The lock query (pipeline.lockWindow) follows it.
//
// A lock query is sent at most once (only a refusal at a pin limit, which
// locked nothing, is asked again, smaller). gRPC answers Unavailable both when
// the channel could not carry it (a channel in reconnect backoff right
// after a link came back fails at once with the cut-time dial error) and
// when the connection broke after the holder got it ("transport is
// closing"): the holder may have granted a session whose answer was lost,
// and a second query would open another one (that one is released by its
// query id: releaseQuery). So the channel is made ready before the query
// (told to reconnect now, within Engine.reconnectWait) instead of
// retrying after it. The handshake is retried once on such an error
// (without a pegad reason): a holder keeps one connection per requester
// node, a repeated handshake retires the earlier one (freed within its
// drain time), and it locks nothing.
func (e *Engine) connect(ctx context.Context, st *fetchState) (rd reader, client pegadv1.PeerServiceClient, err error) {
	e.hook(ctx, st, PhaseConnect)
	if client, err = e.peers(st.peer); err != nil {
		return rd, client, err
	}
	rd, err = e.conns.Get(ctx, st.peer)
	if err != nil && channelDown(err) && ctx.Err() == nil {
		// The handshake found the peer's channel down (client's channel
		// carried it). Repeating a handshake is safe (the holder keeps one
		// connection per requester node), so ready the channel and try once
		// more; the lock query is never repeated.
		if rerr := e.channelReady(ctx, client); rerr != nil {
			e.log.Info().Err(err).AnErr("reconnect", rerr).Str("req_id", st.reqID).Str("remote", st.peer).
				Msg("peer channel down at the handshake and not back within the reconnect wait")
			return rd, client, err
		}
		e.log.Info().Err(err).Str("req_id", st.reqID).Str("remote", st.peer).
			Msg("peer channel was down at the handshake; reconnected, handshaking once more")
		rd, err = e.conns.Get(ctx, st.peer)
	}
	return rd, client, err
}

// channelNotReady is the error of a lock query not sent because the peer's
// channel did not come ready: a connection error, as the query would have
// had, not the fetch's deadline (the reconnect wait ended, not ctx).
func channelNotReady(wait time.Duration, err error) error {
	return status.Errorf(codes.Unavailable, "peer channel not ready within %v, lock query not sent: %v", wait, err)
}

// channelReady makes client's channel, when it can be told to (peer.Clients'
// clients can), connect now and waits until it is ready, at most
// Engine.reconnectWait; at once when it is ready already.
func (e *Engine) channelReady(ctx context.Context, client pegadv1.PeerServiceClient) error {
	rc, ok := client.(reconnecter)
	if !ok {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, e.reconnectWait)
	defer cancel()
	return rc.Reconnect(rctx)
}

// channelDown reports whether err says the peer's gRPC channel could not
// carry the RPC: Unavailable without a pegad reason (a holder's own
// refusals, DRAINING, carry one) and not a handshake the holder rejected.
func channelDown(err error) bool {
	if errors.Is(err, conn.ErrHandshakeRejected) {
		return false
	}
	code, reason := pegaderr.FromStatus(err)
	return code == codes.Unavailable && reason == ""
}

// index inserts a block read under a live lock and records its outcome.
func (e *Engine) index(st *fetchState, b *planBlock, out *fetchOut) {
	created, ierr := e.store.Insert(b.key, b.ext, b.layout)
	switch {
	case ierr != nil:
		out.status[b.idx] = StatusFailed
		out.errs[b.idx] = &FetchError{Peer: st.peer, Phase: PhaseIndex, Class: ErrLocalResource, Err: ierr}
	case created:
		out.status[b.idx] = StatusFetched
		out.bytes += b.bytes
	default:
		out.status[b.idx] = StatusAlreadyLocal // indexed meanwhile (local put)
	}
}

// keepConfirmed indexes, of a fetch cut short or whose lock lapsed, the
// blocks read entirely before the lock was last confirmed live (a renewal
// sent after them succeeded, or the release answered live): lesson 10 per
// block. A block read but not confirmed is marked discarded when drop is
// ErrDiscarded; the others are left to the fetch's error, which runFetch
// gives them. Called after Read returned, before
// the staging extents are released: an indexed block holds its own
// reference on its extent, so the memory of the dropped blocks goes back
// to the pool only with the extent, never while a READ can land in it.
func (e *Engine) keepConfirmed(st *fetchState, plan []*planBlock, tr *readTracker, live bool, out *fetchOut, drop error) {
	var kept, dropped, unread int
	var keptBytes uint64
	for i, b := range plan {
		switch {
		case tr.keep(i, live):
			e.index(st, b, out)
			kept++
			keptBytes += b.bytes
		case tr.landed(i):
			dropped++
			if errors.Is(drop, ErrDiscarded) {
				out.status[b.idx], out.errs[b.idx] = StatusDiscarded, drop
			}
		default:
			unread++
		}
	}
	if kept == 0 && dropped == 0 {
		return
	}
	e.log.Warn().Str("req_id", st.reqID).Str("remote", st.peer).Str("session", out.session).
		Int("kept", kept).Uint64("kept_bytes", keptBytes).Int("discarded", dropped).Int("unread", unread).
		Bool("released_live", live).AnErr("reason", drop).
		Msg("fetch cut short or its lock lapsed: blocks read before the lock was last confirmed live kept, later ones discarded")
}

// lock sends the query. The fetch waits for its answer only until ctx
// ends (the caller's cancel or deadline); the RPC itself runs detached
// from ctx, bounded by its own timeout and cut only by shutdown, because
// a query the holder executed must not lose its answer: a session granted
// after the fetch left is released by a guard here. The goroutine is
// counted in e.wg, so Close waits for it.
func (e *Engine) lock(ctx context.Context, st *fetchState, client pegadv1.PeerServiceClient,
	req *pegadv1.QueryBlocksForTransferRequest) (*pegadv1.QueryBlocksForTransferResponse, error) {
	type answer struct {
		resp *pegadv1.QueryBlocksForTransferResponse
		err  error
	}
	ans := make(chan answer) // unbuffered: either the fetch takes it or left is closed
	left := make(chan struct{})
	// Shutdown still cuts it: the holder reclaims what an old incarnation
	// held when this daemon comes back.
	qctx, qcancel := context.WithTimeout(context.WithoutCancel(ctx), e.lockRPCTimeout)
	stopQ := context.AfterFunc(e.ctx, qcancel)
	req.QueryId = newQueryID()
	e.wg.Add(1) // inside a running Prefetch (counted): Close cannot be past Wait
	go func() {
		defer e.wg.Done()
		resp, err := client.QueryBlocksForTransfer(qctx, req)
		stopQ()
		qcancel()
		if err != nil && answerMayBeLost(err) {
			e.releaseQuery(client, st, req.QueryId, err)
		}
		select {
		case ans <- answer{resp, err}:
		case <-left:
			if sid := resp.GetSessionId(); err == nil && sid != "" {
				e.newGuard(client, st, sid).Abort("fetch left before the lock was granted")
			}
		}
	}()
	select {
	case a := <-ans:
		return a.resp, a.err
	case <-ctx.Done():
		close(left)
		return nil, errors.New("left before the holder answered the lock query")
	}
}

// answerMayBeLost reports whether a lock query's error may hide a session
// the holder granted: the RPC was cut (the connection broke after the
// holder got it, or the wait for its answer ended), not refused by the
// holder, whose refusals carry a pegad reason.
func answerMayBeLost(err error) bool {
	code, reason := pegaderr.FromStatus(err)
	if reason != "" {
		return false
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Internal:
		return true
	}
	return false
}

// releaseQuery releases, by its query id, a session the holder may have
// granted to a query whose answer was lost (cause): otherwise it would pin
// its blocks until the lock timeout. Best effort, bounded by the release
// timeout and cut by shutdown; NOT_FOUND says there was none.
func (e *Engine) releaseQuery(client pegadv1.PeerServiceClient, st *fetchState, query uint64, cause error) {
	ctx, cancel := context.WithTimeout(e.ctx, e.releaseTimeout)
	defer cancel()
	if rerr := e.channelReady(ctx, client); rerr != nil {
		e.log.Info().Err(cause).AnErr("reconnect", rerr).Str("req_id", st.reqID).Str("remote", st.peer).
			Msg("lock query's answer lost; peer not back to release its session by query id, the lock timeout will")
		return
	}
	resp, err := client.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{
		QueryId: query, RequesterId: e.opts.NodeID, Requester: e.requester(),
	})
	if code, _ := pegaderr.FromStatus(err); err != nil && code == codes.NotFound {
		return // the holder granted nothing
	}
	e.log.Info().Err(cause).AnErr("release", err).Bool("released", resp.GetWasLive()).Str("req_id", st.reqID).
		Str("remote", st.peer).Msg("lock query's answer lost; its session released by query id")
}

// newQueryID is a random lock-query id, never 0.
func newQueryID() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

// innocent reports whether a read failed because its connection broke
// under it (a batch flushed or never run), which a fresh connection need
// not repeat: another fetch's cancel breaks the QPs it shares with us.
func innocent(err error) bool {
	if errors.Is(err, conn.ErrRailDown) {
		return true // the NIC is out of placement now: a fresh connection avoids it
	}
	if !errors.Is(err, conn.ErrSessionInvalidated) && !errors.Is(err, conn.ErrConnectionBroken) {
		return false
	}
	// A WR of this read completed in error by itself (retry exceeded,
	// remote access): the link or the peer failed, not a bystander's
	// cancel. Retrying would only wait out the deadline on a dead path and
	// turn a connection error into a deadline one. Flushed WRs are
	// collateral and do qualify.
	var se *ibv.StatusError
	if errors.As(err, &se) && se.Status != ibv.WCWRFlushErr {
		return false
	}
	return true
}

func abortReason(ctx context.Context) string {
	if ctx.Err() != nil {
		return ctxErr(ctx).Error()
	}
	return "fetch left without releasing (panic)"
}

// plan checks the holder's answer to a query for the keys at asked and
// lays out the found blocks; blocks neither found nor deferred to a later
// window are marked missing in out.
func (e *Engine) plan(keys []store.Key, asked []int, resp *pegadv1.QueryBlocksForTransferResponse, out *fetchOut) ([]*planBlock, error) {
	idx := make(map[string]int, len(asked))
	for _, i := range asked {
		idx[keys[i].Hash] = i
	}
	seen := make(map[int]bool, len(resp.GetBlocks()))
	plan := make([]*planBlock, 0, len(resp.GetBlocks()))
	for _, loc := range resp.GetBlocks() {
		i, ok := idx[string(loc.GetHash())]
		if !ok || seen[i] {
			return nil, fmt.Errorf("holder returned unrequested or duplicate block %x", loc.GetHash())
		}
		seen[i] = true
		b := &planBlock{idx: i, key: keys[i], loc: loc}
		slots := loc.GetSlots()
		if len(slots) == 0 || len(slots) > store.MaxSlots {
			return nil, fmt.Errorf("block %x: %d slots", loc.GetHash(), len(slots))
		}
		b.numa = int(slots[0].GetK().GetNumaNode())
		b.layout = make([]store.SlotLayout, len(slots))
		for j, s := range slots {
			k, v := s.GetK(), s.GetV()
			if k.GetSize() == 0 || (v != nil && v.GetSize() == 0) {
				return nil, fmt.Errorf("block %x slot %d: empty segment", loc.GetHash(), j)
			}
			if k.GetSize() > store.MaxBlockLen || v.GetSize() > store.MaxBlockLen {
				return nil, fmt.Errorf("block %x slot %d: segment too large", loc.GetHash(), j)
			}
			// Offsets relative to the block's start; rebased in stage.
			l := store.SlotLayout{KOff: b.size, KLen: k.GetSize()}
			b.size += alignUp(k.GetSize())
			b.bytes += k.GetSize()
			if v != nil {
				l.VOff, l.VLen = b.size, v.GetSize()
				b.size += alignUp(v.GetSize())
				b.bytes += v.GetSize()
			}
			b.layout[j] = l
		}
		if b.bytes > store.MaxBlockLen {
			return nil, fmt.Errorf("block %x: %d bytes", loc.GetHash(), b.bytes)
		}
		plan = append(plan, b)
	}
	// Request order: staging keeps a prefix of it when the pool is short.
	sort.Slice(plan, func(i, j int) bool { return plan[i].idx < plan[j].idx })
	deferred := make(map[string]bool, len(resp.GetDeferred()))
	for _, h := range resp.GetDeferred() {
		deferred[string(h)] = true
	}
	for _, i := range asked {
		if !seen[i] && !deferred[keys[i].Hash] {
			out.status[i] = StatusMissingOnPeer
		}
	}
	return plan, nil
}

// stage places the planned blocks, in plan order, in staging extents.
// Blocks are grouped by the local NUMA node sp places them on (without sp:
// by their remote NUMA node, staged anywhere); each extent is sized
// min(bytes of that group still to place, maxChunk, the largest allocation
// the pool can hold: one NUMA part) and never less than the block being
// placed (lesson 5): large fetches bound eviction amplification, small
// fetches work on small pools. A chunk the pool has no room for is asked
// again the size of its first block, so a pool nearly full still takes
// the blocks that fit. It stops at the first block it cannot place:
// plan[:placed] are placed, and it returns every extent it allocated, also
// on error.
func (e *Engine) stage(plan []*planBlock, sp *conn.StagingPlan) (exts []extent, placed int, err error) {
	ns, onNode := e.store.(nodeStore)
	onNode = onNode && sp != nil
	type group struct {
		remaining, used uint64
		cur             extent
	}
	groups := make(map[int]*group)
	keyOf := make([]int, len(plan))
	for i, b := range plan {
		k := b.numa
		if onNode {
			k = sp.Place(b.numa, b.size)
		}
		keyOf[i] = k
		if groups[k] == nil {
			groups[k] = &group{}
		}
		groups[k].remaining += b.size
	}
	alloc := func(key int, n uint64) (extent, error) {
		if onNode {
			return ns.AllocStagingOn(key, n)
		}
		return e.store.AllocStaging(n)
	}
	// No allocation can exceed one part of a NUMA-split pool: a chunk
	// larger than that fails although its blocks fit in smaller ones.
	chunk := min(e.maxChunk, e.store.MaxStaging())
	for i, b := range plan {
		key, g := keyOf[i], groups[keyOf[i]]
		if g.cur == nil || g.cur.Len()-g.used < b.size {
			n := max(b.size, min(g.remaining, chunk))
			x, aerr := alloc(key, n)
			if aerr != nil && n > b.size && errors.Is(aerr, store.ErrNoSpace) {
				x, aerr = alloc(key, b.size)
			}
			if aerr != nil {
				return exts, i, fmt.Errorf("staging %d bytes (NUMA group %d): %w", n, key, aerr)
			}
			exts = append(exts, x)
			g.cur, g.used = x, 0
		}
		b.ext = g.cur
		for j := range b.layout {
			b.layout[j].KOff += g.used
			if b.layout[j].VLen > 0 {
				b.layout[j].VOff += g.used
			}
		}
		g.used += b.size
		g.remaining -= b.size
	}
	return exts, len(plan), nil
}

// buildOps makes one READ per segment (K and V) of every planned block;
// opBlock[i] is the plan index of the block op i reads. grant: the lock's
// memory windows (nil: none).
func buildOps(plan []*planBlock, grant *conn.Grant) (ops []conn.ReadOp, opBlock []int) {
	for pi, b := range plan {
		base := b.ext.Addr()
		for j, s := range b.loc.GetSlots() {
			l := b.layout[j]
			k := s.GetK()
			ops = append(ops, conn.ReadOp{LocalAddr: base + l.KOff, RemoteAddr: k.GetAddr(), Len: l.KLen, NUMA: int(k.GetNumaNode()), Grant: grant})
			if v := s.GetV(); v != nil {
				ops = append(ops, conn.ReadOp{LocalAddr: base + l.VOff, RemoteAddr: v.GetAddr(), Len: l.VLen, NUMA: int(v.GetNumaNode()), Grant: grant})
			}
		}
		for len(opBlock) < len(ops) {
			opBlock = append(opBlock, pi)
		}
	}
	return ops, opBlock
}

// startRenewer starts the goroutine that keeps the lock alive from the lock
// on (reconnect, staging, read). It belongs to the fetch and exits when ctx
// is done; the returned channel closes when it has. It renews every
// lock_timeout/3 counted from lockedAt (the lease's own clock, not when the
// read began) and cancels ctx (errTransferDeadline) when the lock's
// deadline minus a safety margin passes without a renewal. A failed
// renewal is counted (pegaflow_transfer_lock_renew_failures_total), logged
// and retried at the next tick; the fetch goes on. A renewal that succeeds
// confirms the blocks that landed before it was sent (the tracker in tr,
// set once the window's plan is made: until then no block has landed); the
// release's was_live confirms the rest.
func (e *Engine) startRenewer(ctx context.Context, cancelRead context.CancelCauseFunc, g *lockGuard,
	tr *atomic.Pointer[readTracker], lockedAt time.Time, lockTimeout time.Duration) <-chan struct{} {
	done := make(chan struct{})
	margin := min(5*time.Second, lockTimeout/10)
	deadline := lockedAt.Add(lockTimeout - margin)
	interval := max(lockTimeout/3, time.Millisecond)
	go func() {
		defer close(done)
		dl := time.NewTimer(time.Until(deadline))
		defer dl.Stop()
		next := lockedAt.Add(interval)
		tick := time.NewTimer(time.Until(next))
		defer tick.Stop()
		req := &pegadv1.RenewTransferLockRequest{SessionId: g.sid, Requester: e.requester()}
		for {
			select {
			case <-ctx.Done():
				return
			case <-dl.C:
				cancelRead(errTransferDeadline)
				return
			case <-tick.C:
				// Behind schedule (slow renewals) it renews back to back;
				// each RPC is bounded by interval.
				next = next.Add(interval)
				tick.Reset(time.Until(next))
				sent := time.Now()
				t := tr.Load()
				var stamp uint64
				if t != nil {
					stamp = t.renewalSent()
				}
				rctx, cancel := context.WithTimeout(ctx, interval)
				resp, err := g.client.RenewTransferLock(rctx, req)
				cancel()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					e.m.RenewFailures.Inc()
					e.log.Warn().Err(err).Str("session", g.sid).Str("remote", g.st.peer).Str("req_id", g.st.reqID).
						Msg("transfer lock renewal failed; the read goes on until the lock's deadline")
					continue
				}
				// The lock was live when this renewal was sent: the blocks
				// that landed before it are confirmed.
				if t != nil {
					t.confirm(stamp)
				}
				// Durations only: the holder's clock is not ours.
				ext := lockTimeout
				if ll := resp.GetLifetimeLeft(); ll != nil && ll.AsDuration() < ext {
					ext = ll.AsDuration()
				}
				if nd := sent.Add(ext - margin); nd.After(deadline) {
					deadline = nd
					dl.Reset(time.Until(deadline))
				}
			}
		}
	}()
	return done
}

// incarnated is a connection that knows which incarnation of the holder it
// handshook with (*conn.AddrConnection does).
type incarnated interface{ RemoteIncarnation() string }

// ensureCurrent returns rd when it was handshaken with holderInc (or either
// side does not say), else invalidates it and connects again.
func (e *Engine) ensureCurrent(ctx context.Context, st *fetchState, rd reader, holderInc string) (reader, error) {
	ic, ok := rd.(incarnated)
	if !ok || holderInc == "" || ic.RemoteIncarnation() == "" || ic.RemoteIncarnation() == holderInc {
		return rd, nil
	}
	stale := fmt.Errorf("%w: handshook with incarnation %q, holder now answers as %q",
		conn.ErrPeerRestarted, ic.RemoteIncarnation(), holderInc)
	e.log.Info().Str("remote", st.peer).Str("req_id", st.reqID).Str("old_incarnation", ic.RemoteIncarnation()).
		Str("incarnation", holderInc).Msg("holder restarted since handshake; reconnecting before the read")
	e.conns.Invalidate(rd, stale)
	nrd, err := e.conns.Get(ctx, st.peer)
	if err != nil {
		return nil, err
	}
	if nic, ok := nrd.(incarnated); ok && nic.RemoteIncarnation() != holderInc {
		return nil, fmt.Errorf("%w: reconnected to incarnation %q, lock taken from %q",
			conn.ErrPeerRestarted, nic.RemoteIncarnation(), holderInc)
	}
	return nrd, nil
}
