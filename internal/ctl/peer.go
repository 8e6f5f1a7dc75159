package ctl

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/peertls"
)

// peerClient is pegactl's one client of a pegad's peer port (--listen):
// it speaks as a requester would (lock, renew, release), with the
// certificate an mTLS port asks for. Calls to the local pegad go through
// the public client instead (client.go). Its errors are gRPC's own, which
// classify (exit.go) maps from their status.
type peerClient struct {
	addr string
	cc   *grpc.ClientConn
	rpc  pegadv1.PeerServiceClient
	// who is the requester the holder sees: its node id is the
	// certificate's identity with mTLS, else pegactl@HOST unless named;
	// its incarnation is this process's.
	who *pegadv1.Requester
}

// dialPeer prepares a client of the peer port at addr (gRPC connects
// lazily), with tls when its files are given; requester names the
// requester ("": the certificate's identity, else pegactl@HOST).
func dialPeer(addr string, tls peertls.Files, requester string) (*peerClient, error) {
	if err := tls.Check(); err != nil {
		return nil, usageErrorf("%v", err)
	}
	creds := insecure.NewCredentials()
	if tls.Enabled() { // peertls's client side: the cluster CA, no host name match
		src, err := peertls.New(peertls.Options{Files: tls, Log: zerolog.Nop()})
		if err != nil {
			return nil, usageErrorf("peer TLS: %v", err)
		}
		creds = src.ClientCredentials()
		if requester == "" {
			requester = src.Identity()
		}
	}
	if requester == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "unknown"
		}
		requester = "pegactl@" + host
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("client for peer %s: %w", addr, err)
	}
	return &peerClient{
		addr: addr, cc: cc, rpc: pegadv1.NewPeerServiceClient(cc),
		who: &pegadv1.Requester{NodeId: requester, Incarnation: fmt.Sprintf("pegactl-%d", time.Now().UnixNano())},
	}, nil
}

func (p *peerClient) Close() error { return p.cc.Close() }

// requester is the node id the holder sees.
func (p *peerClient) requester() string { return p.who.GetNodeId() }

// lock locks the blocks it holds under a new transfer session
// (QueryBlocksForTransfer); an answer with no session id locked nothing.
func (p *peerClient) lock(ctx context.Context, namespace string, hashes [][]byte) (*pegadv1.QueryBlocksForTransferResponse, error) {
	return p.rpc.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
		Namespace: namespace, Hashes: hashes, RequesterId: p.requester(), Requester: p.who,
	})
}

// renew extends the session's lock by the holder's lock timeout.
func (p *peerClient) renew(ctx context.Context, session string) error {
	_, err := p.rpc.RenewTransferLock(ctx, &pegadv1.RenewTransferLockRequest{SessionId: session, Requester: p.who})
	return err
}

// release ends the session.
func (p *peerClient) release(ctx context.Context, session string) (*pegadv1.ReleaseTransferLockResponse, error) {
	return p.rpc.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{
		SessionId: session, RequesterId: p.requester(), Requester: p.who,
	})
}
