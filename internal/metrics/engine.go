package metrics

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultNamespaceLabels is how many namespaces get their own label value
// on the engine metrics; later ones share NamespaceOther.
const DefaultNamespaceLabels = 32

// NamespaceOther is the namespace label of every namespace past the first
// DefaultNamespaceLabels.
const NamespaceOther = "other"

// rankSep starts a tensor-parallel rank's suffix ("<base>@tp<r>",
// docs/local-protocol.md "Tensor parallel"): the label is the base, so
// the ranks of one model share one label.
const rankSep = "@tp"

// Engine are the metrics of what inference engines ask of the data socket
// (internal/localdata): prefix lookups, their hit and missed blocks, and
// the bytes engines load (leases, adopted pins) and save (new blocks), per
// namespace. The namespace label set is bounded: the first
// DefaultNamespaceLabels namespaces seen get their own value, the rest
// share "other".
type Engine struct {
	Lookups    *prometheus.CounterVec
	HitBlocks  *prometheus.CounterVec
	MissBlocks *prometheus.CounterVec
	LoadBytes  *prometheus.CounterVec
	SaveBytes  *prometheus.CounterVec

	max  int
	mu   sync.Mutex          // guards seen
	seen map[string]struct{} // namespaces with a label of their own

	// Totals over every namespace, for pegactl stats.
	lookups, hits, misses atomic.Uint64
}

// NewEngine creates and registers the engine metrics on reg.
func NewEngine(reg prometheus.Registerer) *Engine {
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"namespace"})
	}
	m := &Engine{
		Lookups:    vec("pegaflow_lookups_total", "Prefix lookups (LOOKUP, LOOKUP_PIN, LOOKUP_CLUSTER) on the data socket, by namespace (rank suffix dropped; past 32 namespaces: other)."),
		HitBlocks:  vec("pegaflow_lookup_hit_blocks_total", "Blocks of looked-up chains found stored on this node (the prefix length), by namespace."),
		MissBlocks: vec("pegaflow_lookup_miss_blocks_total", "Blocks of looked-up chains past the stored prefix, by namespace."),
		LoadBytes:  vec("pegaflow_engine_load_bytes_total", "Bytes of blocks local clients took read leases on (LEASE, ADOPT), by namespace."),
		SaveBytes:  vec("pegaflow_engine_save_bytes_total", "Bytes of new blocks local clients stored (COMMIT, PUT), by namespace."),
		max:        DefaultNamespaceLabels,
		seen:       make(map[string]struct{}),
	}
	for _, v := range []*prometheus.CounterVec{m.Lookups, m.HitBlocks, m.MissBlocks, m.LoadBytes, m.SaveBytes} {
		v.WithLabelValues(NamespaceOther) // the bucket exists from the first scrape
	}
	reg.MustRegister(m.Lookups, m.HitBlocks, m.MissBlocks, m.LoadBytes, m.SaveBytes)
	return m
}

// Label is the namespace label of ns: its base (rank suffix dropped), its
// own value while fewer than the limit are in use, else "other".
func (m *Engine) Label(ns string) string {
	if i := strings.LastIndex(ns, rankSep); i > 0 {
		ns = ns[:i]
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.seen[ns]; ok {
		return ns
	}
	if len(m.seen) >= m.max || ns == NamespaceOther {
		return NamespaceOther
	}
	m.seen[ns] = struct{}{}
	return ns
}

// Lookup counts one lookup of a chain of n hashes of which hit were found.
func (m *Engine) Lookup(ns string, n, hit int) {
	l := m.Label(ns)
	m.Lookups.WithLabelValues(l).Inc()
	m.HitBlocks.WithLabelValues(l).Add(float64(hit))
	m.MissBlocks.WithLabelValues(l).Add(float64(n - hit))
	m.lookups.Add(1)
	m.hits.Add(uint64(hit))
	m.misses.Add(uint64(n - hit))
}

// Load counts bytes leased to a local client; Save bytes it stored.
func (m *Engine) Load(ns string, bytes uint64) {
	m.LoadBytes.WithLabelValues(m.Label(ns)).Add(float64(bytes))
}
func (m *Engine) Save(ns string, bytes uint64) {
	m.SaveBytes.WithLabelValues(m.Label(ns)).Add(float64(bytes))
}

// Totals are the lookup counters summed over every namespace.
func (m *Engine) Totals() (lookups, hits, misses uint64) {
	return m.lookups.Load(), m.hits.Load(), m.misses.Load()
}
