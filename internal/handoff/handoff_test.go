package handoff

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
)

// clock is a settable time for the table's leases.
type clock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type env struct {
	st  *store.Store
	tab *Table
	m   *metrics.PD
	clk *clock
}

// newEnv is a table over a real store holding blocks "h0".."h{n-1}" of
// namespace "ns", 100 bytes each.
func newEnv(t *testing.T, n int) *env {
	t.Helper()
	p, err := pool.New(pool.Options{Size: 1 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	e := &env{st: store.New(p, nil), m: metricstest.NewPD(), clk: &clock{t: time.Unix(1000, 0)}}
	for i := range n {
		if _, err := e.st.Put(store.Key{Namespace: "ns", Hash: fmt.Sprintf("h%d", i)}, []store.SlotSize{{KSize: 100}},
			func([]byte) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	e.tab, err = New(Options{Store: e.st, Metrics: e.m, Log: zerolog.Nop(), Now: e.clk.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.tab.Close() })
	return e
}

func hashes(names ...string) [][]byte {
	out := make([][]byte, len(names))
	for i, n := range names {
		out[i] = []byte(n)
	}
	return out
}

func keys(names ...string) []store.Key {
	out := make([]store.Key, len(names))
	for i, n := range names {
		out[i] = store.Key{Namespace: "ns", Hash: n}
	}
	return out
}

func (e *env) pinned(t *testing.T, want uint64) {
	t.Helper()
	if got := e.st.Stats().Pinned; got != want {
		t.Fatalf("pinned blocks = %d, want %d", got, want)
	}
}

func (e *env) ended(t *testing.T, result string, want float64) {
	t.Helper()
	if got := testutil.ToFloat64(e.m.Handoffs.WithLabelValues(result)); got != want {
		t.Fatalf("handoffs{result=%q} = %v, want %v", result, got, want)
	}
}

func TestOpenRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hashes [][]byte
		ttl    time.Duration
		want   error
		text   string
	}{
		{"a block missing", hashes("h0", "nope", "h1"), 0, ErrMissing, "1 of 3 blocks"},
		{"ttl past the maximum", hashes("h0"), MaxTTL + time.Second, ErrInvalid, "ttl"},
		{"negative ttl", hashes("h0"), -time.Second, ErrInvalid, "ttl"},
		{"no hashes", nil, 0, ErrInvalid, ""},
		{"empty hash", hashes(""), 0, ErrInvalid, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 2)
			_, err := e.tab.Open("ns", tc.hashes, tc.ttl)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Open = %v, want %v with %q", err, tc.want, tc.text)
			}
			e.pinned(t, 0)
			if n := e.tab.Len(); n != 0 {
				t.Fatalf("%d pending after a refused Open", n)
			}
		})
	}
}

func TestPulledEndsEachPinThenCompletes(t *testing.T) {
	e := newEnv(t, 3)
	h, err := e.tab.Open("ns", hashes("h0", "h1", "h2", "h1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if h.Blocks != 3 || h.Bytes != 300 || h.TTL != DefaultTTL || len(h.Token) != TokenLen {
		t.Fatalf("Open = %+v", h)
	}
	e.pinned(t, 3)
	if n := e.tab.Pulled(h.Token, []store.Key{{Namespace: "other", Hash: "h0"}, {Namespace: "ns", Hash: "x"}}); n != 0 {
		t.Fatalf("Pulled of keys not in the handoff ended %d pins", n)
	}
	if n := e.tab.Pulled(h.Token, keys("h0")); n != 1 {
		t.Fatalf("Pulled(h0) = %d, want 1", n)
	}
	e.pinned(t, 2)
	if n := e.tab.Pulled(h.Token, keys("h0")); n != 0 {
		t.Fatalf("second Pulled(h0) = %d: a pin ended twice", n)
	}
	e.clk.advance(250 * time.Millisecond)
	if n := e.tab.Pulled(h.Token, keys("h1", "h2")); n != 2 {
		t.Fatalf("Pulled(h1, h2) = %d, want 2", n)
	}
	e.pinned(t, 0)
	e.ended(t, metrics.HandoffCompleted, 1)
	if got := testutil.ToFloat64(e.m.Pending); got != 0 {
		t.Fatalf("pending gauge = %v", got)
	}
	if released, _, _ := e.tab.Release(h.Token); released {
		t.Fatal("Release of a completed handoff released it")
	}
}

func TestWrongTokenChangesNothing(t *testing.T) {
	e := newEnv(t, 1)
	h, err := e.tab.Open("ns", hashes("h0"), 0)
	if err != nil {
		t.Fatal(err)
	}
	forged := h.Token[:IDLen] + strings.Repeat("0", TokenLen-IDLen) // the right id, a wrong secret
	for _, tok := range []string{forged, "", "zz", strings.Repeat("0", TokenLen)} {
		if n := e.tab.Pulled(tok, keys("h0")); n != 0 {
			t.Fatalf("Pulled(%q) ended %d pins", tok, n)
		}
		if released, _, _ := e.tab.Release(tok); released {
			t.Fatalf("Release(%q) released", tok)
		}
	}
	e.pinned(t, 1)
}

// TestDoneEndsWhatWasNotPulled: a consumer that pulled only part of a
// handoff (it had the rest, or stopped early) ends it when done; the
// pins it never pulled end then, each once, and it counts as completed.
func TestDoneEndsWhatWasNotPulled(t *testing.T) {
	e := newEnv(t, 4)
	h, err := e.tab.Open("ns", hashes("h0", "h1", "h2", "h3"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := e.tab.Pulled(h.Token, keys("h1")); n != 1 {
		t.Fatalf("Pulled(h1) = %d", n)
	}
	forged := h.Token[:IDLen] + strings.Repeat("0", TokenLen-IDLen) // the right id, a wrong secret
	if ended, _, err := e.tab.Done(forged); ended || err != nil {
		t.Fatalf("Done with a wrong secret = %v, %v: it ended someone else's handoff", ended, err)
	}
	e.pinned(t, 3)
	ended, n, err := e.tab.Done(h.Token)
	if err != nil || !ended || n != 3 {
		t.Fatalf("Done = %v, %d, %v; want true, 3 (the blocks not pulled)", ended, n, err)
	}
	e.pinned(t, 0)
	e.ended(t, metrics.HandoffCompleted, 1)
	if got := testutil.ToFloat64(e.m.Pending); got != 0 {
		t.Fatalf("pending gauge = %v", got)
	}
	if ended, _, err := e.tab.Done(h.Token); ended || err != nil {
		t.Fatalf("second Done = %v, %v", ended, err)
	}
	if n := e.tab.Pulled(h.Token, keys("h0")); n != 0 {
		t.Fatalf("Pulled after Done ended %d pins", n)
	}
	if _, _, err := e.tab.Done("short"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Done of a malformed token = %v, want ErrInvalid", err)
	}
	e.pinned(t, 0)
	e.ended(t, metrics.HandoffCompleted, 1)
	if st := e.st.Stats(); st.RefUnderflows != 0 {
		t.Fatalf("%d unpin underflows", st.RefUnderflows)
	}
}

func TestReleaseIsIdempotent(t *testing.T) {
	e := newEnv(t, 2)
	h, err := e.tab.Open("ns", hashes("h0", "h1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	e.tab.Pulled(h.Token, keys("h0"))
	released, n, err := e.tab.Release(h.Token)
	if err != nil || !released || n != 1 {
		t.Fatalf("Release = %v, %d, %v; want true, 1 (the block not pulled)", released, n, err)
	}
	e.pinned(t, 0)
	if released, _, err := e.tab.Release(h.Token); released || err != nil {
		t.Fatalf("second Release = %v, %v", released, err)
	}
	if _, _, err := e.tab.Release("short"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Release of a malformed token = %v, want ErrInvalid", err)
	}
	e.ended(t, metrics.HandoffReleased, 1)
}

func TestExpiry(t *testing.T) {
	e := newEnv(t, 2)
	short, err := e.tab.Open("ns", hashes("h0"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	long, err := e.tab.Open("ns", hashes("h1"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if n := e.tab.ExpireBefore(e.clk.now()); n != 0 {
		t.Fatalf("expired %d before any ttl passed", n)
	}
	e.clk.advance(time.Second)
	// Lapsed but not swept: no longer pullable or listed.
	if n := e.tab.Pulled(short.Token, keys("h0")); n != 0 {
		t.Fatalf("Pulled a lapsed handoff: %d", n)
	}
	if l, _ := e.tab.List(10); len(l) != 1 || l[0].ID != long.Token[:IDLen] || l[0].TTLLeft != 9*time.Second {
		t.Fatalf("List = %+v, want only the long one with 9s left", l)
	}
	if n := e.tab.ExpireBefore(e.clk.now()); n != 1 {
		t.Fatalf("ExpireBefore = %d, want 1", n)
	}
	e.pinned(t, 1)
	e.ended(t, metrics.HandoffExpired, 1)
	if n := e.tab.Close(); n != 1 {
		t.Fatalf("Close ended %d, want 1", n)
	}
	e.pinned(t, 0)
	if _, err := e.tab.Open("ns", hashes("h0"), 0); !errors.Is(err, ErrDraining) {
		t.Fatalf("Open after Close = %v", err)
	}
	e.pinned(t, 0)
}

func TestLimit(t *testing.T) {
	e := newEnv(t, 2)
	tab, err := New(Options{Store: e.st, Metrics: metricstest.NewPD(), MaxPending: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tab.Close() })
	if _, err := tab.Open("ns", hashes("h0"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.Open("ns", hashes("h1"), 0); !errors.Is(err, ErrLimit) {
		t.Fatalf("Open past MaxPending = %v", err)
	}
	e.pinned(t, 1)
}

// TestConcurrentEnds races every way a handoff ends: each pin is given
// back once (the store counts an unpin of an unpinned block as an
// underflow).
func TestConcurrentEnds(t *testing.T) {
	e := newEnv(t, 8)
	names := []string{"h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7"}
	for range 50 {
		h, err := e.tab.Open("ns", hashes(names...), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for _, n := range names {
			wg.Go(func() { e.tab.Pulled(h.Token, keys(n)) })
		}
		wg.Go(func() { _, _, _ = e.tab.Release(h.Token) })
		wg.Go(func() { _, _, _ = e.tab.Done(h.Token) })
		wg.Go(func() { e.tab.ExpireBefore(e.clk.now().Add(time.Second)) })
		wg.Wait()
		e.pinned(t, 0)
	}
	if st := e.st.Stats(); st.RefUnderflows != 0 {
		t.Fatalf("%d unpin underflows", st.RefUnderflows)
	}
}

func FuzzParseToken(f *testing.F) {
	f.Add(strings.Repeat("ab", TokenLen/2))
	f.Add("")
	f.Add(strings.Repeat("g", TokenLen))
	f.Fuzz(func(t *testing.T, tok string) {
		id, secret, err := ParseToken(tok)
		if err != nil {
			if ID(tok) != "" {
				t.Fatalf("ID of a malformed token %q = %q", tok, ID(tok))
			}
			return
		}
		if len(tok) != TokenLen || ID(tok) != tok[:IDLen] {
			t.Fatalf("accepted %q", tok)
		}
		if got := fmt.Sprintf("%x%x", id, secret); got != strings.ToLower(tok) {
			t.Fatalf("round trip %q -> %q", tok, got)
		}
	})
}
