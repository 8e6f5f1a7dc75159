package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
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
			var info *pegadv1.BlockInfo
			var n uint64
			err = g.withClient(cmd.Context(), func(ctx context.Context, c *client) error {
				if out == "-" {
					info, n, err = getBlock(ctx, c, ref.namespace, hash, cmd.OutOrStdout())
					return err
				}
				info, n, err = getBlockToFile(ctx, c, ref.namespace, hash, out)
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
				Bytes:     n,
				Slots:     slotsOf(info.GetSlots()),
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
func getBlockToFile(ctx context.Context, c *client, ns string, hash []byte, path string) (*pegadv1.BlockInfo, uint64, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".pegactl-*")
	if err != nil {
		return nil, 0, fmt.Errorf("output file: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	info, n, err := getBlock(ctx, c, ns, hash, tmp)
	if err != nil {
		return nil, 0, err
	}
	if err := tmp.Close(); err != nil {
		return nil, 0, fmt.Errorf("output file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, 0, fmt.Errorf("output file: %w", err)
	}
	done = true
	return info, n, nil
}

// getBlock streams a block into w and checks that exactly the announced
// number of bytes arrived.
func getBlock(ctx context.Context, c *client, ns string, hash []byte, w io.Writer) (*pegadv1.BlockInfo, uint64, error) {
	stream, err := c.local.GetBlock(ctx, &pegadv1.GetBlockRequest{Namespace: ns, Hash: hash})
	if err != nil {
		return nil, 0, err
	}
	var (
		info *pegadv1.BlockInfo
		want uint64
		got  uint64
	)
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, 0, err
		}
		switch m := msg.GetMsg().(type) {
		case *pegadv1.GetBlockResponse_Header:
			if info != nil {
				return nil, 0, fmt.Errorf("protocol error: second header from pegad")
			}
			info = m.Header
			want = totalBytes(slotsOf(info.GetSlots()))
		case *pegadv1.GetBlockResponse_Data:
			if info == nil {
				return nil, 0, fmt.Errorf("protocol error: data before header from pegad")
			}
			got += uint64(len(m.Data))
			if got > want {
				return nil, 0, fmt.Errorf("protocol error: pegad sent more than the block's %d bytes", want)
			}
			if _, err := w.Write(m.Data); err != nil {
				return nil, 0, fmt.Errorf("write output: %w", err)
			}
		default:
			return nil, 0, fmt.Errorf("protocol error: empty message from pegad")
		}
	}
	if info == nil {
		return nil, 0, fmt.Errorf("protocol error: no header from pegad")
	}
	if got != want {
		return nil, 0, fmt.Errorf("block truncated: got %d of %d bytes", got, want)
	}
	return info, got, nil
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
