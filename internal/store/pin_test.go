package store

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/pegaflow/pegad/internal/metrics"
)

// TestPinBlockRemovedAfterLookup: a block deleted (and its key put again)
// between Pin's lookup and its pinning pass is reported missing and not
// pinned; its memory is freed at once, and the new block under the key is
// not pinned either (the lookup never saw it).
func TestPinBlockRemovedAfterLookup(t *testing.T) {
	s, m := newStore(t, 1<<20)
	for i := range 3 {
		mustPut(t, s, key(i), i, SlotSize{KSize: 4 * kib})
	}
	hooked := false
	pinGapHook = func() {
		if hooked {
			return
		}
		hooked = true
		if _, err := s.Delete(key(1)); err != nil {
			t.Errorf("Delete: %v", err)
		}
		mustPut(t, s, key(1), 100, SlotSize{KSize: 8 * kib})
	}
	t.Cleanup(func() { pinGapHook = func() {} })

	pinned, missing := s.Pin([]Key{key(0), key(1), key(2)})
	if !hooked {
		t.Fatal("the gap hook did not run")
	}
	if !slices.Equal(missing, []int{1}) || len(pinned) != 2 || pinned[0].Key() != key(0) || pinned[1].Key() != key(2) {
		t.Fatalf("Pin = %d blocks, missing %v; want keys 0 and 2 pinned, 1 missing", len(pinned), missing)
	}
	st := s.Stats()
	if st.Pinned != 2 || st.DeferredFree != 0 || st.Blocks != 3 {
		t.Fatalf("stats %+v: want 2 pinned, nothing deferred, 3 indexed", st)
	}
	if want := uint64(4*kib*2 + 8*kib); st.Pool.Used != want {
		t.Fatalf("pool used %d, want %d: the deleted block's memory was kept", st.Pool.Used, want)
	}
	if got := metrics.Value(m.PoolPinned); got != 2*4*kib {
		t.Fatalf("pinned bytes %v, want %v", got, 2*4*kib)
	}
	s.Unpin(pinned)
	if st := s.Stats(); st.Pinned != 0 || st.RefUnderflows != 0 {
		t.Fatalf("after unpin: %+v", st)
	}
}

// TestPinBatchesWhileEvicting: requesters pin batches of many keys while
// puts evict and deletes remove blocks under a small pool. Every block a
// batch pinned keeps its bytes until its unpin, every key is either pinned
// or missing (in order), and nothing is left pinned or allocated at the
// end. Run with -race: the lookup pass runs without the store's main lock.
func TestPinBatchesWhileEvicting(t *testing.T) {
	const (
		keys  = 96
		batch = 32
		bs    = 8 * kib
	)
	s, _ := newStore(t, 48*bs) // half the keys fit: puts evict
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for range 300 {
				ks := make([]Key, batch)
				start := rng.IntN(keys)
				for i := range ks {
					ks[i] = key((start + i) % keys)
				}
				pinned, missing := s.Pin(ks)
				if len(pinned)+len(missing) != batch || !slices.IsSorted(missing) {
					t.Errorf("Pin: %d pinned + %d missing of %d", len(pinned), len(missing), batch)
					return
				}
				for _, b := range pinned {
					if !bytes.Equal(blockBytes(b), pattern(keyIndex(b.key), b.size)) {
						t.Errorf("pinned block %x changed under a pin", b.key.Hash)
					}
				}
				s.Unpin(pinned)
			}
		})
	}
	for w := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 12))
			for range 600 {
				k := rng.IntN(keys)
				if rng.IntN(4) == 0 {
					_, _ = s.Delete(key(k))
					continue
				}
				_, err := s.Put(key(k), []SlotSize{{KSize: bs}}, func(buf []byte) error {
					copy(buf, pattern(k, bs))
					return nil
				})
				if err != nil && !errors.Is(err, ErrNoSpace) { // all indexed blocks may be pinned
					t.Errorf("Put: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	st := s.Stats()
	if st.Pinned != 0 || st.DeferredFree != 0 || st.Evictions == 0 {
		t.Fatalf("stats %+v: want no pins left and some evictions", st)
	}
	infos, _ := s.List("", 0)
	for _, in := range infos {
		if _, err := s.Delete(in.Key); err != nil {
			t.Fatal(err)
		}
	}
	if st := s.Stats(); st.Pool.Used != 0 || st.RefUnderflows != 0 {
		t.Fatalf("after deleting everything: %+v", st)
	}
}
