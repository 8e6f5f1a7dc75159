package metrics

import "github.com/prometheus/client_golang/prometheus"

// Reasons used as the reason label of KVEvents.Dropped.
const (
	// KVDropQueueFull: the publisher's queue was full when the store
	// handed it changes (the publisher goroutine fell behind).
	KVDropQueueFull = "queue_full"
	// KVDropSubscriberSlow: one subscriber's queue was full (it reads
	// slower than pegad publishes); the others still got the message.
	KVDropSubscriberSlow = "subscriber_slow"
)

// KVEvents are the metrics of the KV-events publisher
// (--kv-events-endpoint, docs/operations.md), registered whether it is
// on or not. Counts are of block changes (one per block stored, evicted
// or deleted), not of messages.
type KVEvents struct {
	Published   *prometheus.CounterVec // kind: stored, evicted, deleted
	Dropped     *prometheus.CounterVec // reason
	Subscribers prometheus.Gauge
	Replays     prometheus.Counter
}

// NewKVEvents creates and registers the KV-events metrics on reg.
func NewKVEvents(reg prometheus.Registerer) *KVEvents {
	m := &KVEvents{
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_kv_events_published_total", Help: "Block changes published as KV events, by kind (stored, evicted, deleted).",
		}, []string{"kind"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_kv_events_dropped_total", Help: "Block changes not delivered as KV events, by reason (queue_full: the publisher fell behind; subscriber_slow: one subscriber did).",
		}, []string{"reason"}),
		Subscribers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_kv_events_subscribers", Help: "Connected KV-event subscribers.",
		}),
		Replays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_kv_events_replays_total", Help: "Replay requests served on --kv-events-replay-endpoint.",
		}),
	}
	reg.MustRegister(m.Published, m.Dropped, m.Subscribers, m.Replays)
	for _, k := range []string{"stored", "evicted", "deleted"} {
		m.Published.WithLabelValues(k)
	}
	for _, r := range []string{KVDropQueueFull, KVDropSubscriberSlow} {
		m.Dropped.WithLabelValues(r)
	}
	return m
}

// NewKVEventsForTest returns KV-events metrics on a private registry.
func NewKVEventsForTest() *KVEvents { return NewKVEvents(prometheus.NewRegistry()) }
