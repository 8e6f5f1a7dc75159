package index_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/index/redisindex"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/ssd"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestPublisherAnnouncesSSDMedium: with an SSD tier under the store, a
// block the pool evicts is announced with medium ssd once its record is
// written (not withdrawn), announced dram again when a read promotes it,
// and withdrawn when deleted; a restart republishes the tier's blocks
// found again as ssd.
func TestPublisherAnnouncesSSDMedium(t *testing.T) {
	r := testutil.StartRedis(t)
	dir := t.TempDir()
	x, err := redisindex.Open(redisindex.Options{URLs: r.URL(), NodeID: "reader", Incarnation: "r", TTL: 10 * time.Second, Metrics: metricstest.NewCluster()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })

	st, tier := startSSDNode(t, r, dir, "a-1")
	for _, h := range []string{"h1", "h2", "h3", "h4", "h5"} { // the pool holds four: h5 evicts h1
		putKey(t, st, h)
	}
	eventuallyMedia(t, x, map[string]string{"h1": "a=ssd", "h2": "a=dram", "h5": "a=dram"})
	// A read promotes h1 (evicting h2, which the tier then writes).
	if found, _ := st.Pin([]store.Key{{Namespace: "ns", Hash: "h1"}}); found[0] == nil {
		t.Fatal("h1 not promoted")
	} else {
		st.Unpin(found)
	}
	eventuallyMedia(t, x, map[string]string{"h1": "a=dram", "h2": "a=ssd"})
	if _, err := st.Delete(store.Key{Namespace: "ns", Hash: "h2"}); err != nil {
		t.Fatal(err)
	}
	eventuallyMedia(t, x, map[string]string{"h1": "a=dram", "h2": ""})
	if err := tier.Close(); err != nil {
		t.Fatal(err)
	}

	// Restarted (new incarnation) on the same SSD path: the pool is
	// empty, what the tier holds is republished as ssd.
	startSSDNode(t, r, dir, "a-2")
	eventuallyMedia(t, x, map[string]string{"h1": "a=ssd", "h2": "", "h3": ""}) // h3 was only in the pool (no flush here)
}

// startSSDNode runs a 64 KiB store over an SSD tier in dir and its
// publisher as node "a" until the test ends.
func startSSDNode(t *testing.T, r *testutil.Redis, dir, inc string) (*store.Store, *ssd.Tier) {
	t.Helper()
	p, err := pool.New(pool.Options{Size: 64 << 10, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	st := store.New(p, nil)
	tier, err := ssd.Open(ssd.Options{Paths: []string{dir}, Size: ssd.MinSize, SegmentSize: 1 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close() })
	st.SetLower(tier, nil)
	idx, err := redisindex.Open(redisindex.Options{URLs: r.URL(), NodeID: "a", Incarnation: inc, TTL: 10 * time.Second, Metrics: metricstest.NewCluster()})
	if err != nil {
		t.Fatal(err)
	}
	pub := newPublisher(t, index.PublisherOptions{
		Index: idx, Source: index.StoreSource{S: st, Lower: tier}, TTL: 10 * time.Second, Log: zerolog.Nop(), Metrics: metricstest.NewCluster(),
		Self: func() index.Node { return index.Node{Addr: "a:1"} },
	})
	st.OnChange(pub.Notify)
	tier.OnChange(pub.Notify)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { pub.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = idx.Close()
	})
	return st, tier
}

func putKey(t *testing.T, st *store.Store, h string) {
	t.Helper()
	if _, err := st.Put(store.Key{Namespace: "ns", Hash: h}, []store.SlotSize{{KSize: 16 << 10}}, func([]byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// eventuallyMedia polls Locate until each hash's holders read as want
// ("node=medium", "" for none).
func eventuallyMedia(t *testing.T, x index.Index, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		last = ""
		ok := true
		for h, w := range want {
			got, err := x.Locate(context.Background(), "ns", [][]byte{[]byte(h)})
			if err != nil {
				t.Fatal(err)
			}
			s := ""
			for _, ho := range got[0] {
				s += ho.NodeID + "=" + string(ho.Medium)
			}
			last += fmt.Sprintf("%s=%q ", h, s)
			ok = ok && s == w
		}
		if ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("index never read %v; last %s", want, last)
}
