package reliability

// The SSD tier's scenarios (docs/tiering.md): kill -9 while evictions
// spill, a full disk, the log corrupted under the running daemon, and
// paths that cannot hold a log at start. Each checks every block a client
// put: served byte-identical, or missing and accounted for by the tier's
// counters (drops, checksum failures, read errors, ageing out, deletes,
// or the documented loss of the pool at kill -9).

import (
	"context"
	"errors"
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
	"github.com/pegaflow/pegad/internal/testutil"
)

// SSD metrics the scenarios read.
const (
	mSSDWrites     = "pegaflow_ssd_writes_total"
	mSSDChecksum   = "pegaflow_ssd_checksum_failures_total"
	mSSDReadErrors = "pegaflow_ssd_read_errors_total"
	mSSDAgedOut    = "pegaflow_ssd_aged_out_total"
	mSSDRecovered  = "pegaflow_ssd_recovered_blocks_total"
	mSSDBlocks     = "pegaflow_ssd_blocks"
	mSSDQueue      = "pegaflow_ssd_write_queue_depth"
	mSSDTombstones = `pegaflow_ssd_tombstones_total{result="written"}`
	mSSDWriteErr   = `pegaflow_ssd_drops_total{reason="write_error"}`

	ssdBlock = 256 << 10 // every SSD scenario's block size (K+V)
	ssdPool  = "8MiB"    // 32 blocks: the rest spill
)

func ssdSpec(size, mount string) []nodeSpec {
	return []nodeSpec{{name: "a", pool: ssdPool, ssdSize: size, ssdMount: mount}}
}

// mountTmpfs mounts a tmpfs with opts (and flags: syscall.MS_RDONLY) at
// dir (created), unmounted at cleanup (after the daemons are killed:
// cleanups run last first).
func mountTmpfs(t testing.TB, dir, opts string, flags uintptr) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", flags, opts); err != nil {
		t.Fatalf("mount tmpfs %s on %s: %v (root needed)", opts, dir, err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
}

// ssdTally is what reading every block back found.
type ssdTally struct {
	found   int
	missing []block
}

// ssdReadAll gets every block from n: each is served byte-identical (the
// history counts a mismatch as wrong) or missing (NotFound).
func (c *cluster) ssdReadAll(n *node, blocks []block) ssdTally {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var tl ssdTally
	for _, b := range blocks {
		got, err := testutil.GetBlock(ctx, n.local, b.ns, b.hash)
		switch {
		case status.Code(err) == codes.NotFound:
			tl.missing = append(tl.missing, b)
		case err != nil:
			c.hist.problem("%s: get %s: %v", n.spec.name, b.key()[:24], err)
		default:
			if c.hist.check("ssd read-back on "+n.spec.name, b, got) {
				tl.found++
			}
		}
	}
	return tl
}

// ssdCounted is the blocks the tier dropped and counted: not written
// (drops), dropped when read (checksum, read errors), aged out.
func ssdCounted(m map[string]float64) float64 {
	return testutil.SSDDrops(m) + m[mSSDChecksum] + m[mSSDReadErrors] + m[mSSDAgedOut]
}

// ssdDrained waits until every eviction so far was written or dropped,
// and returns the scrape.
func (c *cluster) ssdDrained(n *node) map[string]float64 {
	c.t.Helper()
	var m map[string]float64
	c.waitFor(30*time.Second, "SSD write queue drained", func() bool {
		var err error
		m, err = n.scrape()
		c.require(err, "scrape")
		return testutil.SSDDrained(m)
	})
	return m
}

// ssdPutMany puts count fresh blocks, one call each.
func (c *cluster) ssdPutMany(n *node, count int) []block {
	c.t.Helper()
	sizes := make([]int, count)
	for i := range sizes {
		sizes[i] = ssdBlock
	}
	return c.put(n, true, sizes...)
}

func runSSDKillSpills(c *cluster) {
	a := c.n("a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex // guards put
	var put []block
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // puts until the kill breaks the connection
		defer wg.Done()
		for range 160 { // 40 MiB: five pools, within the 128 MiB ring
			b := c.reg.make(ns, ssdBlock, true)
			if c.hist.put(ctx, a, b) != nil {
				return
			}
			mu.Lock()
			put = append(put, b)
			mu.Unlock()
		}
	}()
	c.waitFor(30*time.Second, "40 blocks spilled", func() bool { return c.metric(a, mSSDWrites) >= 40 })
	// Delete 8 blocks held only on SSD: their tombstones must hold
	// across the kill.
	deleted := map[string]bool{}
	infos, err := listBlocks(ctx, a)
	c.require(err, "list blocks")
	for _, in := range infos {
		if in.GetTier() == "ssd" && len(deleted) < 8 {
			_, err := a.local.DeleteBlock(ctx, &pegadv1.DeleteBlockRequest{Namespace: in.GetNamespace(), Hash: in.GetHash()})
			c.require(err, "delete an SSD block")
			deleted[in.GetNamespace()+"/"+fmt.Sprintf("%x", in.GetHash())] = true
		}
	}
	c.waitFor(10*time.Second, "8 tombstones written", func() bool { return c.metric(a, mSSDTombstones) >= 8 })
	m0, err := a.scrape()
	c.require(err, "scrape")
	a.kill()
	c.fault("A killed -9 while puts spill (%.0f blocks written to SSD, %.0f queued)", m0[mSSDWrites], m0[mSSDQueue])
	cancel()
	wg.Wait()
	c.expect(m0[mSSDAgedOut] == 0, "%.0f blocks aged out of a ring sized to hold them all", m0[mSSDAgedOut])

	a.start(c.t)
	m, err := a.scrape()
	c.require(err, "scrape")
	c.expect(m[mSSDRecovered] >= m0[mSSDWrites]-8,
		"recovered %.0f, but %.0f were written before the kill and 8 deleted", m[mSSDRecovered], m0[mSSDWrites])
	tl := c.ssdReadAll(a, put)
	asked := len(deleted)
	for _, b := range tl.missing {
		delete(deleted, b.key())
	}
	c.expect(len(deleted) == 0, "%d deleted blocks came back after the restart", len(deleted))
	gone := asked - len(deleted)
	m, err = a.scrape()
	c.require(err, "scrape")
	// Every block found again is served or dropped and counted.
	c.expect(float64(tl.found)+m[mSSDChecksum]+m[mSSDReadErrors] == m[mSSDRecovered],
		"found %d + checksum failures %.0f + read errors %.0f != recovered %.0f", tl.found, m[mSSDChecksum], m[mSSDReadErrors], m[mSSDRecovered])
	c.note("%d blocks put before the kill: %d served after restart (recovered %.0f, torn %.0f), %d of %d deleted stayed gone, %d lost with the pool and queue",
		len(put), tl.found, m[mSSDRecovered], m[mSSDChecksum], gone, asked, len(tl.missing)-gone)
	c.ssdReadAll(a, c.ssdPutMany(a, 4)) // serves new puts
}

func runSSDFullDisk(c *cluster) {
	a := c.n("a")
	c.require(testutil.FillDisk(filepath.Join(a.ssdDir, "filler")), "fill the disk")
	c.fault("A's SSD file system filled (tmpfs of 40 MiB, 32 MiB log)")
	// Another log on the full disk is refused at start.
	code, out := startUnusable(c.t, filepath.Join(a.ssdDir, "big"), "16MiB")
	c.fault("a second pegad asks 16 MiB of the full disk")
	c.expect(code == 78 && strings.Contains(out, "ssd-path") && strings.Contains(out, "no space left"),
		"ssd-size over a full disk: exit %d, want 78 naming ssd-path and the lack of space: %s", code, lastLine(out))

	bs := c.ssdPutMany(a, 256) // 64 MiB: the 32 MiB ring wraps
	m := c.ssdDrained(a)
	c.expect(m[mSSDWriteErr] == 0, "%.0f write errors on a preallocated log", m[mSSDWriteErr])
	c.expect(m[mSSDAgedOut] > 0, "the ring never wrapped")
	tl := c.ssdReadAll(a, bs)
	m, err := a.scrape()
	c.require(err, "scrape")
	c.expect(float64(len(tl.missing)) <= ssdCounted(m), "%d blocks missing, only %.0f dropped and counted", len(tl.missing), ssdCounted(m))
	c.note("full disk: %d of %d blocks served, %d missing, %.0f aged out, %.0f dropped", tl.found, len(bs), len(tl.missing), m[mSSDAgedOut], ssdCounted(m)-m[mSSDAgedOut])
	c.require(a.stop(), "SIGTERM on a full disk")
	a.start(c.t)
	tl = c.ssdReadAll(a, bs)
	m, err = a.scrape()
	c.require(err, "scrape")
	c.expect(float64(tl.found)+m[mSSDChecksum] == m[mSSDRecovered], "after restart: found %d + checksum failures %.0f != recovered %.0f",
		tl.found, m[mSSDChecksum], m[mSSDRecovered])
}

func runSSDCorrupt(c *cluster) {
	a := c.n("a")
	bs := c.ssdPutMany(a, 96) // 24 MiB: 64 blocks on SSD only
	onSSD := c.ssdDrained(a)[mSSDBlocks]
	pages, err := testutil.CorruptSSDLog(filepath.Join(a.ssdDir, "pegad-ssd.log"))
	c.require(err, "corrupt the log")
	c.fault("every data page of A's log flipped under the running daemon (%d pages, %.0f blocks)", pages, onSSD)
	tl := c.ssdReadAll(a, bs)
	m, err := a.scrape()
	c.require(err, "scrape")
	c.expect(m[mSSDChecksum] > 0, "no checksum failure after corrupting %d pages", pages)
	c.expect(float64(len(tl.missing)) <= ssdCounted(m), "%d blocks missing, only %.0f dropped and counted", len(tl.missing), ssdCounted(m))
	fails := m[mSSDChecksum]
	c.waitFor(10*time.Second, "a tombstone per dropped block", func() bool { return c.metric(a, mSSDTombstones) >= fails })
	c.note("%d served, %d missing, %.0f checksum failures", tl.found, len(tl.missing), fails)
	// After a clean restart the dropped blocks stay dropped (tombstones),
	// and what was served before is served again.
	c.require(a.stop(), "SIGTERM")
	a.start(c.t)
	after := c.ssdReadAll(a, bs)
	m, err = a.scrape()
	c.require(err, "scrape")
	c.expect(m[mSSDChecksum] == 0, "%.0f checksum failures after the restart: dropped blocks came back", m[mSSDChecksum])
	c.expect(after.found == tl.found, "%d served after the restart, %d before", after.found, tl.found)
}

func runSSDUnusable(c *cluster) {
	a := c.n("a")
	bs := c.ssdPutMany(a, 40)
	file := filepath.Join(a.dir, "file")
	c.require(os.WriteFile(file, nil, 0o600), "write file")
	ro := filepath.Join(a.dir, "ro")
	mountTmpfs(c.t, ro, "size=16m", syscall.MS_RDONLY)
	for _, tc := range []struct{ what, path, want string }{
		{"a read-only file system", ro, "read-only file system"},
		{"a path below a file", filepath.Join(file, "ssd"), "not a directory"},
		{"the path of a running pegad", a.ssdDir, "in use by another process"},
	} {
		code, out := startUnusable(c.t, tc.path, "16MiB")
		c.fault("pegad started on %s", tc.what)
		c.expect(code == 78 && strings.Contains(out, "ssd-path") && strings.Contains(out, tc.want),
			"--ssd-path on %s: exit %d, want 78 naming ssd-path and %q: %s", tc.what, code, tc.want, lastLine(out))
	}
	tl := c.ssdReadAll(a, bs)
	m, err := a.scrape()
	c.require(err, "scrape")
	c.expect(float64(len(tl.missing)) <= ssdCounted(m), "%d blocks missing, only %.0f dropped and counted", len(tl.missing), ssdCounted(m))
}

// startUnusable runs a second pegad (loopback, no metrics) with the SSD
// tier on path, and returns its exit status and output.
func startUnusable(t testing.TB, path, size string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binaries.pegad, "serve", "--node-id", "unusable",
		"--socket", filepath.Join(testutil.ShortTempDir(t), "s.sock"), "--listen", "127.0.0.1:0",
		"--metrics-listen", "", "--transport", "tcp", "--pool-size", "4MiB", "--log-format", "json",
		"--ssd-path", path, "--ssd-size", size)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "PEGAD_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run pegad: %v", err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
