package holder

import (
	"errors"
	"sync"
	"time"

	"github.com/pegaflow/pegad/internal/store"
)

// Quarantine: the blocks of a lock whose memory windows could not be
// proved invalid (Windows: an unbind that failed, or a refused bind that
// left windows live) stay pinned for the life of the process, so the pool
// never hands their memory to other blocks while a window may still read
// it. The conn side has moved the windows' QP to ERROR and invalidated the
// requester's connection; what stays here is the memory. Each is logged
// (session, requester, blocks, bytes, cause), its blocks show in the
// store's pinned counts (pegactl stats, pegaflow_pool_pinned_bytes), in
// pegaflow_peer_quarantined_bytes (alert PegadLocksQuarantined) and in
// Quarantined, and their bytes stay counted against --max-pinned-bytes.

// quarantineSet is the lock table's quarantined locks.
type quarantineSet struct {
	mu    sync.Mutex // guards locks
	locks []QuarantinedLock
}

// QuarantinedLock is one quarantined lock's blocks.
type QuarantinedLock struct {
	Session   string // "" for a lock refused at its bind
	Requester string
	Blocks    int
	Bytes     uint64
	At        time.Time
	Cause     string
	blocks    []*store.Block // kept pinned, never unpinned
}

// isLive reports whether err says windows may still be valid
// (LiveWindows).
func isLive(err error) bool {
	var lw LiveWindows
	return errors.As(err, &lw) && lw.WindowsLive()
}

// quarantine keeps blocks pinned for good. counted: their bytes are
// already in the node-wide pin count (a session's); otherwise they are
// added to it.
func (t *LockTable) quarantine(owner, session string, blocks []*store.Block, bytes uint64, cause error, counted bool) {
	if !counted {
		t.pinnedBytes.Add(bytes)
		t.m.PeerPinnedBytes.Add(float64(bytes))
	}
	q := QuarantinedLock{Session: session, Requester: owner, Blocks: len(blocks), Bytes: bytes,
		At: t.clock.Now(), Cause: cause.Error(), blocks: blocks}
	t.m.PeerQuarantined.Add(float64(bytes))
	t.quarantined.mu.Lock()
	t.quarantined.locks = append(t.quarantined.locks, q)
	n := len(t.quarantined.locks)
	t.quarantined.mu.Unlock()
	t.log.Error().Err(cause).Str("session", session).Str("requester", owner).Int("blocks", len(blocks)).
		Uint64("bytes", bytes).Int("quarantined_locks", n).
		Msg("Transfer lock quarantined: its memory windows could not be invalidated; its blocks stay pinned, never reused")
}

// Quarantined lists the quarantined locks, oldest first.
func (t *LockTable) Quarantined() []QuarantinedLock {
	t.quarantined.mu.Lock()
	defer t.quarantined.mu.Unlock()
	return append([]QuarantinedLock(nil), t.quarantined.locks...)
}
