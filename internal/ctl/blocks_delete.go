package ctl

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	pegaclient "github.com/pegaflow/pegad/client"
)

// NewBlocksDeleteCommand removes one block from the index.
func NewBlocksDeleteCommand(g *globalFlags) *cobra.Command {
	var ref blockRef
	cmd := &cobra.Command{
		Use:   "delete --namespace NS --hash HEX",
		Short: "Delete a block (its memory stays until transfer sessions pinning it end)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			hash, err := ref.parse()
			if err != nil {
				return err
			}
			var deferred bool
			err = g.withClient(cmd.Context(), func(ctx context.Context, c *pegaclient.Client) error {
				return c.Delete(ctx, ref.namespace, hash, pegaclient.WasDeferred(&deferred))
			})
			if err != nil {
				return err
			}
			return g.printer(cmd.OutOrStdout()).print(&deleteResult{
				Namespace: ref.namespace,
				Hash:      hexOf(hash),
				Deleted:   true,
				Deferred:  deferred,
			})
		},
	}
	ref.addFlags(cmd)
	return cmd
}

type deleteResult struct {
	Namespace string `json:"namespace"`
	Hash      string `json:"hash"`
	Deleted   bool   `json:"deleted"`
	Deferred  bool   `json:"deferred"`
}

func (r *deleteResult) writeTable(w io.Writer) error {
	state := "deleted"
	if r.Deferred {
		state = "deleted (memory freed when its transfer sessions end)"
	}
	fmt.Fprintln(w, "NAMESPACE\tHASH\tRESULT")
	_, err := fmt.Fprintf(w, "%s\t%s\t%s\n", r.Namespace, r.Hash, state)
	return err
}
