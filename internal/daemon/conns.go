package daemon

import (
	"fmt"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/conn"
)

// openConns makes the RDMA connections' NIC set (the pool registered on
// every device) and its two halves: the Dialer the prefetch engine reads
// through, and the Acceptor the holder answers handshakes with. On error
// nothing is left open.
func (d *Daemon) openConns(cfg *config.Config) (err error) {
	// verbs: a holder that died while idle is found by a keepalive READ
	// (tcp sees its data connections close).
	probe := probeInterval(d.tr.name)
	d.nics, err = conn.NewNICs(conn.NICOptions{
		NodeID:      cfg.NodeID,
		Incarnation: d.incarnation,
		Transport:   d.tr.name,
		Devices:     d.tr.devices,
		Memory:      d.pool.Bytes(),
		ConnectAttr: connectAttr(d.tr.name, cfg),

		NoRelaxedOrdering: !cfg.RelaxedOrdering,
		MemoryWindows:     cfg.MemoryWindows,
		Keepalive:         probe > 0,
		Reopen:            d.tr.reopen,
		Placement:         d.pool,
		Rails:             cfg.NICRails(), // same order as the devices (openTransport opens names in order)
		Metrics:           d.metrics,
		Log:               d.log.With().Str("component", "conn").Logger(),
	})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = d.closeConns()
		}
	}()
	d.dialer, err = conn.NewDialer(d.nics, conn.DialerOptions{
		Advertise:     d.advertise,
		QPsPerPeer:    cfg.QPsPerPeer,
		Dial:          d.peers.Get,
		ProbeInterval: probe,
	})
	if err != nil {
		return fmt.Errorf("dialer: %w", err)
	}
	d.acceptor, err = conn.NewAcceptor(d.nics, conn.AcceptorOptions{IdleTimeout: cfg.RDMAIdleTimeout})
	if err != nil {
		return fmt.Errorf("acceptor: %w", err)
	}
	return nil
}

// closeConns closes the halves, then the NIC set their QPs are made on.
func (d *Daemon) closeConns() (errs []error) {
	if d.dialer != nil {
		if err := d.dialer.Close(); err != nil {
			errs = append(errs, fmt.Errorf("dialer: %w", err))
		}
	}
	if d.acceptor != nil {
		if err := d.acceptor.Close(); err != nil {
			errs = append(errs, fmt.Errorf("acceptor: %w", err))
		}
	}
	if d.nics != nil {
		if err := d.nics.Close(); err != nil {
			errs = append(errs, fmt.Errorf("connections: %w", err))
		}
	}
	return errs
}

// connsListing is what the admin API lists (localapi.Conns): both halves'
// connections and the NIC set's QPs.
func (d *Daemon) connsListing() conn.Listing {
	return conn.Listing{Dialer: d.dialer, Acceptor: d.acceptor}
}
