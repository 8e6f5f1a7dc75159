package requester

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/store"
)

// fakeLocator answers from a fixed table: hash → holder node ids, each
// with ":ssd" after it when the node holds the block on its SSD tier.
type fakeLocator struct {
	table map[string][]string
	err   error
	calls int
}

func (l *fakeLocator) Locate(_ context.Context, _ string, hashes [][]byte) ([][]index.Holder, error) {
	l.calls++
	if l.err != nil {
		return nil, l.err
	}
	out := make([][]index.Holder, len(hashes))
	for i, h := range hashes {
		for _, e := range l.table[string(h)] {
			id, onSSD := strings.CutSuffix(e, ":ssd")
			m := index.MediumDRAM
			if onSSD {
				m = index.MediumSSD
			}
			out[i] = append(out[i], index.Holder{NodeID: id, Addr: id + ":1", Incarnation: "i", Medium: m})
		}
	}
	return out, nil
}

// holderSet is one fake holder per node, each holding the hashes given.
func holderSet(has map[string][]string) map[string]*fakeHolder {
	out := make(map[string]*fakeHolder)
	for id, hs := range has {
		h := newFakeHolder()
		h.shape = func(hash string) ([]store.SlotSize, int, bool) {
			return []store.SlotSize{{KSize: 4096}}, 0, slices.Contains(hs, hash)
		}
		out[id] = h
	}
	return out
}

func newClusterHarness(t *testing.T, holders map[string]*fakeHolder, loc Locator) (*Cluster, *harness) {
	t.Helper()
	hs := newHarness(t, withOpts(func(o *Options) {
		o.Peers = func(addr string) (pegadv1.PeerServiceClient, error) {
			h, ok := holders[strings.TrimSuffix(addr, ":1")]
			if !ok {
				return nil, fmt.Errorf("no peer %s", addr)
			}
			return h, nil
		}
	}))
	c, err := NewCluster(hs.e, ClusterOptions{Locator: loc, Self: "me", PD: metricstest.NewPD()})
	if err != nil {
		t.Fatal(err)
	}
	return c, hs
}

func TestClusterPrefetch(t *testing.T) {
	h := func(i int) string { return fmt.Sprintf("h%02d", i) }
	var n1, n2, n3 []string
	table := map[string][]string{}
	for i := range 6 {
		n1 = append(n1, h(i))
		table[h(i)] = []string{"n1"}
	}
	for i := 6; i < 10; i++ {
		n2 = append(n2, h(i))
		table[h(i)] = []string{"n2"}
	}
	// h10: the index lists n2 (stale: it evicted it) before n3, which has it.
	table[h(10)] = []string{"n2", "n3"}
	n3 = append(n3, h(10))
	table[h(11)] = []string{"me"} // this node is never asked
	// h12: in nobody's table.
	holders := holderSet(map[string][]string{"n1": append(n1, "local"), "n2": n2, "n3": n3})

	c, _ := newClusterHarness(t, holders, &fakeLocator{table: table})
	// A block already here, fetched with --peer before the parallel
	// barrier is armed.
	if _, err := c.Prefetch(context.Background(), "n1:1", "ns", [][]byte{[]byte("local")}); err != nil {
		t.Fatal(err)
	}
	// n1 and n2 are fetched from at once: each query waits for the other.
	var arrived sync.WaitGroup
	arrived.Add(2)
	for _, id := range []string{"n1", "n2"} {
		var once sync.Once
		holders[id].queryErr = func() error {
			once.Do(func() {
				arrived.Done()
				done := make(chan struct{})
				go func() { arrived.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(5 * time.Second):
				}
			})
			return nil
		}
	}
	var req [][]byte
	for i := range 13 {
		req = append(req, []byte(h(i)))
	}
	req = append(req, []byte("local"))

	start := time.Now()
	res, err := c.Prefetch(context.Background(), "", "ns", req)
	if err != nil {
		t.Fatalf("Prefetch: %v", err)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("took %v: n1 and n2 were not fetched from in parallel", d)
	}
	want := map[string]string{}
	for i := range 6 {
		want[h(i)] = "fetched@n1"
	}
	for i := 6; i < 10; i++ {
		want[h(i)] = "fetched@n2"
	}
	want[h(10)] = "fetched@n3"
	want[h(11)] = "not_found@"
	want[h(12)] = "not_found@"
	want["local"] = "already_local@"
	for _, b := range res.Blocks {
		if got := b.Status.String() + "@" + b.Node; got != want[string(b.Hash)] {
			t.Errorf("%s: %s (err %v), want %s", b.Hash, got, b.Err, want[string(b.Hash)])
		}
	}
	if len(res.Blocks) != len(req) {
		t.Fatalf("%d results for %d hashes", len(res.Blocks), len(req))
	}
	for id, fh := range holders {
		fh.checkReleasedOnce(t)
		if id == "n3" && fh.queryOK != 1 {
			t.Errorf("n3 queried %d times, want 1 (for h10 after n2 missed it)", fh.queryOK)
		}
	}
}

// TestClusterPrefetchPrefersDRAM: n1 holds all four blocks on its SSD
// tier, n2 two of them in DRAM (one of the two a stale entry). The DRAM
// copies are asked for first, although n1 alone could serve all four;
// the block n2 turns out to lack comes from n1's SSD next.
func TestClusterPrefetchPrefersDRAM(t *testing.T) {
	table := map[string][]string{
		"h0": {"n1:ssd", "n2"},
		"h1": {"n1:ssd", "n2"}, // stale on n2
		"h2": {"n1:ssd"},
		"h3": {"n1:ssd"},
	}
	holders := holderSet(map[string][]string{"n1": {"h0", "h1", "h2", "h3"}, "n2": {"h0"}})
	c, _ := newClusterHarness(t, holders, &fakeLocator{table: table})
	req := [][]byte{[]byte("h0"), []byte("h1"), []byte("h2"), []byte("h3")}
	res, err := c.Prefetch(context.Background(), "", "ns", req)
	if err != nil {
		t.Fatalf("Prefetch: %v", err)
	}
	want := map[string]string{"h0": "fetched@n2", "h1": "fetched@n1", "h2": "fetched@n1", "h3": "fetched@n1"}
	for _, b := range res.Blocks {
		if got := b.Status.String() + "@" + b.Node; got != want[string(b.Hash)] {
			t.Errorf("%s: %s (err %v), want %s", b.Hash, got, b.Err, want[string(b.Hash)])
		}
	}
	for _, fh := range holders {
		fh.checkReleasedOnce(t)
	}
}

func TestClusterPrefetchErrors(t *testing.T) {
	down := fmt.Errorf("%w: locate: dial tcp: connection refused", index.ErrUnavailable)
	for _, tc := range []struct {
		name string
		loc  Locator
		peer string
		want error
	}{
		{"index down", &fakeLocator{err: down}, "", index.ErrUnavailable},
		{"no index", nil, "", index.ErrDisabled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c *Cluster
			if tc.loc == nil {
				c, _ = newClusterHarness(t, nil, nil)
			} else {
				c, _ = newClusterHarness(t, nil, tc.loc)
			}
			res, err := c.Prefetch(context.Background(), tc.peer, "ns", [][]byte{[]byte("h")})
			if !errors.Is(err, tc.want) || res != nil {
				t.Fatalf("Prefetch = %v, %v; want %v", res, err, tc.want)
			}
		})
	}
	// With a peer the index is not consulted, even when it is down.
	loc := &fakeLocator{err: down}
	c, _ := newClusterHarness(t, holderSet(map[string][]string{"p": {"h"}}), loc)
	res, err := c.Prefetch(context.Background(), "p:1", "ns", [][]byte{[]byte("h")})
	if err != nil || res.Blocks[0].Status != StatusFetched || loc.calls != 0 {
		t.Fatalf("--peer fetch with the index down: %+v, %v, %d lookups", res, err, loc.calls)
	}
}

// A holder that fails (its port is gone) leaves its blocks to the next.
func TestClusterPrefetchHolderDown(t *testing.T) {
	holders := holderSet(map[string][]string{"n2": {"a", "b"}})
	loc := &fakeLocator{table: map[string][]string{"a": {"n1", "n2"}, "b": {"n1", "n2"}}}
	c, _ := newClusterHarness(t, holders, loc) // n1 is in the index but not dialable
	res, err := c.Prefetch(context.Background(), "", "ns", [][]byte{[]byte("a"), []byte("b")})
	if err != nil {
		t.Fatalf("Prefetch: %v", err)
	}
	for _, b := range res.Blocks {
		if b.Status != StatusFetched || b.Node != "n2" {
			t.Fatalf("%s: %v from %q, want fetched from n2", b.Hash, b.Status, b.Node)
		}
	}
}

func TestPlan(t *testing.T) {
	hold := func(ids ...string) []index.Holder {
		out := make([]index.Holder, len(ids))
		for i, id := range ids {
			out[i] = index.Holder{NodeID: id}
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		cands map[string][]index.Holder
		want  string
	}{
		{"one holder", map[string][]index.Holder{"a": hold("x"), "b": hold("x")}, "x:a,b"},
		{"most first", map[string][]index.Holder{"a": hold("x", "y"), "b": hold("y"), "c": hold("y"), "d": hold("x")},
			"y:a,b,c x:d"},
		{"ties by id", map[string][]index.Holder{"a": hold("z", "y")}, "y:a"},
		{"no candidates", map[string][]index.Holder{"a": nil}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items := make([]string, 0, len(tc.cands))
			for k := range tc.cands {
				items = append(items, k)
			}
			slices.Sort(items)
			var parts []string
			for _, g := range plan(items, func(s string) []index.Holder { return tc.cands[s] }) {
				parts = append(parts, g.holder.NodeID+":"+strings.Join(g.items, ","))
			}
			if got := strings.Join(parts, " "); got != tc.want {
				t.Fatalf("plan = %q, want %q", got, tc.want)
			}
		})
	}
}

// hangingHolder never answers a query until the caller gives up.
type hangingHolder struct{ *fakeHolder }

func (h hangingHolder) QueryBlocksForTransfer(ctx context.Context, _ *pegadv1.QueryBlocksForTransferRequest, _ ...grpc.CallOption) (*pegadv1.QueryBlocksForTransferResponse, error) {
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

// A holder that hangs does not eat the whole fetch: the block's next
// holder still serves it before the deadline.
func TestClusterPrefetchHangingHolder(t *testing.T) {
	good := holderSet(map[string][]string{"n2": {"a"}})["n2"]
	hs := newHarness(t, withOpts(func(o *Options) {
		o.Peers = func(addr string) (pegadv1.PeerServiceClient, error) {
			if addr == "n1:1" {
				return hangingHolder{newFakeHolder()}, nil
			}
			return good, nil
		}
	}))
	c, err := NewCluster(hs.e, ClusterOptions{Locator: &fakeLocator{table: map[string][]string{"a": {"n1", "n2"}}}, Self: "me", PD: metricstest.NewPD()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res, err := c.Prefetch(ctx, "", "ns", [][]byte{[]byte("a")})
	if err != nil || res.Blocks[0].Status != StatusFetched || res.Blocks[0].Node != "n2" {
		t.Fatalf("Prefetch = %+v, %v; want a fetched from n2", res, err)
	}
}
