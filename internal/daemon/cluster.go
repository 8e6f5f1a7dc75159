package daemon

import (
	"context"
	"fmt"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/clusterapi"
	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/index/redisindex"
	"github.com/pegaflow/pegad/internal/localdata"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/requester"
)

// cluster is the daemon's part in the cluster index (--cluster-redis):
// the index client and the publisher goroutine that keeps this node's
// record and blocks in it. Zero when standalone.
type cluster struct {
	idx *redisindex.Index // nil: standalone
	pub *index.Publisher
}

// openCluster connects the index client (lazily: Redis may be down) and
// subscribes the publisher to the store. Standalone: nothing.
func (d *Daemon) openCluster() error {
	// Registered standalone too (at 0): dashboards and alerts need not
	// know which nodes are clustered.
	m := metrics.NewCluster(d.reg)
	if d.cfg.ClusterRedis == "" {
		return nil
	}
	idx, err := redisindex.Open(redisindex.Options{
		URLs: d.cfg.ClusterRedis, NodeID: d.cfg.NodeID, Incarnation: d.incarnation,
		TTL: d.cfg.ClusterTTL, Metrics: m,
	})
	if err != nil {
		return fmt.Errorf("cluster index: %w", err)
	}
	d.cluster.idx = idx
	src := index.StoreSource{S: d.store}
	if d.tier != nil {
		src.Lower = d.tier // SSD-held blocks are announced with their medium
	}
	pub, err := index.NewPublisher(index.PublisherOptions{
		Index: idx, Source: src, TTL: d.cfg.ClusterTTL, Metrics: m,
		Log:  d.log.With().Str("component", "cluster").Logger(),
		Self: d.clusterSelf,
	})
	if err != nil {
		return fmt.Errorf("cluster index: %w", err) // d.cluster.idx is closed with the daemon
	}
	d.cluster.pub = pub
	d.store.OnChange(d.cluster.pub.Notify)
	if d.tier != nil {
		d.tier.OnChange(d.cluster.pub.Notify)
	}
	return nil
}

// clusterSelf is this node's membership record as of now.
func (d *Daemon) clusterSelf() index.Node {
	return index.Node{
		Addr: d.advertise, Transport: d.tr.name, PoolSize: d.pool.Size(),
		FreeBytes: d.pool.Size() - d.pool.Used(), Started: d.started,
	}
}

// openFetcher makes the prefetch engine the local API uses: a fetch
// without a peer asks the cluster index (refused when standalone), and a
// known_peer_only fetch checks its peer against the index's live nodes,
// or trusts the peer port's mTLS when an allow-list checks every holder
// it dials.
func (d *Daemon) openFetcher() (err error) {
	o := requester.ClusterOptions{Self: d.cfg.NodeID, PD: d.pd,
		PeersVerified: d.tls != nil && d.cfg.PeerAllow != ""}
	if d.cluster.idx != nil {
		o.Locator, o.Nodes = d.cluster.idx, d.cluster.idx
	}
	d.fetch, err = requester.NewCluster(d.engine, o)
	return err
}

// locator is the index LOOKUP_CLUSTER asks; nil when standalone (a nil
// *redisindex.Index must not become a non-nil interface).
func (d *Daemon) locator() localdata.Locator {
	if d.cluster.idx == nil {
		return nil
	}
	return d.cluster.idx
}

// registerCluster serves ClusterService on the local socket.
func (d *Daemon) registerCluster() {
	var idx index.Index
	if d.cluster.idx != nil {
		idx = d.cluster.idx
	}
	pegadv1.RegisterClusterServiceServer(d.localSrv, clusterapi.New(idx, d.cfg.NodeID))
}

// startPublisher runs the publisher until bg ends (Close); it registers
// this node once the peer port is bound, so peers can reach it.
func (d *Daemon) startPublisher(bg context.Context) {
	if d.cluster.pub == nil {
		return
	}
	d.wg.Go(func() { d.cluster.pub.Run(bg) })
	d.log.Info().Stringer("ttl", d.cfg.ClusterTTL).Msg("Cluster index enabled: registering with Redis")
}

// leaveTimeout bounds leaving the index at drain start (the publisher's
// deregistration has its own 1 s bound; this covers its wind-down).
const leaveTimeout = 2 * time.Second

// leaveCluster takes this node out of the cluster index as its drain
// begins: the publisher stops refreshing and removes the record, so
// requesters stop choosing this node now, not after the drain.
func (d *Daemon) leaveCluster() {
	if d.cluster.pub == nil || !d.ready { // not ready: the publisher never ran
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	d.cluster.pub.Leave(ctx)
}

// closeCluster closes the index client after the publisher stopped.
func (d *Daemon) closeCluster() {
	d.store.OnChange(nil)
	if d.tier != nil {
		d.tier.OnChange(nil)
	}
	if d.cluster.idx != nil {
		_ = d.cluster.idx.Close()
	}
}
