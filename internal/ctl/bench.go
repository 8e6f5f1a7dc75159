package ctl

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/bytesize"
)

// The acceptance bench (docs/rdma-acceptance.md): `bench seed` on the
// holder stores blocks whose hashes and bytes derive from a seed; `bench
// fetch` on the requester makes its pegad fetch them from the holder,
// sweeping block sizes and concurrency, and checks every byte against the
// seed. The two pair up by default (same namespace, seed, sizes, count),
// fit a 1 GiB pool and finish within a minute on loopback.

// maxBenchBlocks bounds --blocks: room for 64 concurrent prefetches of
// 1,000+ blocks each (issue 27's acceptance run), per size.
const maxBenchBlocks = 1 << 18

// benchSpec is what both commands derive blocks from.
type benchSpec struct {
	namespace string
	seed      uint64
	sizes     []uint64
	blocks    int
	// perPrefetch (fetch): blocks per Prefetch call.
	perPrefetch int
}

func (s *benchSpec) addFlags(cmd *cobra.Command, sizes *string) {
	cmd.Flags().StringVar(&s.namespace, "namespace", "pegad-bench", "namespace of the bench blocks")
	cmd.Flags().Uint64Var(&s.seed, "seed", 1, "seed the blocks' hashes and bytes derive from")
	cmd.Flags().StringVar(sizes, "sizes", "64KiB,256KiB,1MiB,4MiB,8MiB", "block sizes, comma-separated")
	cmd.Flags().IntVar(&s.blocks, "blocks", 16, "blocks of each size")
}

func (s *benchSpec) parse(sizes string) error {
	if s.namespace == "" {
		return usageErrorf("--namespace must not be empty")
	}
	if s.blocks < 1 || s.blocks > maxBenchBlocks {
		return usageErrorf("--blocks %d is outside 1..%d", s.blocks, maxBenchBlocks)
	}
	s.sizes = nil
	for _, f := range strings.Split(sizes, ",") {
		b, err := bytesize.Parse(strings.TrimSpace(f))
		if err != nil || b == 0 || b > 1<<30 {
			return usageErrorf("--sizes: %q is not a size of 1 B..1 GiB", f)
		}
		s.sizes = append(s.sizes, uint64(b))
	}
	return nil
}

// benchHash is block i of size's hash: 16 bytes of SHA-256 over the seed.
func benchHash(seed, size uint64, i int) []byte {
	var in [32]byte
	copy(in[:8], "pegadbn\x00")
	binary.LittleEndian.PutUint64(in[8:], seed)
	binary.LittleEndian.PutUint64(in[16:], size)
	binary.LittleEndian.PutUint64(in[24:], uint64(i))
	h := sha256.Sum256(in[:])
	return h[:16]
}

// benchBytes fills b with the bytes of the block whose hash is h.
func benchBytes(h []byte, b []byte) {
	var key [32]byte
	copy(key[:], h)
	r := rand.NewChaCha8(key)
	_, _ = r.Read(b)
}

// NewBenchCommand groups the acceptance bench.
func NewBenchCommand(g *globalFlags) *cobra.Command {
	cmd := newGroupCommand("bench", "Acceptance bench between two pegads: seed blocks on a holder, fetch and check them from a requester")
	cmd.AddCommand(newBenchSeedCommand(g), newBenchFetchCommand(g), newBenchReplayCommand(g))
	return cmd
}

func newBenchSeedCommand(g *globalFlags) *cobra.Command {
	var (
		spec  benchSpec
		sizes string
	)
	cmd := &cobra.Command{
		Use:   "seed [--namespace NS] [--seed N] [--sizes 64KiB,...] [--blocks N]",
		Short: "Store the bench blocks in this node's pegad (run on the holder)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := spec.parse(sizes); err != nil {
				return err
			}
			out := &benchSeedResult{Namespace: spec.namespace, Seed: spec.seed}
			err := g.withBlockClient(cmd.Context(), func(ctx context.Context, c *pegaclient.Client) error {
				for _, size := range spec.sizes {
					start := time.Now()
					buf := make([]byte, size)
					for i := range spec.blocks {
						h := benchHash(spec.seed, size, i)
						benchBytes(h, buf)
						if err := c.Put(ctx, spec.namespace, h, buf); err != nil {
							return fmt.Errorf("seed block %d of %d bytes: %w", i, size, err)
						}
					}
					out.Sizes = append(out.Sizes, benchSeedRow{BlockBytes: size, Blocks: spec.blocks,
						Seconds: roundMillis(time.Since(start).Seconds())})
				}
				return nil
			})
			if err != nil {
				return err
			}
			return g.printer(cmd.OutOrStdout()).print(out)
		},
	}
	spec.addFlags(cmd, &sizes)
	return cmd
}

type benchSeedRow struct {
	BlockBytes uint64  `json:"block_bytes"`
	Blocks     int     `json:"blocks"`
	Seconds    float64 `json:"seconds"`
}

type benchSeedResult struct {
	Namespace string         `json:"namespace"`
	Seed      uint64         `json:"seed"`
	Sizes     []benchSeedRow `json:"sizes"`
}

func (r *benchSeedResult) writeTable(w io.Writer) error {
	fmt.Fprintf(w, "seeded namespace %s, seed %d\n", r.Namespace, r.Seed)
	fmt.Fprintln(w, "BLOCK\tBLOCKS\tSECONDS")
	for _, s := range r.Sizes {
		fmt.Fprintf(w, "%s\t%d\t%.3f\n", humanBytes(s.BlockBytes), s.Blocks, s.Seconds)
	}
	return nil
}

func newBenchFetchCommand(g *globalFlags) *cobra.Command {
	var (
		spec        benchSpec
		sizes, conc string
		peer        string
		metricsAddr string
		perPrefetch int
	)
	cmd := &cobra.Command{
		Use:   "fetch --peer HOST:PORT [--concurrency 1,4] [--per-prefetch N] [--metrics HOST:PORT] [seed flags]",
		Short: "Fetch the bench blocks from a holder into this node's pegad, sweeping sizes and concurrency, and check every byte",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := spec.parse(sizes); err != nil {
				return err
			}
			if _, _, err := net.SplitHostPort(peer); err != nil {
				return usageErrorf("--peer %q: want HOST:PORT", peer)
			}
			if perPrefetch < 1 || perPrefetch > limits.MaxBlocksPerRequest {
				return usageErrorf("--per-prefetch %d is outside 1..%d", perPrefetch, limits.MaxBlocksPerRequest)
			}
			spec.perPrefetch = perPrefetch
			var concs []int
			for _, f := range strings.Split(conc, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(f))
				if err != nil || n < 1 || n > 256 {
					return usageErrorf("--concurrency: %q is not 1..256", f)
				}
				concs = append(concs, n)
			}
			out := &benchFetchResult{Peer: peer, Namespace: spec.namespace, Seed: spec.seed}
			nicsBefore, err := scrapeNICBytes(metricsAddr)
			if err != nil {
				return err
			}
			err = g.withBlockClient(cmd.Context(), func(ctx context.Context, c *pegaclient.Client) error {
				for _, size := range spec.sizes {
					for _, n := range concs {
						row, err := benchFetchOne(ctx, c, peer, spec, size, n, g.timeout)
						if err != nil {
							return err
						}
						out.Rows = append(out.Rows, row)
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			nicsAfter, err := scrapeNICBytes(metricsAddr)
			if err != nil {
				return err
			}
			for nic, b := range nicsAfter {
				out.NICBytes = append(out.NICBytes, benchNICRow{NIC: nic, Bytes: uint64(b - nicsBefore[nic])})
			}
			slices.SortFunc(out.NICBytes, func(a, b benchNICRow) int { return strings.Compare(a.NIC, b.NIC) })
			return g.printer(cmd.OutOrStdout()).print(out)
		},
	}
	spec.addFlags(cmd, &sizes)
	cmd.Flags().StringVar(&peer, "peer", "", "the holder's peer address, HOST:PORT (required)")
	cmd.Flags().StringVar(&conc, "concurrency", "1,4", "concurrent Prefetch calls, comma-separated sweep")
	cmd.Flags().IntVar(&perPrefetch, "per-prefetch", 1, "blocks each Prefetch call asks for (an engine's prefetch carries hundreds to thousands)")
	cmd.Flags().StringVar(&metricsAddr, "metrics", "", "this pegad's --metrics-listen HOST:PORT: report the bytes each NIC carried")
	return cmd
}

// benchFetchOne drops the local copies of one size's blocks, fetches them
// with conc concurrent Prefetch calls, and checks every byte.
func benchFetchOne(ctx context.Context, c *pegaclient.Client, peer string, spec benchSpec, size uint64, conc int, timeout time.Duration) (benchFetchRow, error) {
	per := max(spec.perPrefetch, 1)
	row := benchFetchRow{BlockBytes: size, Blocks: spec.blocks, Concurrency: conc, PerPrefetch: per}
	hashes := make([][]byte, spec.blocks)
	for i := range hashes {
		hashes[i] = benchHash(spec.seed, size, i)
		if err := c.Delete(ctx, spec.namespace, hashes[i]); err != nil && !errors.Is(err, pegaclient.ErrNotFound) {
			return row, fmt.Errorf("drop the local copy of a %d-byte block: %w", size, err)
		}
	}
	var (
		mu   sync.Mutex // guards lats and errs
		lats []time.Duration
		errs []error
		wg   sync.WaitGroup
	)
	// Calls of per blocks each, dealt round-robin to conc workers.
	var calls [][][]byte
	for i := 0; i < len(hashes); i += per {
		calls = append(calls, hashes[i:min(i+per, len(hashes))])
	}
	start := time.Now()
	for w := range conc {
		wg.Go(func() {
			for i := w; i < len(calls); i += conc {
				t0 := time.Now()
				res, err := c.Prefetch(ctx, spec.namespace, calls[i],
					pegaclient.FromPeer(peer), pegaclient.WithPrefetchTimeout(timeout))
				d := time.Since(t0)
				if res != nil {
					for _, b := range res.Blocks {
						if b.Status != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED {
							err = errors.Join(err, fmt.Errorf("block %s: %s %s", hexOf(b.Hash), b.Status, b.Err))
						}
					}
				}
				mu.Lock()
				lats = append(lats, d)
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return row, fmt.Errorf("fetch %d-byte blocks from %s: %w", size, peer, err)
	}
	want, got := make([]byte, size), make([]byte, size+1)
	for i, h := range hashes {
		benchBytes(h, want)
		n, err := c.Get(ctx, spec.namespace, h, got)
		if err != nil {
			return row, fmt.Errorf("read back block %d of %d bytes: %w", i, size, err)
		}
		if !bytes.Equal(got[:n], want) {
			return row, fmt.Errorf("block %d of %d bytes (%s): fetched bytes differ from the seed's", i, size, hexOf(h))
		}
	}
	row.Verified = true
	sort.Slice(lats, func(a, b int) bool { return lats[a] < lats[b] })
	row.GBps = roundMillis(float64(size) * float64(spec.blocks) / took.Seconds() / 1e9)
	row.P50Ms = roundMillis(float64(lats[len(lats)/2].Microseconds()) / 1e3)
	row.P99Ms = roundMillis(float64(lats[(len(lats)*99)/100].Microseconds()) / 1e3)
	return row, nil
}

// scrapeNICBytes reads pegaflow_rdma_nic_read_bytes_total per NIC from a
// pegad's /metrics; empty when addr is.
func scrapeNICBytes(addr string) (map[string]float64, error) {
	out := map[string]float64{}
	if addr == "" {
		return out, nil
	}
	cl := http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("--metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("--metrics: %w", err)
	}
	const name = `pegaflow_rdma_nic_read_bytes_total{nic="`
	for line := range strings.Lines(string(body)) {
		rest, ok := strings.CutPrefix(line, name)
		if !ok {
			continue
		}
		nic, val, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			out[nic] = v
		}
	}
	return out, nil
}

type benchFetchRow struct {
	BlockBytes  uint64  `json:"block_bytes"`
	Blocks      int     `json:"blocks"`
	Concurrency int     `json:"concurrency"`
	PerPrefetch int     `json:"per_prefetch"`
	GBps        float64 `json:"gb_per_second"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	Verified    bool    `json:"verified"`
}

type benchNICRow struct {
	NIC   string `json:"nic"`
	Bytes uint64 `json:"bytes"`
}

type benchFetchResult struct {
	Peer      string          `json:"peer"`
	Namespace string          `json:"namespace"`
	Seed      uint64          `json:"seed"`
	Rows      []benchFetchRow `json:"rows"`
	NICBytes  []benchNICRow   `json:"nic_bytes,omitempty"`
}

func (r *benchFetchResult) writeTable(w io.Writer) error {
	fmt.Fprintf(w, "fetched namespace %s (seed %d) from %s; every byte checked\n", r.Namespace, r.Seed, r.Peer)
	fmt.Fprintln(w, "BLOCK\tBLOCKS\tCONC\tPER_PREFETCH\tGB/s\tP50\tP99")
	for _, x := range r.Rows {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%.3f\t%.3fms\t%.3fms\n", humanBytes(x.BlockBytes), x.Blocks, x.Concurrency, x.PerPrefetch, x.GBps, x.P50Ms, x.P99Ms)
	}
	if len(r.NICBytes) > 0 {
		fmt.Fprintln(w, "NIC\tBYTES READ")
		for _, n := range r.NICBytes {
			fmt.Fprintf(w, "%s\t%s\n", n.NIC, humanBytes(n.Bytes))
		}
	}
	return nil
}
