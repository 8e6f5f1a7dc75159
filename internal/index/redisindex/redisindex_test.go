package redisindex

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, r *testutil.Redis, node, inc string, ttl time.Duration) *Index {
	t.Helper()
	x, err := Open(Options{URLs: r.URL(), NodeID: node, Incarnation: inc, TTL: ttl, Metrics: metricstest.NewCluster()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	return x
}

func register(t *testing.T, x *Index, addr string) bool {
	t.Helper()
	lost, err := x.Register(context.Background(), index.Node{Addr: addr, Transport: "tcp", PoolSize: 1 << 20})
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	return lost
}

func keys(ns string, hs ...string) []store.Key {
	out := make([]store.Key, len(hs))
	for i, h := range hs {
		out[i] = store.Key{Namespace: ns, Hash: h}
	}
	return out
}

// holders renders Locate's answer as "a,b|c|" per hash.
func holders(t *testing.T, x *Index, ns string, hs ...string) string {
	t.Helper()
	raw := make([][]byte, len(hs))
	for i, h := range hs {
		raw[i] = []byte(h)
	}
	got, err := x.Locate(context.Background(), ns, raw)
	if err != nil {
		t.Fatalf("Locate: %v", err)
	}
	s := ""
	for i, hs := range got {
		if i > 0 {
			s += "|"
		}
		ids := make([]string, len(hs))
		for j, h := range hs {
			ids[j] = h.NodeID
		}
		// Map order is random: sort for a stable answer.
		for a := range ids {
			for b := a + 1; b < len(ids); b++ {
				if ids[b] < ids[a] {
					ids[a], ids[b] = ids[b], ids[a]
				}
			}
		}
		for j, id := range ids {
			if j > 0 {
				s += ","
			}
			s += id
		}
	}
	return s
}

func TestAnnounceLocateWithdraw(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := context.Background()
	a := open(t, r, "a", "inc-a", 10*time.Second)
	b := open(t, r, "b", "inc-b", 10*time.Second)
	if !register(t, a, "10.0.0.1:1") || !register(t, b, "10.0.0.2:1") {
		t.Fatal("first registration not reported as lost")
	}
	if register(t, a, "10.0.0.1:1") {
		t.Fatal("refresh of a live record reported as lost")
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(a.Announce(ctx, index.MediumDRAM, keys("ns", "h1", "h2")))
	must(b.Announce(ctx, index.MediumDRAM, keys("ns", "h2", "h3")))
	must(b.Announce(ctx, index.MediumDRAM, keys("other", "h1")))
	if got, want := holders(t, a, "ns", "h1", "h2", "h3", "h4"), "a|a,b|b|"; got != want {
		t.Fatalf("Locate = %q, want %q", got, want)
	}
	must(a.Withdraw(ctx, keys("ns", "h2")))
	if got, want := holders(t, b, "ns", "h2"), "b"; got != want {
		t.Fatalf("after withdraw: %q, want %q", got, want)
	}
	got, err := a.Locate(ctx, "ns", [][]byte{[]byte("h1")})
	if err != nil || len(got[0]) != 1 || got[0][0].Addr != "10.0.0.1:1" || got[0][0].Incarnation != "inc-a" {
		t.Fatalf("holder = %+v, %v; want a at 10.0.0.1:1", got, err)
	}

	nodes, err := a.Nodes(ctx)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("Nodes = %+v, %v", nodes, err)
	}
	for _, n := range nodes {
		if n.Transport != "tcp" || n.PoolSize != 1<<20 || time.Until(n.Expires) <= 0 {
			t.Fatalf("node record %+v", n)
		}
	}
	must(b.Deregister(ctx))
	if got, want := holders(t, a, "ns", "h2", "h3"), "|"; got != want {
		t.Fatalf("after b deregistered: %q, want %q", got, want)
	}
	if nodes, _ := a.Nodes(ctx); len(nodes) != 1 || nodes[0].ID != "a" {
		t.Fatalf("Nodes after deregister = %+v", nodes)
	}
}

// A node that starts again (new incarnation) no longer counts as holding
// what its old incarnation announced, before and after it resets.
func TestNewIncarnation(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := context.Background()
	old := open(t, r, "a", "inc-1", 10*time.Second)
	register(t, old, "x:1")
	if err := old.Announce(ctx, index.MediumDRAM, keys("ns", "h1", "h2")); err != nil {
		t.Fatal(err)
	}
	restarted := open(t, r, "a", "inc-2", 10*time.Second)
	if !register(t, restarted, "x:1") {
		t.Fatal("a new incarnation's registration not reported as lost")
	}
	if got := holders(t, restarted, "ns", "h1", "h2"); got != "|" {
		t.Fatalf("old incarnation's blocks still located: %q", got)
	}
	if err := restarted.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Client(t).Exists(ctx, restarted.BlockKey("ns", []byte("h1")), restarted.nodeBlocksKey("a")).Result(); err != nil || n != 0 {
		t.Fatalf("keys left after Reset: %d, %v", n, err)
	}
	if err := restarted.Announce(ctx, index.MediumDRAM, keys("ns", "h2")); err != nil {
		t.Fatal(err)
	}
	if got := holders(t, restarted, "ns", "h1", "h2"); got != "|a" {
		t.Fatalf("after republish: %q, want %q", got, "|a")
	}
}

// A record not refreshed lapses after its TTL and its blocks stop counting.
func TestExpiry(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := context.Background()
	ttl := 300 * time.Millisecond
	a := open(t, r, "a", "inc", ttl)
	b := open(t, r, "b", "inc", 10*time.Second)
	register(t, a, "x:1")
	register(t, b, "y:1")
	if err := a.Announce(ctx, index.MediumDRAM, keys("ns", "h1")); err != nil {
		t.Fatal(err)
	}
	if got := holders(t, b, "ns", "h1"); got != "a" {
		t.Fatalf("before expiry: %q", got)
	}
	time.Sleep(ttl + 100*time.Millisecond)
	if got := holders(t, b, "ns", "h1"); got != "" {
		t.Fatalf("after expiry: %q, want no holder", got)
	}
	if nodes, _ := b.Nodes(ctx); len(nodes) != 1 || nodes[0].ID != "b" {
		t.Fatalf("Nodes after a's expiry = %+v", nodes)
	}
	if !register(t, a, "x:1") {
		t.Fatal("registration after expiry not reported as lost")
	}
}

// Redis down: every call fails fast with ErrUnavailable. Back empty: the
// next registration reports the record lost.
func TestRedisDown(t *testing.T) {
	r := testutil.StartRedis(t)
	a := open(t, r, "a", "inc", 10*time.Second)
	register(t, a, "x:1")
	r.Kill()
	ctx := context.Background()
	start := time.Now()
	_, err := a.Locate(ctx, "ns", [][]byte{[]byte("h")})
	if !errors.Is(err, index.ErrUnavailable) {
		t.Fatalf("Locate with Redis down: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Locate took %v with Redis down: want a fast failure", d)
	}
	for name, err := range map[string]error{
		"announce": a.Announce(ctx, index.MediumDRAM, keys("ns", "h")),
		"reset":    a.Reset(ctx),
	} {
		if !errors.Is(err, index.ErrUnavailable) {
			t.Fatalf("%s with Redis down: %v", name, err)
		}
	}
	if _, err := a.Nodes(ctx); !errors.Is(err, index.ErrUnavailable) {
		t.Fatalf("Nodes with Redis down: %v", err)
	}
	r.Restart()
	if !register(t, a, "x:1") {
		t.Fatal("registration into an empty Redis not reported as lost")
	}
}

func TestLookupMetrics(t *testing.T) {
	r := testutil.StartRedis(t)
	m := metricstest.NewCluster()
	x, err := Open(Options{URLs: r.URL(), NodeID: "a", Incarnation: "i", TTL: 10 * time.Second, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	register(t, x, "x:1")
	if err := x.Announce(context.Background(), index.MediumDRAM, keys("ns", "h1")); err != nil {
		t.Fatal(err)
	}
	holders(t, x, "ns", "h1")
	holders(t, x, "ns", "h1", "h2")
	holders(t, x, "ns", "h2")
	for outcome, want := range map[string]float64{metrics.LookupFound: 1, metrics.LookupPartial: 1, metrics.LookupNone: 1, metrics.LookupError: 0} {
		if got := metrics.Value(m.Lookups.WithLabelValues(outcome)); got != want {
			t.Errorf("lookups{outcome=%s} = %v, want %v", outcome, got, want)
		}
	}
}

func TestParseURLs(t *testing.T) {
	for _, tc := range []struct {
		in      string
		addrs   string
		pass    string
		tls     bool
		wantErr bool
	}{
		{in: "redis://127.0.0.1:6379", addrs: "[127.0.0.1:6379]"},
		{in: "rediss://:s3cret@cache.example:6380/0", addrs: "[cache.example:6380]", pass: "s3cret", tls: true},
		{in: "redis://a:7000, redis://b:7001,redis://c:7002", addrs: "[a:7000 b:7001 c:7002]"},
		{in: "", wantErr: true},
		{in: "http://a:1", wantErr: true},
		{in: "127.0.0.1:6379", wantErr: true},
		{in: "redis://a:7000/3,redis://b:7001", wantErr: true}, // no DB on a cluster
		{in: "redis://a:notaport", wantErr: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			o, err := ParseURLs(tc.in)
			if tc.wantErr {
				if !errors.Is(err, ErrBadURL) {
					t.Fatalf("ParseURLs(%q) = %v, want ErrBadURL", tc.in, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(o.Addrs); got != tc.addrs || o.Password != tc.pass || (o.TLSConfig != nil) != tc.tls {
				t.Fatalf("ParseURLs(%q) = addrs %s pass %q tls %v", tc.in, got, o.Password, o.TLSConfig != nil)
			}
		})
	}
}

// The same operations on a real three-shard Redis Cluster (a comma list):
// no command spans two slots.
func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	rs := testutil.StartRedisCluster(t, 3)
	ctx := context.Background()
	mk := func(node, inc string) *Index {
		x, err := Open(Options{URLs: testutil.ClusterURL(rs), NodeID: node, Incarnation: inc, TTL: 10 * time.Second, Metrics: metricstest.NewCluster()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = x.Close() })
		return x
	}
	a, b := mk("a", "1"), mk("b", "1")
	register(t, a, "x:1")
	register(t, b, "y:1")
	var hs []string
	for i := range 200 { // spread over every shard
		hs = append(hs, fmt.Sprintf("h%03d", i))
	}
	if err := a.Announce(ctx, index.MediumDRAM, keys("ns", hs...)); err != nil {
		t.Fatal(err)
	}
	if err := b.Announce(ctx, index.MediumDRAM, keys("ns", hs[:100]...)); err != nil {
		t.Fatal(err)
	}
	if got := holders(t, b, "ns", hs[0], hs[150]); got != "a,b|a" {
		t.Fatalf("Locate on the cluster = %q", got)
	}
	if nodes, err := a.Nodes(ctx); err != nil || len(nodes) != 2 {
		t.Fatalf("Nodes = %v, %v", nodes, err)
	}
	// a restarts: its old entries stop counting, the lookup cleans them
	// (the one-key script), Reset clears the rest.
	a2 := mk("a", "2")
	if !register(t, a2, "x:1") {
		t.Fatal("new incarnation not reported lost")
	}
	if got := holders(t, b, "ns", hs[0], hs[150]); got != "b|" {
		t.Fatalf("after a restarted: %q", got)
	}
	if err := a2.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a2.Withdraw(ctx, keys("ns", hs[:10]...)); err != nil {
		t.Fatal(err)
	}
}

// mediaOf renders Locate's answer for one hash as "node=medium,..." sorted.
func mediaOf(t *testing.T, x *Index, ns, h string) string {
	t.Helper()
	got, err := x.Locate(context.Background(), ns, [][]byte{[]byte(h)})
	if err != nil {
		t.Fatalf("Locate: %v", err)
	}
	var out []string
	for _, hd := range got[0] {
		out = append(out, hd.NodeID+"="+string(hd.Medium))
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// TestAnnounceMedium: a holder's medium travels with its entry; a later
// announcement replaces it (spilled to SSD, promoted back), and an SSD
// entry of an old incarnation is as stale as a DRAM one.
func TestAnnounceMedium(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := context.Background()
	a := open(t, r, "a", "inc-a", 10*time.Second)
	b := open(t, r, "b", "inc-b", 10*time.Second)
	register(t, a, "10.0.0.1:1")
	register(t, b, "10.0.0.2:1")
	for _, step := range []struct {
		x      *Index
		medium index.Medium
		want   string
	}{
		{a, index.MediumDRAM, "a=dram"},
		{b, index.MediumSSD, "a=dram,b=ssd"},
		{a, index.MediumSSD, "a=ssd,b=ssd"},
		{b, index.MediumDRAM, "a=ssd,b=dram"},
	} {
		if err := step.x.Announce(ctx, step.medium, keys("ns", "h1")); err != nil {
			t.Fatal(err)
		}
		if got := mediaOf(t, a, "ns", "h1"); got != step.want {
			t.Fatalf("after %s announced %s: %q, want %q", step.x.o.NodeID, step.medium, got, step.want)
		}
	}
	restarted := open(t, r, "a", "inc-a2", 10*time.Second)
	register(t, restarted, "10.0.0.1:1")
	if got := mediaOf(t, b, "ns", "h1"); got != "b=dram" {
		t.Fatalf("after a restarted: %q, want only b", got)
	}
	if v, err := r.Client(t).HGet(ctx, a.BlockKey("ns", []byte("h1")), "a").Result(); err == nil {
		t.Fatalf("the old incarnation's SSD entry %q was not removed", v)
	}
}

// TestOpenRequiresMetrics: metrics are a required option; Open does not
// make a private registry the daemon never serves.
func TestOpenRequiresMetrics(t *testing.T) {
	x, err := Open(Options{URLs: "redis://127.0.0.1:1", NodeID: "n", Incarnation: "i", TTL: time.Second})
	if err == nil || !strings.Contains(err.Error(), "Metrics is required") {
		if x != nil {
			_ = x.Close()
		}
		t.Fatalf("Open without Metrics: %v, want Metrics is required", err)
	}
}
