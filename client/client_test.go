package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/config"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

func TestPutGetDelete(t *testing.T) {
	n := startNode(t, nil)
	tests := []struct {
		name  string
		size  int
		slots []client.SlotSize
	}{
		{"one byte", 1, nil},
		{"4 MiB", 4 << 20, nil},
		{"two slots K and V", 3000, []client.SlotSize{{K: 1000, V: 500}, {K: 1000, V: 500}}},
	}
	for _, zc := range []bool{true, false} {
		var opts []client.Option
		if !zc {
			// No data socket there: Put and Get stream over gRPC.
			opts = []client.Option{client.WithDataSocket(n.socket + ".none"), client.AllowStreamFallback()}
		}
		c := n.dial(t, opts...)
		if c.ZeroCopy() != zc {
			t.Fatalf("ZeroCopy %v, want %v", c.ZeroCopy(), zc)
		}
		for i, tc := range tests {
			t.Run(fmt.Sprintf("%s/zerocopy=%v", tc.name, zc), func(t *testing.T) {
				ctx := context.Background()
				hash := fmt.Appendf(nil, "h-%v-%d", zc, i)
				data := pattern(tc.size, byte(i))
				var popts []client.PutOption
				if tc.slots != nil {
					popts = append(popts, client.WithSlots(tc.slots...))
				}
				var created bool
				if err := c.Put(ctx, "ns", hash, data, append(popts, client.WasCreated(&created))...); err != nil || !created {
					t.Fatalf("Put: %v, created %v", err, created)
				}
				if err := c.Put(ctx, "ns", hash, pattern(tc.size, 99), append(popts, client.WasCreated(&created))...); err != nil || created {
					t.Fatalf("second Put of the same key: %v, created %v", err, created)
				}
				dst := make([]byte, tc.size+10)
				got, err := c.Get(ctx, "ns", hash, dst)
				if err != nil || got != tc.size || !bytes.Equal(dst[:got], data) {
					t.Fatalf("Get = %d, %v; bytes equal %v (the first Put's must win)", got, err, bytes.Equal(dst[:got], data))
				}
				if tc.size > 1 {
					got, err = c.Get(ctx, "ns", hash, dst[:tc.size-1])
					if !errors.Is(err, client.ErrShortBuffer) || got != tc.size {
						t.Fatalf("Get into a short buffer = %d, %v; want %d, ErrShortBuffer", got, err, tc.size)
					}
				}
				if err := c.Delete(ctx, "ns", hash); err != nil {
					t.Fatal(err)
				}
				_, err = c.Get(ctx, "ns", hash, dst)
				if !errors.Is(err, client.ErrNotFound) {
					t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
				}
				// Both paths name the block, in the daemon's words, once.
				want := fmt.Sprintf("block not found: namespace=ns hash=%x", hash)
				if !strings.HasSuffix(err.Error(), want) || strings.Count(err.Error(), "not found") != 1 {
					t.Fatalf("Get after Delete: %q, want it to end %q", err, want)
				}
				if err := c.Delete(ctx, "ns", hash); !errors.Is(err, client.ErrNotFound) {
					t.Fatalf("second Delete: %v, want ErrNotFound", err)
				}
			})
		}
		if !zc {
			if _, err := c.Alloc(context.Background(), "ns", []byte("x"), 10); !errors.Is(err, client.ErrNoZeroCopy) {
				t.Fatalf("Alloc without the data socket: %v, want ErrNoZeroCopy", err)
			}
		}
		// Closing gives back the room reserved for its next Put.
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The streamed Get that stopped early (short buffer) unpins when its
	// server handler sees the cancel: wait for it.
	n.waitStats(t, "after deleting everything", func(st *pegadv1.StatsResponse) bool {
		return st.GetPoolUsed() == 0 && st.GetPinnedBlocks() == 0
	})
}

func TestDialWithoutDataSocket(t *testing.T) {
	n := startNode(t, nil)
	_, err := client.Dial(context.Background(), n.socket, client.WithDataSocket(n.socket+".none"))
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Dial without the data socket: %v, want ErrUnavailable", err)
	}
}

func TestInvalidInput(t *testing.T) {
	n := startNode(t, func(c *config.Config) { c.PoolSize = 1 << 20 })
	c := n.dial(t)
	ctx := context.Background()
	tests := []struct {
		name string
		err  error
		call func() error
	}{
		{"empty namespace", client.ErrInvalid, func() error { return c.Put(ctx, "", []byte("h"), []byte("x")) }},
		{"empty hash", client.ErrInvalid, func() error { return c.Put(ctx, "ns", nil, []byte("x")) }},
		{"hash too long", client.ErrInvalid, func() error { return c.Put(ctx, "ns", make([]byte, 65), []byte("x")) }},
		{"empty block", client.ErrInvalid, func() error { return c.Put(ctx, "ns", []byte("h"), nil) }},
		{"slots do not add up", client.ErrInvalid, func() error {
			return c.Put(ctx, "ns", []byte("h"), []byte("xy"), client.WithSlots(client.SlotSize{K: 1}))
		}},
		{"empty K", client.ErrInvalid, func() error {
			return c.Put(ctx, "ns", []byte("h"), []byte("xy"), client.WithSlots(client.SlotSize{V: 2}))
		}},
		{"larger than the pool", client.ErrPoolFull, func() error { return c.Put(ctx, "ns", []byte("h"), make([]byte, 2<<20)) }},
		{"lease of a missing block", client.ErrNotFound, func() error { _, err := c.Lease(ctx, "ns", []byte("nope")); return err }},
		{"prefetch of no blocks is a no-op", nil, func() error { _, err := c.Prefetch(ctx, "ns", nil); return err }},
		{"prefetch without a peer nor an index", client.ErrNoIndex, func() error {
			_, err := c.Prefetch(ctx, "ns", [][]byte{[]byte("h")})
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
		})
	}
	// The connection is still good after refused items.
	if err := c.Put(ctx, "ns", []byte("ok"), []byte("fine")); err != nil {
		t.Fatal(err)
	}
	if st := n.stats(t); st.GetBlocks() != 1 || st.GetPinnedBlocks() != 0 {
		t.Fatalf("stats after refusals %+v", st)
	}
}

func TestAllocCommitAbort(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t)
	ctx := context.Background()
	w, err := c.Alloc(ctx, "ns", []byte("a"), 1000)
	if err != nil {
		t.Fatal(err)
	}
	copy(w.Bytes(), pattern(1000, 3))
	if _, err := c.Lease(ctx, "ns", []byte("a")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Lease before Commit: %v, want ErrNotFound", err)
	}
	// A second writer of the same key is allowed until one commits.
	w2, err := c.Alloc(ctx, "ns", []byte("a"), 1000)
	if err != nil {
		t.Fatal(err)
	}
	copy(w2.Bytes(), pattern(1000, 4))
	if err := w.Commit(ctx); err != nil || !w.Created() {
		t.Fatalf("Commit: %v created %v", err, w.Created())
	}
	if err := w2.Commit(ctx); err != nil || w2.Created() {
		t.Fatalf("second Commit: %v created %v, want nil and false", err, w2.Created())
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatalf("Commit twice: %v", err)
	}
	if _, err := c.Alloc(ctx, "ns", []byte("a"), 1000); !errors.Is(err, client.ErrExists) {
		t.Fatalf("Alloc of a stored key: %v, want ErrExists", err)
	}
	r, err := c.Lease(ctx, "ns", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Bytes(), pattern(1000, 3)) || r.Size() != 1000 {
		t.Fatal("leased bytes differ from the committed writer's")
	}
	if err := r.Release(); err != nil {
		t.Fatal(err)
	}
	used := n.stats(t).GetPoolUsed()
	w3, err := c.Alloc(ctx, "ns", []byte("b"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.stats(t).GetPoolUsed(); got != used+4096 {
		t.Fatalf("pool used %d after Alloc, want %d", got, used+4096)
	}
	if err := w3.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := w3.Commit(ctx); err != nil {
		t.Fatalf("Commit after Abort must do nothing: %v", err)
	}
	if st := n.stats(t); st.GetPoolUsed() != used || st.GetBlocks() != 1 {
		t.Fatalf("after Abort %+v, want pool used %d and 1 block", st, used)
	}
}

// TestLeaseOutlivesDelete: a leased block's memory stays until Release,
// even once deleted.
func TestLeaseOutlivesDelete(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t)
	ctx := context.Background()
	data := pattern(1<<16, 5)
	if err := c.Put(ctx, "ns", []byte("k"), data); err != nil {
		t.Fatal(err)
	}
	r, err := c.Lease(ctx, "ns", []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "ns", []byte("k")); err != nil {
		t.Fatal(err)
	}
	// Reuse the pool: the deleted block's memory must not be handed out.
	for i := range 8 {
		if err := c.Put(ctx, "ns", fmt.Appendf(nil, "o%d", i), pattern(1<<16, 9)); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(r.Bytes(), data) {
		t.Fatal("leased block overwritten after Delete")
	}
	if st := n.stats(t); st.GetPinnedBlocks() != 1 {
		t.Fatalf("pinned %d, want 1", st.GetPinnedBlocks())
	}
	if err := r.Release(); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(); err != nil {
		t.Fatalf("Release twice: %v", err)
	}
	// 8 blocks and the room reserved for the client's next Put.
	if st := n.stats(t); st.GetPinnedBlocks() != 0 || st.GetPoolUsed() != 9<<16 {
		t.Fatalf("after Release %+v, want 0 pinned, %d used", st, 9<<16)
	}
}

func TestBatches(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t)
	ctx := context.Background()
	const count = 300
	reqs := make([]client.AllocRequest, count)
	for i := range reqs {
		reqs[i] = client.AllocRequest{Namespace: "ns", Hash: fmt.Appendf(nil, "b%d", i), Size: 1000 + i}
	}
	reqs[7].Size = 0 // refused alone
	res, err := c.AllocBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	var ws []*client.Writer
	for i, r := range res {
		if i == 7 {
			if !errors.Is(r.Err, client.ErrInvalid) {
				t.Fatalf("item 7: %v, want ErrInvalid", r.Err)
			}
			continue
		}
		if r.Err != nil {
			t.Fatalf("item %d: %v", i, r.Err)
		}
		copy(r.Writer.Bytes(), pattern(1000+i, byte(i)))
		ws = append(ws, r.Writer)
	}
	if err := c.CommitBatch(ctx, ws); err != nil {
		t.Fatal(err)
	}
	hashes := make([][]byte, count)
	for i := range hashes {
		hashes[i] = reqs[i].Hash
	}
	lr, err := c.LeaseBatch(ctx, "ns", hashes)
	if err != nil {
		t.Fatal(err)
	}
	var rs []*client.Reader
	for i, r := range lr {
		if i == 7 {
			if !errors.Is(r.Err, client.ErrNotFound) {
				t.Fatalf("lease of item 7: %v, want ErrNotFound", r.Err)
			}
			continue
		}
		if r.Err != nil || !bytes.Equal(r.Reader.Bytes(), pattern(1000+i, byte(i))) {
			t.Fatalf("lease of item %d: %v, bytes equal %v", i, r.Err, r.Err == nil && bytes.Equal(r.Reader.Bytes(), pattern(1000+i, byte(i))))
		}
		rs = append(rs, r.Reader)
	}
	if st := n.stats(t); st.GetPinnedBlocks() != count-1 || st.GetBlocks() != count-1 {
		t.Fatalf("stats %+v, want %d pinned and stored", st, count-1)
	}
	if err := c.ReleaseBatch(rs); err != nil {
		t.Fatal(err)
	}
	if st := n.stats(t); st.GetPinnedBlocks() != 0 {
		t.Fatalf("pinned %d after ReleaseBatch", st.GetPinnedBlocks())
	}
}

// TestCloseEndsLeases: a client that closes with leases open leaves no pin
// and no allocation behind.
func TestCloseEndsLeases(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t)
	ctx := context.Background()
	if err := c.Put(ctx, "ns", []byte("k"), pattern(5000, 1)); err != nil {
		t.Fatal(err)
	}
	base := blockBytes(5000) // the block; the spare the Put left goes with the leases
	if _, err := c.Lease(ctx, "ns", []byte("k")); err != nil {
		t.Fatal(err)
	}
	w, err := c.Alloc(ctx, "ns", []byte("w"), 8192)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	n.waitStats(t, "after Close", func(st *pegadv1.StatsResponse) bool {
		return st.GetPinnedBlocks() == 0 && st.GetPoolUsed() == base && st.GetBlocks() == 1
	})
	if err := w.Commit(ctx); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Commit after Close: %v, want ErrClosed", err)
	}
}

// TestLeaseExpiry: a lease neither finished nor renewed ends after the
// daemon's lock-timeout, through the sweeper.
func TestLeaseExpiry(t *testing.T) {
	n := startNode(t, func(c *config.Config) {
		c.LockTimeout = 300 * time.Millisecond
		c.GCInterval = 20 * time.Millisecond
	})
	c := n.dial(t)
	ctx := context.Background()
	if c.LeaseTimeout() != 300*time.Millisecond {
		t.Fatalf("LeaseTimeout %v", c.LeaseTimeout())
	}
	if err := c.Put(ctx, "ns", []byte("k"), pattern(5000, 1)); err != nil {
		t.Fatal(err)
	}
	base := blockBytes(5000) // the block; the spare the Put left goes with the leases
	r, err := c.Lease(ctx, "ns", []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Alloc(ctx, "ns", []byte("w"), 8192)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := c.Lease(ctx, "ns", []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	stop := time.Now().Add(600 * time.Millisecond)
	for time.Now().Before(stop) { // renewed: outlives the others
		if err := kept.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.waitStats(t, "after expiry", func(st *pegadv1.StatsResponse) bool {
		return st.GetPinnedBlocks() == 1 && st.GetPoolUsed() == base
	})
	if err := w.Commit(ctx); !errors.Is(err, client.ErrLeaseEnded) {
		t.Fatalf("Commit after expiry: %v, want ErrLeaseEnded", err)
	}
	if err := r.Release(); !errors.Is(err, client.ErrLeaseEnded) {
		t.Fatalf("Release after expiry: %v, want ErrLeaseEnded", err)
	}
	if err := kept.Release(); err != nil {
		t.Fatalf("Release of the renewed lease: %v", err)
	}
	if _, err := c.Get(ctx, "ns", []byte("w"), make([]byte, 8192)); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("expired allocation indexed: %v", err)
	}
}

// TestContext: a context already done fails the call and leaves the
// connection usable; a context that ends while the daemon is busy breaks
// the connection (its leases end, and their releases say so), and the
// next call dials a new one.
func TestContext(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Alloc(ctx, "ns", []byte("a"), 100); !errors.Is(err, context.Canceled) {
		t.Fatalf("Alloc with a cancelled context: %v", err)
	}
	if err := c.Put(context.Background(), "ns", []byte("a"), []byte("x")); err != nil {
		t.Fatalf("Put after a cancelled call: %v", err)
	}
	r, err := c.Lease(context.Background(), "ns", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	// A deadline that has passed by the time the answer is read: the
	// connection is closed under the call.
	dctx, dcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer dcancel()
	if _, err := c.Lease(contextWithoutErr{dctx}, "ns", []byte("a")); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Lease past its deadline: %v", err)
	}
	r2, err := c.Lease(context.Background(), "ns", []byte("a"))
	if err != nil {
		t.Fatalf("Lease after the break: %v, want a new connection", err)
	}
	if err := r2.Release(); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Release on a broken connection: %v", err)
	}
	n.waitStats(t, "after the break", func(st *pegadv1.StatsResponse) bool { return st.GetPinnedBlocks() == 0 })
}

// contextWithoutErr shows only its context's deadline (no Done, no Err),
// so that the call reaches the socket with a deadline already past.
type contextWithoutErr struct{ context.Context }

func (contextWithoutErr) Err() error            { return nil }
func (contextWithoutErr) Done() <-chan struct{} { return nil }

func TestPrefetch(t *testing.T) {
	a, b := startNode(t, nil), startNode(t, nil)
	ca, cb := a.dial(t), b.dial(t)
	ctx := context.Background()
	data := pattern(1<<20, 7)
	if err := ca.Put(ctx, "ns", []byte("p1"), data); err != nil {
		t.Fatal(err)
	}
	res, err := cb.Prefetch(ctx, "ns", [][]byte{[]byte("p1"), []byte("nope")}, client.FromPeer(a.peer),
		client.WithPrefetchTimeout(20*time.Second))
	if err != nil {
		t.Fatalf("Prefetch: %v (result %+v)", err, res)
	}
	want := []pegadv1.PrefetchBlockStatus{
		pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED,
		pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_MISSING_ON_PEER,
	}
	if len(res.Blocks) != 2 || res.Blocks[0].Status != want[0] || res.Blocks[1].Status != want[1] || res.Bytes != 1<<20 {
		t.Fatalf("result %+v, want statuses %v and %d bytes", res, want, 1<<20)
	}
	dst := make([]byte, 1<<20)
	if n, err := cb.Get(ctx, "ns", []byte("p1"), dst); err != nil || n != len(data) || !bytes.Equal(dst, data) {
		t.Fatalf("Get of the prefetched block: %d, %v", n, err)
	}
	// A block already here is not fetched again (the peer is not asked).
	res, err = cb.Prefetch(ctx, "ns", [][]byte{[]byte("p1")}, client.FromPeer("127.0.0.1:1"))
	if err != nil || res.Blocks[0].Status != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_ALREADY_LOCAL {
		t.Fatalf("Prefetch of a local block: %+v, %v", res, err)
	}
	if _, err := cb.Prefetch(ctx, "ns", [][]byte{[]byte("p2")}, client.FromPeer("127.0.0.1:1"),
		client.WithPrefetchTimeout(5*time.Second)); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Prefetch from a dead peer: %v, want ErrUnavailable", err)
	}
}

// TestCancelRacingSuccess: a cancel that races the end of a call which
// succeeded never leaves a past deadline on the data connection: the next
// call on the same client works. (Before, the cancel callback could set a
// 1970 deadline after the call's own reset, and the next call broke the
// connection, ending every lease of the client.)
func TestCancelRacingSuccess(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t)
	if err := c.Put(context.Background(), "ns", []byte("k"), []byte("value")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	successes := 0
	for i := 0; i < 2000 && successes < 300; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		go cancel()
		_, err := c.Get(ctx, "ns", []byte("k"), buf)
		if err != nil {
			// Cancelled mid-call: the connection is closed by design;
			// start over on a fresh client.
			c.Close()
			c = n.dial(t)
			continue
		}
		successes++
		if _, err := c.Get(context.Background(), "ns", []byte("k"), buf); err != nil {
			t.Fatalf("iteration %d: the call after a successful one whose context was cancelled: %v", i, err)
		}
	}
	if successes == 0 {
		t.Fatal("no call succeeded")
	}
}
