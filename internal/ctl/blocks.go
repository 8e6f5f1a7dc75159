package ctl

import (
	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// NewBlocksCommand groups the commands on this node's stored blocks.
func NewBlocksCommand(g *globalFlags) *cobra.Command {
	cmd := newGroupCommand("blocks", "Put, get, list and delete blocks in this node's pool")
	cmd.AddCommand(
		NewBlocksPutCommand(g),
		NewBlocksGetCommand(g),
		NewBlocksListCommand(g),
		NewBlocksDeleteCommand(g),
		NewBlocksWhereCommand(g),
	)
	return cmd
}

// blockRef is the --namespace/--hash pair naming one block.
type blockRef struct {
	namespace string
	hashHex   string
}

func (r *blockRef) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&r.namespace, "namespace", "", "block namespace (required)")
	cmd.Flags().StringVar(&r.hashHex, "hash", "", "block hash in hex (required)")
}

func (r *blockRef) parse() ([]byte, error) {
	if r.namespace == "" {
		return nil, usageErrorf("--namespace is required")
	}
	if r.hashHex == "" {
		return nil, usageErrorf("--hash is required")
	}
	return parseHash(r.hashHex)
}

func slotsOf(ss []*pegadv1.SlotSize) []slotJSON {
	out := make([]slotJSON, 0, len(ss))
	for _, s := range ss {
		out = append(out, slotJSON{KSize: s.GetKSize(), VSize: s.GetVSize()})
	}
	return out
}
