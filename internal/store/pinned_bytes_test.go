package store

import (
	"testing"

	"github.com/pegaflow/pegad/internal/metrics"
)

// TestPinnedBytesMetric: pegaflow_pool_pinned_bytes counts each pinned
// block's bytes once, however many pins it has, until its last Unpin (the
// pool-nearly-full-of-pinned-blocks alert reads it).
func TestPinnedBytesMetric(t *testing.T) {
	s, m := newStore(t, 1<<20)
	const bs = 64 * kib
	mustPut(t, s, key(0), 0, SlotSize{KSize: bs / 2, VSize: bs / 2})
	mustPut(t, s, key(1), 1, SlotSize{KSize: bs})
	steps := []struct {
		name string
		do   func() []*Block
		want float64
	}{
		{"nothing pinned", func() []*Block { return nil }, 0},
		{"one block", func() []*Block { p, _ := s.Pin([]Key{key(0)}); return p }, bs},
		{"same block again", func() []*Block { p, _ := s.Pin([]Key{key(0)}); return p }, bs},
		{"second block", func() []*Block { p, _ := s.Pin([]Key{key(1)}); return p }, 2 * bs},
	}
	var held [][]*Block
	for _, st := range steps {
		held = append(held, st.do())
		if got := metrics.Value(m.PoolPinned); got != st.want {
			t.Fatalf("%s: pinned bytes %v, want %v", st.name, got, st.want)
		}
	}
	for i := len(held) - 1; i >= 0; i-- {
		s.Unpin(held[i])
	}
	if got := metrics.Value(m.PoolPinned); got != 0 {
		t.Fatalf("after every unpin: pinned bytes %v, want 0", got)
	}
}
