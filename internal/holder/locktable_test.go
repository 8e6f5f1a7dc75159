package holder

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/metrics/metricstest"
)

// TestExactlyOnceUnpinUnderRace ends the same sessions from every path at
// once — owner release, expiry, operator force-release, requester restart,
// shutdown — and checks each session's pins were dropped exactly once.
func TestExactlyOnceUnpinUnderRace(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Log = zerolog.Nop() })
	const rounds, perRound = 20, 200
	for round := 0; round < rounds; round++ {
		inc := fmt.Sprintf("inc-%d", round)
		ids := make([]string, perRound)
		for i := range ids {
			ids[i] = e.open(t, fmt.Sprintf("node-%d", i%4), inc, 1+i%3)
		}
		expireAt := e.clock.Advance(time.Minute)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := 0; g < 4; g++ {
			wg.Add(4)
			go func() { // owners
				defer wg.Done()
				<-start
				for i, id := range ids {
					_, _ = e.svc.locks.Release(id, fmt.Sprintf("node-%d", i%4), inc)
				}
			}()
			go func() { // operator
				defer wg.Done()
				<-start
				for i := len(ids) - 1; i >= 0; i-- {
					_, _ = e.svc.locks.ForceRelease(ids[i], "op")
				}
			}()
			go func() { // sweeper
				defer wg.Done()
				<-start
				for i := 0; i < 10; i++ {
					e.svc.locks.ExpireBefore(expireAt)
				}
			}()
			go func(g int) { // restarts
				defer wg.Done()
				<-start
				_, _ = e.svc.ObserveIncarnation(fmt.Sprintf("node-%d", g), inc+"-next")
			}(g)
		}
		close(start)
		if round%5 == 4 {
			e.svc.locks.ReleaseAll("race")
		}
		wg.Wait()
	}
	st := e.state()
	if st.sessions != 0 || st.locked != 0 || st.gActive != 0 || st.gLocked != 0 {
		t.Fatalf("leftover: %+v", st)
	}
	e.pins.check(t, 0)
}

// Test100kSessionsExpiry: with 100k live sessions, a sweep ends exactly
// the few expired ones, and does so without touching the rest.
func Test100kSessionsExpiry(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Log = zerolog.Nop() })
	t0 := e.clock.Now()
	const live, early = 100_000, 50
	earlyIDs := map[string]bool{}
	for i := 0; i < early; i++ {
		earlyIDs[e.open(t, "early", "", 1)] = true
	}
	e.clock.Advance(time.Second)
	for i := 0; i < live; i++ {
		e.open(t, fmt.Sprintf("n%d", i%1000), "", 1)
	}
	start := time.Now()
	n := e.svc.locks.ExpireBefore(t0.Add(10 * time.Second))
	took := time.Since(start)
	if n != early {
		t.Fatalf("expired %d, want %d", n, early)
	}
	if e.svc.locks.Len() != live {
		t.Fatalf("live = %d, want %d", e.svc.locks.Len(), live)
	}
	for _, s := range e.svc.locks.Sessions() {
		if earlyIDs[s.ID] {
			t.Fatalf("expired session %s still listed", s.ID)
		}
	}
	// Generous bound (race detector, 2 cores): a full scan under -race takes
	// far longer than this; the heaps make it O(shards + k log n).
	if took > 100*time.Millisecond {
		t.Fatalf("sweep of %d expired among %d live took %v", early, live, took)
	}
	t.Logf("sweep of %d expired among %d live took %v", early, live, took)
	if n := e.svc.locks.ExpireBefore(t0.Add(11 * time.Second)); n != live {
		t.Fatalf("second sweep expired %d, want %d", n, live)
	}
	e.pins.check(t, 0)
}

func BenchmarkExpireBefore(b *testing.B) {
	for _, expiring := range []int{0, 10} {
		b.Run(fmt.Sprintf("live=100000/expired=%d", expiring), func(b *testing.B) {
			pins := newFakePinner()
			clock := newFakeClock()
			svc := mustNew(b, Options{Store: pins, Metrics: metricstest.New(), Log: zerolog.Nop(), LockTimeout: time.Minute, Now: clock.Now})
			base := clock.Now()
			clock.Set(base.Add(time.Hour))
			for i := 0; i < 100_000; i++ {
				if _, err := svc.locks.open(fmt.Sprintf("n%d", i%1000), "", pins.pins(1), 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				clock.Set(base)
				for j := 0; j < expiring; j++ {
					if _, err := svc.locks.open("x", "", pins.pins(1), 1); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				if n := svc.locks.ExpireBefore(base.Add(2 * time.Minute)); n != expiring {
					b.Fatalf("expired %d, want %d", n, expiring)
				}
			}
		})
	}
}

func BenchmarkQueryReleaseParallel(b *testing.B) {
	pins := newFakePinner()
	svc := mustNew(b, Options{Store: pins, Metrics: metricstest.New(), Log: zerolog.Nop()})
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s, err := svc.locks.open("n", "", pins.pins(4), 4)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := svc.locks.Release(s.id.String(), "n", ""); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestIdleRequestersForgotten: requester nodes that come and go do not
// grow the table forever, and a node holding a session is never forgotten
// (its incarnation history still guards its sessions).
func TestIdleRequestersForgotten(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxRequesters = 4 })
	keep := e.open(t, "holder-of-lock", "k1", 1)
	for i := 0; i < 100; i++ {
		if _, err := e.svc.ObserveIncarnation(fmt.Sprintf("n%d", i), "i"); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(time.Minute) // > 2 * max lifetime (25s) each step
	}
	e.svc.locks.nodesMu.Lock()
	n := len(e.svc.locks.nodes)
	_, kept := e.svc.locks.nodes["holder-of-lock"]
	e.svc.locks.nodesMu.Unlock()
	if n > 8 {
		t.Fatalf("%d requester nodes tracked, want <= 8", n)
	}
	if !kept {
		t.Fatal("node with a live session was forgotten")
	}
	if _, err := e.svc.ObserveIncarnation("holder-of-lock", "k2"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.locks.Release(keep, "holder-of-lock", "k2"); err != nil {
		t.Fatal(err)
	}
	// Its session lapsed long ago (no sweeper ran here): the restart ends
	// it as expired, not reclaimed (TestLapsedLeaseOnEveryPath).
	if st := e.state(); st.timeouts != 1 || st.reclaims != 0 || st.sessions != 0 {
		t.Fatalf("restart of a long-lived node did not end its lapsed session: %+v", st)
	}
	e.pins.check(t, 0)
}
