package reliability

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	grpcstatus "google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/testutil"
)

// block is a block whose bytes derive from (seed, size): the validator
// regenerates them to compare what any daemon serves, byte for byte.
type block struct {
	ns   string
	hash []byte
	size int
	kv   bool
	seed uint64
}

func (b block) key() string { return b.ns + "/" + hex.EncodeToString(b.hash) }

// content is the block's bytes.
func (b block) content() []byte {
	r := rand.New(rand.NewPCG(b.seed, uint64(b.size)))
	out := make([]byte, b.size+7)
	for i := 0; i < b.size; i += 8 {
		binary.LittleEndian.PutUint64(out[i:], r.Uint64())
	}
	return out[:b.size]
}

// registry knows every block a scenario made, by namespace and hash.
type registry struct {
	mu     sync.Mutex // guards blocks, next
	blocks map[string]block
	next   uint64
	seed   uint64
}

func newRegistry(seed uint64) *registry {
	return &registry{blocks: map[string]block{}, seed: seed}
}

// make creates a new block of size bytes in namespace ns.
func (r *registry) make(ns string, size int, kv bool) block {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	seed := r.seed*1_000_003 + r.next
	h := sha256.Sum256(fmt.Appendf(nil, "reliability/%d/%d", r.seed, r.next))
	b := block{ns: ns, hash: h[:], size: size, kv: kv, seed: seed}
	r.blocks[b.key()] = b
	return b
}

func (r *registry) lookup(ns string, hash []byte) (block, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.blocks[ns+"/"+hex.EncodeToString(hash)]
	return b, ok
}

// op is one client operation of the recorded history.
type op struct {
	kind       string // put, prefetch, get
	node, peer string
	blocks     int
	start, end time.Time
	err        error
	statuses   map[pegadv1.PrefetchBlockStatus]int
}

// history records every client operation of a scenario, and the bytes the
// traffic compared while it ran.
type history struct {
	mu       sync.Mutex // guards ops, verified, wrong, problems, partial
	ops      []op
	verified int64
	wrong    int
	problems []string
	// partial: per node, the bytes asked for by prefetches that failed
	// yet kept some blocks (read and confirmed under a live lock before
	// the cut). Their staging extents are shared with the blocks not
	// kept, so that much pool stays allocated until the kept blocks go:
	// bounded, not a leak (validate's pool check allows it).
	partial map[string]float64
}

// partialBytes is what partial prefetches on node may hold beyond their
// kept blocks.
func (h *history) partialBytes(node string) float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.partial[node]
}

func (h *history) record(o op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, o)
}

// check compares got with b's content.
func (h *history) check(where string, b block, got []byte) bool {
	want := b.content()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.verified += int64(len(want))
	if !bytes.Equal(got, want) {
		h.wrong++
		h.problems = append(h.problems, fmt.Sprintf("%s: block %s: %d bytes differ from the %d put", where, b.key()[:24], len(got), len(want)))
		return false
	}
	return true
}

// checkSum compares the SHA-256 of bytes a client read (zero-copy, in
// another process) with b's content.
func (h *history) checkSum(where string, b block, sum []byte) bool {
	want := sha256.Sum256(b.content())
	h.mu.Lock()
	defer h.mu.Unlock()
	h.verified += int64(b.size)
	if !bytes.Equal(sum, want[:]) {
		h.wrong++
		h.problems = append(h.problems, fmt.Sprintf("%s: block %s: leased bytes differ from the %d put", where, b.key()[:24], b.size))
		return false
	}
	return true
}

func (h *history) problem(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.problems = append(h.problems, fmt.Sprintf(format, args...))
}

// put stores blocks on n through its local API.
func (h *history) put(ctx context.Context, n *node, blocks ...block) error {
	o := op{kind: "put", node: n.spec.name, blocks: len(blocks), start: time.Now()}
	defer func() { o.end = time.Now(); h.record(o) }()
	for _, b := range blocks {
		if _, err := testutil.PutBlock(ctx, n.local, b.ns, b.hash, b.content(), b.kv); err != nil {
			o.err = fmt.Errorf("%s: put %s: %w", n.spec.name, b.key()[:24], err)
			return o.err
		}
	}
	return nil
}

// fetchResult is a prefetch's outcome as the traffic saw it.
type fetchResult struct {
	resp    *pegadv1.PrefetchResponse
	err     error
	fetched int
	took    time.Duration
}

// prefetch runs n.Prefetch(peer, blocks), then checks the history's
// promises at once: every block reported fetched is served byte-identical
// by n; every block reported failed or discarded is not indexed on n. A
// call that fails carries its per-block outcomes in the error's
// PrefetchResponse detail (a fetch of several lock windows can index the
// windows before the one that failed); without that detail every block
// counts as failed. blocks must be fresh (no other operation fetches them
// concurrently).
func (h *history) prefetch(ctx context.Context, n, peer *node, timeout time.Duration, blocks ...block) fetchResult {
	o := op{kind: "prefetch", node: n.spec.name, peer: peer.spec.name, blocks: len(blocks), start: time.Now(),
		statuses: map[pegadv1.PrefetchBlockStatus]int{}}
	hashes := make([][]byte, len(blocks))
	for i, b := range blocks {
		hashes[i] = b.hash
	}
	ns := ""
	if len(blocks) > 0 {
		ns = blocks[0].ns
	}
	resp, err := n.prefetch(ctx, peer, ns, hashes, timeout)
	o.end = time.Now()
	o.err = err
	res := fetchResult{resp: resp, err: err, took: o.end.Sub(o.start)}
	status := make([]pegadv1.PrefetchBlockStatus, len(blocks))
	outcomes := resp
	if err != nil {
		outcomes = nil
		if st, ok := grpcstatus.FromError(err); ok {
			for _, d := range st.Details() {
				if pr, ok := d.(*pegadv1.PrefetchResponse); ok {
					outcomes = pr
				}
			}
		}
	}
	if outcomes != nil {
		for i, r := range outcomes.GetBlocks() {
			if i < len(status) {
				status[i] = r.GetStatus()
			}
			o.statuses[r.GetStatus()]++
		}
	}
	h.record(o)
	if err != nil && o.statuses[pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED] > 0 {
		var asked float64
		for _, b := range blocks {
			asked += float64(b.size)
		}
		h.mu.Lock()
		if h.partial == nil {
			h.partial = map[string]float64{}
		}
		h.partial[n.spec.name] += asked
		h.mu.Unlock()
	}
	if !n.serving() {
		return res // a killed or stopping requester serves nothing to check
	}
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, b := range blocks {
		got, gerr := testutil.GetBlock(cctx, n.local, b.ns, b.hash)
		if gerr != nil && !n.serving() {
			return res // signalled while we read back
		}
		switch {
		case status[i] == pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED ||
			status[i] == pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_ALREADY_LOCAL:
			if gerr != nil {
				h.problem("%s: block %s reported fetched from %s but not served: %v", n.spec.name, b.key()[:24], peer.spec.name, gerr)
				continue
			}
			if h.check("prefetched on "+n.spec.name, b, got) && status[i] == pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED {
				res.fetched++
			}
		case gerr == nil:
			// Not fetched, yet indexed: whatever it holds must still be
			// right, but a failed fetch must index nothing.
			h.check("failed-prefetch block on "+n.spec.name, b, got)
			h.problem("%s: block %s indexed although its prefetch from %s ended %v (err %v)", n.spec.name, b.key()[:24], peer.spec.name, status[i], err)
		}
	}
	return res
}
