package ctl

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/bytesize"
	"github.com/pegaflow/pegad/internal/replay"
)

// newBenchReplayCommand replays a prefix-cache trace through the running
// pegad (issue 25): the hit ratio its eviction policy gives at the
// capacity its pool gives (and which policy it runs), beside LRU and Belady simulated at that
// capacity in the same run.
func newBenchReplayCommand(g *globalFlags) *cobra.Command {
	var (
		tracePath, blockSize, namespace string
	)
	cmd := &cobra.Command{
		Use:   "replay --trace FILE [--block-size 16KiB] [--namespace NS]",
		Short: "Replay a prefix-cache trace (JSONL, .gz too) through this pegad; print its hit ratio beside LRU and Belady at the capacity seen",
		Long: `Replay drives the pegad named by --socket as an engine would, through the
local client: for each request of the trace it leases the chain, reads and
checks the longest prefix held, and puts the blocks after it (equal-size
blocks of --block-size, bytes derived from the block id). The pool is the
daemon's, sized by the caller: start pegad with --pool-size = blocks ×
block size. It reports the prefix hit ratio (blocks hit / blocks requested),
the capacity in blocks it saw (most blocks resident at once), and the same
trace at that capacity through a plain LRU and Belady's offline optimum.

Trace lines: {"timestamp": ms, "input_length": n, "output_length": n,
"hash_ids": [chained block ids]} (the Mooncake FAST'25 form). Use a fresh
daemon or a namespace of its own: blocks already stored count as hits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			bs, err := bytesize.Parse(blockSize)
			if err != nil || bs < 8 || bs > 64<<20 {
				return usageErrorf("--block-size %q is not a size of 8 B..64 MiB", blockSize)
			}
			if namespace == "" {
				return usageErrorf("--namespace must not be empty")
			}
			reqs, err := replay.ReadTraceFile(tracePath)
			if err != nil {
				return usageErrorf("%v", err)
			}
			res, err := g.replay(cmd.Context(), reqs, replay.Options{Namespace: namespace, BlockSize: int(bs)})
			if err != nil {
				return err
			}
			return g.printer(cmd.OutOrStdout()).print(res)
		},
	}
	cmd.Flags().StringVar(&tracePath, "trace", "", "trace file, JSONL (gzip when it ends in .gz)")
	cmd.Flags().StringVar(&blockSize, "block-size", "16KiB", "bytes per block")
	cmd.Flags().StringVar(&namespace, "namespace", "pegad-replay", "namespace of the replayed blocks")
	_ = cmd.MarkFlagRequired("trace")
	return cmd
}

// replay runs the trace against the daemon. It takes no --timeout: a
// replay runs for as long as the trace does.
func (g *globalFlags) replay(ctx context.Context, reqs []replay.Request, opts replay.Options) (*replayResult, error) {
	// Zero-copy or not at all: a replay through gRPC streams would
	// measure the streams.
	c, err := pegaclient.Dial(ctx, g.socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	opts.Resident = func(ctx context.Context) (uint64, error) {
		st, err := c.Admin().Stats(ctx, &pegadv1.StatsRequest{})
		return st.GetBlocks(), err
	}
	res, err := replay.Drive(ctx, c, reqs, opts)
	if err != nil {
		return nil, err
	}
	st, err := c.Admin().Stats(ctx, &pegadv1.StatsRequest{})
	if err != nil {
		return nil, err
	}
	capacity := int(res.CapacityBlocks)
	accesses, unique := replay.Stats(reqs)
	return &replayResult{
		Policy:         st.GetEvictionPolicy(),
		Requests:       len(reqs),
		Accesses:       accesses,
		UniqueBlocks:   unique,
		BlockSize:      opts.BlockSize,
		HitRatio:       round3(res.Value()),
		CapacityBlocks: capacity,
		CapacityShare:  round3(float64(capacity) / float64(unique)),
		Stored:         res.Stored,
		Dropped:        res.Dropped,
		LRU:            round3(replay.LRU(reqs, capacity).Value()),
		Belady:         round3(replay.Belady(reqs, capacity).Value()),
	}, nil
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

type replayResult struct {
	Policy         string  `json:"policy"` // the daemon's eviction policy
	Requests       int     `json:"requests"`
	Accesses       int     `json:"accesses"`
	UniqueBlocks   int     `json:"unique_blocks"`
	BlockSize      int     `json:"block_size"`
	HitRatio       float64 `json:"hit_ratio"`
	CapacityBlocks int     `json:"capacity_blocks"`
	CapacityShare  float64 `json:"capacity_share"`
	Stored         uint64  `json:"stored"`
	Dropped        uint64  `json:"dropped"`
	LRU            float64 `json:"lru"`
	Belady         float64 `json:"belady"`
}

func (r *replayResult) writeTable(w io.Writer) error {
	_, err := fmt.Fprintf(w, "POLICY\tREQUESTS\tBLOCKS\tUNIQUE\tCAPACITY\tPEGAD\tLRU\tBELADY\tSTORED\tDROPPED\n"+
		"%s\t%d\t%d\t%d\t%d (%.1f%%)\t%.3f\t%.3f\t%.3f\t%d\t%d\n",
		r.Policy, r.Requests, r.Accesses, r.UniqueBlocks, r.CapacityBlocks, 100*r.CapacityShare,
		r.HitRatio, r.LRU, r.Belady, r.Stored, r.Dropped)
	return err
}
