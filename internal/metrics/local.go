package metrics

import "github.com/prometheus/client_golang/prometheus"

// LocalLeases are the metrics of the local data socket's leases
// (internal/localdata): how many are live, how many ended other than by
// their client's commit, abort or release, and how many write leases asked
// for a NUMA node's part of the pool and got room elsewhere.
type LocalLeases struct {
	Live  prometheus.GaugeFunc
	Ended *prometheus.CounterVec // reason: disconnected, expired, shutdown, spare_expired
	// NUMAFallback: pegaflow_pool_numa_fallback_total{reason}, reason
	// NUMAFallbackFull (the node's part had no room) or NUMAFallbackAbsent
	// (the pool has no part on that node).
	NUMAFallback *prometheus.CounterVec
}

// The pegaflow_pool_numa_fallback_total reasons.
const (
	NUMAFallbackFull   = "full"
	NUMAFallbackAbsent = "absent"
)

// NewLocalLeases creates and registers the local lease metrics on reg;
// live reports the number of live leases when scraped.
func NewLocalLeases(reg prometheus.Registerer, live func() float64) *LocalLeases {
	m := &LocalLeases{
		Live: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pegaflow_local_leases", Help: "Live leases of local clients on the data socket (write allocations and read pins).",
		}, live),
		Ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_local_lease_ends_total", Help: "Local leases ended without their client finishing them, by reason (disconnected, expired, shutdown, spare_expired).",
		}, []string{"reason"}),
		NUMAFallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_pool_numa_fallback_total", Help: "Local allocations that asked for a NUMA node's part of the pool and were placed on another part, by reason (full: that part had no room; absent: the pool has no part on that node).",
		}, []string{"reason"}),
	}
	for _, r := range LocalLeaseEndReasons {
		m.Ended.WithLabelValues(r) // 0 from start, like every known series
	}
	m.NUMAFallback.WithLabelValues(NUMAFallbackFull)
	m.NUMAFallback.WithLabelValues(NUMAFallbackAbsent)
	reg.MustRegister(m.Live, m.Ended, m.NUMAFallback)
	return m
}
