package replay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	pegaclient "github.com/pegaflow/pegad/client"
)

// Options say how Drive stores a trace's blocks in the daemon.
type Options struct {
	Namespace string // the blocks' namespace
	BlockSize int    // bytes per block
	// Resident reports how many blocks the daemon holds; Drive asks after
	// each request, to find the capacity the pool gave (the most blocks
	// resident at once). Nil: capacity is not measured.
	Resident func(ctx context.Context) (uint64, error)
	// Progress, if set, is called after each request.
	Progress func(done, total int)
}

// Result is what a replay through the daemon saw.
type Result struct {
	// Prefix hits: for each request, the blocks of its longest prefix that
	// the daemon held, over all blocks requested.
	Ratio
	CapacityBlocks uint64 // most blocks resident at once (0 without Resident)
	Stored         uint64 // blocks written
	Dropped        uint64 // blocks that did not fit (pool full of pinned blocks)
}

// ErrWrongBytes is returned when a block read back differs from what was
// put under its key.
var ErrWrongBytes = errors.New("replay: a block read back holds the wrong bytes")

// Drive replays reqs through the daemon behind c, as an engine would: for
// each request it leases the chain, counts and reads (and checks) the
// longest prefix held, releases it, and puts the blocks after the prefix
// that are not stored. Each block's bytes derive from its id, so a wrong
// byte anywhere fails the replay.
func Drive(ctx context.Context, c *pegaclient.Client, reqs []Request, opts Options) (Result, error) {
	if opts.BlockSize < 8 {
		return Result{}, fmt.Errorf("replay: block size %d is below 8 bytes", opts.BlockSize)
	}
	var res Result
	want := make([]byte, opts.BlockSize)
	for i, req := range reqs {
		hashes := make([][]byte, len(req.HashIDs))
		for j, id := range req.HashIDs {
			hashes[j] = binary.BigEndian.AppendUint64(nil, id)
		}
		n, err := readPrefix(ctx, c, opts.Namespace, req.HashIDs, hashes, want)
		if err != nil {
			return res, fmt.Errorf("request %d: %w", i, err)
		}
		res.Accesses += uint64(len(hashes))
		res.Hits += uint64(n)
		stored, dropped, err := putRest(ctx, c, opts.Namespace, req.HashIDs[n:], hashes[n:], opts.BlockSize)
		if err != nil {
			return res, fmt.Errorf("request %d: %w", i, err)
		}
		res.Stored += stored
		res.Dropped += dropped
		if opts.Resident != nil {
			r, err := opts.Resident(ctx)
			if err != nil {
				return res, fmt.Errorf("request %d: resident blocks: %w", i, err)
			}
			res.CapacityBlocks = max(res.CapacityBlocks, r)
		}
		if opts.Progress != nil {
			opts.Progress(i+1, len(reqs))
		}
	}
	return res, nil
}

// readPrefix leases the chain, checks the bytes of its longest held
// prefix, releases every lease, and returns the prefix's length.
func readPrefix(ctx context.Context, c *pegaclient.Client, ns string, ids []uint64, hashes [][]byte, want []byte) (int, error) {
	leased, err := c.LeaseBatch(ctx, ns, hashes)
	if err != nil {
		return 0, fmt.Errorf("lease: %w", err)
	}
	var readers []*pegaclient.Reader
	for _, l := range leased {
		if l.Reader != nil {
			readers = append(readers, l.Reader)
		}
	}
	defer func() { _ = c.ReleaseBatch(readers) }()
	n := 0
	for ; n < len(leased); n++ {
		l := leased[n]
		if errors.Is(l.Err, pegaclient.ErrNotFound) {
			break
		}
		if l.Err != nil {
			return 0, fmt.Errorf("lease block %d: %w", ids[n], l.Err)
		}
		fill(want, ids[n])
		if got := l.Reader.Bytes(); string(got) != string(want) {
			return 0, fmt.Errorf("%w: block %d (%d bytes, want %d)", ErrWrongBytes, ids[n], len(got), len(want))
		}
	}
	return n, nil
}

// putRest writes the blocks not stored yet; a block that does not fit is
// dropped and counted (the daemon decided, as it would for an engine).
func putRest(ctx context.Context, c *pegaclient.Client, ns string, ids []uint64, hashes [][]byte, size int) (stored, dropped uint64, err error) {
	if len(ids) == 0 {
		return 0, 0, nil
	}
	reqs := make([]pegaclient.AllocRequest, len(ids))
	for i := range ids {
		reqs[i] = pegaclient.AllocRequest{Namespace: ns, Hash: hashes[i], Size: size}
	}
	allocs, err := c.AllocBatch(ctx, reqs)
	if err != nil {
		return 0, 0, fmt.Errorf("alloc: %w", err)
	}
	var ws []*pegaclient.Writer
	for i, a := range allocs {
		switch {
		case a.Err == nil:
			fill(a.Writer.Bytes(), ids[i])
			ws = append(ws, a.Writer)
		case errors.Is(a.Err, pegaclient.ErrExists):
		case errors.Is(a.Err, pegaclient.ErrPoolFull):
			dropped++
		case err == nil:
			err = fmt.Errorf("alloc block %d: %w", ids[i], a.Err)
		}
	}
	if err != nil {
		for _, a := range allocs {
			if a.Writer != nil {
				_ = a.Writer.Abort()
			}
		}
		return 0, 0, err
	}
	if err := c.CommitBatch(ctx, ws); err != nil {
		return 0, 0, fmt.Errorf("commit: %w", err)
	}
	return uint64(len(ws)), dropped, nil
}

// fill writes block id's bytes into b: 8-byte words that mix the id with
// the word's index, so a block moved, truncated or mixed with another
// fails the check.
func fill(b []byte, id uint64) {
	x := (id + 1) * 0x9E3779B97F4A7C15
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], x^uint64(i))
	}
	for ; i < len(b); i++ {
		b[i] = byte(x >> (8 * (i % 8)))
	}
}
