package kvevents

import (
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/ssd"
	"github.com/pegaflow/pegad/internal/store"
)

// TestSSDMedium: with an SSD tier under the store, a block the pool
// evicts is announced removed from "cpu", then stored on "ssd" once its
// record is written; a delete of the SSD copy is announced removed from
// "ssd". A subscriber decoding as llm-d does sees each with its medium.
func TestSSDMedium(t *testing.T) {
	const kib = 1024
	r := newRig(t, 64*kib, Options{})
	tier, err := ssd.Open(ssd.Options{Paths: []string{t.TempDir()}, Size: ssd.MinSize, SegmentSize: 1 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close() })
	r.s.SetLower(tier, nil)
	tier.OnEvents(r.p.Enqueue)
	lines := startPy(t, "sub", "tcp://"+r.p.Addr(), "kv@")
	if l := next(t, lines); !l.Ready {
		t.Fatalf("first line %+v", l)
	}
	r.waitSubscribers(t, 1)

	const ns = "m"
	for _, h := range []string{"h1", "h2", "h3", "h4", "h5"} { // the pool holds four: h5 evicts h1
		r.put(t, ns, h, 16*kib)
	}
	k1 := store.Key{Namespace: ns, Hash: "h1"}
	deadline := time.Now().Add(10 * time.Second)
	for !tier.Has(k1) {
		if time.Now().After(deadline) {
			t.Fatal("h1 never written to the SSD tier")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := r.s.Delete(k1); err != nil {
		t.Fatal(err)
	}
	want := []tierEvent{
		{"BlockStored", "h1", "cpu"}, {"BlockStored", "h2", "cpu"}, {"BlockStored", "h3", "cpu"}, {"BlockStored", "h4", "cpu"},
		{"BlockRemoved", "h1", "cpu"}, {"BlockStored", "h5", "cpu"},
		{"BlockStored", "h1", "ssd"},
		{"BlockRemoved", "h1", "ssd"},
	}
	var got []tierEvent
	for len(got) < len(want) {
		l := next(t, lines)
		for _, e := range l.Events {
			for _, h := range e.Hashes {
				for _, name := range []string{"h1", "h2", "h3", "h4", "h5"} {
					if h == hashOf(name) {
						got = append(got, tierEvent{e.Tag, name, e.Medium})
					}
				}
			}
		}
	}
	// Each medium's events come in order; across media they need not: the
	// SSD writer publishes h1's record from its own goroutine, which may
	// beat the store's eviction event for the same spill.
	for _, medium := range []string{"cpu", "ssd"} {
		if g, w := ofMedium(got, medium), ofMedium(want, medium); !slices.Equal(g, w) {
			t.Fatalf("%s events %v\nwant       %v (all: %v)", medium, g, w, got)
		}
	}
}

// tierEvent is one hash of a KV event, as TestSSDMedium compares them.
type tierEvent struct{ tag, hash, medium string }

// ofMedium keeps the events of one medium, in order.
func ofMedium(evs []tierEvent, medium string) []tierEvent {
	var out []tierEvent
	for _, e := range evs {
		if e.medium == medium {
			out = append(out, e)
		}
	}
	return out
}
