package integration

// The SSD tier with real daemons (docs/tiering.md): evicted blocks come
// back through get, lease and a peer's query; they survive a clean stop
// and kill -9 (also in the middle of spilling); a log corrupted under the
// daemon, a full disk and an unusable path never make it serve a wrong
// byte or crash.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/ssd"
	"github.com/pegaflow/pegad/internal/testutil"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

const (
	ssdBlock  = 64 << 10 // block bytes
	ssdBlocks = 128      // 8 MiB: four times the 2 MiB pool
	ssdNS     = "ssd"
)

// ssdConfig is a 2 MiB pool over an SSD tier of size bytes in dir.
func ssdConfig(dir string, size config.ByteSize) func(*config.Config) {
	return func(c *config.Config) {
		c.PoolSize = 2 << 20
		c.SSDPath = dir
		c.SSDSize = size
	}
}

func ssdHash(i int) []byte { return []byte(fmt.Sprintf("blk-%04d", i)) }

func ssdBody(i int) []byte {
	b := make([]byte, ssdBlock)
	x := uint32(i)*2654435761 + 7
	for j := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[j] = byte(x)
	}
	return b
}

func ssdPutAll(t *testing.T, n *cluster.Node, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := from; i < to; i++ {
		if _, err := testutil.PutBlock(ctx, n.Local, ssdNS, ssdHash(i), ssdBody(i), true); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
}

// ssdCheckAll gets every block: each is either missing or exactly right
// (never a wrong byte); it returns how many were found.
func ssdCheckAll(t *testing.T, n *cluster.Node, count int) (found int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < count; i++ {
		got, err := testutil.GetBlock(ctx, n.Local, ssdNS, ssdHash(i))
		switch {
		case status.Code(err) == codes.NotFound:
		case err != nil:
			t.Fatalf("get %d: %v", i, err)
		case !bytes.Equal(got, ssdBody(i)):
			t.Fatalf("get %d: WRONG BYTES served (%d bytes)", i, len(got))
		default:
			found++
		}
	}
	return found
}

// ssdDrained waits until every eviction so far was written or dropped,
// and returns the scrape.
func ssdDrained(t *testing.T, n *cluster.Node) map[string]float64 {
	t.Helper()
	var m map[string]float64
	cluster.Eventually(t, "SSD write queue drained", 20*time.Second, func() error {
		m = n.Scrape(t)
		if !testutil.SSDDrained(m) {
			return fmt.Errorf("queue %v, written+dropped %v of %v evicted", m["pegaflow_ssd_write_queue_depth"],
				m["pegaflow_ssd_writes_total"]+testutil.SSDDrops(m), m["pegaflow_block_evictions_total"])
		}
		return nil
	})
	return m
}

// TestSSDSpillAndPromote: four pools' worth of blocks all come back with
// their bytes, through get (local) and through a peer's query (prefetch
// from another node), counted as SSD hits.
func TestSSDSpillAndPromote(t *testing.T) {
	dir := t.TempDir()
	a := cluster.Start(t, cluster.Named("a"), cluster.WithConfig(ssdConfig(dir, 16<<20)))
	ssdPutAll(t, a, 0, ssdBlocks)
	m := ssdDrained(t, a)
	if m["pegaflow_ssd_writes_total"] < ssdBlocks/2 || testutil.SSDDrops(m) != 0 {
		t.Fatalf("writes %v, drops %v: want most evictions written, none dropped", m["pegaflow_ssd_writes_total"], testutil.SSDDrops(m))
	}
	listTiers(t, a, 10) // pages of 10: through the pool's pages into the SSD's
	if got := ssdCheckAll(t, a, ssdBlocks); got != ssdBlocks {
		t.Fatalf("%d of %d blocks came back", got, ssdBlocks)
	}
	m = a.Scrape(t)
	if m[`pegaflow_tier_hits_total{tier="ssd"}`] < ssdBlocks/2 || m["pegaflow_ssd_promotions_total"] < ssdBlocks/2 {
		t.Fatalf("ssd hits %v, promotions %v", m[`pegaflow_tier_hits_total{tier="ssd"}`], m["pegaflow_ssd_promotions_total"])
	}

	// Block 0 was read first, so the reads after it evicted it again: it
	// is on a's SSD only. A peer's query reads it back before answering.
	b := cluster.Start(t, cluster.Named("b"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.Local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: a.PeerAddr(), Namespace: ssdNS, Hashes: [][]byte{ssdHash(0)}}); err != nil {
		t.Fatalf("prefetch from a: %v", err)
	}
	got, err := testutil.GetBlock(ctx, b.Local, ssdNS, ssdHash(0))
	if err != nil || !bytes.Equal(got, ssdBody(0)) {
		t.Fatalf("block 0 on b after prefetch: err %v, right bytes %v", err, bytes.Equal(got, ssdBody(0)))
	}

	// A prefetch on a of a block on its own SSD reads it back from there
	// (already local), not from the peer, which lacks it.
	onlySSD := -1
	list, err := a.Local.ListBlocks(ctx, &pegadv1.ListBlocksRequest{Namespace: ssdNS, Limit: 4096})
	if err != nil {
		t.Fatal(err)
	}
	for _, bl := range list.GetBlocks() {
		if bl.GetTier() == "ssd" {
			if _, err := fmt.Sscanf(string(bl.GetHash()), "blk-%04d", &onlySSD); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if onlySSD < 0 {
		t.Fatal("no SSD-only block on a")
	}
	before := a.Scrape(t)["pegaflow_ssd_promotions_total"]
	res, err := a.Local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: b.PeerAddr(), Namespace: ssdNS, Hashes: [][]byte{ssdHash(onlySSD)}})
	if err != nil {
		t.Fatalf("prefetch on a: %v", err)
	}
	if st := res.GetBlocks()[0].GetStatus(); st != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_ALREADY_LOCAL {
		t.Fatalf("prefetch of an SSD block: %v, want already local", st)
	}
	if after := a.Scrape(t)["pegaflow_ssd_promotions_total"]; after != before+1 {
		t.Fatalf("promotions %v -> %v, want one more", before, after)
	}
}

// TestSSDWarmRestart: what was written to the SSD tier is served again
// after kill -9, and after a clean stop, which also writes the pool's
// blocks; the index comes from the headers.
func TestSSDWarmRestart(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "clean", true: "kill-9"}[kill], func(t *testing.T) {
			dir := t.TempDir()
			n := cluster.StartProcess(t, cluster.Named("before"), cluster.WithConfig(ssdConfig(dir, 16<<20)))
			ssdPutAll(t, n, 0, ssdBlocks)
			written := ssdDrained(t, n)["pegaflow_ssd_writes_total"]
			if kill {
				n.Kill(t)
			} else if err := n.Stop(); err != nil {
				t.Fatal(err)
			}
			// A clean stop also writes the pool's blocks: all of them come back.
			want := float64(ssdBlocks)
			if kill {
				want = written
			}
			after := cluster.StartProcess(t, cluster.Named("after"), cluster.WithConfig(ssdConfig(dir, 16<<20)))
			m := after.Scrape(t)
			if m["pegaflow_ssd_recovered_blocks_total"] != want || m["pegaflow_ssd_blocks"] != want {
				t.Fatalf("recovered %v, held %v; want %v (%v written before the stop)", m["pegaflow_ssd_recovered_blocks_total"],
					m["pegaflow_ssd_blocks"], want, written)
			}
			if found := ssdCheckAll(t, after, ssdBlocks); float64(found) < want {
				t.Fatalf("%d blocks found after restart, %v were on SSD", found, want)
			}
		})
	}
}

// TestSSDKillDuringSpills kills the daemon while puts keep evicting (and
// so spilling): after restart every block is missing or right, and a
// record torn by the kill is dropped by its checksum, never served.
func TestSSDKillDuringSpills(t *testing.T) {
	dir := t.TempDir()
	n := cluster.StartProcess(t, cluster.Named("victim"), cluster.WithConfig(ssdConfig(dir, 16<<20)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // puts until the kill breaks the connection
		defer wg.Done()
		for i := 0; i < 4*ssdBlocks && ctx.Err() == nil; i++ {
			if _, err := testutil.PutBlock(ctx, n.Local, ssdNS, ssdHash(i), ssdBody(i), true); err != nil {
				return
			}
		}
	}()
	cluster.Eventually(t, "spills under way", 20*time.Second, func() error {
		if w := n.Scrape(t)["pegaflow_ssd_writes_total"]; w < ssdBlocks/2 {
			return fmt.Errorf("%v written", w)
		}
		return nil
	})
	n.Kill(t)
	cancel()
	wg.Wait()

	after := cluster.StartProcess(t, cluster.Named("after"), cluster.WithConfig(ssdConfig(dir, 16<<20)))
	found := ssdCheckAll(t, after, 4*ssdBlocks)
	m := after.Scrape(t)
	held := m["pegaflow_ssd_recovered_blocks_total"]
	if held < ssdBlocks/2 {
		t.Fatalf("only %v blocks recovered", held)
	}
	// Every recovered block was served or failed its checksum (counted).
	if float64(found)+m["pegaflow_ssd_checksum_failures_total"] < held {
		t.Fatalf("found %d + checksum failures %v < recovered %v", found, m["pegaflow_ssd_checksum_failures_total"], held)
	}
}

// TestSSDCorruptedUnderDaemon flips a byte of every data page of the log
// while the daemon runs: every SSD block then fails its checksum, is
// dropped and counted; the DRAM blocks and new puts are unaffected.
func TestSSDCorruptedUnderDaemon(t *testing.T) {
	dir := t.TempDir()
	n := cluster.Start(t, cluster.Named("corrupt"), cluster.WithConfig(ssdConfig(dir, 16<<20)))
	ssdPutAll(t, n, 0, ssdBlocks)
	before := ssdDrained(t, n)
	if flipped, err := testutil.CorruptSSDLog(filepath.Join(dir, ssd.LogName)); err != nil || flipped == 0 {
		t.Fatalf("corrupt the log: %d pages flipped, %v", flipped, err)
	}

	// A get that promotes from SSD may first evict (and so spill) a DRAM
	// block: that record is written after the corruption and is sound.
	// Every block on SSD before the corruption must be gone.
	found := ssdCheckAll(t, n, ssdBlocks)
	m := ssdDrained(t, n)
	fails := m["pegaflow_ssd_checksum_failures_total"]
	spilledSince := m["pegaflow_ssd_writes_total"] - before["pegaflow_ssd_writes_total"]
	if fails == 0 || float64(found)+fails < ssdBlocks || m["pegaflow_ssd_blocks"] > spilledSince {
		t.Fatalf("found %d, checksum failures %v, on SSD %v (was %v, %v spilled since)", found, fails,
			m["pegaflow_ssd_blocks"], before["pegaflow_ssd_blocks"], spilledSince)
	}
	ssdPutAll(t, n, 1000, 1001)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := testutil.GetBlock(ctx, n.Local, ssdNS, ssdHash(1000)); err != nil || !bytes.Equal(got, ssdBody(1000)) {
		t.Fatalf("put after corruption: %v", err)
	}
}

// runPegadProcess runs pegad (this test binary) with args and returns its
// exit status and output.
func runPegadProcess(t *testing.T, args ...string) (int, string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"serve", "--socket", filepath.Join(testutil.ShortTempDir(t), "s.sock"), "--listen", "127.0.0.1:0",
		"--metrics-listen", "", "--transport", "tcp", "--pool-size", "4MiB", "--log-format", "json"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, append(base, args...)...)
	cmd.Env = append(os.Environ(), "PEGAD_TEST_CLUSTER_RUN_PEGAD=1")
	out, _ := cmd.CombinedOutput()
	return cmd.ProcessState.ExitCode(), string(out)
}

// TestSSDUnusablePathExits78: a path that cannot hold the log stops the
// start with exit 78 and an error naming ssd-path.
func TestSSDUnusablePathExits78(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := runPegadProcess(t, "--ssd-path", filepath.Join(file, "ssd"), "--ssd-size", "16MiB")
	if code != 78 || !strings.Contains(out, "ssd-path") || !strings.Contains(out, "not a directory") {
		t.Fatalf("exit %d, want 78 with a clear error; output:\n%s", code, out)
	}
}

// TestSSDFullDisk runs the tier on a small tmpfs (root only: it mounts
// one). A size larger than the disk is refused at start (exit 78: the log
// is preallocated, so it never meets a full disk later); a log that fits
// keeps working after the rest of the disk is filled, ageing out its
// oldest blocks as its ring wraps. tmpfs also refuses O_DIRECT, so this
// runs the buffered fallback.
func TestSSDFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=12m"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })

	code, out := runPegadProcess(t, "--ssd-path", filepath.Join(dir, "big"), "--ssd-size", "16MiB")
	if code != 78 || !strings.Contains(out, "no space left") {
		t.Fatalf("ssd-size over the disk: exit %d, want 78 naming the lack of space; output:\n%s", code, out)
	}
	_ = os.RemoveAll(filepath.Join(dir, "big"))

	n := cluster.Start(t, cluster.Named("full"), cluster.WithConfig(ssdConfig(filepath.Join(dir, "ssd"), 5<<20)))
	if err := testutil.FillDisk(filepath.Join(dir, "filler")); err != nil {
		t.Fatalf("fill the disk: %v", err)
	}
	ssdPutAll(t, n, 0, ssdBlocks)
	m := ssdDrained(t, n)
	if m[`pegaflow_ssd_drops_total{reason="write_error"}`] != 0 || m["pegaflow_ssd_aged_out_total"] == 0 {
		t.Fatalf("write errors %v, aged out %v", m[`pegaflow_ssd_drops_total{reason="write_error"}`], m["pegaflow_ssd_aged_out_total"])
	}
	if found := ssdCheckAll(t, n, ssdBlocks); float64(found) < m["pegaflow_ssd_blocks"] {
		t.Fatalf("%d found, %v on SSD", found, m["pegaflow_ssd_blocks"])
	}
}

// listTiers lists n's blocks page by page (limit each) and checks that
// each block is listed once, with its tier: the pool's first, then the
// SSD-only ones.
func listTiers(t *testing.T, n *cluster.Node, limit uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen := map[string]string{}
	req := &pegadv1.ListBlocksRequest{Namespace: ssdNS, Limit: limit}
	inSSD := false
	for pages := 0; ; pages++ {
		res, err := n.Local.ListBlocks(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range res.GetBlocks() {
			h, tier := string(b.GetHash()), b.GetTier()
			if _, dup := seen[h]; dup {
				t.Fatalf("block %s listed twice", h)
			}
			seen[h] = tier
			switch {
			case tier == "ssd":
				inSSD = true
			case tier != "dram" && tier != "dram+ssd":
				t.Fatalf("block %s: tier %q", h, tier)
			case inSSD:
				t.Fatalf("pool block %s listed after SSD-only ones", h)
			}
		}
		if !res.GetTruncated() {
			break
		}
		if pages > 2*ssdBlocks {
			t.Fatal("listing never ends")
		}
		req.Cursor = res.GetNextCursor()
	}
	count := map[string]int{}
	for _, tier := range seen {
		count[tier]++
	}
	if len(seen) != ssdBlocks || count["ssd"] == 0 || count["dram"]+count["dram+ssd"] == 0 {
		t.Fatalf("listed %d blocks of %d, by tier %v", len(seen), ssdBlocks, count)
	}
}
