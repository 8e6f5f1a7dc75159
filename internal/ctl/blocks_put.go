package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// chunkSize is the data carried by one PutBlock message; the local API
// accepts at most 1 MiB per message.
const chunkSize = 1 << 20

// NewBlocksPutCommand stores one block from files, one segment per file.
func NewBlocksPutCommand(g *globalFlags) *cobra.Command {
	var (
		ref   blockRef
		files []string
		kv    bool
	)
	cmd := &cobra.Command{
		Use:   "put --namespace NS --hash HEX --file F [--file F2 ...] [--kv]",
		Short: "Store a block; each file is one slot's K segment, or with --kv pairs of files are a slot's K and V",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			hash, err := ref.parse()
			if err != nil {
				return err
			}
			segs, slots, err := planSegments(files, kv)
			if err != nil {
				return err
			}
			var res *pegadv1.PutBlockResponse
			err = g.withClient(cmd.Context(), func(ctx context.Context, c *client) error {
				res, err = putBlock(ctx, c, &pegadv1.PutBlockHeader{Namespace: ref.namespace, Hash: hash, Slots: slots}, segs)
				return err
			})
			if err != nil {
				return err
			}
			return g.printer(cmd.OutOrStdout()).print(&putResult{
				Namespace: ref.namespace,
				Hash:      hexOf(hash),
				Bytes:     res.GetBytes(),
				Created:   res.GetCreated(),
				Slots:     slotsOf(slots),
			})
		},
	}
	ref.addFlags(cmd)
	cmd.Flags().StringArrayVar(&files, "file", nil, "segment file, in slot order (repeatable, required)")
	cmd.Flags().BoolVar(&kv, "kv", false, "consecutive pairs of --file are one slot's K and V segments")
	return cmd
}

// segment is one input file and the size announced for it in the header.
type segment struct {
	path string
	size int64
}

// planSegments stats the files and derives the block's slot layout.
func planSegments(files []string, kv bool) ([]segment, []*pegadv1.SlotSize, error) {
	if len(files) == 0 {
		return nil, nil, usageErrorf("at least one --file is required")
	}
	if kv && len(files)%2 != 0 {
		return nil, nil, usageErrorf("--kv needs pairs of --file (K then V per slot), got %d files", len(files))
	}
	segs := make([]segment, 0, len(files))
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, nil, usageErrorf("segment file: %v", err)
		}
		if !fi.Mode().IsRegular() {
			return nil, nil, usageErrorf("segment file %s: not a regular file", f)
		}
		if fi.Size() == 0 {
			return nil, nil, usageErrorf("segment file %s: empty (a segment needs at least one byte)", f)
		}
		segs = append(segs, segment{path: f, size: fi.Size()})
	}
	var slots []*pegadv1.SlotSize
	if kv {
		for i := 0; i < len(segs); i += 2 {
			slots = append(slots, &pegadv1.SlotSize{KSize: uint64(segs[i].size), VSize: uint64(segs[i+1].size)})
		}
	} else {
		for _, s := range segs {
			slots = append(slots, &pegadv1.SlotSize{KSize: uint64(s.size)})
		}
	}
	return segs, slots, nil
}

// putBlock streams the header then every segment in ≤1 MiB chunks.
func putBlock(ctx context.Context, c *client, hdr *pegadv1.PutBlockHeader, segs []segment) (*pegadv1.PutBlockResponse, error) {
	stream, err := c.local.PutBlock(ctx)
	if err != nil {
		return nil, err
	}
	send := func(req *pegadv1.PutBlockRequest) error {
		if err := stream.Send(req); err != nil {
			if errors.Is(err, io.EOF) {
				// The server ended the stream early; its status says why.
				_, err = stream.CloseAndRecv()
			}
			return err
		}
		return nil
	}
	if err := send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Header{Header: hdr}}); err != nil {
		return nil, err
	}
	buf := make([]byte, chunkSize)
	for _, s := range segs {
		if err := sendFile(s, buf, func(chunk []byte) error {
			return send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Data{Data: chunk}})
		}); err != nil {
			return nil, err
		}
	}
	return stream.CloseAndRecv()
}

// sendFile sends exactly s.size bytes of s.path; a file that changed size
// since it was measured is an error, not a silently different block.
func sendFile(s segment, buf []byte, send func([]byte) error) error {
	f, err := os.Open(s.path)
	if err != nil {
		return fmt.Errorf("segment file: %w", err)
	}
	defer f.Close()
	var sent int64
	for sent < s.size {
		n := int64(len(buf))
		if left := s.size - sent; left < n {
			n = left
		}
		if _, err := io.ReadFull(f, buf[:n]); err != nil {
			return fmt.Errorf("segment file %s: shrank while reading (%d of %d bytes): %w", s.path, sent, s.size, err)
		}
		// Send serializes the message before it returns: buf is reusable.
		if err := send(buf[:n]); err != nil {
			return err
		}
		sent += n
	}
	return nil
}

type putResult struct {
	Namespace string     `json:"namespace"`
	Hash      string     `json:"hash"`
	Bytes     uint64     `json:"bytes"`
	Created   bool       `json:"created"`
	Slots     []slotJSON `json:"slots"`
}

func (r *putResult) writeTable(w io.Writer) error {
	state := "stored"
	if !r.Created {
		state = "already present (kept the stored copy)"
	}
	fmt.Fprintln(w, "NAMESPACE\tHASH\tBYTES\tSLOTS\tRESULT")
	_, err := fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Hash, humanBytes(r.Bytes), slotsSummary(r.Slots), state)
	return err
}
