package store

import (
	"context"
	"testing"
)

// flushingLower is a fakeLower whose SpillWait holds what it is handed, as
// the SSD tier queues it, after running during (the window in which
// FlushLower has the block pinned but no lock held).
type flushingLower struct {
	*fakeLower
	during func(Key)
}

func (l *flushingLower) SpillWait(_ context.Context, k Key, sizes []SlotSize, size uint64, fill func([]byte)) error {
	buf := make([]byte, size)
	fill(buf)
	if l.during != nil {
		l.during(k)
	}
	l.hold(k, append([]SlotSize(nil), sizes...), buf)
	return nil
}

// TestDeleteDuringFlushWins: a block deleted while a clean stop's
// FlushLower copies it to the lower tier must not be on the tier
// afterwards. The Delete succeeded (the block was in the pool, pinned by
// the flush), so a restart that brought it back from the tier would
// resurrect a deleted block, and a later re-put would read the old bytes.
func TestDeleteDuringFlushWins(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	low := &flushingLower{fakeLower: newFakeLower()}
	s.SetLower(low, nil)
	sz := SlotSize{KSize: 4 * kib, VSize: 4 * kib}
	mustPut(t, s, key(1), 1, sz)
	mustPut(t, s, key(2), 2, sz)

	deleted := false
	low.during = func(k Key) {
		if k != key(1) || deleted {
			return
		}
		deleted = true
		if _, err := s.Delete(k); err != nil {
			t.Errorf("Delete during the flush: %v", err)
		}
	}
	n, err := s.FlushLower(context.Background())
	if err != nil {
		t.Fatalf("FlushLower: %v", err)
	}
	if !deleted {
		t.Fatal("the flush never offered the block that the test deletes")
	}
	if low.Has(key(1)) {
		t.Fatal("a block deleted during FlushLower is on the lower tier: a restart would resurrect it")
	}
	if s.Has(key(1)) {
		t.Fatal("the deleted block is still indexed")
	}
	if !low.Has(key(2)) {
		t.Fatal("the block nobody deleted was not flushed")
	}
	if n != 1 {
		t.Fatalf("FlushLower handed over %d blocks, want 1 (the deleted one does not count)", n)
	}
	if st := s.Stats(); st.Pinned != 0 {
		t.Fatalf("stats %+v: the flush left pins", st)
	}
	s.mu.Lock()
	left := len(s.promoting)
	s.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d tier writes still registered", left)
	}
}
