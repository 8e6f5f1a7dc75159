package metrics

import "github.com/prometheus/client_golang/prometheus"

// Quota are the namespace quota metrics (--namespace-quota,
// internal/store's quota.go). The namespace label is a quota's configured
// namespace or prefix, never a namespace seen at run time, so the label
// set is bounded by the configuration; a quota dropped by a reload loses
// its series (Forget).
type Quota struct {
	Bytes     *prometheus.GaugeVec   // pegaflow_namespace_quota_bytes
	Used      *prometheus.GaugeVec   // pegaflow_namespace_used_bytes
	Evictions *prometheus.CounterVec // pegaflow_namespace_quota_evictions_total
	Refusals  *prometheus.CounterVec // pegaflow_namespace_quota_refusals_total
}

func newQuota(reg prometheus.Registerer) *Quota {
	lbl := []string{"namespace"}
	q := &Quota{
		Bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pegaflow_namespace_quota_bytes",
			Help: "The most bytes of indexed blocks a namespace (or namespace prefix) may hold (--namespace-quota).",
		}, lbl),
		Used: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pegaflow_namespace_used_bytes",
			Help: "Bytes of indexed blocks held by the namespaces a quota covers.",
		}, lbl),
		Evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_namespace_quota_evictions_total",
			Help: "Blocks a namespace at its quota evicted of its own to make room.",
		}, lbl),
		Refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_namespace_quota_refusals_total",
			Help: "Allocations refused because the namespace is at its quota and its own blocks cannot make room (ResourceExhausted).",
		}, lbl),
	}
	reg.MustRegister(q.Bytes, q.Used, q.Evictions, q.Refusals)
	return q
}

// Forget drops the series of the quota labelled ns.
func (q *Quota) Forget(ns string) {
	q.Bytes.DeleteLabelValues(ns)
	q.Used.DeleteLabelValues(ns)
	q.Evictions.DeleteLabelValues(ns)
	q.Refusals.DeleteLabelValues(ns)
}
