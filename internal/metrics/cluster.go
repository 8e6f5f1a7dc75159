package metrics

import "github.com/prometheus/client_golang/prometheus"

// Lookup outcomes used as the outcome label of Cluster.Lookups.
const (
	LookupFound   = "found"     // every hash has a live holder
	LookupPartial = "partial"   // some hashes have one
	LookupNone    = "not_found" // none has
	LookupError   = "error"     // the index did not answer
)

// Publish operations used as the op label of Cluster.Published.
const (
	PublishAnnounce = "announce"
	PublishWithdraw = "withdraw"
)

// Cluster are the metrics of the cluster index (docs/cluster.md),
// registered only when --cluster-redis is set.
type Cluster struct {
	PublishLag    prometheus.Histogram
	PublishErrors prometheus.Counter
	Published     *prometheus.CounterVec // op
	Resyncs       prometheus.Counter
	Lookups       *prometheus.CounterVec // outcome
	Nodes         prometheus.Gauge
}

// NewCluster creates and registers the cluster-index metrics on reg.
func NewCluster(reg prometheus.Registerer) *Cluster {
	c := &Cluster{
		PublishLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "pegaflow_cluster_index_publish_lag_seconds", Help: "Time from a block change on this node to its publication in the cluster index.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		PublishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_cluster_index_publish_errors_total", Help: "Failed writes to the cluster index (registration, publish, resync).",
		}),
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_cluster_index_published_total", Help: "Block entries written to the cluster index, by op.",
		}, []string{"op"}),
		Resyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_cluster_index_resyncs_total", Help: "Full republications of this node's blocks (start, Redis lost the node, after errors).",
		}),
		Lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_cluster_index_lookups_total", Help: "Cluster index lookups, by outcome.",
		}, []string{"outcome"}),
		Nodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_cluster_nodes", Help: "Live nodes in the cluster index, as of this node's last heartbeat (or nodes list).",
		}),
	}
	reg.MustRegister(c.PublishLag, c.PublishErrors, c.Published, c.Resyncs, c.Lookups, c.Nodes)
	for _, op := range []string{PublishAnnounce, PublishWithdraw} {
		c.Published.WithLabelValues(op)
	}
	for _, o := range []string{LookupFound, LookupPartial, LookupNone, LookupError} {
		c.Lookups.WithLabelValues(o)
	}
	return c
}
