package conn

import (
	"sync"
	"testing"
	"time"
)

// TestOpProgress: every completed READ is reported with the index of the op
// it belongs to, so the bytes reported per op add up to the op's length,
// also for an op split into several WRs over several QPs and NICs.
func TestOpProgress(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2, qps: 2, mem: 48 << 20})
	req := newNode(t, d, nodeOpts{id: "req", nics: 2, qps: 2, mem: 48 << 20})
	hold.fillRandom(3)
	c, err := req.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	spans := []span{{0, 5, 1}, {64, 4099, 4097}, {1 << 20, 1 << 20, 20<<20 + 11}, {24 << 20, 30 << 20, 4096}}
	var mu sync.Mutex // guards got, calls, bad
	got := make([]uint64, len(spans))
	calls, bad := 0, 0
	var plain uint64 // WithProgress's total: ignored when WithOpProgress is set
	ctx := WithProgress(ctxT(t, 20*time.Second), func(n uint64) {
		mu.Lock()
		plain += n
		mu.Unlock()
	})
	ctx = WithOpProgress(ctx, func(op int, n uint64) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if op < 0 || op >= len(got) {
			bad++
			return
		}
		got[op] += n
	})
	if err := c.Read(ctx, opsOf(req, hold, spans)); err != nil {
		t.Fatalf("Read: %v", err)
	}
	checkSpans(t, req, hold, spans)
	mu.Lock()
	defer mu.Unlock()
	if bad != 0 {
		t.Fatalf("%d completions reported with an op index out of range", bad)
	}
	for i, s := range spans {
		if got[i] != s.n {
			t.Errorf("op %d: %d bytes reported, want %d", i, got[i], s.n)
		}
	}
	if want := len(spans) + 20; calls != want { // 20 MiB + 11 is 21 WRs of at most 1 MiB (Options.SliceBytes)
		t.Errorf("%d completions reported, want %d (one per WR)", calls, want)
	}
	if plain != 0 {
		t.Errorf("WithProgress saw %d bytes though WithOpProgress was set", plain)
	}

	// Without WithOpProgress, WithProgress still gets every byte.
	var total uint64
	ctx = WithProgress(ctxT(t, 20*time.Second), func(n uint64) {
		mu.Lock()
		total += n
		mu.Unlock()
	})
	mu.Unlock()
	err = c.Read(ctx, opsOf(req, hold, spans[:2]))
	mu.Lock()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if want := spans[0].n + spans[1].n; total != want {
		t.Errorf("WithProgress total %d, want %d", total, want)
	}
}
