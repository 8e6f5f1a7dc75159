package ssd

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/store"
)

// writerGate holds a writer (writeHook) before the next job that match
// reports, until release.
type writerGate struct {
	mu      sync.Mutex // guards the fields below
	match   func(*job) bool
	entered chan struct{} // closed once a writer holds
	release chan struct{} // closed by the test to let it go
}

// installGate sets writeHook to a gate; call it before Open, so that the
// writers start after it.
func installGate(t *testing.T) *writerGate {
	t.Helper()
	g := &writerGate{}
	writeHook = g.hook
	t.Cleanup(func() { writeHook = func(*job) {} }) // after the tier's Close (cleanups run last first)
	return g
}

func (g *writerGate) hook(j *job) {
	g.mu.Lock()
	hold := g.match != nil && g.match(j)
	if hold {
		g.match = nil
	}
	entered, release := g.entered, g.release
	g.mu.Unlock()
	if hold {
		close(entered)
		<-release
	}
}

// arm makes the gate hold the next job match reports; wait blocks until a
// writer holds there.
func (g *writerGate) arm(match func(*job) bool) (wait func(t *testing.T), release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.match, g.entered, g.release = match, make(chan struct{}), make(chan struct{})
	entered, rel := g.entered, g.release
	wait = func(t *testing.T) {
		t.Helper()
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("no writer reached the gate")
		}
	}
	return wait, sync.OnceFunc(func() { close(rel) })
}

func blockOf(k store.Key) func(*job) bool {
	return func(j *job) bool { return j.key == k && !j.tomb }
}

// spillBytes offers k with data (sizes2) without waiting for its write.
func spillBytes(tr *Tier, k store.Key, data []byte) {
	n := uint64(len(data))
	tr.Spill(k, sizes2(n), n, func(dst []byte) { copy(dst, data) })
}

// holdsBytes fails unless tr holds k with data, on path dev (-1: any).
func holdsBytes(t *testing.T, tr *Tier, k store.Key, data []byte, dev int) {
	t.Helper()
	tr.mu.Lock()
	l, ok := tr.index[k]
	tr.mu.Unlock()
	if !ok {
		t.Fatalf("%s not held", k.Hash)
	}
	if dev >= 0 && l.dev != tr.devs[dev] {
		t.Fatalf("%s on %s, want path %d", k.Hash, l.dev.path, dev)
	}
	if _, got, err := loadCopy(tr, k); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("%s: load err %v, same bytes %v", k.Hash, err, bytes.Equal(got, data))
	}
}

func waitHeld(t *testing.T, tr *Tier, k store.Key) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !tr.Has(k) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never written", k.Hash)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestForgetDuringWriteThenRespill: a Forget while the writer writes K's
// record, then K spilled again at once with new bytes (issue 33, defect
// 3). The tier holds the new copy, and so must a restart: the tombstone
// of the first record must not land after the second (the log read
// record, record, tombstone, and a clean restart dropped the block).
// Forgotten once more, K stays gone after the restart.
func TestForgetDuringWriteThenRespill(t *testing.T) {
	for _, again := range []bool{false, true} {
		t.Run(fmt.Sprintf("forgetAgain=%v", again), func(t *testing.T) {
			g := installGate(t)
			e := newEnv(t, 1, 8<<20, 1<<20)
			tr := e.open(t)
			const n = 32 << 10
			k, v1, v2 := key(1), pattern(1, n), pattern(2, n)
			wait, release := g.arm(blockOf(k))
			defer release()
			spillBytes(tr, k, v1)
			wait(t) // the writer is writing K's first record
			if !tr.Forget(k) {
				t.Fatal("Forget of a block being written: not held")
			}
			spillBytes(tr, k, v2) // evicted again at once
			release()
			waitIdle(t, tr)
			holdsBytes(t, tr, k, v2, -1)
			if again {
				if !tr.Forget(k) {
					t.Fatal("second Forget: not held")
				}
				waitIdle(t, tr)
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			tr = e.open(t)
			if again {
				if tr.Has(k) {
					t.Fatal("forgotten twice, the block came back after a restart")
				}
				return
			}
			if !tr.Has(k) {
				t.Fatal("the tier held the re-spilled block before a clean restart, and dropped it after")
			}
			holdsBytes(t, tr, k, v2, -1)
		})
	}
}

// TestNewestWriteWinsAcrossPaths: with two paths, K's first copy lands on
// path 1; K is forgotten (its tombstone queued on path 1) and spilled
// again with new bytes, which path 0 writes first (issue 33, defect 4).
// Killed before path 1 writes the tombstone, a restart must serve the
// newer copy: write order, not path order (path 1 was applied last and
// won). With the tombstone written (a clean stop), the newer copy too.
func TestNewestWriteWinsAcrossPaths(t *testing.T) {
	for _, kill := range []bool{true, false} {
		t.Run(fmt.Sprintf("kill=%v", kill), func(t *testing.T) {
			g := installGate(t)
			e := newEnv(t, 2, 8<<20, 1<<20)
			tr := e.open(t)
			const n = 32 << 10
			k, filler, v1, v2 := key(1), key(2), pattern(1, n), pattern(2, n)

			// Path 0 busy with a filler: K's first copy goes to path 1.
			wait, release := g.arm(blockOf(filler))
			spillBytes(tr, filler, pattern(9, n))
			wait(t)
			spillBytes(tr, k, v1)
			waitHeld(t, tr, k)
			release()
			waitIdle(t, tr)
			holdsBytes(t, tr, k, v1, 1)

			// Path 1 holds K's tombstone: the new copy goes to path 0.
			wait, release = g.arm(func(j *job) bool { return j.tomb && j.key == k })
			defer release()
			if !tr.Forget(k) {
				t.Fatal("Forget: not held")
			}
			wait(t)
			spillBytes(tr, k, v2)
			waitHeld(t, tr, k)
			holdsBytes(t, tr, k, v2, 0)

			if kill {
				killHolding(tr, release) // the tombstone is never written
			} else {
				release()
				waitIdle(t, tr)
				if err := tr.Close(); err != nil {
					t.Fatal(err)
				}
			}
			tr = e.open(t)
			if !tr.Has(k) {
				t.Fatal("the newer copy is gone after the restart")
			}
			_, got, err := loadCopy(tr, k)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Equal(got, v1) {
				t.Fatal("a restart served the older copy (path 1, applied last), not the newer one (path 0)")
			}
			if !bytes.Equal(got, v2) {
				t.Fatal("a restart served other bytes")
			}
		})
	}
}

// killHolding leaves tr as a kill -9 would while a writer is held at the
// gate: the files are closed under it, so that what it then writes fails
// and nothing more reaches the logs; release lets it go.
func killHolding(tr *Tier, release func()) {
	tr.mu.Lock()
	tr.closed = true
	for _, d := range tr.devs {
		close(d.queue)
	}
	tr.mu.Unlock()
	for _, d := range tr.devs {
		_ = d.f.Close()
	}
	release()
	tr.wg.Wait()
}

// TestSeqResumesAfterRestart: records written after a restart order after
// those found (their seqs follow the highest), so a key forgotten and
// spilled again after a restart comes back with its newest copy, and
// listings stay newest first.
func TestSeqResumesAfterRestart(t *testing.T) {
	e := newEnv(t, 2, 8<<20, 1<<20)
	tr := e.open(t)
	const n = 16 << 10
	for i := range 4 {
		spill(t, tr, i, n)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	tr = e.open(t)
	if !tr.Forget(key(0)) {
		t.Fatal("Forget: not held")
	}
	spillBytes(tr, key(0), pattern(100, n))
	waitIdle(t, tr)
	entries, _ := tr.Page("", 0, 10, nil)
	if len(entries) != 4 || entries[0].Key != key(0) {
		t.Fatalf("listing after a restart: %v; want 4, the re-spilled key 0 first", entries)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	tr = e.open(t)
	holdsBytes(t, tr, key(0), pattern(100, n), -1)
	for i := 1; i < 4; i++ {
		mustLoad(t, tr, i, n)
	}
}
