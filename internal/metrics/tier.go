package metrics

import "github.com/prometheus/client_golang/prometheus"

// Tier label values (the tier label of Tier.Hits).
const (
	TierDRAM = "dram"
	TierSSD  = "ssd"
)

// Reasons of Tier.Drops: why a block eviction offered to the SSD tier was
// not written (it is gone from this node; a later lookup misses).
const (
	SSDDropQueueFull  = "queue_full"  // the write queue was full: the SSD is slower than evictions
	SSDDropTooLarge   = "too_large"   // the block is larger than one segment
	SSDDropWriteError = "write_error" // the write failed (I/O error, disk full)
	SSDDropClosed     = "closed"      // the tier was closing
)

// Tier are the metrics of the SSD tier (--ssd-path, docs/tiering.md),
// registered whether it is on or not. The DRAM tier's own blocks and
// bytes are pegaflow_blocks and pegaflow_block_bytes.
type Tier struct {
	Hits             *prometheus.CounterVec // tier: dram, ssd (blocks found by a lookup)
	Promotions       prometheus.Counter
	Blocks           prometheus.Gauge
	Bytes            prometheus.Gauge // block bytes held on SSD (payload, not records)
	Capacity         prometheus.Gauge
	QueueDepth       prometheus.Gauge // blocks waiting to be written
	Written          prometheus.Counter
	WrittenBytes     prometheus.Counter
	Drops            *prometheus.CounterVec // reason
	ChecksumFailures prometheus.Counter
	ReadErrors       prometheus.Counter
	AgedOut          prometheus.Counter     // blocks dropped when their segment was reclaimed
	Recovered        prometheus.Counter     // blocks found again at start
	Tombstones       *prometheus.CounterVec // result: written, lost (deletes recorded in the log)
}

// Results of Tier.Tombstones.
const (
	TombstoneWritten = "written" // the delete is in the log: a restart does not find the block
	TombstoneLost    = "lost"    // queue full, write failed or closing: a restart may find the block again
)

// NewTier creates and registers the tier metrics on reg.
func NewTier(reg prometheus.Registerer) *Tier {
	m := &Tier{
		Hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_tier_hits_total", Help: "Blocks a lookup found, by the tier they were in (dram, ssd: read back into the pool). Counted only with an SSD tier.",
		}, []string{"tier"}),
		Promotions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_ssd_promotions_total", Help: "Blocks read back from the SSD tier into the pool.",
		}),
		Blocks: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_ssd_blocks", Help: "Blocks held on the SSD tier.",
		}),
		Bytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_ssd_bytes", Help: "Block bytes held on the SSD tier.",
		}),
		Capacity: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_ssd_capacity_bytes", Help: "Bytes of the SSD tier's logs (--ssd-size times the paths).",
		}),
		QueueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_ssd_write_queue_depth", Help: "Evicted blocks waiting to be written to the SSD tier.",
		}),
		Written: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_ssd_writes_total", Help: "Blocks written to the SSD tier.",
		}),
		WrittenBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_ssd_written_bytes_total", Help: "Bytes written to the SSD tier (records: headers, data, padding).",
		}),
		Drops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_ssd_drops_total", Help: "Evicted blocks not written to the SSD tier, by reason (queue_full, too_large, write_error, closed).",
		}, []string{"reason"}),
		ChecksumFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_ssd_checksum_failures_total", Help: "SSD blocks that failed their CRC32C when read back: dropped, never served.",
		}),
		ReadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_ssd_read_errors_total", Help: "SSD reads that failed with an I/O error: the block is dropped.",
		}),
		AgedOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_ssd_aged_out_total", Help: "SSD blocks dropped because the ring reclaimed their segment.",
		}),
		Recovered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_ssd_recovered_blocks_total", Help: "SSD blocks found again from the segments' headers at start.",
		}),
	}
	m.Tombstones = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_ssd_tombstones_total",
		Help: "Deletes of SSD blocks (delete, failed checksum or read) recorded in the log so that a restart does not find the block again, by result (written, lost).",
	}, []string{"result"})
	reg.MustRegister(m.Hits, m.Promotions, m.Blocks, m.Bytes, m.Capacity, m.QueueDepth, m.Written,
		m.WrittenBytes, m.Drops, m.ChecksumFailures, m.ReadErrors, m.AgedOut, m.Recovered, m.Tombstones)
	for _, r := range []string{TombstoneWritten, TombstoneLost} {
		m.Tombstones.WithLabelValues(r)
	}
	for _, t := range []string{TierDRAM, TierSSD} {
		m.Hits.WithLabelValues(t)
	}
	for _, r := range []string{SSDDropQueueFull, SSDDropTooLarge, SSDDropWriteError, SSDDropClosed} {
		m.Drops.WithLabelValues(r)
	}
	return m
}
