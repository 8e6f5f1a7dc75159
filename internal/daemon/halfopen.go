package daemon

// Half-open connections on pegad's ports (issue 33): every listener is
// bounded as the tcp data port is, by internal/netgate (64 connections per
// source, 512 in all, that have not completed their protocol's first step;
// the oldest is evicted), and each first step has a deadline. The data
// socket's server keeps its own gate (localdata.Options.MaxHalfOpen).

import (
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/pegaflow/pegad/internal/netgate"
)

// gated bounds the half-open connections of l, pegad's port named port
// (a metrics.Port*), whose first step step recognises (nil: only
// netgate.Pass ends it).
func (d *Daemon) gated(port string, l net.Listener, step netgate.Step) net.Listener {
	return netgate.NewListener(l, netgate.Options{Step: step, Refused: d.halfOpenRefused(port)})
}

// halfOpenRefused counts port's half-open connections netgate dropped.
func (d *Daemon) halfOpenRefused(port string) func(reason string) {
	c := d.metrics.HalfOpenRefused
	return func(reason string) { c.WithLabelValues(port, reason).Inc() }
}

// gatedGRPC bounds a gRPC port's half-open connections: those that have
// not sent the HTTP/2 preface and first frame (or, with TLS, finished the
// TLS handshake, which passCreds reports), and, through ConnectionTimeout,
// the whole handshake of those that have (grpc-go's default is 120 s).
func (d *Daemon) gatedGRPC(port string, l net.Listener, tls bool) (net.Listener, grpc.ServerOption) {
	step := netgate.HTTP2()
	if tls {
		step = nil
	}
	return d.gated(port, l, step), grpc.ConnectionTimeout(netgate.DefaultTimeout)
}

// passCreds end a connection's half-open time once its TLS handshake has
// succeeded: the listener cannot see the HTTP/2 preface inside TLS, and a
// peer that got that far holds a certificate this node trusts (what follows
// is bounded by ConnectionTimeout).
type passCreds struct {
	credentials.TransportCredentials
}

func (p passCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	nc, ai, err := p.TransportCredentials.ServerHandshake(c)
	if err == nil {
		netgate.Pass(c)
	}
	return nc, ai, err
}

func (p passCreds) Clone() credentials.TransportCredentials {
	return passCreds{p.TransportCredentials.Clone()}
}
