package client

import (
	"context"
	"fmt"

	"github.com/pegaflow/pegad/api/localwire"
)

// lookupVersion is the data protocol version that brought the lookups.
const lookupVersion = 3

// Pin is a pinned stored prefix (LookupPin): its first N blocks stay in
// the pool until a connection of the same user adopts Token (Adopt), the
// pin is released, or the daemon's lease timeout passes.
type Pin struct {
	N     int
	Token []byte
	c     *Client
}

// Release drops the pin at once (UNPIN); ErrNotFound when it was adopted,
// released or expired already.
func (p *Pin) Release() error {
	ctx, cancel := cleanupContext()
	defer cancel()
	res, err := p.c.lookupCall(ctx, localwire.OpUnpin, func(b []byte) []byte { return localwire.AppendToken(b, p.Token) })
	if err != nil {
		return err
	}
	return res.err
}

// ClusterHit is what LookupCluster found: Local blocks of the chain are on
// this node; the node Peer (its peer address, PeerID in the index) holds
// the first N (N 0, Peer "": no other node holds the first block). When N >
// Local, Prefetch(hashes[Local:N], FromPeer(Peer)) brings the rest here.
type ClusterHit struct {
	Peer   string
	PeerID string
	N      int
	Local  int
}

type lookupResult struct {
	res localwire.Result
	err error     // the item's status, as an error
	d   *dataConn // the connection that answered (an ADOPT's leases are on it)
}

// lookupCall sends one version-3 request (one item) and returns its result.
func (c *Client) lookupCall(ctx context.Context, op localwire.Op, enc func([]byte) []byte) (lookupResult, error) {
	if c.data == nil {
		return lookupResult{}, ErrNoZeroCopy
	}
	d, err := c.data.get(ctx)
	if err != nil {
		return lookupResult{}, err
	}
	if d.version < lookupVersion {
		return lookupResult{}, fmt.Errorf("%w: %v needs data protocol %d, the daemon speaks %d (upgrade pegad)",
			ErrProtocol, op, lookupVersion, d.version)
	}
	res, err := d.call(ctx, op, 1, enc)
	if err != nil {
		return lookupResult{}, err
	}
	r := lookupResult{res: res[0], d: d}
	if r.res.Status != localwire.StatusOK {
		r.err = fromWire(op, r.res.Status, r.res.Msg)
	}
	return r, nil
}

func chainItem(namespace string, hashes [][]byte) (localwire.Chain, error) {
	if len(namespace) > localwire.MaxNamespace {
		return localwire.Chain{}, fmt.Errorf("%w: namespace of %d bytes (max %d)", ErrInvalid, len(namespace), localwire.MaxNamespace)
	}
	for i, h := range hashes {
		if len(h) > localwire.MaxHash {
			return localwire.Chain{}, fmt.Errorf("%w: hash %d of %d bytes (max %d)", ErrInvalid, i, len(h), localwire.MaxHash)
		}
	}
	return localwire.Chain{Namespace: namespace, Hashes: hashes}, nil
}

// chainCall sends a LOOKUP, LOOKUP_PIN or LOOKUP_CLUSTER of up to
// localwire.MaxBatch hashes.
func (c *Client) chainCall(ctx context.Context, op localwire.Op, namespace string, hashes [][]byte) (localwire.Result, error) {
	ch, err := chainItem(namespace, hashes)
	if err != nil {
		return localwire.Result{}, err
	}
	r, err := c.lookupCall(ctx, op, func(b []byte) []byte { return localwire.AppendChain(b, ch) })
	if err != nil {
		return localwire.Result{}, err
	}
	if r.err == nil && int(r.res.N) > len(hashes) && op != localwire.OpLookupCluster {
		r.err = fmt.Errorf("%w: %v of %d hashes answered %d", ErrProtocol, op, len(hashes), r.res.N)
	}
	return r.res, r.err
}

// Lookup is the number of blocks of the chain hashes (in chain order),
// from the first, stored one after another in namespace. It pins nothing
// and changes nothing, not even the blocks' LRU places: a scheduler may ask
// as often as it likes. One round trip per localwire.MaxBatch hashes (the
// next only when the chain is stored that far).
func (c *Client) Lookup(ctx context.Context, namespace string, hashes [][]byte) (int, error) {
	n := 0
	for {
		chunk := hashes[n:min(len(hashes), n+localwire.MaxBatch)]
		res, err := c.chainCall(ctx, localwire.OpLookup, namespace, chunk)
		if err != nil {
			return n, err
		}
		n += int(res.N)
		if int(res.N) < len(chunk) || n == len(hashes) {
			return n, nil
		}
	}
}

// LookupPin is Lookup of up to localwire.MaxBatch hashes that also pins
// the stored prefix under a token: another connection of the same user
// (a worker process) takes the blocks over with Adopt. An unadopted pin
// ends at the daemon's lease timeout, or at Release. Pin.N may be less
// than Lookup's answer when the blocks' places would not fit one ADOPT
// answer (16 MiB).
func (c *Client) LookupPin(ctx context.Context, namespace string, hashes [][]byte) (*Pin, error) {
	if len(hashes) > localwire.MaxBatch {
		return nil, fmt.Errorf("%w: %d hashes in one pin (max %d)", ErrInvalid, len(hashes), localwire.MaxBatch)
	}
	res, err := c.chainCall(ctx, localwire.OpLookupPin, namespace, hashes)
	if err != nil {
		return nil, err
	}
	return &Pin{N: int(res.N), Token: append([]byte(nil), res.Token...), c: c}, nil
}

// Adopt takes over the pin token names (made by LookupPin on any
// connection of this user): its blocks become Readers of this client, in
// chain order, ended by Release or when this client closes or its process
// dies. ErrNotFound: the token is unknown, expired, adopted or released;
// ErrDenied: another user pinned it. On an error nothing changes.
func (c *Client) Adopt(ctx context.Context, token []byte) ([]*Reader, error) {
	if len(token) > localwire.MaxToken {
		return nil, fmt.Errorf("%w: token of %d bytes (max %d)", ErrInvalid, len(token), localwire.MaxToken)
	}
	r, err := c.lookupCall(ctx, localwire.OpAdopt, func(b []byte) []byte { return localwire.AppendToken(b, token) })
	if err != nil {
		return nil, err
	}
	if r.err != nil {
		return nil, r.err
	}
	out := make([]*Reader, 0, len(r.res.Adopted))
	for _, l := range r.res.Adopted {
		rd, err := r.d.reader(localwire.Result{Lease: l.Lease, Slots: l.Slots})
		if err != nil {
			ids := readersIDs(out)
			for _, l := range r.res.Adopted[len(out):] {
				ids = append(ids, l.Lease)
			}
			_ = cleanupFinish(r.d, localwire.OpRelease, ids)
			return nil, err
		}
		out = append(out, rd)
	}
	return out, nil
}

// LookupCluster asks this node for the stored prefix of the chain (up to
// localwire.MaxBatch hashes) and the cluster index for the other node
// holding the longest prefix. ErrInvalid when the daemon has no cluster
// index (--cluster-redis).
func (c *Client) LookupCluster(ctx context.Context, namespace string, hashes [][]byte) (ClusterHit, error) {
	if len(hashes) > localwire.MaxBatch {
		return ClusterHit{}, fmt.Errorf("%w: %d hashes (max %d)", ErrInvalid, len(hashes), localwire.MaxBatch)
	}
	res, err := c.chainCall(ctx, localwire.OpLookupCluster, namespace, hashes)
	if err != nil {
		return ClusterHit{}, err
	}
	h := res.Cluster
	if int(h.N) > len(hashes) || int(h.Local) > len(hashes) {
		return ClusterHit{}, fmt.Errorf("%w: cluster lookup of %d hashes answered %d, %d", ErrProtocol, len(hashes), h.Local, h.N)
	}
	return ClusterHit{Peer: h.PeerAddr, PeerID: h.PeerID, N: int(h.N), Local: int(h.Local)}, nil
}
