package ctl

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
)

// NewBlocksListCommand lists stored blocks.
func NewBlocksListCommand(g *globalFlags) *cobra.Command {
	var (
		namespace string
		limit     int
		watch     time.Duration
		order     string
	)
	cmd := &cobra.Command{
		Use:   "list [--namespace NS] [--limit N]",
		Short: "List stored blocks (all namespaces unless --namespace)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 || limit > math.MaxUint32 {
				return usageErrorf("invalid --limit %d", limit)
			}
			if err := blockSort.check(order); err != nil {
				return err
			}
			return g.repeat(cmd, watch, func(ctx context.Context, c *pegaclient.Client) (result, error) {
				out := &listBlocksResult{Blocks: []blockJSON{}, now: time.Now()}
				// pegad answers a page at a time: follow next_cursor until
				// --limit blocks (pegad's default page when 0) or the end.
				req := &pegadv1.ListBlocksRequest{Namespace: namespace, Limit: uint32(limit)}
				for {
					res, err := c.Local().ListBlocks(ctx, req)
					if err != nil {
						return nil, err
					}
					for _, b := range res.GetBlocks() {
						out.Blocks = append(out.Blocks, blockOf(b))
					}
					out.Truncated = res.GetTruncated()
					if res.GetNextCursor() == "" || limit == 0 || len(out.Blocks) >= limit {
						break
					}
					req.Cursor, req.Limit = res.GetNextCursor(), uint32(limit-len(out.Blocks))
				}
				blockSort.apply(out.Blocks, order)
				return out, nil
			})
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "only this namespace")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most N blocks (0: pegad's default, 1000)")
	addWatchFlag(cmd, &watch)
	addSortFlag(cmd, &order, blockSort)
	return cmd
}

type blockJSON struct {
	Namespace  string     `json:"namespace"`
	Hash       string     `json:"hash"`
	Bytes      uint64     `json:"bytes"`
	Slots      []slotJSON `json:"slots"`
	Pins       uint32     `json:"pins"`
	NumaNode   int32      `json:"numa_node"`
	Tier       string     `json:"tier"`
	CreatedAt  string     `json:"created_at"`
	LastAccess string     `json:"last_access"`

	lastAccess time.Time // for the table's IDLE column and --sort idle
}

// blockSort are the --sort keys of blocks list.
var blockSort = sortKeys[blockJSON]{
	"namespace": by(func(b blockJSON) string { return b.Namespace }),
	"hash":      by(func(b blockJSON) string { return b.Hash }),
	"bytes":     by(func(b blockJSON) uint64 { return b.Bytes }),
	"pins":      by(func(b blockJSON) uint32 { return b.Pins }),
	// idle: most recently used first; -idle: the eviction candidates first.
	"idle": func(a, b blockJSON) int { return b.lastAccess.Compare(a.lastAccess) },
}

func blockOf(b *pegadv1.BlockInfo) blockJSON {
	return blockJSON{
		Namespace:  b.GetNamespace(),
		Hash:       hexOf(b.GetHash()),
		Bytes:      b.GetBytes(),
		Slots:      slotsOf(b.GetSlots()),
		Pins:       b.GetPins(),
		NumaNode:   b.GetNumaNode(),
		Tier:       tierOf(b),
		CreatedAt:  timestamp(b.GetCreatedAt()),
		LastAccess: timestamp(b.GetLastAccess()),
		lastAccess: b.GetLastAccess().AsTime(),
	}
}

// tierOf is the block's tier; a pegad from before tiers lists the pool
// only.
func tierOf(b *pegadv1.BlockInfo) string {
	if t := b.GetTier(); t != "" {
		return t
	}
	return "dram"
}

type listBlocksResult struct {
	Blocks    []blockJSON `json:"blocks"`
	Truncated bool        `json:"truncated"`

	now time.Time // when listed: IDLE is now − last access
}

func (r *listBlocksResult) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "NAMESPACE\tHASH\tBYTES\tSLOTS\tPINS\tNUMA\tTIER\tIDLE")
	for _, b := range r.Blocks {
		last := "-"
		if b.LastAccess != "" && b.Tier != "ssd" {
			last = humanDur(max(r.now.Sub(b.lastAccess), 0).Truncate(time.Second))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n",
			b.Namespace, b.Hash, humanBytes(b.Bytes), slotsSummary(b.Slots), b.Pins, b.NumaNode, b.Tier, last)
	}
	if r.Truncated {
		fmt.Fprintf(w, "(truncated after %d blocks: raise --limit)\n", len(r.Blocks))
	}
	return nil
}
