package localdata

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pegaflow/pegad/api/localwire"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// NUMA placement (protocol version 4): HELLO tells a client the pool's
// parts, and ALLOC_ON places each block on the part of the node it names
// where that part has room, else anywhere (the store's AllocExtentOn:
// falling back beats evicting blocks to keep a node's share). A fallback
// is counted (pegaflow_pool_numa_fallback_total) and logged at most once
// per fallbackLogEvery.

// fallbackLogEvery spaces the warnings about NUMA fallbacks: a client whose
// node's part is full falls back on every block.
const fallbackLogEvery = time.Minute

// fallbackLog rate-limits the fallback warning. Shared by every connection.
type fallbackLog struct {
	mu     sync.Mutex // guards last, missed
	last   time.Time  // when the last warning was logged
	missed int        // fallbacks since, not logged
}

// parts is the HELLO reply's view of the pool: its NUMA parts in address
// order, back to back from offset 0.
func (s *Server) parts() []localwire.Part {
	st := s.store.Pool().PartStats()
	out := make([]localwire.Part, len(st))
	var off uint64
	for i, p := range st {
		out[i] = localwire.Part{Node: int32(p.Node), Off: off, Len: p.Size}
		off += p.Size
	}
	return out
}

// checkNode refuses a node id no machine has (a client's bug, not a node
// the pool lacks: that one falls back).
func checkNode(node int32) error {
	if node < localwire.NoNode || node > localwire.MaxNode {
		return fmt.Errorf("%w: NUMA node %d (want %d for none, or 0..%d)", store.ErrInvalid, node, localwire.NoNode, localwire.MaxNode)
	}
	return nil
}

// placed accounts for an extent asked for on node (NoNode: anywhere) that
// landed on got.
func (s *Server) placed(node, got int) {
	if node < 0 || got == node {
		return
	}
	reason := metrics.NUMAFallbackFull
	if !slices.Contains(s.nodes, node) {
		reason = metrics.NUMAFallbackAbsent
	}
	if s.met != nil {
		s.met.NUMAFallback.WithLabelValues(reason).Inc()
	}
	f := &s.fallback
	f.mu.Lock()
	now := time.Now()
	if !f.last.IsZero() && now.Sub(f.last) < fallbackLogEvery {
		f.missed++
		f.mu.Unlock()
		return
	}
	missed := f.missed
	f.last, f.missed = now, 0
	f.mu.Unlock()
	s.log.Warn().Int("node", node).Int("placed_on", got).Str("reason", reason).Ints("pool_nodes", s.nodes).
		Int("not_logged", missed).Msg("Local allocation placed off its NUMA node; further ones are only counted for a minute")
}
