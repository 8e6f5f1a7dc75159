package ctl

import (
	"context"
	"fmt"
	"io"
	"math"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// NewBlocksListCommand lists stored blocks.
func NewBlocksListCommand(g *globalFlags) *cobra.Command {
	var (
		namespace string
		limit     int
	)
	cmd := &cobra.Command{
		Use:   "list [--namespace NS] [--limit N]",
		Short: "List stored blocks (all namespaces unless --namespace)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 || limit > math.MaxUint32 {
				return usageErrorf("invalid --limit %d", limit)
			}
			out := &listBlocksResult{Blocks: []blockJSON{}}
			err := g.withClient(cmd.Context(), func(ctx context.Context, c *client) error {
				// pegad answers a page at a time: follow next_cursor until
				// --limit blocks (pegad's default page when 0) or the end.
				req := &pegadv1.ListBlocksRequest{Namespace: namespace, Limit: uint32(limit)}
				for {
					res, err := c.local.ListBlocks(ctx, req)
					if err != nil {
						return err
					}
					for _, b := range res.GetBlocks() {
						out.Blocks = append(out.Blocks, blockOf(b))
					}
					out.Truncated = res.GetTruncated()
					if res.GetNextCursor() == "" || limit == 0 || len(out.Blocks) >= limit {
						return nil
					}
					req.Cursor, req.Limit = res.GetNextCursor(), uint32(limit-len(out.Blocks))
				}
			})
			if err != nil {
				return err
			}
			return g.printer(cmd.OutOrStdout()).print(out)
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "only this namespace")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most N blocks (0: pegad's default, 1000)")
	return cmd
}

type blockJSON struct {
	Namespace  string     `json:"namespace"`
	Hash       string     `json:"hash"`
	Bytes      uint64     `json:"bytes"`
	Slots      []slotJSON `json:"slots"`
	Pins       uint32     `json:"pins"`
	NumaNode   int32      `json:"numa_node"`
	CreatedAt  string     `json:"created_at"`
	LastAccess string     `json:"last_access"`
}

func blockOf(b *pegadv1.BlockInfo) blockJSON {
	return blockJSON{
		Namespace:  b.GetNamespace(),
		Hash:       hexOf(b.GetHash()),
		Bytes:      b.GetBytes(),
		Slots:      slotsOf(b.GetSlots()),
		Pins:       b.GetPins(),
		NumaNode:   b.GetNumaNode(),
		CreatedAt:  timestamp(b.GetCreatedAt()),
		LastAccess: timestamp(b.GetLastAccess()),
	}
}

type listBlocksResult struct {
	Blocks    []blockJSON `json:"blocks"`
	Truncated bool        `json:"truncated"`
}

func (r *listBlocksResult) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "NAMESPACE\tHASH\tBYTES\tSLOTS\tPINS\tNUMA\tLAST ACCESS")
	for _, b := range r.Blocks {
		last := b.LastAccess
		if last == "" {
			last = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n",
			b.Namespace, b.Hash, humanBytes(b.Bytes), slotsSummary(b.Slots), b.Pins, b.NumaNode, last)
	}
	if r.Truncated {
		fmt.Fprintf(w, "(truncated after %d blocks: raise --limit)\n", len(r.Blocks))
	}
	return nil
}
