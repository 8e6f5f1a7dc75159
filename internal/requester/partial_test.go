package requester

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// holderByte is the content of the fake holder's memory at remote address a.
func holderByte(a uint64) byte { return byte(a*131 + a>>9 + 7) }

// realStoreHarness is a harness whose engine stages into a real pool and
// store, so a test can check the bytes of what was indexed.
func realStoreHarness(t *testing.T) (*harness, *store.Store, *pool.Pool) {
	t.Helper()
	p, err := pool.New(pool.Options{Size: 4 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	hs := &harness{h: newFakeHolder(), cs: &fakeConns{r: &fakeReader{}}, m: metricstest.New(), log: &testutil.LogBuffer{}}
	s := store.New(p, hs.m)
	e, err := newEngine(Options{
		NodeID: "req-node", Incarnation: "inc-1",
		Peers:   func(string) (pegadv1.PeerServiceClient, error) { return hs.h, nil },
		Metrics: hs.m, Log: zerolog.New(hs.log),
	}, storeAdapter{s}, hs.cs, hooks{})
	if err != nil {
		t.Fatal(err)
	}
	hs.e = e
	t.Cleanup(func() { _ = e.Close() })
	return hs, s, p
}

// TestCutFetchKeepsConfirmedBlocks: issue 19 item 5. A fetch cut short (the
// lock's deadline, a forced release, a broken link, the caller's deadline)
// keeps exactly the blocks whose READs all completed before the lock was
// last confirmed live (a renewal sent after them succeeded, or the release
// answered live), byte for byte, and indexes nothing read after the lock
// ended. Each block is 2 slots of K and V (4 READs); the reader lands them
// one at a time and the fake holder's lock ends at a chosen point.
func TestCutFetchKeepsConfirmedBlocks(t *testing.T) {
	const blocks = 6
	cases := []struct {
		name string
		// endAfter: the lock ends once this many blocks landed and a
		// renewal sent after them succeeded; -1: it never ends.
		endAfter int
		land     int // blocks the reader lands before it finishes
		// lateAnswer: a renewal the holder found live when the lock ended
		// is answered only after the later blocks landed: it confirms
		// what landed before it was sent, not before it was answered.
		lateAnswer bool
		finish     string // "ok", "wait" (until its ctx ends), "broken"
		caller     time.Duration
		wantErr    error
		wantKept   int
		// wantRest: status of the landed blocks not kept.
		wantRest Status
	}{
		{name: "lock deadline after renewals stop", endAfter: 2, land: 4, finish: "wait",
			wantErr: ErrDeadline, wantKept: 2, wantRest: StatusDiscarded},
		{name: "forced release, read finished", endAfter: 2, land: blocks, finish: "ok",
			wantErr: ErrDiscarded, wantKept: 2, wantRest: StatusDiscarded},
		{name: "renewal answered after later blocks landed", endAfter: 2, land: blocks, finish: "ok", lateAnswer: true,
			wantErr: ErrDiscarded, wantKept: 2, wantRest: StatusDiscarded},
		{name: "lock ended before any block", endAfter: 0, land: blocks, finish: "ok",
			wantErr: ErrDiscarded, wantKept: 0, wantRest: StatusDiscarded},
		{name: "broken link under a live lock", endAfter: -1, land: 3, finish: "broken",
			wantErr: ErrConnection, wantKept: 3},
		{name: "caller deadline under a live lock", endAfter: -1, land: 4, finish: "wait", caller: 300 * time.Millisecond,
			wantErr: ErrDeadline, wantKept: 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hs, s, p := realStoreHarness(t)
			// Renewals every 400ms; without them the read is cut ~1.1s
			// after the last one. Wide enough for a loaded host.
			hs.h.lockTimeout = 1200 * time.Millisecond
			var ended, armed atomic.Bool
			inFlight, proceed := make(chan struct{}), make(chan struct{})
			hs.h.renewErr = func() error {
				if ended.Load() {
					return status.Error(codes.NotFound, "session ended FORCED")
				}
				if armed.CompareAndSwap(true, false) {
					close(inFlight) // found live; answered once proceed closes
					<-proceed
				}
				return nil
			}
			hs.h.notLive = func(string) bool { return ended.Load() }
			renewals := func() int { _, _, n := hs.h.counts(); return n }
			mem, base := p.Bytes(), p.Base()
			var landedAfterEnd []int
			hs.cs.r.selfReport = true
			hs.cs.r.read = func(ctx context.Context, ops []conn.ReadOp) error {
				if len(ops) != blocks*4 {
					return fmt.Errorf("%d ops, want %d", len(ops), blocks*4)
				}
				report := conn.OpProgressOf(ctx)
				for b := 0; b < c.land; b++ {
					if b == c.endAfter {
						// A renewal sent after block b-1 landed must succeed
						// first: the one answered next may have been sent
						// before, so wait for the one after it.
						c0 := renewals()
						for b > 0 && renewals() < c0+2 {
							if ctx.Err() != nil {
								return fmt.Errorf("read cut before the lock was renewed: %w", ctx.Err())
							}
							time.Sleep(5 * time.Millisecond)
						}
						if c.lateAnswer {
							armed.Store(true)
							select {
							case <-inFlight:
							case <-ctx.Done():
								return fmt.Errorf("no renewal came: %w", ctx.Err())
							}
							defer close(proceed)
						}
						ended.Store(true) // forced release
					}
					if ended.Load() {
						landedAfterEnd = append(landedAfterEnd, b)
					}
					for i := 4 * b; i < 4*b+4; i++ {
						op := ops[i]
						dst := mem[op.LocalAddr-base : op.LocalAddr-base+op.Len]
						for j := range dst {
							dst[j] = holderByte(op.RemoteAddr + uint64(j))
						}
						report(i, op.Len)
					}
				}
				switch c.finish {
				case "wait":
					<-ctx.Done()
					return ctx.Err()
				case "broken":
					return fmt.Errorf("%w: injected", conn.ErrConnectionBroken)
				}
				return nil
			}
			ctx := context.Background()
			if c.caller > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.caller)
				defer cancel()
			}
			keys := hashes("cut", blocks)
			res, err := hs.e.Prefetch(ctx, "peer:1", "ns", keys)
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("err = %v, want %v", err, c.wantErr)
			}
			// The fake holder hands out addresses in request order from
			// 1<<40: block j's K/V segments are its 4 x 4 KiB from there.
			want := map[string][]byte{}
			for j, h := range keys {
				var b []byte
				for a := uint64(1<<40) + uint64(j)*4*4096; a < uint64(1<<40)+uint64(j+1)*4*4096; a++ {
					b = append(b, holderByte(a))
				}
				want[string(h)] = b
			}
			var kept []store.Key
			for j, r := range res.Blocks {
				key := store.Key{Namespace: "ns", Hash: string(r.Hash)}
				switch {
				case j < c.wantKept:
					if r.Status != StatusFetched || r.Err != nil {
						t.Errorf("block %d: %v %v, want fetched", j, r.Status, r.Err)
						continue
					}
					var got bytes.Buffer
					info, err := s.Read(key, func(b []byte) error { got.Write(b); return nil })
					if err != nil {
						t.Fatalf("block %d: %v", j, err)
					}
					if !info.Fetched {
						t.Errorf("block %d: not indexed as a fetched copy (evicted first)", j)
					}
					if !bytes.Equal(got.Bytes(), want[string(r.Hash)]) {
						t.Errorf("block %d: indexed bytes differ from what the holder had", j)
					}
					kept = append(kept, key)
				default:
					if s.Has(key) {
						t.Errorf("block %d indexed (landed after the lock ended: %v)", j, landedAfterEnd)
					}
					wantSt := StatusFailed
					if j < c.land && c.wantRest != 0 {
						wantSt = c.wantRest
					}
					if c.wantErr == ErrDiscarded {
						wantSt = StatusDiscarded
					}
					if r.Status != wantSt || r.Err == nil {
						t.Errorf("block %d: %v %v, want %v with a reason", j, r.Status, r.Err, wantSt)
					}
				}
			}
			if wantBytes := uint64(c.wantKept) * 4 * 4096; res.Bytes != wantBytes {
				t.Errorf("bytes = %d, want %d (the kept blocks)", res.Bytes, wantBytes)
			}
			hs.h.checkReleasedOnce(t)
			if got := metrics.Value(hs.m.GuardAborts); got != 0 {
				t.Errorf("guard aborts = %v, want 0 (released on the normal path)", got)
			}
			// The staging memory of the dropped blocks went back: once the
			// kept blocks are deleted, the pool is empty.
			for _, k := range kept {
				if _, err := s.Delete(k); err != nil {
					t.Fatal(err)
				}
			}
			if u := p.Used(); u != 0 {
				t.Errorf("pool still uses %d bytes after the kept blocks were deleted (staging leaked)", u)
			}
		})
	}
}
