package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/testutil"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// Cluster index tests: real daemons and a real redis-server
// (docs/cluster.md).

const clusterTTL = time.Second

func startClusterNode(t *testing.T, id string, r *testutil.Redis) *node {
	t.Helper()
	cfg := baseConfig(t, id)
	cfg.ClusterRedis = r.URL()
	cfg.ClusterTTL = clusterTTL
	return start(t, cfg)
}

func clusterAPI(n *node) pegadv1.ClusterServiceClient { return pegadv1.NewClusterServiceClient(n.cc) }

// holdersOf renders the index's view: hash → sorted node ids joined by ",".
func holdersOf(ctx context.Context, n *node, ns string, hashes ...[]byte) (map[string]string, error) {
	res, err := clusterAPI(n).LocateBlocks(ctx, &pegadv1.LocateBlocksRequest{Namespace: ns, Hashes: hashes})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, b := range res.GetBlocks() {
		var ids []string
		for _, h := range b.GetHolders() {
			ids = append(ids, h.GetNodeId())
		}
		slices.Sort(ids)
		out[string(b.GetHash())] = strings.Join(ids, ",")
	}
	return out, nil
}

// waitHolders waits until the index says what want says (hash → ids).
func waitHolders(t *testing.T, n *node, ns string, want map[string]string) {
	t.Helper()
	var hashes [][]byte
	for h := range want {
		hashes = append(hashes, []byte(h))
	}
	eventually(t, "the cluster index to read "+fmt.Sprint(want), 10*time.Second, func() error {
		got, err := holdersOf(context.Background(), n, ns, hashes...)
		if err != nil {
			return err
		}
		for h, w := range want {
			if got[h] != w {
				return fmt.Errorf("%s held by %q, want %q", h, got[h], w)
			}
		}
		return nil
	})
}

// pegactl runs pegactl against socket and returns its stdout.
func pegactl(t *testing.T, socket string, args ...string) (string, int) {
	t.Helper()
	out, errOut, code := runPegactl(socket, args...)
	if code != 0 {
		t.Logf("pegactl %v: exit %d: %s", args, code, errOut)
	}
	return out, code
}

// Three daemons: c prefetches without --peer; the index sends it to a and
// b at once, and each block says who served it.
func TestClusterPrefetchFromTwoHolders(t *testing.T) {
	r := testutil.StartRedis(t)
	a := startClusterNode(t, "a", r)
	b := startClusterNode(t, "b", r)
	c := startClusterNode(t, "c", r)
	ns := "cl"
	var blocks []block
	for i := range 8 {
		blocks = append(blocks, block{hash: fmt.Appendf(nil, "blk-%02d", i), body: bytes.Repeat([]byte{byte(i + 1)}, 64<<10+i)})
	}
	putAll(t, a, ns, blocks[:5])
	putAll(t, b, ns, blocks[5:])
	want := map[string]string{}
	var hashes [][]byte
	for i, bl := range blocks {
		want[string(bl.hash)] = map[bool]string{true: "a", false: "b"}[i < 5]
		hashes = append(hashes, bl.hash)
	}
	waitHolders(t, c, ns, want)

	out, code := pegactl(t, c.d.SocketPath(), "nodes", "list")
	if code != 0 {
		t.Fatalf("nodes list: exit %d", code)
	}
	t.Logf("pegactl nodes list:\n%s", out)
	for _, id := range []string{"a ", "b ", "c (self)"} {
		if !strings.Contains(out, id) {
			t.Fatalf("nodes list lacks %q:\n%s", id, out)
		}
	}
	js, _ := pegactl(t, c.d.SocketPath(), "-o", "json", "nodes", "list")
	var nodes struct {
		Nodes []struct {
			NodeID    string `json:"node_id"`
			Advertise string `json:"advertise"`
			Self      bool   `json:"self"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(js), &nodes); err != nil || len(nodes.Nodes) != 3 {
		t.Fatalf("nodes list -o json: %v: %s", err, js)
	}
	for _, n := range nodes.Nodes {
		if n.NodeID == "a" && n.Advertise != a.d.PeerAddr() {
			t.Fatalf("a advertises %q, want %q", n.Advertise, a.d.PeerAddr())
		}
	}
	where, _ := pegactl(t, c.d.SocketPath(), "blocks", "where", "--namespace", ns, fmt.Sprintf("%x", blocks[0].hash), fmt.Sprintf("%x", blocks[7].hash))
	t.Logf("pegactl blocks where:\n%s", where)
	if !strings.Contains(where, "a@"+a.d.PeerAddr()) || !strings.Contains(where, "b@"+b.d.PeerAddr()) {
		t.Fatalf("blocks where:\n%s", where)
	}

	args := []string{"prefetch", "--namespace", ns}
	for _, h := range hashes {
		args = append(args, fmt.Sprintf("%x", h))
	}
	out, code = pegactl(t, c.d.SocketPath(), args...)
	t.Logf("pegactl prefetch (no --peer):\n%s", out)
	if code != 0 {
		t.Fatalf("prefetch without --peer: exit %d", code)
	}
	served := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[1] == "fetched" {
			served[f[2]]++
		}
	}
	if served["a"] != 5 || served["b"] != 3 {
		t.Fatalf("served by %v, want a:5 b:3", served)
	}
	ctx := ctxT(t, 30*time.Second)
	for _, bl := range blocks {
		got, err := get(ctx, c, ns, bl.hash)
		if err != nil || !bytes.Equal(got, bl.body) {
			t.Fatalf("block %s on c after the fetch: %v (%d bytes, want %d)", bl.hash, err, len(got), len(bl.body))
		}
	}
	// c now holds them too: the index learns it from c's store.
	for h := range want {
		want[h] += ",c"
	}
	waitHolders(t, a, ns, want)
	if got := c.cn.Scrape(t)[`pegaflow_cluster_index_lookups_total{outcome="found"}`]; got < 1 {
		t.Fatalf("c's found lookups: %v", got)
	}
	// a never listed nodes: its heartbeats count the membership.
	eventually(t, "a to count 3 nodes", 5*time.Second, func() error {
		if got := a.cn.Scrape(t)[`pegaflow_cluster_nodes`]; got != 3 {
			return fmt.Errorf("pegaflow_cluster_nodes = %v", got)
		}
		return nil
	})
}

func init() { cluster.RunPegadIfChild() }

// startProcess runs pegad as a child process in the cluster, to be killed
// with SIGKILL.
func startProcess(t *testing.T, id string, r *testutil.Redis) *cluster.Node {
	t.Helper()
	return cluster.StartProcess(t, cluster.Named(id), cluster.WithConfig(func(c *config.Config) {
		c.MetricsListen = ""
		c.PoolSize = 16 << 20
		c.ClusterRedis = r.URL()
		c.ClusterTTL = clusterTTL
	}))
}

// A holder killed with SIGKILL cannot deregister: it drops out after its
// TTL, and its blocks read as missing, in bounded time.
func TestClusterHolderKilled(t *testing.T) {
	r := testutil.StartRedis(t)
	c := startClusterNode(t, "c", r)
	victim := startProcess(t, "victim", r)
	ns := "kill"
	bl := block{hash: []byte("doomed"), body: bytes.Repeat([]byte{7}, 4096)}
	ctx := ctxT(t, 60*time.Second)
	if _, err := testutil.PutBlock(ctx, victim.Local, ns, bl.hash, bl.body, false); err != nil {
		t.Fatal(err)
	}
	waitHolders(t, c, ns, map[string]string{"doomed": "victim"})

	victim.Kill(t)
	killed := time.Now()
	waitHolders(t, c, ns, map[string]string{"doomed": ""})
	if d := time.Since(killed); d > clusterTTL+2*time.Second {
		t.Fatalf("dropped out after %v, want about its TTL %v", d, clusterTTL)
	}
	out, _ := pegactl(t, c.d.SocketPath(), "nodes", "list")
	if strings.Contains(out, "victim") {
		t.Fatalf("killed node still listed:\n%s", out)
	}
	start := time.Now()
	res, err := c.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Namespace: ns, Hashes: [][]byte{bl.hash}, Timeout: durationpb.New(10 * time.Second)})
	if err != nil {
		t.Fatalf("prefetch without peer: %v", err)
	}
	if st := res.GetBlocks()[0].GetStatus(); st != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_NOT_FOUND {
		t.Fatalf("block of the killed node: %v, want NOT_FOUND", st)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("prefetch took %v", d)
	}
}

// Redis killed mid-run: daemons serve on, --peer fetches work, peer-less
// ones fail fast and say why. Redis back empty: every node registers again
// and republishes its whole index, with no restart.
func TestClusterRedisRestartedEmpty(t *testing.T) {
	r := testutil.StartRedis(t)
	a := startClusterNode(t, "a", r)
	b := startClusterNode(t, "b", r)
	c := startClusterNode(t, "c", r)
	ns := "rr"
	x := block{hash: []byte("x"), body: bytes.Repeat([]byte{1}, 8192)}
	y := block{hash: []byte("y"), body: bytes.Repeat([]byte{2}, 8192)}
	putAll(t, a, ns, []block{x})
	waitHolders(t, c, ns, map[string]string{"x": "a"})

	r.Kill()
	ctx := ctxT(t, 60*time.Second)
	start := time.Now()
	_, err := c.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Namespace: ns, Hashes: [][]byte{x.hash}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "cluster index unavailable") {
		t.Fatalf("peer-less prefetch with Redis down: %v, want Unavailable naming the cluster index", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("peer-less prefetch with Redis down took %v: want a fast failure", d)
	}
	if _, code := pegactl(t, c.d.SocketPath(), "nodes", "list"); code == 0 {
		t.Fatal("nodes list succeeded with Redis down")
	}
	res, err := prefetch(ctx, c, a.d.PeerAddr(), ns, x.hash)
	if err != nil || res.GetBlocks()[0].GetStatus() != statusFetched {
		t.Fatalf("--peer prefetch with Redis down: %v, %v", res, err)
	}
	putAll(t, b, ns, []block{y}) // a change while Redis is away

	r.Restart() // empty
	waitHolders(t, a, ns, map[string]string{"x": "a,c", "y": "b"})
	eventually(t, "three nodes listed again", 10*time.Second, func() error {
		res, err := clusterAPI(a).ListNodes(ctx, &pegadv1.ListNodesRequest{})
		if err != nil {
			return err
		}
		if len(res.GetNodes()) != 3 {
			return fmt.Errorf("%d nodes", len(res.GetNodes()))
		}
		return nil
	})
	res, err = c.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Namespace: ns, Hashes: [][]byte{y.hash}})
	if err != nil || res.GetBlocks()[0].GetStatus() != statusFetched || res.GetBlocks()[0].GetNode() != "b" {
		t.Fatalf("peer-less prefetch after Redis came back: %v, %v", res, err)
	}
	if got := a.cn.Scrape(t)[`pegaflow_cluster_index_resyncs_total`]; got < 2 {
		t.Fatalf("a republished %v times, want >= 2 (start, Redis back)", got)
	}
	if got := c.cn.Scrape(t)[`pegaflow_cluster_index_lookups_total{outcome="error"}`]; got < 1 {
		t.Fatalf("c counted %v failed lookups, want >= 1", got)
	}
}

// Without --cluster-redis nothing changes: the cluster metrics stay 0,
// and a prefetch without a peer (or a cluster command) says the index is
// not configured.
func TestClusterDisabled(t *testing.T) {
	n := start(t, baseConfig(t, "solo"))
	ctx := ctxT(t, 30*time.Second)
	_, err := n.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Namespace: "ns", Hashes: [][]byte{[]byte("h")}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--cluster-redis") {
		t.Fatalf("peer-less prefetch standalone: %v, want FailedPrecondition naming --cluster-redis", err)
	}
	if _, err := clusterAPI(n).ListNodes(ctx, &pegadv1.ListNodesRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("ListNodes standalone: %v", err)
	}
	for name, v := range n.cn.Scrape(t) {
		if strings.HasPrefix(name, "pegaflow_cluster_") && v != 0 {
			t.Fatalf("standalone node: %s = %v, want 0", name, v)
		}
	}
}

// A node that starts again (same id, new incarnation, empty pool) clears
// what its old incarnation announced: its old blocks read as held by
// nobody, and no entry of the old incarnation is left in Redis.
func TestClusterNodeRestart(t *testing.T) {
	r := testutil.StartRedis(t)
	c := startClusterNode(t, "c", r)
	a := startClusterNode(t, "a", r)
	ns := "restart"
	putAll(t, a, ns, []block{{hash: []byte("old"), body: bytes.Repeat([]byte{3}, 4096)}})
	waitHolders(t, c, ns, map[string]string{"old": "a"})
	oldInc := a.d.Incarnation()
	if err := a.close(); err != nil {
		t.Fatal(err)
	}
	a2 := startClusterNode(t, "a", r)
	putAll(t, a2, ns, []block{{hash: []byte("new"), body: bytes.Repeat([]byte{4}, 4096)}})
	// Only "new" is looked up before Redis is inspected: lookups clean
	// stale entries they meet, and this is about the restart's own reset.
	waitHolders(t, c, ns, map[string]string{"new": "a"})
	rc := r.Client(t)
	ctx := ctxT(t, 10*time.Second)
	eventually(t, "no entry of a's old incarnation in Redis", 5*time.Second, func() error {
		keys, err := rc.Keys(ctx, "pegad:b:*").Result()
		if err != nil {
			return err
		}
		for _, k := range keys {
			if inc, err := rc.HGet(ctx, k, "a").Result(); err == nil && inc == oldInc {
				return fmt.Errorf("%s still names a's old incarnation", k)
			}
		}
		return nil
	})
	waitHolders(t, c, ns, map[string]string{"old": "", "new": "a"})
}
