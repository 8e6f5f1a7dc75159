package requester

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// Locator finds the live holders of blocks (index.Index is one).
type Locator interface {
	Locate(ctx context.Context, namespace string, hashes [][]byte) ([][]index.Holder, error)
}

// Defaults of ClusterOptions left zero.
const (
	defaultLookupTimeout = 2 * time.Second
	defaultMaxHolders    = 8
)

// ClusterOptions configure a Cluster.
type ClusterOptions struct {
	// Locator is the cluster index; nil: prefetch needs a peer.
	Locator Locator
	// Self is this node's id: the index may list it as a holder of a block
	// it evicted since; it never fetches from itself.
	Self string
	// LookupTimeout bounds one index lookup (0: 2s).
	LookupTimeout time.Duration
	// MaxHolders caps the holders fetched from at once (0: 8).
	MaxHolders int
	// Nodes is the cluster index's membership, which a Request with
	// KnownPeerOnly checks its peer against; nil: none (standalone).
	Nodes NodeLister
	// PeersVerified: the peer port's mTLS checks every holder's
	// certificate against --peer-allow as it is dialed, so any peer a
	// fetch reaches is admitted (KnownPeerOnly needs no index then).
	PeersVerified bool
	// PD counts P/D pulls and refused peers; required.
	PD *metrics.PD
}

// NodeLister lists the cluster's live nodes (index.Index is one).
type NodeLister interface {
	Nodes(ctx context.Context) ([]index.Node, error)
}

// Cluster is the prefetch engine seen by the local API: a fetch names a
// peer (Engine.Prefetch as is), or none, and then the cluster index says
// who holds each block and Cluster fetches from several holders at once.
// It owns no state beyond its options; the Engine owns the fetches.
type Cluster struct {
	*Engine
	o ClusterOptions
}

// NewCluster wraps e. A nil o.Locator keeps peer-less prefetch refused
// with index.ErrDisabled.
func NewCluster(e *Engine, o ClusterOptions) (*Cluster, error) {
	if o.PD == nil {
		return nil, errors.New("requester: ClusterOptions.PD is required")
	}
	if o.LookupTimeout <= 0 {
		o.LookupTimeout = defaultLookupTimeout
	}
	if o.MaxHolders <= 0 {
		o.MaxHolders = defaultMaxHolders
	}
	return &Cluster{Engine: e, o: o}, nil
}

// Fetch is Prefetch of r: with r.KnownPeerOnly, a peer that is not a
// known node (checkPeer) is refused with ErrUnknownPeer before anything is
// sent, and counted; with r.Handoff, the bytes fetched count as a P/D
// pull.
func (c *Cluster) Fetch(ctx context.Context, r Request) (*Result, error) {
	if r.KnownPeerOnly && r.Peer != "" { // without a peer the index chooses: known by construction
		if err := c.checkPeer(ctx, r.Peer); err != nil {
			return nil, err
		}
	}
	r.KnownPeerOnly = false
	var (
		res *Result
		err error
	)
	if r.Peer != "" {
		res, err = c.Engine.Fetch(ctx, r)
	} else {
		res, err = c.fromIndex(ctx, r)
	}
	if r.Handoff != "" && res != nil {
		c.o.PD.PullBytes.Add(float64(res.Bytes))
	}
	return res, err
}

// checkPeer admits peer when the peer port's mTLS checks it against
// --peer-allow at the dial, or when the cluster index lists a live node
// advertising that address. Otherwise it refuses (ErrUnknownPeer), also
// when the index cannot answer: an address from a request body is never
// dialed unchecked.
func (c *Cluster) checkPeer(ctx context.Context, peer string) error {
	if c.o.PeersVerified {
		return nil
	}
	refuse := func(reason string, err error) error {
		c.o.PD.PeerRefusals.WithLabelValues(reason).Inc()
		c.log.Warn().Str("remote", peer).Str("reason", reason).Err(err).Msg("Prefetch refused: not a known peer")
		return &FetchError{Peer: peer, Phase: "validate", Class: ErrUnknownPeer, Err: err}
	}
	if c.o.Nodes == nil {
		return refuse(metrics.RefusedNoCheck, fmt.Errorf("peer %q: %s", peer, noPeerCheck))
	}
	lctx, cancel := context.WithTimeout(ctx, c.o.LookupTimeout)
	defer cancel()
	nodes, err := c.o.Nodes.Nodes(lctx)
	if err != nil {
		return refuse(metrics.RefusedIndexDown, fmt.Errorf("peer %q not checked: %w", peer, err))
	}
	for _, n := range nodes {
		if n.Addr == peer {
			return nil
		}
	}
	return refuse(metrics.RefusedNotInIndex, fmt.Errorf("peer %q: no live node of the cluster index advertises that address (%d live)", peer, len(nodes)))
}

// Prefetch fetches hashes from peer, or, with peer "", from whichever live
// nodes the cluster index says hold them:
//
//   - look the hashes up (failing fast, index.ErrUnavailable, when the
//     index cannot answer); skip this node and nodes not live;
//   - group the hashes by holder, the holder with the most of them first,
//     each hash in exactly one group, and fetch the groups in parallel;
//   - a hash its holder no longer has (the index is a hint; the holder's
//     QueryBlocksForTransfer is the truth) or failed to serve is tried on
//     its next holder, until none is left.
//
// Each BlockResult's Node names the node that served it; StatusNotFound
// says no live node had it. Bounded by ctx (or the engine's default fetch
// timeout) and at most one round per holder.
func (c *Cluster) Prefetch(ctx context.Context, peer, namespace string, hashes [][]byte) (*Result, error) {
	return c.Fetch(ctx, Request{Peer: peer, Namespace: namespace, Hashes: hashes})
}

// fromIndex is Fetch without a peer: the cluster index says who holds
// each block (Prefetch has the steps).
func (c *Cluster) fromIndex(ctx context.Context, req Request) (*Result, error) {
	namespace, hashes := req.Namespace, req.Hashes
	start := time.Now()
	if err := validate("cluster", namespace, hashes); err != nil {
		return nil, &FetchError{Phase: "validate", Class: ErrInvalidInput, Err: err}
	}
	if c.o.Locator == nil {
		return nil, fmt.Errorf("requester: prefetch without a peer: %w", index.ErrDisabled)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.defaultTimeout)
		defer cancel()
	}
	// One keep set for every holder's fetch: no group's staging evicts
	// what another group (or the check for local blocks) made local.
	keep := newKeepSet(c.store)
	defer keep.release()
	ctx = withKeep(ctx, keep)
	r := &clusterRun{c: c, ns: namespace, handoff: req.Handoff, keep: keep,
		res: &Result{Blocks: make([]BlockResult, len(hashes)), ReqID: newReqID()}}
	byHash := r.wanted(hashes)
	if err := r.locate(ctx); err != nil {
		return nil, err
	}
	for ctx.Err() == nil && r.round(ctx) {
	}
	return r.finish(ctx, hashes, byHash, start)
}

// want is one distinct hash of a cluster prefetch not already here.
type want struct {
	hash  []byte
	cands []index.Holder // untried live holders, index order
	done  bool
	res   BlockResult
}

// clusterRun is one Cluster.Prefetch. It belongs to the calling goroutine;
// its round's goroutines share it under mu.
type clusterRun struct {
	c       *Cluster
	ns      string
	handoff string // Request.Handoff, sent to every holder
	keep    *keepSet
	wants   []*want
	// mu guards every want, res.Bytes and sessions while a round runs.
	mu       sync.Mutex
	res      *Result
	sessions []string
}

// wanted makes one want per distinct hash (those already here are done)
// and returns them by hash.
func (r *clusterRun) wanted(hashes [][]byte) map[string]*want {
	byHash := make(map[string]*want)
	for _, h := range hashes {
		if _, dup := byHash[string(h)]; dup {
			continue
		}
		w := &want{hash: h, res: BlockResult{Hash: h, Status: StatusNotFound}}
		byHash[string(h)] = w
		if r.keep.local(store.Key{Namespace: r.ns, Hash: string(h)}) {
			w.done, w.res.Status = true, StatusAlreadyLocal
			continue
		}
		r.wants = append(r.wants, w)
	}
	return byHash
}

// locate looks the wanted hashes up in the cluster index (failing fast,
// index.ErrUnavailable, when it cannot answer) and keeps, as each one's
// candidates, the live holders other than this node.
func (r *clusterRun) locate(ctx context.Context) error {
	if len(r.wants) == 0 {
		return nil
	}
	lookup := make([][]byte, len(r.wants))
	for i, w := range r.wants {
		lookup[i] = w.hash
	}
	lctx, cancel := context.WithTimeout(ctx, r.c.o.LookupTimeout)
	found, err := r.c.o.Locator.Locate(lctx, r.ns, lookup)
	cancel()
	if err != nil {
		return fmt.Errorf("requester: prefetch without a peer: locate holders: %w", err)
	}
	for i, w := range r.wants {
		for _, h := range found[i] {
			if h.NodeID != r.c.o.Self && h.Addr != "" {
				w.cands = append(w.cands, h)
			}
		}
	}
	return nil
}

// round fetches every want not done from one of its candidates (those
// holding it in DRAM while any is left), the holders in parallel (at
// most MaxHolders at once); false when no want has a candidate left.
func (r *clusterRun) round(ctx context.Context) bool {
	groups := plan(r.wants, func(w *want) []index.Holder {
		if w.done {
			return nil
		}
		// A DRAM copy first: an SSD holder reads the block back before
		// it can answer. SSD holders get their turn once every DRAM
		// holder of the block was tried.
		return index.PreferDRAM(w.cands)
	})
	if len(groups) == 0 {
		return false
	}
	sem := make(chan struct{}, r.c.o.MaxHolders)
	var wg sync.WaitGroup
	for _, g := range groups {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r.fetchGroup(ctx, g)
		})
	}
	wg.Wait()
	return true
}

// fetchGroup fetches one holder's group and records each want's outcome.
func (r *clusterRun) fetchGroup(ctx context.Context, g group[*want]) {
	hs := make([][]byte, len(g.items))
	for i, w := range g.items {
		hs[i] = w.hash
	}
	// A holder that hangs (a blackholed node not yet lapsed) may take at
	// most half the time left when another holder could serve some of its
	// blocks, so the next one still gets a try.
	actx, cancel := ctx, context.CancelFunc(func() {})
	if dl, ok := ctx.Deadline(); ok && slices.ContainsFunc(g.items, func(w *want) bool { return len(w.cands) > 1 }) {
		actx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
	}
	res, err := r.c.Engine.Fetch(actx, Request{Peer: g.holder.Addr, Namespace: r.ns, Hashes: hs, Handoff: r.handoff})
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if res != nil {
		r.res.Bytes += res.Bytes
		if res.SessionID != "" {
			r.sessions = append(r.sessions, res.SessionID)
		}
	}
	for i, w := range g.items {
		// This holder is tried for w, whatever it answered.
		w.cands = slices.DeleteFunc(w.cands, func(h index.Holder) bool { return h.NodeID == g.holder.NodeID })
		var br BlockResult
		switch {
		case res != nil && i < len(res.Blocks):
			br = res.Blocks[i]
		case err != nil:
			br = BlockResult{Status: StatusFailed, Err: err}
		}
		switch br.Status {
		case StatusFetched, StatusAlreadyLocal:
			w.done = true
			w.res = BlockResult{Hash: w.hash, Status: br.Status, Node: g.holder.NodeID}
		case StatusNotFetched:
			// This node's pool is what is short, not the holder: no
			// other holder is asked.
			w.done = true
			w.res = BlockResult{Hash: w.hash, Status: br.Status, Err: br.Err, Node: g.holder.NodeID}
		case StatusMissingOnPeer:
			// Stale hint: next holder. NotFound stays unless another
			// holder failed it.
		default:
			if br.Err == nil {
				br.Err = err
			}
			w.res = BlockResult{Hash: w.hash, Status: br.Status, Err: br.Err, Node: g.holder.NodeID}
			if w.res.Status == 0 {
				w.res.Status = StatusFailed
			}
		}
	}
}

// finish writes each hash's outcome into the result, in request order.
func (r *clusterRun) finish(ctx context.Context, hashes [][]byte, byHash map[string]*want, start time.Time) (*Result, error) {
	var errs []error
	for _, w := range r.wants {
		if !w.done && ctx.Err() != nil && len(w.cands) > 0 {
			w.res = BlockResult{Hash: w.hash, Status: StatusFailed, Err: &FetchError{Phase: "wait", Class: classify(ctxErr(ctx), ErrDeadline), Err: ctxErr(ctx)}}
		}
		if w.res.Status == StatusFailed || w.res.Status == StatusDiscarded {
			errs = append(errs, w.res.Err)
		}
	}
	res := r.res
	for i, h := range hashes {
		b := byHash[string(h)].res
		b.Hash = h
		res.Blocks[i] = b
	}
	res.SessionID = strings.Join(r.sessions, ",")
	res.Duration = time.Since(start)
	if len(errs) > 0 {
		return res, errors.Join(errs...)
	}
	return res, nil
}

// group is the hashes one holder serves in a round.
type group[T any] struct {
	holder index.Holder
	items  []T
}

// plan assigns each item with candidates to exactly one of them, greedily:
// the holder that can serve the most items takes all of those, then the
// next among what is left, and so on (ties: lower node id). Fewer, larger
// fetches mean fewer locks and handshakes; several holders run at once.
func plan[T any](items []T, cands func(T) []index.Holder) []group[T] {
	left := make([]T, 0, len(items))
	for _, it := range items {
		if len(cands(it)) > 0 {
			left = append(left, it)
		}
	}
	var out []group[T]
	for len(left) > 0 {
		count := make(map[string]int)
		holders := make(map[string]index.Holder)
		for _, it := range left {
			for _, h := range cands(it) {
				count[h.NodeID]++
				holders[h.NodeID] = h
			}
		}
		best := ""
		for id, n := range count {
			if best == "" || n > count[best] || (n == count[best] && id < best) {
				best = id
			}
		}
		g := group[T]{holder: holders[best]}
		rest := left[:0]
		for _, it := range left {
			if slices.ContainsFunc(cands(it), func(h index.Holder) bool { return h.NodeID == best }) {
				g.items = append(g.items, it)
			} else {
				rest = append(rest, it)
			}
		}
		left = rest
		out = append(out, g)
	}
	slices.SortStableFunc(out, func(a, b group[T]) int { return cmp.Compare(len(b.items), len(a.items)) })
	return out
}
