package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pegaflow/pegad/internal/ctl"
)

// benchFetchArgs is the sweep BenchmarkBenchFetchVsTCP runs: the
// acceptance sweep (docs/rdma-acceptance.md) cut to a size that a 1 s
// benchtime repeats, small blocks one at a time and big ones 4 at once.
var benchFetchArgs = []string{"--sizes", "256KiB,4MiB", "--blocks", "16"}

// pegactl runs one pegactl command against n and returns its stdout.
func (n *node) pegactl(b *testing.B, args ...string) []byte {
	b.Helper()
	var out, errb bytes.Buffer
	code := ctl.Main(context.Background(), append([]string{"--socket", n.d.SocketPath(), "--timeout", "2m"}, args...),
		ctl.Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
	if code != 0 {
		b.Fatalf("pegactl %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
	}
	return out.Bytes()
}

// BenchmarkBenchFetchVsTCP: `pegactl bench fetch` between two daemons in
// this process on loopback over the tcp provider (the acceptance sweep of
// docs/rdma-acceptance.md, every byte checked against the seed), next to
// plain TCP streams (one per QP) copying the same bytes in 1 MiB writes in
// every iteration. The subject's rate is what the sweep itself reports:
// the bytes of all its rows over the time their Prefetch calls took (not
// the deletes and byte checks around them). Reports benchfetch-MB/s,
// tcp-MB/s and benchfetch-ratio (higher is better).
func BenchmarkBenchFetchVsTCP(b *testing.B) {
	holderNode := startNode(b, "holder", 256<<20)
	req := startNode(b, "requester", 256<<20)
	holderNode.pegactl(b, append([]string{"bench", "seed"}, benchFetchArgs...)...)
	fetch := append([]string{"-o", "json", "bench", "fetch", "--peer", holderNode.d.PeerAddr(),
		"--concurrency", "1,4"}, benchFetchArgs...)

	// sweep runs the fetch and returns its bytes and the seconds its
	// Prefetch calls took, from the rows it printed.
	sweep := func() (bytes int, secs float64) {
		var res struct {
			Rows []struct {
				BlockBytes int     `json:"block_bytes"`
				Blocks     int     `json:"blocks"`
				GBps       float64 `json:"gb_per_second"`
				Verified   bool    `json:"verified"`
			} `json:"rows"`
		}
		if err := json.Unmarshal(req.pegactl(b, fetch...), &res); err != nil || len(res.Rows) != 4 {
			b.Fatalf("bench fetch output: %v (%d rows)", err, len(res.Rows))
		}
		for _, r := range res.Rows {
			if !r.Verified || r.GBps <= 0 {
				b.Fatalf("row %+v: not verified", r)
			}
			n := r.BlockBytes * r.Blocks
			bytes += n
			secs += float64(n) / (r.GBps * 1e9)
		}
		return bytes, secs
	}
	total, _ := sweep() // warm up: handshake, first touch of the pools' pages
	raw := newStreams(b, "tcp", holderNode.d.Config().QPsPerPeer)
	src, dst := pattern(total, 1), pattern(total, 2)
	var fetchSecs float64
	var fetched int
	var plain clock
	for b.Loop() {
		n, s := sweep()
		fetched += n
		fetchSecs += s
		plain.time(func() { raw.Copy(b, src, dst, 1<<20) })
	}
	sv := float64(fetched) / fetchSecs / 1e6
	bv := plain.mbps(total)
	b.ReportMetric(sv, "benchfetch-MB/s")
	b.ReportMetric(bv, "tcp-MB/s")
	if bv > 0 {
		b.ReportMetric(sv/bv, "benchfetch-ratio")
	}
}
