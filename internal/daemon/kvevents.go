package daemon

import (
	"context"
	"fmt"

	"github.com/pegaflow/pegad/internal/kvevents"
	"github.com/pegaflow/pegad/internal/metrics"
)

// bindKVEvents binds the KV-events sockets (--kv-events-endpoint) with
// the other ports, so a port in use fails start-up at once. Off: only the
// metrics, at 0.
func (d *Daemon) bindKVEvents() error {
	m := metrics.NewKVEvents(d.reg)
	if d.cfg.KVEventsEndpoint == "" {
		return nil
	}
	p, err := kvevents.New(kvevents.Options{
		Endpoint: d.cfg.KVEventsEndpoint, ReplayEndpoint: d.cfg.KVEventsReplayEndpoint,
		Topic: d.cfg.KVEventsTopic, NodeID: d.cfg.NodeID, Metrics: m,
		Log: d.log.With().Str("component", "kvevents").Logger(),
	})
	if err != nil {
		return fmt.Errorf("--%w", err)
	}
	d.kv = p
	return nil
}

// startKVEvents subscribes the publisher to the store and runs it until
// bg ends (Close). Changes made before Run starts wait in its queue.
func (d *Daemon) startKVEvents(bg context.Context) {
	if d.kv == nil {
		return
	}
	d.store.OnEvents(d.kv.Enqueue)
	if d.tier != nil {
		d.tier.OnEvents(d.kv.Enqueue) // the SSD copies, medium "ssd"
	}
	d.wg.Go(func() { d.kv.Run(bg) })
	d.log.Info().Str("endpoint", d.kv.Addr()).Str("replay", d.kv.ReplayAddr()).
		Str("topic", d.cfg.KVEventsTopic).Msg("KV events enabled")
}

// closeKVEvents unhooks the publisher after Run returned (or never ran).
func (d *Daemon) closeKVEvents() {
	if d.kv == nil {
		return
	}
	if d.store != nil {
		d.store.OnEvents(nil)
	}
	if d.tier != nil {
		d.tier.OnEvents(nil)
	}
	d.kv.Close()
}

// KVEventsAddr is the bound KV-events PUB address ("" when off).
func (d *Daemon) KVEventsAddr() string {
	if d.kv == nil {
		return ""
	}
	return d.kv.Addr()
}

// KVEventsReplayAddr is the bound replay address ("" when none).
func (d *Daemon) KVEventsReplayAddr() string {
	if d.kv == nil {
		return ""
	}
	return d.kv.ReplayAddr()
}
