package ctl

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	pegaclient "github.com/pegaflow/pegad/client"
)

// NewBlocksGetCommand writes one block's bytes to a file or stdout.
func NewBlocksGetCommand(g *globalFlags) *cobra.Command {
	var (
		ref blockRef
		out string
	)
	cmd := &cobra.Command{
		Use:   "get --namespace NS --hash HEX --out F",
		Short: "Write a block's segments, concatenated in slot order, to F ('-' for stdout)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			hash, err := ref.parse()
			if err != nil {
				return err
			}
			if out == "" {
				return usageErrorf("--out is required ('-' for stdout)")
			}
			var info *pegaclient.BlockInfo
			err = g.withBlockClient(cmd.Context(), func(ctx context.Context, c *pegaclient.Client) error {
				if out == "-" {
					info, err = c.GetTo(ctx, ref.namespace, hash, cmd.OutOrStdout())
					return err
				}
				info, err = getBlockToFile(ctx, c, ref.namespace, hash, out)
				return err
			})
			if err != nil {
				return err
			}
			if out == "-" {
				// stdout carries the data; nothing else may go there.
				return nil
			}
			return g.printer(cmd.OutOrStdout()).print(&getResult{
				Namespace: ref.namespace,
				Hash:      hexOf(hash),
				Bytes:     info.Size,
				Slots:     slotJSONs(info.Slots),
				Out:       out,
			})
		},
	}
	ref.addFlags(cmd)
	cmd.Flags().StringVar(&out, "out", "", "output file, '-' for stdout (required)")
	return cmd
}

// getBlockToFile writes into a temporary file beside path and renames it
// into place only when the whole block arrived: a failed get leaves no
// partial file behind.
func getBlockToFile(ctx context.Context, c *pegaclient.Client, ns string, hash []byte, path string) (*pegaclient.BlockInfo, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".pegactl-*")
	if err != nil {
		return nil, fmt.Errorf("output file: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	info, err := c.GetTo(ctx, ns, hash, tmp)
	if err != nil {
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("output file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, fmt.Errorf("output file: %w", err)
	}
	done = true
	return info, nil
}

func slotJSONs(ss []pegaclient.SlotSize) []slotJSON {
	out := make([]slotJSON, 0, len(ss))
	for _, s := range ss {
		out = append(out, slotJSON{KSize: s.K, VSize: s.V})
	}
	return out
}

type getResult struct {
	Namespace string     `json:"namespace"`
	Hash      string     `json:"hash"`
	Bytes     uint64     `json:"bytes"`
	Slots     []slotJSON `json:"slots"`
	Out       string     `json:"out"`
}

func (r *getResult) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "NAMESPACE\tHASH\tBYTES\tSLOTS\tOUT")
	_, err := fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Hash, humanBytes(r.Bytes), slotsSummary(r.Slots), r.Out)
	return err
}
