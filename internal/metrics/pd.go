package metrics

import "github.com/prometheus/client_golang/prometheus"

// Handoff results used as the result label of PD.Handoffs.
const (
	HandoffCompleted = "completed" // the consumer pulled every block, or ended it when done
	HandoffExpired   = "expired"   // its ttl passed first
	HandoffReleased  = "released"  // ended early by its producer (or at shutdown)
)

// Reasons of PD.PeerRefusals.
const (
	RefusedNotInIndex = "not_in_index" // the cluster index lists no live node at that address
	RefusedNoCheck    = "no_check"     // no cluster index and no --peer-allow to check it against
	RefusedIndexDown  = "index_unavailable"
)

// PD are the metrics of prefill/decode handoffs (docs/engines.md "P/D"):
// the producer's handoffs and the consumer's pulls.
type PD struct {
	Handoffs     *prometheus.CounterVec // result
	Pending      prometheus.Gauge
	HandoffAge   prometheus.Histogram // handoff to its last block pulled
	PullBytes    prometheus.Counter   // consumer side: bytes fetched by prefetches naming a handoff
	PeerRefusals *prometheus.CounterVec
}

// NewPD creates and registers the P/D metrics on reg.
func NewPD(reg prometheus.Registerer) *PD {
	p := &PD{
		Handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_pd_handoffs_total", Help: "Prefill/decode handoffs ended on this node (producer), by result: completed (pulled in full, or ended by its consumer once done), expired (ttl), released.",
		}, []string{"result"}),
		Pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_pd_handoffs_pending", Help: "Handoffs pinning blocks on this node now, waiting for their consumer's pull.",
		}),
		HandoffAge: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "pegaflow_pd_handoff_age_seconds", Help: "Time from a handoff (the producer's finish) to the consumer's pull of its last block, for completed handoffs.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		PullBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_pd_pull_bytes_total", Help: "Bytes this node fetched (consumer) with prefetches that named a handoff.",
		}),
		PeerRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_pd_peer_refusals_total", Help: "Prefetches with known_peer_only refused because their peer is not a known node, by reason.",
		}, []string{"reason"}),
	}
	reg.MustRegister(p.Handoffs, p.Pending, p.HandoffAge, p.PullBytes, p.PeerRefusals)
	for _, r := range []string{HandoffCompleted, HandoffExpired, HandoffReleased} {
		p.Handoffs.WithLabelValues(r)
	}
	for _, r := range []string{RefusedNotInIndex, RefusedNoCheck, RefusedIndexDown} {
		p.PeerRefusals.WithLabelValues(r)
	}
	return p
}
