package daemon

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"os/user"
	"slices"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/peertls"
)

// expiryCheck is how often the node certificate's expiry is re-checked
// (a warning once it is within peertls.ExpiryWarning).
const expiryCheck = time.Hour

// setupPeerTLS loads the peer TLS files when configured (d.tls stays nil
// otherwise) and exports the limits in force. Files that do not load are
// the configuration's fault (config.ErrInvalid).
func (d *Daemon) setupPeerTLS() error {
	cfg := &d.cfg
	l := d.holderLimits()
	d.metrics.PeerLimitSettings.WithLabelValues(metrics.LimitSessionsPerPeer).Set(float64(l.SessionsPerPeer))
	d.metrics.PeerLimitSettings.WithLabelValues(metrics.LimitPinnedBytesPerPeer).Set(float64(l.PinnedBytesPerPeer))
	d.metrics.PeerLimitSettings.WithLabelValues(metrics.LimitPinnedBytesNode).Set(float64(l.PinnedBytes))
	if !cfg.PeerTLS() {
		return nil
	}
	allow, err := peertls.ParseAllowList(cfg.PeerAllow)
	if err != nil {
		return config.Invalid(fmt.Errorf("peer-allow: %w", err))
	}
	d.tls, err = peertls.New(peertls.Options{
		Files:   cfg.PeerTLSFiles(),
		Allow:   allow,
		Log:     d.log.With().Str("component", "peertls").Logger(),
		Metrics: d.metrics.PeerTLS(),
		// A new certificate (or an operator's SIGHUP) may cure a refusal:
		// peers that refused are dialled again at once.
		OnReload: func() {
			if d.peers != nil {
				d.peers.Forget()
			}
		},
	})
	if err != nil {
		return config.Invalid(fmt.Errorf("peer TLS: %w", err))
	}
	d.log.Info().Str("identity", d.tls.Identity()).Time("not_after", d.tls.NotAfter()).
		Bool("allow_list", !allow.Empty()).Msg("Peer port requires mutual TLS")
	d.tls.WarnExpiry()
	if !slices.Contains(d.tls.Names(), cfg.NodeID) {
		// Requests carry the node id; holders refuse one the certificate
		// does not prove.
		d.log.Warn().Str("node_id", cfg.NodeID).Strs("names", d.tls.Names()).
			Msg("node-id is not one of this node's certificate identities: peers will refuse its requests (set --node-id to one of them)")
	}
	return nil
}

// holderLimits are the configured per-peer and node-wide pin limits.
func (d *Daemon) holderLimits() holder.Limits {
	return holder.Limits{
		SessionsPerPeer:    d.cfg.MaxSessionsPerPeer,
		PinnedBytesPerPeer: uint64(d.cfg.EffectiveMaxPinnedBytesPerPeer()),
		PinnedBytes:        uint64(d.cfg.EffectiveMaxPinnedBytes()),
	}
}

// authenticator makes the certificate identity the session owner (nil on
// a plaintext peer port: the claimed node id is trusted).
func (d *Daemon) authenticator() holder.Authenticator {
	if d.tls == nil {
		return nil
	}
	return func(ctx context.Context) (string, []string, bool) {
		p, ok := peertls.FromContext(ctx)
		return p.Identity, p.Names, ok
	}
}

// peerServerOptions are the peer server's credentials and the allow-list
// interceptors (outermost, so a refused caller reaches nothing else).
func (d *Daemon) peerServerOptions() (opts []grpc.ServerOption, unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) {
	if d.tls == nil {
		return nil, nil, nil
	}
	return []grpc.ServerOption{grpc.Creds(passCreds{d.tls.ServerCredentials()})},
		[]grpc.UnaryServerInterceptor{d.tls.UnaryInterceptor()},
		[]grpc.StreamServerInterceptor{d.tls.StreamInterceptor()}
}

// peerDialOptions make the requester present the node certificate.
func (d *Daemon) peerDialOptions() []grpc.DialOption {
	if d.tls == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(d.tls.ClientCredentials())}
}

// peerClientOptions are peerDialOptions for the requester's peer clients:
// a peer that refuses a certificate is logged once per refusal and not
// dialled again until its backoff passes or the files are reloaded
// (peer.Clients.Refused).
func (d *Daemon) peerClientOptions() []grpc.DialOption {
	if d.tls == nil {
		return nil
	}
	creds := d.tls.ReportingClientCredentials(func(p string, err error) {
		if until, ok := d.peers.Refused(p, err); ok {
			d.log.Warn().Str("peer", p).Err(err).Time("until", until).
				Msg("Peer certificate refused: not redialling this peer until then, or until SIGHUP reloads the certificates")
		}
	})
	return []grpc.DialOption{grpc.WithTransportCredentials(creds)}
}

// warnPlaintext warns when a plaintext peer port is reachable from other
// hosts: anyone who reaches it can pin blocks and learn pool addresses.
func (d *Daemon) warnPlaintext(addr net.Addr) {
	if d.tls != nil {
		return
	}
	if ta, ok := addr.(*net.TCPAddr); ok && ta.IP.IsLoopback() {
		return
	}
	d.log.Warn().Str("listen", addr.String()).
		Msg("Peer port is plaintext on a non-loopback address: any host that reaches it can pin blocks and read pool memory; set --peer-tls-cert, --peer-tls-key and --peer-tls-ca (docs/security.md)")
}

// startReloader reloads the peer TLS files and the namespace quotas
// (quota.go) on SIGHUP (with neither, SIGHUP is logged and otherwise
// ignored rather than killing the daemon) and re-checks the certificate's
// expiry; its goroutines stop with ctx.
func (d *Daemon) startReloader(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	var tlsHup chan os.Signal // the TLS source's own signal, fed by the loop below
	if d.tls != nil {
		tlsHup = make(chan os.Signal, 1)
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.tls.Run(ctx, tlsHup, expiryCheck)
		}()
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case sig := <-hup:
				if tlsHup != nil {
					select {
					case tlsHup <- sig:
					default: // a reload is pending already
					}
				}
				d.reloadQuotasOnHUP()
				if tlsHup == nil && d.opts.reload == nil {
					d.log.Info().Msg("SIGHUP: nothing to reload (no peer TLS files, no configuration source)")
				}
			}
		}
	}()
}

// lookupGID resolves a group name, or takes a number as the gid itself
// when no group has that name (chown(1) does the same): a container image
// rarely lists the engines' group in /etc/group.
func lookupGID(group string) (int, error) {
	g, err := user.LookupGroup(group)
	if err != nil {
		if n, nerr := strconv.ParseUint(group, 10, 31); nerr == nil {
			return int(n), nil
		}
		return 0, config.Invalid(fmt.Errorf("socket-group %q: %w", group, err))
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("socket-group %q: gid %q: %w", group, g.Gid, err)
	}
	return gid, nil
}

// ReloadTLS reloads the peer TLS files, as SIGHUP does. On error the files
// in use stay in use. Established connections, sessions and QPs are not
// touched.
func (d *Daemon) ReloadTLS() error {
	if d.tls == nil {
		return fmt.Errorf("%w: no files to reload", peertls.ErrIncomplete)
	}
	return d.tls.Reload()
}

// chownSocket gives the local socket to cfg.SocketGroup when set; a group
// that does not exist is the configuration's fault (config.ErrInvalid).
func chownSocket(path, group string) error {
	if group == "" {
		return nil
	}
	gid, err := lookupGID(group)
	if err != nil {
		return err
	}
	if err := os.Chown(path, -1, gid); err != nil {
		return fmt.Errorf("socket-group %q: chown %s: %w", group, path, err)
	}
	return nil
}
