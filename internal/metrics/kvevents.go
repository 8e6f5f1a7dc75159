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

// Reasons used as the reason label of KVEvents.Refused: connections to
// the KV-events sockets ended by pegad.
const (
	// KVRefusedHandshake: the greeting or READY was malformed, of another
	// mechanism or version, or of an incompatible socket type.
	KVRefusedHandshake = "handshake"
	// KVRefusedTimeout: no complete handshake within its deadline.
	KVRefusedTimeout = "handshake_timeout"
	// KVRefusedFrame: a malformed or oversized frame after the handshake.
	KVRefusedFrame = "frame"
	// KVRefusedSourceLimit, KVRefusedTotalLimit: evicted while still in
	// its handshake, to make room for a newer connection from the same
	// source, or from anywhere.
	KVRefusedSourceLimit = "source_limit"
	KVRefusedTotalLimit  = "total_limit"
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
	Refused     *prometheus.CounterVec // reason
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
	m.Refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_kv_events_connections_refused_total", Help: "Connections to the KV-events sockets that pegad ended, by reason (handshake, handshake_timeout, frame, source_limit, total_limit).",
	}, []string{"reason"})
	reg.MustRegister(m.Published, m.Dropped, m.Subscribers, m.Replays, m.Refused)
	for _, r := range []string{KVRefusedHandshake, KVRefusedTimeout, KVRefusedFrame, KVRefusedSourceLimit, KVRefusedTotalLimit} {
		m.Refused.WithLabelValues(r)
	}
	for _, k := range []string{"stored", "evicted", "deleted"} {
		m.Published.WithLabelValues(k)
	}
	for _, r := range []string{KVDropQueueFull, KVDropSubscriberSlow} {
		m.Dropped.WithLabelValues(r)
	}
	return m
}
