package integration

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// pegactl runs the CLI against n's socket.
func pegactlNode(t *testing.T, n *node, args ...string) (string, int) {
	t.Helper()
	out, errOut, code := runPegactl(n.d.SocketPath(), append([]string{"--timeout", "60s"}, args...)...)
	return out + errOut, code
}

// TestBenchSeedFetch: `pegactl bench seed` on a holder and `pegactl bench
// fetch` on a requester pair up, fetch over the tcp provider, check every
// byte and report the bytes each NIC carried; fetched bytes that differ
// from the seed's fail the run.
func TestBenchSeedFetch(t *testing.T) {
	hcfg := baseConfig(t, "holder")
	hcfg.NICs = "2"
	rcfg := baseConfig(t, "requester")
	rcfg.NICs = "2"
	hold, req := start(t, hcfg), start(t, rcfg)
	small := []string{"--sizes", "64KiB,1MiB", "--blocks", "4"}

	if out, code := pegactlNode(t, hold, append([]string{"bench", "seed"}, small...)...); code != 0 {
		t.Fatalf("bench seed: exit %d\n%s", code, out)
	}
	out, code := pegactlNode(t, req, append([]string{"bench", "fetch", "--peer", hold.d.PeerAddr(),
		"--concurrency", "1,2", "--metrics", req.d.MetricsAddr()}, small...)...)
	if code != 0 || !strings.Contains(out, "every byte checked") || !strings.Contains(out, "tcp0") || !strings.Contains(out, "tcp1") {
		t.Fatalf("bench fetch: exit %d\n%s", code, out)
	}
	t.Logf("\n%s", out)

	// Many blocks per Prefetch call (an engine's prefetch carries
	// hundreds to thousands): 2 calls of 1,000 blocks at once.
	many := []string{"--sizes", "4KiB", "--blocks", "2000", "--seed", "3"}
	if out, code := pegactlNode(t, hold, append([]string{"bench", "seed"}, many...)...); code != 0 {
		t.Fatalf("bench seed: exit %d\n%s", code, out)
	}
	out, code = pegactlNode(t, req, append([]string{"-o", "json", "bench", "fetch", "--peer", hold.d.PeerAddr(),
		"--per-prefetch", "1000", "--concurrency", "2"}, many...)...)
	if code != 0 || !strings.Contains(out, `"per_prefetch": 1000`) || !strings.Contains(out, `"verified": true`) {
		t.Fatalf("bench fetch --per-prefetch 1000: exit %d\n%s", code, out)
	}

	// A holder whose block under a bench hash holds other bytes: the
	// fetch succeeds on the wire and the check fails the run.
	bad := make([]byte, 64<<10)
	bad[100] = 1
	file := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(file, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := pegactlNode(t, hold, "blocks", "put", "--namespace", "bad", "--hash", benchHashHex(7, 64<<10, 0), "--file", file); code != 0 {
		t.Fatalf("blocks put: %d\n%s", code, out)
	}
	out, code = pegactlNode(t, req, "bench", "fetch", "--peer", hold.d.PeerAddr(), "--namespace", "bad",
		"--sizes", "64KiB", "--blocks", "1", "--seed", "7", "--concurrency", "1")
	if code == 0 || !strings.Contains(out, "fetched bytes differ from the seed's") {
		t.Fatalf("fetch of a block with other bytes: exit %d\n%s", code, out)
	}
	// A seed the holder never stored: its blocks are missing on the peer.
	out, code = pegactlNode(t, req, append([]string{"bench", "fetch", "--peer", hold.d.PeerAddr(), "--seed", "9"}, small...)...)
	if code == 0 || !strings.Contains(out, "MISSING_ON_PEER") {
		t.Fatalf("fetch of another seed: exit %d\n%s", code, out)
	}
}

// benchHashHex is pegactl bench's hash of block i of size under seed
// (internal/ctl/bench.go), written out so the test pins the format.
func benchHashHex(seed, size uint64, i int) string {
	var in [32]byte
	copy(in[:8], "pegadbn\x00")
	binary.LittleEndian.PutUint64(in[8:], seed)
	binary.LittleEndian.PutUint64(in[16:], size)
	binary.LittleEndian.PutUint64(in[24:], uint64(i))
	h := sha256.Sum256(in[:])
	return hex.EncodeToString(h[:16])
}
