package ctl

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
)

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
			data, err := readSegments(segs)
			if err != nil {
				return err
			}
			var (
				created bool
				evicted uint64
			)
			err = g.withBlockClient(cmd.Context(), func(ctx context.Context, c *pegaclient.Client) error {
				// A put into a full pool evicts the least valuable blocks
				// without a word, and a peer asking for them later finds
				// them gone (issue 33, item 7): the pool's eviction count
				// around the put says whether that happened.
				before, known := poolEvictions(ctx, c)
				err := c.Put(ctx, ref.namespace, hash, data, pegaclient.WithSlots(clientSlots(slots)...), pegaclient.WasCreated(&created))
				if err != nil {
					return err
				}
				if after, ok := poolEvictions(ctx, c); known && ok && after > before {
					evicted = after - before
				}
				return nil
			})
			if err != nil {
				return err
			}
			return g.printer(cmd.OutOrStdout()).print(&putResult{
				Namespace:     ref.namespace,
				Hash:          hexOf(hash),
				Bytes:         uint64(len(data)),
				Created:       created,
				Slots:         slotsOf(slots),
				EvictedBlocks: evicted,
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

// readSegments reads exactly each segment's size from its file, in slot
// order, into one buffer: a file that changed size since it was measured
// is an error, not a silently different block.
func readSegments(segs []segment) ([]byte, error) {
	var total int64
	for _, s := range segs {
		total += s.size
	}
	data := make([]byte, total)
	off := int64(0)
	for _, s := range segs {
		if err := readFile(s, data[off:off+s.size]); err != nil {
			return nil, err
		}
		off += s.size
	}
	return data, nil
}

func readFile(s segment, dst []byte) error {
	f, err := os.Open(s.path)
	if err != nil {
		return fmt.Errorf("segment file: %w", err)
	}
	defer f.Close()
	if n, err := io.ReadFull(f, dst); err != nil {
		return fmt.Errorf("segment file %s: shrank while reading (%d of %d bytes): %w", s.path, n, s.size, err)
	}
	return nil
}

func clientSlots(slots []*pegadv1.SlotSize) []pegaclient.SlotSize {
	out := make([]pegaclient.SlotSize, len(slots))
	for i, s := range slots {
		out[i] = pegaclient.SlotSize{K: s.GetKSize(), V: s.GetVSize()}
	}
	return out
}

type putResult struct {
	Namespace string     `json:"namespace"`
	Hash      string     `json:"hash"`
	Bytes     uint64     `json:"bytes"`
	Created   bool       `json:"created"`
	Slots     []slotJSON `json:"slots"`
	// EvictedBlocks: blocks the pool evicted while the put ran, to make
	// room for it (or for another writer at the same moment).
	EvictedBlocks uint64 `json:"evicted_blocks"`
}

// poolEvictions is the daemon's eviction count; false when its stats
// cannot be read (the put goes on without saying).
func poolEvictions(ctx context.Context, c *pegaclient.Client) (uint64, bool) {
	st, err := c.Admin().Stats(ctx, &pegadv1.StatsRequest{})
	if err != nil {
		return 0, false
	}
	return st.GetEvictions(), true
}

func (r *putResult) writeTable(w io.Writer) error {
	state := "stored"
	if !r.Created {
		state = "already present (kept the stored copy)"
	}
	if r.EvictedBlocks > 0 {
		state += fmt.Sprintf("; pool full: %d %s evicted to make room", r.EvictedBlocks, plural(r.EvictedBlocks, "block", "blocks"))
	}
	fmt.Fprintln(w, "NAMESPACE\tHASH\tBYTES\tSLOTS\tRESULT")
	_, err := fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Hash, humanBytes(r.Bytes), slotsSummary(r.Slots), state)
	return err
}

func plural(n uint64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
