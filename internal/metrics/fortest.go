package metrics

import "github.com/prometheus/client_golang/prometheus"

// NewForTest is metrics on a private registry. It is not a default:
// every constructor takes its metrics from the daemon's registry, and
// tests use metricstest.New. Its one caller left is internal/conn's
// default in conn.go, which is becoming a required option in its own
// change; delete this file with that default. TestNoProductionNewForTest
// keeps other production callers out.
func NewForTest() *Metrics { return New(prometheus.NewRegistry(), false) }
