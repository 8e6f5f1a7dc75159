package metrics

import (
	"math"
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
//
// Beside the hit and miss blocks it counts the recomputed ones (puts of
// blocks the store had evicted, internal/store's recompute.go), and
// exports per namespace label the real prefix hit ratio and its ceiling,
// hit ÷ (hit + miss) and (hit + recomputed) ÷ (hit + miss), both over the
// daemon's life (pegaflow_prefix_hit_ratio, _ceiling).
type Engine struct {
	Lookups    *prometheus.CounterVec
	HitBlocks  *prometheus.CounterVec
	MissBlocks *prometheus.CounterVec
	LoadBytes  *prometheus.CounterVec
	SaveBytes  *prometheus.CounterVec
	// RecomputedBlocks: pegaflow_recomputed_blocks_total.
	RecomputedBlocks *prometheus.CounterVec

	max  int
	mu   sync.Mutex              // guards seen
	seen map[string]*labelCounts // namespace labels (their own and "other") and their counts

	// Totals over every namespace, for pegactl stats.
	lookups, hits, misses, recomputed atomic.Uint64
}

// labelCounts are one namespace label's block counts, for the ratios.
type labelCounts struct{ hits, misses, recomputed atomic.Uint64 }

var (
	hitRatioDesc = prometheus.NewDesc("pegaflow_prefix_hit_ratio",
		"Blocks of looked-up chains found stored ÷ all blocks looked up, since start, by namespace (as pegaflow_lookup_*).",
		[]string{"namespace"}, nil)
	ceilingDesc = prometheus.NewDesc("pegaflow_prefix_hit_ratio_ceiling",
		"(hit + recomputed blocks) ÷ looked-up blocks since start, by namespace: the hit ratio a pool that kept every evicted block would have had (capped at 1).",
		[]string{"namespace"}, nil)
)

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
		RecomputedBlocks: vec("pegaflow_recomputed_blocks_total",
			"Local puts of blocks this node held before and evicted (capacity misses: prefill done again because the pool was too small), by namespace."),
		max:  DefaultNamespaceLabels,
		seen: map[string]*labelCounts{NamespaceOther: {}},
	}
	for _, v := range []*prometheus.CounterVec{m.Lookups, m.HitBlocks, m.MissBlocks, m.LoadBytes, m.SaveBytes, m.RecomputedBlocks} {
		v.WithLabelValues(NamespaceOther) // the bucket exists from the first scrape
	}
	reg.MustRegister(m.Lookups, m.HitBlocks, m.MissBlocks, m.LoadBytes, m.SaveBytes, m.RecomputedBlocks, ratios{m})
	return m
}

// Label is the namespace label of ns: its base (rank suffix dropped), its
// own value while fewer than the limit are in use, else "other".
func (m *Engine) Label(ns string) string {
	l, _ := m.label(ns)
	return l
}

// label is Label with the label's counts.
func (m *Engine) label(ns string) (string, *labelCounts) {
	if i := strings.LastIndex(ns, rankSep); i > 0 {
		ns = ns[:i]
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.seen[ns]; ok {
		return ns, c
	}
	if len(m.seen) > m.max || ns == NamespaceOther { // seen holds "other" too
		return NamespaceOther, m.seen[NamespaceOther]
	}
	c := &labelCounts{}
	m.seen[ns] = c
	// From a label's first use on, its recomputed series exists (at
	// 0), so that hit + recomputed is defined in PromQL before the first
	// recomputation.
	m.RecomputedBlocks.WithLabelValues(ns)
	return ns, c
}

// Lookup counts one lookup of a chain of n hashes of which hit were found.
func (m *Engine) Lookup(ns string, n, hit int) {
	l, c := m.label(ns)
	m.Lookups.WithLabelValues(l).Inc()
	m.HitBlocks.WithLabelValues(l).Add(float64(hit))
	m.MissBlocks.WithLabelValues(l).Add(float64(n - hit))
	c.hits.Add(uint64(hit))
	c.misses.Add(uint64(n - hit))
	m.lookups.Add(1)
	m.hits.Add(uint64(hit))
	m.misses.Add(uint64(n - hit))
}

// Recomputed counts one put of a block of ns the store had evicted (the
// store's OnRecomputed hook: it runs under the store's lock and takes
// only m.mu, a leaf, and the counter's own).
func (m *Engine) Recomputed(ns string) {
	l, c := m.label(ns)
	m.RecomputedBlocks.WithLabelValues(l).Inc()
	c.recomputed.Add(1)
	m.recomputed.Add(1)
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

// RecomputedTotal is the recomputed blocks summed over every namespace.
func (m *Engine) RecomputedTotal() uint64 { return m.recomputed.Load() }

// Ceiling is the hit-ratio ceiling of hit, miss and recomputed blocks:
// (hit + recomputed) ÷ (hit + miss), capped at 1 (a put no lookup asked
// for first counts as recomputed but not as a miss); ok is false when
// nothing was looked up.
func Ceiling(hits, misses, recomputed uint64) (ratio float64, ok bool) {
	if hits+misses == 0 {
		return 0, false
	}
	return min(float64(hits+recomputed)/float64(hits+misses), 1), true
}

// ratios collects pegaflow_prefix_hit_ratio and _ceiling per namespace
// label from the labels' counts at scrape time; NaN for a label nothing
// was looked up in yet ("other" from the first scrape, as the counters).
type ratios struct{ m *Engine }

func (r ratios) Describe(ch chan<- *prometheus.Desc) {
	ch <- hitRatioDesc
	ch <- ceilingDesc
}

func (r ratios) Collect(ch chan<- prometheus.Metric) {
	type row struct {
		l string
		c *labelCounts
	}
	r.m.mu.Lock() // not held while sending: a lookup's label() would wait on the scrape
	rows := make([]row, 0, len(r.m.seen))
	for l, c := range r.m.seen {
		rows = append(rows, row{l, c})
	}
	r.m.mu.Unlock()
	for _, w := range rows {
		l, c := w.l, w.c
		h, mi := c.hits.Load(), c.misses.Load()
		ratio, ceil := math.NaN(), math.NaN() // 0 ÷ 0: nothing looked up yet
		if cl, ok := Ceiling(h, mi, c.recomputed.Load()); ok {
			ratio, ceil = float64(h)/float64(h+mi), cl
		}
		ch <- prometheus.MustNewConstMetric(hitRatioDesc, prometheus.GaugeValue, ratio, l)
		ch <- prometheus.MustNewConstMetric(ceilingDesc, prometheus.GaugeValue, ceil, l)
	}
}
