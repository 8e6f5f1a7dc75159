package metrics

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// PoolPart is one NUMA part of the pool: its node (-1: none) and bytes.
type PoolPart struct {
	Node       int
	Size, Used uint64
}

// poolParts exports each part's size and use, read from the pool at each
// scrape (no cost on the allocation path):
// pegaflow_pool_part_size_bytes and pegaflow_pool_part_used_bytes, labelled
// by part index and NUMA node. A pool split over nodes should show its
// parts used about evenly; one part filling first means fetches read across
// the socket link.
type poolParts struct {
	f          atomic.Pointer[func() []PoolPart]
	size, used *prometheus.Desc
}

func newPoolParts() *poolParts {
	labels := []string{"part", "node"}
	return &poolParts{
		size: prometheus.NewDesc("pegaflow_pool_part_size_bytes", "Size of each NUMA part of the pool.", labels, nil),
		used: prometheus.NewDesc("pegaflow_pool_part_used_bytes", "Bytes allocated in each NUMA part of the pool.", labels, nil),
	}
}

func (p *poolParts) Describe(ch chan<- *prometheus.Desc) {
	ch <- p.size
	ch <- p.used
}

func (p *poolParts) Collect(ch chan<- prometheus.Metric) {
	f := p.f.Load()
	if f == nil {
		return
	}
	for i, pt := range (*f)() {
		part, node := strconv.Itoa(i), strconv.Itoa(pt.Node)
		ch <- prometheus.MustNewConstMetric(p.size, prometheus.GaugeValue, float64(pt.Size), part, node)
		ch <- prometheus.MustNewConstMetric(p.used, prometheus.GaugeValue, float64(pt.Used), part, node)
	}
}

// SetPoolParts installs the function read at each scrape for the pool's
// parts (the daemon's pool).
func (m *Metrics) SetPoolParts(f func() []PoolPart) { m.poolParts.f.Store(&f) }
