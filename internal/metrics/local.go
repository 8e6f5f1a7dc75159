package metrics

import "github.com/prometheus/client_golang/prometheus"

// LocalLeases are the metrics of the local data socket's leases
// (internal/localdata): how many are live, and how many ended other than by
// their client's commit, abort or release.
type LocalLeases struct {
	Live  prometheus.GaugeFunc
	Ended *prometheus.CounterVec // reason: disconnected, expired, shutdown, spare_expired
}

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
	}
	for _, r := range LocalLeaseEndReasons {
		m.Ended.WithLabelValues(r) // 0 from start, like every known series
	}
	reg.MustRegister(m.Live, m.Ended)
	return m
}
