package store

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/pegaflow/pegad/internal/metrics"
)

// TestConcurrentStress runs puts, staged multi-block inserts, pins held
// across other goroutines' evictions, reads and deletes at once under a
// small pool. Every pinned block's bytes are checked right before its unpin
// (its memory must not have been reused), every read is checked, and when
// everything is released and deleted the pool is empty again.
func TestConcurrentStress(t *testing.T) {
	const (
		poolSize = 2 << 20
		keys     = 256
		workers  = 8
		ops      = 1500
	)
	s, m := newStore(t, poolSize)
	// The content of key i is pattern(i, size): independent of which
	// goroutine wrote it, so any reader can check any block.
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 77))
			var held []*Block
			unpinSome := func(all bool) bool {
				for len(held) > 0 && (all || rng.IntN(2) == 0) {
					b := held[len(held)-1]
					held = held[:len(held)-1]
					if !bytes.Equal(blockBytes(b), pattern(keyIndex(b.key), b.size)) {
						t.Errorf("pinned block %x changed under a pin", b.key.Hash)
						return false
					}
					s.Unpin([]*Block{b})
				}
				return true
			}
			for i := 0; i < ops; i++ {
				k := rng.IntN(keys)
				switch op := rng.IntN(100); {
				case op < 35: // local put
					n := uint64(rng.IntN(48<<10) + 1)
					sizes := []SlotSize{{KSize: n/2 + 1, VSize: n / 2}}
					if rng.IntN(3) == 0 {
						sizes = append(sizes, SlotSize{KSize: n})
					}
					_, err := s.Put(key(k), sizes, func(buf []byte) error {
						copy(buf, pattern(k, total(sizes)))
						return nil
					})
					if err != nil && !errors.Is(err, ErrNoSpace) {
						t.Errorf("Put: %v", err)
						return
					}
				case op < 42: // a prefetch staging 4 blocks in one extent
					const bs = 16 << 10
					e, err := s.AllocExtent(4 * bs)
					if errors.Is(err, ErrNoSpace) {
						continue
					}
					if err != nil {
						t.Errorf("AllocExtent: %v", err)
						return
					}
					for j := 0; j < 4; j++ {
						kk := (k + j) % keys
						copy(e.Bytes()[j*bs:], pattern(kk, bs))
						if _, err := s.Insert(key(kk), e, []SlotLayout{{KOff: uint64(j) * bs, KLen: bs}}); err != nil {
							t.Errorf("Insert: %v", err)
						}
					}
					s.ReleaseExtent(e)
				case op < 65: // a holder session pins a few
					ks := []Key{key(k), key((k + 1) % keys), key((k + 7) % keys)}
					pinned, _ := s.Pin(ks)
					held = append(held, pinned...)
				case op < 80:
					if !unpinSome(false) {
						return
					}
				case op < 92:
					var got []byte
					info, err := s.Read(key(k), func(c []byte) error { got = append(got, c...); return nil })
					if errors.Is(err, ErrNotFound) {
						continue
					}
					if err != nil {
						t.Errorf("Read: %v", err)
						return
					}
					if !bytes.Equal(got, pattern(k, info.Size)) {
						t.Errorf("Read of %d returned wrong bytes", k)
						return
					}
				default:
					if _, err := s.Delete(key(k)); err != nil && !errors.Is(err, ErrNotFound) {
						t.Errorf("Delete: %v", err)
						return
					}
				}
			}
			unpinSome(true)
		}(uint64(w))
	}
	wg.Wait()
	st := s.Stats()
	if st.Pinned != 0 || st.DeferredFree != 0 {
		t.Fatalf("pins left after every worker unpinned: %+v", st)
	}
	if st.Evictions == 0 {
		t.Fatal("stress never evicted: the pool is too large to test pressure")
	}
	if metrics.Value(m.Blocks) != float64(st.Blocks) || metrics.Value(m.BlockBytes) != float64(st.Bytes) || metrics.Value(m.PoolUsed) != float64(st.Pool.Used) {
		t.Fatalf("metrics disagree with stats %+v", st)
	}
	t.Logf("stress: %d evictions, %d blocks left, pool used %d", st.Evictions, st.Blocks, st.Pool.Used)
	infos, _ := s.List("", 0)
	for _, in := range infos {
		if deferred, err := s.Delete(in.Key); err != nil || deferred {
			t.Fatalf("final Delete(%x) = %v, %v", in.Key.Hash, deferred, err)
		}
	}
	st = s.Stats()
	if st.Pool.Used != 0 || st.Pool.Allocs != 0 || st.Blocks != 0 || st.Bytes != 0 || st.RefUnderflows != 0 {
		t.Fatalf("after releasing everything: %+v", st)
	}
	if st.Pool.LargestFree != st.Pool.Size {
		t.Fatalf("pool not coalesced back: %+v", st.Pool)
	}
	if metrics.Value(m.PoolUsed) != 0 || metrics.Value(m.Blocks) != 0 || metrics.Value(m.BlockBytes) != 0 || metrics.Value(m.PinnedDeferred) != 0 {
		t.Fatal("metrics not back to zero")
	}
	if metrics.Value(m.Evictions) != float64(st.Evictions) {
		t.Fatalf("evictions metric %v, stats %d", metrics.Value(m.Evictions), st.Evictions)
	}
}

// keyIndex inverts key().
func keyIndex(k Key) int {
	var i int
	for _, c := range k.Hash[1:] {
		i = i*10 + int(c-'0')
	}
	return i
}

// BenchmarkPutUnderPressure: steady state of a full pool, every put evicts
// the least recently used block.
func BenchmarkPutUnderPressure(b *testing.B) {
	s, _ := newStore(b, 64<<20)
	const bs = 64 << 10
	sizes := []SlotSize{{KSize: bs / 2, VSize: bs / 2}}
	fill := func(buf []byte) error { return nil }
	b.SetBytes(bs)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Put(key(i), sizes, fill); err != nil {
			b.Fatal(err)
		}
	}
}
