// Package metricstest gives tests metrics on a private registry, so each
// test (and each node of a multi-node test) counts alone. Tests only: no
// production package imports it (cmd/pegad's TestProductionDepsLackTestHelpers),
// and every production constructor takes its metrics from the daemon,
// which registers them on the one registry /metrics serves.
package metricstest

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pegaflow/pegad/internal/metrics"
)

// New is the daemon's metrics (metrics.New) on a private registry,
// without the Go and process collectors.
func New() *metrics.Metrics { return metrics.New(prometheus.NewRegistry(), false) }

// NewTier is the SSD tier's metrics on a private registry.
func NewTier() *metrics.Tier { return metrics.NewTier(prometheus.NewRegistry()) }

// NewCluster is the cluster index's metrics on a private registry.
func NewCluster() *metrics.Cluster { return metrics.NewCluster(prometheus.NewRegistry()) }

// NewPD is the P/D handoff metrics on a private registry.
func NewPD() *metrics.PD { return metrics.NewPD(prometheus.NewRegistry()) }

// NewKVEvents is the KV-events publisher's metrics on a private registry.
func NewKVEvents() *metrics.KVEvents { return metrics.NewKVEvents(prometheus.NewRegistry()) }
