package index_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/index/redisindex"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type node struct {
	st  *store.Store
	idx *redisindex.Index
	m   *metrics.Cluster
	pub *index.Publisher
	ran chan struct{} // closed when pub.Run returned
}

// newPublisher is index.NewPublisher, failing t on its error.
func newPublisher(t *testing.T, o index.PublisherOptions) *index.Publisher {
	t.Helper()
	pub, err := index.NewPublisher(o)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// TestNewPublisherRequiresMetrics: metrics are a required option; the
// publisher does not make a private registry the daemon never serves.
func TestNewPublisherRequiresMetrics(t *testing.T) {
	if pub, err := index.NewPublisher(index.PublisherOptions{Source: emptySource{}}); err == nil || pub != nil {
		t.Fatalf("NewPublisher without Metrics: %v, %v; want an error", pub, err)
	}
}

// startNode runs a store and its publisher against r until the test ends.
func startNode(t *testing.T, r *testutil.Redis, id string, ttl time.Duration) *node {
	t.Helper()
	p, err := pool.New(pool.Options{Size: 64 << 10, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	n := &node{st: store.New(p, nil), m: metricstest.NewCluster()}
	n.idx, err = redisindex.Open(redisindex.Options{URLs: r.URL(), NodeID: id, Incarnation: id + "-1", TTL: ttl, Metrics: n.m})
	if err != nil {
		t.Fatal(err)
	}
	pub := newPublisher(t, index.PublisherOptions{
		Index: n.idx, Source: index.StoreSource{S: n.st}, TTL: ttl, Metrics: n.m, Log: zerolog.Nop(),
		Self: func() index.Node {
			return index.Node{Addr: id + ":1", PoolSize: p.Size(), FreeBytes: p.Size() - p.Used()}
		},
	})
	n.st.OnChange(pub.Notify)
	n.pub, n.ran = pub, make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(n.ran)
		pub.Run(ctx)
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = n.idx.Close()
	})
	return n
}

func (n *node) put(t *testing.T, h string) {
	t.Helper()
	if _, err := n.st.Put(store.Key{Namespace: "ns", Hash: h}, []store.SlotSize{{KSize: 16 << 10}}, func([]byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// eventually polls Locate until every hash's holders read as want.
func eventually(t *testing.T, x index.Index, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		hs := make([][]byte, 0, len(want))
		order := make([]string, 0, len(want))
		for h := range want {
			hs = append(hs, []byte(h))
			order = append(order, h)
		}
		got, err := x.Locate(context.Background(), "ns", hs)
		if err == nil {
			ok := true
			last = ""
			for i, h := range order {
				ids := ""
				for _, ho := range got[i] {
					ids += ho.NodeID
				}
				last += fmt.Sprintf("%s=%q ", h, ids)
				if ids != want[h] {
					ok = false
				}
			}
			if ok {
				return
			}
		} else {
			last = err.Error()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("index never read %v; last: %s", want, last)
}

func histCount(h prometheus.Histogram) uint64 {
	var m dto.Metric
	_ = h.Write(&m)
	return m.GetHistogram().GetSampleCount()
}

// Every block stored, deleted or evicted reaches the index.
func TestPublisherFollowsStore(t *testing.T) {
	r := testutil.StartRedis(t)
	a := startNode(t, r, "a", 3*time.Second)
	a.put(t, "h1")
	a.put(t, "h2")
	eventually(t, a.idx, map[string]string{"h1": "a", "h2": "a"})
	if _, err := a.st.Delete(store.Key{Namespace: "ns", Hash: "h1"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, a.idx, map[string]string{"h1": "", "h2": "a"})
	// The pool holds four 16 KiB blocks: three more evict h2.
	for _, h := range []string{"h3", "h4", "h5", "h6"} {
		a.put(t, h)
	}
	eventually(t, a.idx, map[string]string{"h2": "", "h3": "a", "h6": "a"})
	if histCount(a.m.PublishLag) == 0 {
		t.Fatal("no publish lag observed")
	}
	if got := metrics.Value(a.m.Published.WithLabelValues(metrics.PublishWithdraw)); got < 2 {
		t.Fatalf("withdrawals published = %v, want >= 2", got)
	}
}

// Redis killed and restarted empty: the node registers again and
// republishes everything it holds, including what changed while Redis was
// away, without a restart.
func TestPublisherRedisRestartsEmpty(t *testing.T) {
	r := testutil.StartRedis(t)
	ttl := 600 * time.Millisecond
	a := startNode(t, r, "a", ttl)
	a.put(t, "h1")
	eventually(t, a.idx, map[string]string{"h1": "a"})
	r.Kill()
	a.put(t, "h2") // while Redis is down
	deadline := time.Now().Add(5 * time.Second)
	for metrics.Value(a.m.PublishErrors) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if metrics.Value(a.m.PublishErrors) == 0 {
		t.Fatal("no publish error counted while Redis was down")
	}
	r.Restart()
	eventually(t, a.idx, map[string]string{"h1": "a", "h2": "a"})
	if nodes, err := a.idx.Nodes(context.Background()); err != nil || len(nodes) != 1 {
		t.Fatalf("Nodes after Redis came back = %+v, %v", nodes, err)
	}
}

// Redis lost everything without ever failing a call (FLUSHALL, a failover
// to an empty replica): the next heartbeat finds the record gone and the
// node republishes.
func TestPublisherRedisFlushed(t *testing.T) {
	r := testutil.StartRedis(t)
	a := startNode(t, r, "a", 600*time.Millisecond)
	a.put(t, "h1")
	eventually(t, a.idx, map[string]string{"h1": "a"})
	if err := r.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, a.idx, map[string]string{"h1": "a"})
	if got := metrics.Value(a.m.PublishErrors); got != 0 {
		t.Fatalf("publish errors = %v, want 0 (no call failed)", got)
	}
}

// Two pegads under one node id replace each other's record at every
// heartbeat: the publisher says so.
func TestPublisherDuplicateNodeID(t *testing.T) {
	r := testutil.StartRedis(t)
	logs := &testutil.LogBuffer{}
	ttl := 300 * time.Millisecond
	for _, inc := range []string{"first", "second"} {
		x, err := redisindex.Open(redisindex.Options{URLs: r.URL(), NodeID: "twin", Incarnation: inc, TTL: ttl, Metrics: metricstest.NewCluster()})
		if err != nil {
			t.Fatal(err)
		}
		pub := newPublisher(t, index.PublisherOptions{
			Index: x, Source: emptySource{}, TTL: ttl, Log: zerolog.New(logs), Metrics: metricstest.NewCluster(),
			Self: func() index.Node { return index.Node{Addr: inc + ":1"} },
		})
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { pub.Run(ctx) })
		t.Cleanup(func() {
			cancel()
			wg.Wait()
			_ = x.Close()
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "same --node-id") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning about a duplicate node id; logs:\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type emptySource struct{}

func (emptySource) Has(store.Key) bool { return false }
func (emptySource) Keys() []store.Key  { return nil }

// slowIndex makes every announcement take a while, as republishing a
// million blocks does.
type slowIndex struct {
	*redisindex.Index
	delay time.Duration
}

func (s slowIndex) Announce(ctx context.Context, m index.Medium, keys []store.Key) error {
	time.Sleep(s.delay)
	return s.Index.Announce(ctx, m, keys)
}

type oneKey struct{}

func (oneKey) Has(store.Key) bool { return true }
func (oneKey) Keys() []store.Key  { return []store.Key{{Namespace: "ns", Hash: "h"}} }

// A republication longer than the TTL never lets the node's record lapse:
// the record is refreshed on its own schedule.
func TestPublisherSlowRepublishKeepsRecord(t *testing.T) {
	r := testutil.StartRedis(t)
	ttl := 300 * time.Millisecond
	x, err := redisindex.Open(redisindex.Options{URLs: r.URL(), NodeID: "slow", Incarnation: "1", TTL: ttl, Metrics: metricstest.NewCluster()})
	if err != nil {
		t.Fatal(err)
	}
	viewer, err := redisindex.Open(redisindex.Options{URLs: r.URL(), NodeID: "viewer", Incarnation: "1", TTL: ttl, Metrics: metricstest.NewCluster()})
	if err != nil {
		t.Fatal(err)
	}
	defer viewer.Close()
	pub := newPublisher(t, index.PublisherOptions{
		Index: slowIndex{x, 3 * ttl}, Source: oneKey{}, TTL: ttl, Log: zerolog.Nop(), Metrics: metricstest.NewCluster(),
		Self: func() index.Node { return index.Node{Addr: "slow:1"} },
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { pub.Run(ctx) })
	defer func() {
		cancel()
		wg.Wait()
		_ = x.Close()
	}()
	seen := false
	for end := time.Now().Add(4 * ttl); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		nodes, err := viewer.Nodes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case len(nodes) == 1:
			seen = true
		case seen:
			t.Fatal("the node's record lapsed during a slow republication")
		}
	}
	if !seen {
		t.Fatal("the node never registered")
	}
	eventually(t, viewer, map[string]string{"h": "slow"})
}

// TestPublisherLeave: Leave (a drain beginning) takes the node out of the
// index at once, while its Run's context is still live: its record is
// gone from Nodes and its blocks from Locate, no heartbeat puts it back,
// nothing later is announced, and Run has returned.
func TestPublisherLeave(t *testing.T) {
	r := testutil.StartRedis(t)
	const ttl = 300 * time.Millisecond // heartbeat every 100 ms
	a := startNode(t, r, "a", ttl)
	b := startNode(t, r, "b", ttl)
	a.put(t, "h1")
	b.put(t, "h1")
	eventually(t, b.idx, map[string]string{"h1": "ab"})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.pub.Leave(ctx)
	announced := metrics.Value(a.m.Published.WithLabelValues(metrics.PublishAnnounce))
	// Leave returns once Run's work is done; Run's own return (and the
	// test's goroutine noting it) follows at once.
	select {
	case <-a.ran:
	case <-time.After(time.Second):
		t.Fatal("Run still running a second after Leave returned")
	}
	for round := range 2 { // at once, and after heartbeats would have refreshed it
		nodes, err := b.idx.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			if n.ID == "a" {
				t.Fatalf("round %d: node a still listed after Leave: %+v", round, n)
			}
		}
		eventually(t, b.idx, map[string]string{"h1": "b"})
		a.put(t, fmt.Sprintf("after-%d", round))
		time.Sleep(2 * ttl / 3)
	}
	if got := metrics.Value(a.m.Published.WithLabelValues(metrics.PublishAnnounce)); got != announced {
		t.Fatalf("announced %v blocks after Leave", got-announced)
	}
	a.pub.Leave(ctx) // again: returns at once
}

// manyKeys holds n blocks, for a republication of n round trips.
type manyKeys int

func (manyKeys) Has(store.Key) bool { return true }
func (m manyKeys) Keys() []store.Key {
	out := make([]store.Key, m)
	for i := range out {
		out[i] = store.Key{Namespace: "ns", Hash: fmt.Sprintf("m%d", i)}
	}
	return out
}

// TestPublisherLeaveDuringRepublish: Leave while a long republication is
// under way stops it at the next round trip: Leave returns promptly with
// Run gone and the record removed, and nothing is announced after it (the
// drain's 2 s wait for Leave used to run out with the node still listed).
func TestPublisherLeaveDuringRepublish(t *testing.T) {
	r := testutil.StartRedis(t)
	const ttl = 300 * time.Millisecond
	x, err := redisindex.Open(redisindex.Options{URLs: r.URL(), NodeID: "leaver", Incarnation: "1", TTL: ttl, Metrics: metricstest.NewCluster()})
	if err != nil {
		t.Fatal(err)
	}
	viewer, err := redisindex.Open(redisindex.Options{URLs: r.URL(), NodeID: "viewer", Incarnation: "1", TTL: ttl, Metrics: metricstest.NewCluster()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = viewer.Close() })
	m := metricstest.NewCluster()
	// 100 announcements of 30 ms each: a republication of 3 s.
	pub := newPublisher(t, index.PublisherOptions{
		Index: slowIndex{x, 30 * time.Millisecond}, Source: manyKeys(100), TTL: ttl, MaxBatch: 1, Metrics: m, Log: zerolog.Nop(),
		Self: func() index.Node { return index.Node{Addr: "leaver:1"} },
	})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(ran)
		pub.Run(ctx)
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = x.Close()
	})
	announced := func() float64 { return metrics.Value(m.Published.WithLabelValues(metrics.PublishAnnounce)) }
	deadline := time.Now().Add(5 * time.Second)
	for announced() < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the republication never started")
		}
		time.Sleep(10 * time.Millisecond)
	}

	lctx, lcancel := context.WithTimeout(context.Background(), 2*time.Second) // the daemon's drain wait
	defer lcancel()
	start := time.Now()
	pub.Leave(lctx)
	took := time.Since(start)
	select {
	case <-ran:
	case <-time.After(time.Second):
		t.Fatalf("Run still republishing a second after Leave returned (after %v; %v blocks announced)", took, announced())
	}
	if took > time.Second {
		t.Fatalf("Leave took %v during a republication", took)
	}
	after := announced()
	if after >= 100 {
		t.Fatalf("the whole republication ran (%v blocks) before Leave returned", after)
	}
	nodes, err := viewer.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == "leaver" {
			t.Fatalf("node still listed after Leave: %+v", n)
		}
	}
	time.Sleep(ttl)
	if got := announced(); got != after {
		t.Fatalf("%v blocks announced after Leave returned", got-after)
	}
	if got := metrics.Value(m.Resyncs); got != 0 {
		t.Fatalf("%v republications completed, want 0 (cut short by Leave)", got)
	}
}
