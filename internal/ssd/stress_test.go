package ssd

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestStressRingRaces spills, loads and forgets a small set of blocks
// from several goroutines over a ring that wraps all the time: a load
// either misses or returns the block's exact bytes, and a read that races
// with its segment's reclaim is a miss, never a checksum failure.
func TestStressRingRaces(t *testing.T) {
	e := newEnv(t, 2, 4<<20, 1<<20)
	e.o.QueueBytes = 1 << 20
	tr := e.open(t)
	const nkeys, n = 256, 60 << 10
	bodies := make([][]byte, nkeys)
	for i := range bodies {
		bodies[i] = pattern(i, n)
	}
	stop := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	var loaded, missed int64
	var mu sync.Mutex
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for time.Now().Before(stop) {
				time.Sleep(50 * time.Microsecond) // two cores: leave the writers room
				i := rng.IntN(nkeys)
				switch {
				case g < 3:
					tr.Spill(key(i), sizes2(n), n, func(dst []byte) { copy(dst, bodies[i]) })
				case g < 5:
					_, data, err := loadCopy(tr, key(i))
					mu.Lock()
					if err == nil {
						loaded++
					} else {
						missed++
					}
					mu.Unlock()
					if err != nil && !errors.Is(err, ErrNotFound) {
						t.Errorf("load %d: %v", i, err)
						return
					}
					if err == nil && !bytes.Equal(data, bodies[i]) {
						t.Errorf("load %d: WRONG BYTES", i)
						return
					}
				default:
					tr.Forget(key(i))
				}
			}
		}()
	}
	wg.Wait()
	waitIdle(t, tr)
	if f := testutil.ToFloat64(e.m.ChecksumFailures); f != 0 {
		t.Fatalf("%v checksum failures without corruption", f)
	}
	t.Logf("loaded %d, missed %d, written %v, aged out %v, drops %v", loaded, missed,
		testutil.ToFloat64(e.m.Written), testutil.ToFloat64(e.m.AgedOut), testutil.ToFloat64(e.m.Drops.WithLabelValues("queue_full")))
	if testutil.ToFloat64(e.m.AgedOut) == 0 || loaded == 0 {
		t.Fatalf("the ring never wrapped (aged out %v) or nothing loaded (%d)", testutil.ToFloat64(e.m.AgedOut), loaded)
	}
}
