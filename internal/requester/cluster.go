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
func NewCluster(e *Engine, o ClusterOptions) *Cluster {
	if o.LookupTimeout <= 0 {
		o.LookupTimeout = defaultLookupTimeout
	}
	if o.MaxHolders <= 0 {
		o.MaxHolders = defaultMaxHolders
	}
	return &Cluster{Engine: e, o: o}
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
	if peer != "" {
		res, err := c.Engine.Prefetch(ctx, peer, namespace, hashes)
		return res, err
	}
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

	res := &Result{Blocks: make([]BlockResult, len(hashes)), ReqID: newReqID()}
	// One entry per distinct hash not already here.
	type want struct {
		hash  []byte
		cands []index.Holder // untried live holders, index order
		done  bool
		res   BlockResult
	}
	var wants []*want
	byHash := make(map[string]*want)
	for _, h := range hashes {
		if _, dup := byHash[string(h)]; dup {
			continue
		}
		w := &want{hash: h, res: BlockResult{Hash: h, Status: StatusNotFound}}
		byHash[string(h)] = w
		if c.store.Has(store.Key{Namespace: namespace, Hash: string(h)}) {
			w.done, w.res.Status = true, StatusAlreadyLocal
			continue
		}
		wants = append(wants, w)
	}
	if len(wants) > 0 {
		lookup := make([][]byte, len(wants))
		for i, w := range wants {
			lookup[i] = w.hash
		}
		lctx, cancel := context.WithTimeout(ctx, c.o.LookupTimeout)
		found, err := c.o.Locator.Locate(lctx, namespace, lookup)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("requester: prefetch without a peer: locate holders: %w", err)
		}
		for i, w := range wants {
			for _, h := range found[i] {
				if h.NodeID != c.o.Self && h.Addr != "" {
					w.cands = append(w.cands, h)
				}
			}
		}
	}

	var mu sync.Mutex // guards every want and res.Bytes/SessionID below
	var sessions []string
	for ctx.Err() == nil {
		groups := plan(wants, func(w *want) []index.Holder {
			if w.done {
				return nil
			}
			return w.cands
		})
		if len(groups) == 0 {
			break
		}
		sem := make(chan struct{}, c.o.MaxHolders)
		var wg sync.WaitGroup
		for _, g := range groups {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				hs := make([][]byte, len(g.items))
				for i, w := range g.items {
					hs[i] = w.hash
				}
				// A holder that hangs (a blackholed node not yet lapsed) may
				// take at most half the time left when another holder could
				// serve some of its blocks, so the next one still gets a try.
				actx, cancel := ctx, context.CancelFunc(func() {})
				if dl, ok := ctx.Deadline(); ok && slices.ContainsFunc(g.items, func(w *want) bool { return len(w.cands) > 1 }) {
					actx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
				}
				r, err := c.Engine.Prefetch(actx, g.holder.Addr, namespace, hs)
				cancel()
				mu.Lock()
				defer mu.Unlock()
				if r != nil {
					res.Bytes += r.Bytes
					if r.SessionID != "" {
						sessions = append(sessions, r.SessionID)
					}
				}
				for i, w := range g.items {
					// This holder is tried for w, whatever it answered.
					w.cands = slices.DeleteFunc(w.cands, func(h index.Holder) bool { return h.NodeID == g.holder.NodeID })
					var br BlockResult
					switch {
					case r != nil && i < len(r.Blocks):
						br = r.Blocks[i]
					case err != nil:
						br = BlockResult{Status: StatusFailed, Err: err}
					}
					switch br.Status {
					case StatusFetched, StatusAlreadyLocal:
						w.done = true
						w.res = BlockResult{Hash: w.hash, Status: br.Status, Node: g.holder.NodeID}
					case StatusMissingOnPeer:
						// Stale hint: next holder. NotFound stays unless
						// another holder failed it.
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
			})
		}
		wg.Wait()
	}
	var errs []error
	for _, w := range wants {
		if !w.done && ctx.Err() != nil && len(w.cands) > 0 {
			w.res = BlockResult{Hash: w.hash, Status: StatusFailed, Err: &FetchError{Phase: "wait", Class: classify(ctxErr(ctx), ErrDeadline), Err: ctxErr(ctx)}}
		}
		if w.res.Status == StatusFailed || w.res.Status == StatusDiscarded {
			errs = append(errs, w.res.Err)
		}
	}
	for i, h := range hashes {
		r := byHash[string(h)].res
		r.Hash = h
		res.Blocks[i] = r
	}
	res.SessionID = strings.Join(sessions, ",")
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
