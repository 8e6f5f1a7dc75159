package requester

import (
	"sync/atomic"
)

// readTracker follows, for one fetch, which planned blocks have landed and
// whether the lock was confirmed live after they did, so a fetch cut short
// (its deadline, a forced release, a broken link) keeps exactly the blocks
// read under a live lock (docs/lessons.md L10 per block) instead of none.
//
// One clock orders both kinds of event: a block is stamped when the
// completion of its last outstanding READ is polled (its bytes are in
// memory then), a renewal when it is sent. A renewal that succeeds proves
// the lock was live when it was sent (a lock never comes back once ended),
// so every block stamped before it was read entirely under the live lock.
type readTracker struct {
	// opBlock maps an op index (buildOps) to its plan index; set before
	// Read runs and not changed while it does.
	opBlock []int
	size    []uint64        // per plan block: payload bytes
	left    []atomic.Int64  // per plan block: bytes not yet completed
	doneAt  []atomic.Uint64 // per plan block: clock when its last READ completed; 0 = not all yet
	clock   atomic.Uint64
	// confirmed is the clock of the latest renewal sent that succeeded.
	confirmed atomic.Uint64
}

func newReadTracker(plan []*planBlock) *readTracker {
	t := &readTracker{
		size:   make([]uint64, len(plan)),
		left:   make([]atomic.Int64, len(plan)),
		doneAt: make([]atomic.Uint64, len(plan)),
	}
	for i, b := range plan {
		t.size[i] = b.bytes
	}
	t.reset()
	return t
}

// reset forgets every completion: the blocks are read again from the
// start. Only while no Read runs.
func (t *readTracker) reset() {
	for i := range t.size {
		t.left[i].Store(int64(t.size[i]))
		t.doneAt[i].Store(0)
	}
}

// completed records n bytes of op landed (conn.WithOpProgress; called
// concurrently from the QP workers). Exactly one call sees its block's
// count reach zero, after every other READ of the block completed.
func (t *readTracker) completed(op int, n uint64) {
	if op < 0 || op >= len(t.opBlock) {
		return
	}
	b := t.opBlock[op]
	if t.left[b].Add(-int64(n)) == 0 {
		t.doneAt[b].Store(t.clock.Add(1))
	}
}

// renewalSent stamps a renewal about to be sent; confirm(stamp) once it
// succeeded.
func (t *readTracker) renewalSent() uint64 { return t.clock.Add(1) }

func (t *readTracker) confirm(stamp uint64) {
	for {
		c := t.confirmed.Load()
		if stamp <= c || t.confirmed.CompareAndSwap(c, stamp) {
			return
		}
	}
}

// landed reports whether every byte of plan block i was read.
func (t *readTracker) landed(i int) bool { return t.doneAt[i].Load() != 0 }

// keep reports whether plan block i may be indexed: it landed entirely and
// the lock was confirmed live afterwards, by a renewal sent after it or by
// the release's answer (live).
func (t *readTracker) keep(i int, live bool) bool {
	d := t.doneAt[i].Load()
	return d != 0 && (live || d < t.confirmed.Load())
}
