package kvevents

import (
	"context"
	"fmt"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
)

// BenchmarkPut: a store put of a small block (the pool full, so every put
// also evicts) without KV events, and with them on and a stalled
// subscriber (every message dropped for it: the most work per put).
func BenchmarkPut(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "events=off", true: "events=on"}[on], func(b *testing.B) {
			pl, err := pool.New(pool.Options{Size: 1 << 20, Log: zerolog.Nop()})
			if err != nil {
				b.Fatal(err)
			}
			defer pl.Close()
			s := store.New(pl, nil)
			if on {
				p, err := New(Options{Endpoint: "tcp://127.0.0.1:0", NodeID: "n", Metrics: metricstest.NewKVEvents()})
				if err != nil {
					b.Fatal(err)
				}
				s.OnEvents(p.Enqueue)
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); p.Run(ctx) }()
				defer func() { cancel(); <-done }()
			}
			keys := make([]store.Key, 4096)
			for i := range keys {
				keys[i] = store.Key{Namespace: "ns", Hash: fmt.Sprintf("%032d", i)}
			}
			sz := []store.SlotSize{{KSize: 1024}}
			fill := func([]byte) error { return nil }
			b.ResetTimer()
			for i := range b.N {
				if _, err := s.Put(keys[i%len(keys)], sz, fill); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
