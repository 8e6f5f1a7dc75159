package requester

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/pegaflow/pegad/internal/store"
)

// ErrPoolTooSmall: a block of a prefetch was not fetched because the pool
// had no room for it without evicting blocks that same prefetch had made
// local (StatusNotFetched). Not an error class: the fetch as a whole went
// on and reported what it kept (issue 33, item 7).
var ErrPoolTooSmall = errors.New("pool too small")

// keepSet holds what one prefetch has made local (the staging extents its
// fetched blocks live in, a pin of each block it found already local) until
// the prefetch returns, so its own later staging cannot evict them: a
// staging allocation evicts only blocks whose memory nothing else
// references, and a held extent or a pin is such a reference. Without it a
// prefetch larger than the pool evicted its first windows to stage its last
// ones and still answered "fetched" for all of them.
//
// A Cluster prefetch shares one set among the per-holder fetches it runs
// at once (withKeep), so no group evicts another's blocks. Safe for
// concurrent use.
type keepSet struct {
	st blockStore

	mu    sync.Mutex // guards the fields below
	exts  []extent
	pins  []func()
	bytes uint64 // bytes of the held extents and pinned blocks
	done  bool
}

func newKeepSet(st blockStore) *keepSet { return &keepSet{st: st} }

type keepKey struct{}

// withKeep makes the prefetches run under ctx share k (Cluster.Prefetch).
func withKeep(ctx context.Context, k *keepSet) context.Context {
	return context.WithValue(ctx, keepKey{}, k)
}

// keepOf is the set ctx carries, or nil.
func keepOf(ctx context.Context) *keepSet {
	k, _ := ctx.Value(keepKey{}).(*keepSet)
	return k
}

// extents takes over the fetch's references on xs (staging whose indexed
// blocks hold their own): they are released with the set.
func (k *keepSet) extents(xs []extent) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done { // a fetch that outlived its prefetch (never expected): free at once
		for _, x := range xs {
			k.st.ReleaseStaging(x)
		}
		return
	}
	for _, x := range xs {
		k.exts = append(k.exts, x)
		k.bytes += x.Len()
	}
}

// local pins key, found already local, for as long as the set; false when
// it is no longer indexed (evicted since it was found).
func (k *keepSet) local(key store.Key) bool {
	release, size, ok := k.st.Hold(key)
	if !ok {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		release()
		return true
	}
	k.pins = append(k.pins, release)
	k.bytes += size
	return true
}

// held is the bytes the set keeps now.
func (k *keepSet) held() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.bytes
}

// release lets go of everything held: the blocks become evictable like any
// other. Idempotent.
func (k *keepSet) release() {
	k.mu.Lock()
	exts, pins := k.exts, k.pins
	k.exts, k.pins, k.bytes, k.done = nil, nil, 0, true
	k.mu.Unlock()
	for _, x := range exts {
		k.st.ReleaseStaging(x)
	}
	for _, p := range pins {
		p()
	}
}

// tooSmall is the outcome of a block the pool has no room for beside what
// the prefetch keeps (held bytes, plus staged bytes of the window being
// placed).
func tooSmall(need, held uint64, cause error) error {
	return fmt.Errorf("%w: no room for %s more without evicting the %s this prefetch already brought in (%w)",
		ErrPoolTooSmall, inMiB(need), inMiB(held), cause)
}

// inMiB formats n bytes for an operator (the staging sizes are aligned, so
// rarely a whole unit).
func inMiB(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
