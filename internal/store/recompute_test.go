package store

import (
	"testing"

	"github.com/pegaflow/pegad/internal/evict"
)

// TestRecomputeWindow: the sketch remembers at least the last 5 × and at
// most the last 10 × the peak block count of evictions (the peak taken as
// at least minRecomputeBlocks): a generation's evictions are all found
// until the second rotation after them, and (but for the filter's false
// positives) none after it.
func TestRecomputeWindow(t *testing.T) {
	const gen = recomputeSpan * minRecomputeBlocks
	var r recomputeSketch
	for id := range uint64(gen) { // generation 1: ids [0, gen)
		r.evicted(id, 10)
	}
	for id := range uint64(gen) { // generation 2: [gen, 2 gen)
		r.evicted(gen+id, 10)
	}
	for id := range uint64(2 * gen) {
		if !r.seen(id) {
			t.Fatalf("id %d of the last 10 × peak evictions forgotten", id)
		}
	}
	r.evicted(2*gen, 10) // generation 3 begins: generation 1 goes
	if !r.seen(2*gen) || !r.seen(gen) || !r.seen(2*gen-1) {
		t.Fatal("the newest evictions forgotten at a rotation")
	}
	false1 := 0
	for id := range uint64(gen) {
		if r.seen(id) {
			false1++
		}
	}
	if limit := gen / 100; false1 > limit { // recomputeFP is 0.1 %
		t.Fatalf("%d of %d aged-out evictions still found (limit %d)", false1, gen, limit)
	}
	if n := uint(2 * recomputeSpan * minRecomputeBlocks); r.curCap+r.oldCap != n {
		t.Fatalf("generations sized %d + %d, want %d in all", r.curCap, r.oldCap, n)
	}
}

// TestRecomputeSizedByPeak: a generation begun after the index held more
// than minRecomputeBlocks blocks is sized for recomputeSpan × that peak.
func TestRecomputeSizedByPeak(t *testing.T) {
	var r recomputeSketch
	r.evicted(1, 3000)
	if r.curCap != recomputeSpan*3000 {
		t.Fatalf("generation sized %d, want %d", r.curCap, recomputeSpan*3000)
	}
}

// TestRecomputedOnlyLocalPuts: a block evicted and then inserted as a
// copy fetched from a peer is not a recomputation; the same put locally
// is, once per eviction.
func TestRecomputedOnlyLocalPuts(t *testing.T) {
	s := newPolicyStore(t, evict.KindLRU, 4)
	var told []string
	s.OnRecomputed(func(ns string) { told = append(told, ns) })
	for i := range 6 { // key(0), key(1) evicted
		mustPut(t, s, key(i), i, SlotSize{KSize: 64 * kib})
	}
	if s.Has(key(0)) || s.Has(key(1)) {
		t.Fatal("key(0), key(1) not evicted")
	}
	putFetched(t, s, key(0)) // evicts key(2)
	if n := s.Recomputed(); n != 0 {
		t.Fatalf("a fetched copy counted: %d recomputed", n)
	}
	mustPut(t, s, key(1), 1, SlotSize{KSize: 64 * kib}) // evicts key(3)
	mustPut(t, s, key(2), 2, SlotSize{KSize: 64 * kib})
	mustPut(t, s, key(7), 7, SlotSize{KSize: 64 * kib}) // never held
	if n := s.Recomputed(); n != 2 || len(told) != 2 || told[0] != "ns" {
		t.Fatalf("%d recomputed, told %v; want 2, [ns ns]", n, told)
	}
}
