package holder

// What the lock table lists for operators (pegactl sessions list, locks
// list): live sessions only, never lapsed ones the sweeper has not reached.

import (
	"container/heap"
	"sort"
	"time"

	"github.com/pegaflow/pegad/internal/store"
)

// SessionInfo is a listing row (pegactl sessions list).
type SessionInfo struct {
	ID          string
	RequesterID string
	Incarnation string
	Blocks      int
	Bytes       uint64
	CreatedAt   time.Time
	ExpiresAt   time.Time
	Renewals    int
	// Handoff is the token of the handoff the session pulls for ("":
	// none); listings show only its id.
	Handoff string
	blocks  []*store.Block // immutable; for Locked
}

// Sessions snapshots the live sessions (not lapsed ones the sweeper has
// yet to end), oldest first.
func (t *LockTable) Sessions() []SessionInfo {
	out := make([]SessionInfo, 0, t.Len())
	nowS := t.clock.Stamp(t.clock.Now())
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		sh.live.each(func(s *session) {
			if !s.lapsed(nowS) { // over, though not swept yet: not live
				out = append(out, t.infoLocked(s))
			}
		})
		sh.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// SessionsPage lists up to limit (> 0) live sessions (not lapsed ones the
// sweeper has yet to end) opened after cursor (0: from the first), oldest
// first; next is the cursor of the following page, 0 on the last. Each
// shard is locked only while its sessions past the cursor are offered to
// a bounded heap of the limit+1 oldest, so a page costs O(n log limit)
// time and O(limit) memory, and no lock is held across shards.
func (t *LockTable) SessionsPage(cursor uint64, limit int) (page []SessionInfo, next uint64) {
	limit = max(limit, 1)
	h := make(pageHeap, 0, limit+1)
	nowS := t.clock.Stamp(t.clock.Now())
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		sh.live.each(func(s *session) {
			if s.seq <= cursor || s.lapsed(nowS) || (len(h) == limit+1 && s.seq >= h[0].seq) {
				return
			}
			row := pageRow{seq: s.seq, info: t.infoLocked(s)}
			if len(h) == limit+1 {
				h[0] = row
				heap.Fix(&h, 0)
			} else {
				heap.Push(&h, row)
			}
		})
		sh.mu.Unlock()
	}
	sort.Slice(h, func(i, j int) bool { return h[i].seq < h[j].seq })
	if len(h) > limit {
		h = h[:limit]
		next = h[limit-1].seq
	}
	page = make([]SessionInfo, len(h))
	for i, r := range h {
		page[i] = r.info
	}
	return page, next
}

// infoLocked is s's listing row; its shard's mu held.
func (t *LockTable) infoLocked(s *session) SessionInfo {
	return SessionInfo{
		ID: s.id.String(), RequesterID: s.owner(), Incarnation: s.incarnation(),
		Blocks: len(s.blocks), Bytes: s.bytes, CreatedAt: t.clock.At(s.created),
		ExpiresAt: t.clock.At(s.deadline()), Renewals: int(s.lease.Renewals()), Handoff: s.handoff(), blocks: s.blocks,
	}
}

type pageRow struct {
	seq  uint64
	info SessionInfo
}

// pageHeap is a max-heap by seq: its top is the newest row kept.
type pageHeap []pageRow

func (h pageHeap) Len() int           { return len(h) }
func (h pageHeap) Less(i, j int) bool { return h[i].seq > h[j].seq }
func (h pageHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *pageHeap) Push(x any)        { *h = append(*h, x.(pageRow)) }
func (h *pageHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	*h = old[:len(old)-1]
	return r
}

// Len is the number of live sessions.
func (t *LockTable) Len() int { return int(t.liveSessions.Load()) }

// LockedBlocks is the number of block pins held by live sessions (a block
// in two sessions counts twice).
func (t *LockTable) LockedBlocks() int { return int(t.lockedBlocks.Load()) }
