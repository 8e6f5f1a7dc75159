package requester

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/store"
)

// defaultWindowBytes is the lock window a fetch asks for; a holder lowers
// it to half its per-peer pin cap (QueryBlocksForTransferRequest.window_bytes).
const defaultWindowBytes = 128 << 20

// window is one lock window of a fetch: the holder's answer to one query
// for some of the fetch's keys.
type window struct {
	resp     *pegadv1.QueryBlocksForTransferResponse
	lockedAt time.Time
	asked    []int // indices (into the fetch's keys) this query named
	rest     []int // indices still to lock after it: deferred by the holder, or not asked
	err      error // the query's error (nothing was locked then)
	// lease: the lock's guard and renewer, started when it was granted;
	// nil without a session. transfer or drop stops it.
	lease *trackedLease
}

// pipeline is one fetch from one peer: connect, then a pipeline of lock
// windows, each locked while the one before it is read, and each released
// behind its reads, its blocks indexed only after its release answered
// (docs/lessons.md L10). Each window fits the pin cap the holder states; a holder
// that states none (older) is asked for fewer hashes when it refuses at a
// limit. It belongs to the goroutine running fetch.
type pipeline struct {
	e      *Engine
	ctx    context.Context
	st     *fetchState
	keys   []store.Key
	idx    map[string]int // hash → index into keys
	out    *fetchOut
	client pegadv1.PeerServiceClient
	rd     reader
	// maxHashes: the most hashes a query names; halved when a holder
	// refuses a window at a pin limit.
	maxHashes int
	sessions  []string
	// full is set (ErrPoolTooSmall) once a window found no room for its
	// next block beside what the prefetch keeps: no later block is
	// fetched, so what the prefetch keeps is a prefix of what it asked.
	full error
}

// fetch runs connect → (lock window → transfer → release → index)… for
// keys, writing per-block outcomes into out.
func (e *Engine) fetch(ctx context.Context, st *fetchState, keys []store.Key, out *fetchOut) error {
	p := &pipeline{e: e, ctx: ctx, st: st, keys: keys, out: out, maxHashes: len(keys),
		idx: make(map[string]int, len(keys))}
	for i, k := range keys {
		p.idx[k.Hash] = i
	}
	var err error
	p.rd, p.client, err = e.connect(ctx, st)
	if err != nil {
		return p.fail(PhaseConnect, err, ErrConnection)
	}
	all := make([]int, len(keys))
	for i := range all {
		all[i] = i
	}
	e.hook(ctx, st, PhaseLock)
	if rerr := e.channelReady(ctx, p.client); rerr != nil {
		return p.fail(PhaseLock, channelNotReady(e.reconnectWait, rerr), ErrRemote)
	}
	w := p.lockWindow(all, true)
	if w.err != nil && connectionRefused(w.err) && ctx.Err() == nil {
		// The holder has no connection of ours to bind the lock's memory
		// windows on (it reaped ours as idle, or restarted): handshake
		// again and ask once more. The refusal locked nothing. Only the
		// first window: nothing reads through p.rd yet.
		e.log.Info().Err(w.err).Str("req_id", st.reqID).Str("remote", st.peer).
			Msg("lock refused: the holder has no connection of ours; reconnecting")
		e.conns.Invalidate(p.rd, w.err)
		rd, err := e.conns.Get(ctx, st.peer)
		if err != nil {
			return p.fail(PhaseConnect, err, ErrConnection)
		}
		p.rd = rd
		w = p.lockWindow(all, true)
	}
	return p.run(w)
}

// connectionRefused reports whether a lock was refused because the holder
// had no connection of this requester to serve it through (memory windows).
func connectionRefused(err error) bool {
	code, reason := pegaderr.FromStatus(err)
	return code == codes.Unavailable && reason == pegaderr.Connection
}

// run transfers w and every window after it. The next window's query runs
// in a goroutine of this fetch while w is read; it is always received,
// also on a panic, and its session released when the fetch stops early.
func (p *pipeline) run(w window) (err error) {
	var next chan window
	defer func() {
		if next != nil {
			p.drop(<-next)
		}
	}()
	for {
		if w.err != nil {
			return p.fail(PhaseLock, w.err, ErrRemote)
		}
		if sid := w.resp.GetSessionId(); sid != "" {
			p.sessions = append(p.sessions, sid)
			p.out.session = strings.Join(p.sessions, ",")
		}
		if len(w.rest) > 0 {
			next = make(chan window, 1)
			rest := w.rest
			go func() { next <- p.lockWindow(rest, false) }()
		}
		if err := p.transfer(w); err != nil {
			return err
		}
		if p.full != nil {
			// The deferred drop releases the next window's lock unread.
			for _, i := range w.rest {
				p.out.status[i], p.out.errs[i] = StatusNotFetched, p.full
			}
			return nil
		}
		if next == nil {
			return nil
		}
		nw := <-next
		next = nil
		if nw.err != nil && limitRefused(nw.err) && p.ctx.Err() == nil {
			// Refused while this fetch held the window before it (other
			// sessions of this node share the cap): ask again now that it
			// is released, for fewer hashes if need be.
			nw = p.lockWindow(w.rest, true)
		}
		w = nw
	}
}

// lockWindow queries the holder for the keys at todo, at most maxHashes of
// them, asking for a window of defaultWindowBytes. With halve, a refusal
// at a pin limit (nothing was locked) is asked again for half as many
// hashes, down to one: an older holder states no cap and windows nothing.
func (p *pipeline) lockWindow(todo []int, halve bool) window {
	for {
		n := min(len(todo), p.maxHashes)
		w := p.query(todo[:n])
		w.rest = append(w.rest, todo[n:]...)
		if w.err == nil || !halve || n == 1 || !limitRefused(w.err) || p.ctx.Err() != nil {
			return w
		}
		p.maxHashes = (n + 1) / 2
		p.e.log.Info().Err(w.err).Str("req_id", p.st.reqID).Str("remote", p.st.peer).Int("hashes", p.maxHashes).
			Msg("lock window refused at the holder's pin limit; asking for fewer blocks")
	}
}

// query sends one lock query for the keys at asked.
func (p *pipeline) query(asked []int) window {
	hashes := make([][]byte, len(asked))
	for i, k := range asked {
		hashes[i] = []byte(p.keys[k].Hash)
	}
	w := window{asked: asked, lockedAt: time.Now()}
	w.resp, w.err = p.e.lock(p.ctx, p.st, p.client, &pegadv1.QueryBlocksForTransferRequest{
		Namespace: p.st.ns, Hashes: hashes, RequesterId: p.e.opts.NodeID, Requester: p.e.requester(),
		WindowBytes: defaultWindowBytes, HandoffToken: p.st.handoff,
	})
	if w.err != nil {
		return w
	}
	if sid := w.resp.GetSessionId(); sid != "" {
		w.lease = p.startLease(p.e.newGuard(p.client, p.st, sid), w)
	}
	for _, h := range w.resp.GetDeferred() {
		i, ok := p.idx[string(h)]
		if !ok {
			continue // plan refuses the answer's unrequested blocks; a deferred one is simply not asked again
		}
		w.rest = append(w.rest, i)
	}
	return w
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

// drop releases the session of a window the fetch will not read.
func (p *pipeline) drop(w window) {
	if w.err != nil || w.lease == nil {
		return
	}
	w.lease.stop()
	g := w.lease.g
	if p.ctx.Err() != nil {
		g.Abort(abortReason(p.ctx))
		return
	}
	_, _ = g.Release()
}

// fail wraps cause as the fetch's error in phase.
func (p *pipeline) fail(phase string, cause, fallback error) error {
	if p.ctx.Err() != nil {
		cause = fmt.Errorf("%w (%w)", ctxErr(p.ctx), cause)
	}
	return &FetchError{Peer: p.st.peer, Phase: phase, Class: classify(cause, fallback), Err: cause}
}

// limitRefused reports whether a lock query was refused at a pin limit
// (ResourceExhausted, reason LIMIT): nothing was locked, so asking again is
// safe.
func limitRefused(err error) bool {
	_, reason := pegaderr.FromStatus(err)
	return reason == pegaderr.Limit
}

// errNoSession: the holder returned blocks but no session to release them.
var errNoSession = errors.New("holder returned blocks without a session")

func abortReason(ctx context.Context) string {
	if ctx.Err() != nil {
		return ctxErr(ctx).Error()
	}
	return "fetch left without releasing (panic)"
}
