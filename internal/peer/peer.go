// Package peer owns this node's gRPC client connections to other pegads'
// peer ports: one *grpc.ClientConn per peer address, created on first use
// and closed at shutdown. It never retries RPCs on its own.
//
// API CONTRACT (implementation pending; signatures are fixed):
package peer

import (
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// Clients is safe for concurrent use.
type Clients struct{}

func NewClients() *Clients { panic("unimplemented") }

// Get returns the client for peer (host:port).
func (c *Clients) Get(peer string) (pegadv1.PeerServiceClient, error) { panic("unimplemented") }

func (c *Clients) Close() error { panic("unimplemented") }
