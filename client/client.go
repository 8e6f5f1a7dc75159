// Package client is the Go client of a local pegad: the one package an
// inference engine imports to put, get, delete and prefetch KV-cache
// blocks.
//
// Put and Get copy once (into or out of the daemon's pool); Alloc and Lease
// copy nothing: the pool is a memfd the client maps (received over the data
// socket, docs/local-protocol.md), Alloc hands out room in it to write in
// place, Lease pins a stored block to read in place. Delete and Prefetch go
// over the local gRPC API, and so do the daemon's services the Client has
// no method of its own for (Admin, Cluster, Local: admin.go).
//
// It depends only on pegad's api/ packages, gRPC and the standard library
// (golang.org/x/sys for mmap): it must never import pegad's internal
// packages, so that it builds on its own in an engine's tree.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pegaflow/pegad/api/localwire"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
)

// DataSocketSuffix names the data socket next to the local API socket.
const DataSocketSuffix = ".data"

// streamChunk is the data of one PutBlock message (the daemon's limit).
const streamChunk = 1 << 20

// maxRecvMsg bounds one gRPC answer from the daemon.
const maxRecvMsg = 64 << 20

// Option configures Dial.
type Option func(*options)

type options struct {
	dataSocket string
	noData     bool
	conn       grpc.ClientConnInterface
	fallback   bool
	node       int // WithNUMANode's; valid when nodeSet
	nodeSet    bool
}

// WithDataSocket sets the data socket's path (default: socket + ".data").
func WithDataSocket(path string) Option { return func(o *options) { o.dataSocket = path } }

// WithoutDataSocket makes Dial connect only the local API socket, lazily as
// gRPC does (a daemon that is down shows up as a SocketError from the first
// call): for tools that only administer (pegactl stats). Put and Get then
// stream over gRPC, and Alloc and Lease return ErrNoZeroCopy.
func WithoutDataSocket() Option { return func(o *options) { o.noData = true } }

// WithConn makes the client use cc for the gRPC calls instead of dialling
// the socket itself (Close then leaves cc open).
func WithConn(cc grpc.ClientConnInterface) Option { return func(o *options) { o.conn = cc } }

// AllowStreamFallback lets Dial succeed without the data socket (an older
// daemon, or a socket forwarded from another host): Put and Get then stream
// over gRPC (several copies), and Alloc and Lease return ErrNoZeroCopy.
func AllowStreamFallback() Option { return func(o *options) { o.fallback = true } }

// Client talks to one local pegad. Safe for concurrent use; zero-copy
// calls on one client are serialized on its data connection (dial one
// client per thread for parallel calls).
type Client struct {
	local  pegadv1.LocalServiceClient // over typed: errors as grpcErr makes them
	typed  typedConn
	cc     *grpc.ClientConn // nil with WithConn
	data   *dataLink        // nil without the data socket (fallback, WithoutDataSocket)
	socket string
	dials  *dialRecord // nil with WithConn
	node   int         // WithNUMANode's node, NoNUMANode when none; immutable
}

// Dial connects to the daemon whose local API listens on socket, and to
// its data socket next to it.
//
// The client outlives its connections: after the daemon restarts (or a
// call broke the data connection) the next call dials the data socket
// again, and gRPC redials its channel. A request that was sent when its
// connection broke is never sent again (the daemon may have applied it):
// that call returns ErrUnavailable. Writers, Readers and Pins end with the
// connection that made them.
func Dial(ctx context.Context, socket string, opts ...Option) (*Client, error) {
	o := options{dataSocket: socket + DataSocketSuffix}
	for _, f := range opts {
		f(&o)
	}
	c := &Client{socket: socket, node: NoNUMANode}
	if o.nodeSet {
		if err := checkNUMANode(o.node); err != nil {
			return nil, err
		}
		c.node = o.node
	}
	if !o.noData {
		data, err := dialData(ctx, o.dataSocket)
		switch {
		case err == nil:
			c.data = newDataLink(o.dataSocket, data)
		case o.fallback && errors.Is(err, ErrUnavailable):
		default:
			return nil, err
		}
	}
	cc := o.conn
	if cc == nil {
		c.dials = &dialRecord{}
		conn, err := grpc.NewClient("passthrough:///pegad",
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			// gRPC's default backoff grows to 2 minutes while the daemon
			// is down; a restarted daemon is found within a second.
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnectBackoff, MinConnectTimeout: 5 * time.Second}),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				var d net.Dialer
				conn, err := d.DialContext(ctx, "unix", socket)
				c.dials.set(err)
				return conn, err
			}),
			// Data comes in chunks of 1 MiB, but list answers (ListBlocks,
			// ListSessions with blocks) outgrow gRPC's default 4 MiB.
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsg)),
		)
		if err != nil {
			if c.data != nil {
				_ = c.data.close()
			}
			return nil, fmt.Errorf("pegad client for %s: %w", socket, err)
		}
		c.cc, cc = conn, conn
	}
	c.typed = typedConn{cc: cc, c: c}
	c.local = pegadv1.NewLocalServiceClient(c.typed)
	return c, nil
}

// ZeroCopy reports whether Alloc and Lease are available (the data socket
// is connected).
func (c *Client) ZeroCopy() bool { return c.data != nil }

// LeaseTimeout is how long a lease lives without Renew (0 without the data
// socket).
func (c *Client) LeaseTimeout() time.Duration {
	if c.data == nil {
		return 0
	}
	return c.data.current().leaseTimeout
}

// Close closes the connections; the daemon ends every lease still held,
// and every slice from Writer.Bytes or Reader.Bytes becomes invalid. The
// room reserved for a next Put is given back before Close returns.
func (c *Client) Close() error {
	var errs []error
	if c.data != nil {
		errs = append(errs, c.data.close())
	}
	if c.cc != nil {
		errs = append(errs, c.cc.Close())
	}
	return errors.Join(errs...)
}

// SlotSize is the shape of one slot (one tensor-parallel rank) of a block:
// a K segment and an optional V segment (V 0: none).
type SlotSize struct{ K, V uint64 }

// PutOption configures Put and Alloc.
type PutOption func(*putOptions)

type putOptions struct {
	slots   []SlotSize
	created *bool
}

// WasCreated makes Put report in *p whether it stored the block (false:
// a block was already stored under the key and was kept).
func WasCreated(p *bool) PutOption { return func(o *putOptions) { o.created = p } }

// WithSlots gives the block's slot layout; its sizes must add up to the
// block's size. Default: one slot, all K.
func WithSlots(slots ...SlotSize) PutOption {
	return func(o *putOptions) { o.slots = append([]SlotSize(nil), slots...) }
}

func putOpts(opts []PutOption) putOptions {
	var o putOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

func slotsFor(size int, opts []PutOption) ([]SlotSize, error) {
	o := putOpts(opts)
	if size <= 0 {
		return nil, fmt.Errorf("%w: block of %d bytes", ErrInvalid, size)
	}
	if o.slots == nil {
		return []SlotSize{{K: uint64(size)}}, nil
	}
	var total uint64
	for _, s := range o.slots {
		total += s.K + s.V
	}
	if total != uint64(size) {
		return nil, fmt.Errorf("%w: slots add up to %d bytes, the block is %d", ErrInvalid, total, size)
	}
	return o.slots, nil
}

// Put stores data as the block (namespace, hash): one copy, into the pool.
// A block already stored under that key is kept and Put returns nil.
//
// Put returns once the block is indexed, in one round trip to the daemon:
// it copies into room the previous Put of the same size reserved, and one
// request stores the block and reserves room for the next Put. So a client
// that has put holds one block's worth of pool room until its next Put or
// Close (or, unused, until the lease timeout).
func (c *Client) Put(ctx context.Context, namespace string, hash, data []byte, opts ...PutOption) error {
	o := putOpts(opts)
	created := func(v bool) {
		if o.created != nil {
			*o.created = v
		}
	}
	created(false)
	if c.data == nil {
		return c.putStream(ctx, namespace, hash, data, opts, created)
	}
	d, err := c.data.get(ctx)
	if err != nil {
		return err
	}
	if d.version >= 2 {
		slots, err := slotsFor(len(data), opts)
		if err != nil {
			return err
		}
		if len(slots) > localwire.MaxSlots {
			return fmt.Errorf("%w: %d slots (max %d)", ErrInvalid, len(slots), localwire.MaxSlots)
		}
		k, err := keyItem(namespace, hash)
		if err != nil {
			return err
		}
		ok, err := d.put(ctx, k, slots, data)
		created(ok)
		return err
	}
	w, err := c.Alloc(ctx, namespace, hash, len(data), opts...)
	if errors.Is(err, ErrExists) {
		return nil
	}
	if err != nil {
		return err
	}
	copy(w.Bytes(), data)
	if err := w.Commit(ctx); err != nil {
		return err
	}
	created(w.Created())
	return nil
}

// Get copies the block's bytes (slot order: slot 0 K, slot 0 V, slot 1 K,
// ...) into dst and returns their number; with a dst too short it copies
// nothing and returns the size needed and ErrShortBuffer.
func (c *Client) Get(ctx context.Context, namespace string, hash, dst []byte) (int, error) {
	if c.data == nil {
		info, err := c.GetTo(ctx, namespace, hash, &fixedWriter{buf: dst})
		if info != nil && errors.Is(err, ErrShortBuffer) {
			return int(info.Size), err
		}
		if err != nil {
			return 0, err
		}
		return int(info.Size), nil
	}
	r, err := c.Lease(ctx, namespace, hash)
	if err != nil {
		return 0, err
	}
	n := r.Size()
	if len(dst) < n {
		_ = r.Release()
		return n, fmt.Errorf("%w: %d bytes for a block of %d", ErrShortBuffer, len(dst), n)
	}
	off := 0
	for _, s := range r.slots {
		off += copy(dst[off:], s.K)
		off += copy(dst[off:], s.V)
	}
	// A release that finds the lease ended means it expired during the
	// copy: the memory may have been reused, so the bytes are not trusted.
	if err := r.release(ctx); err != nil {
		return 0, err
	}
	return off, nil
}

// BlockInfo describes a block read with GetTo.
type BlockInfo struct {
	Slots []SlotSize
	Size  uint64
}

// GetTo writes the block's bytes (slot order) to w, leased in place when the
// data socket is there, streamed over gRPC otherwise.
func (c *Client) GetTo(ctx context.Context, namespace string, hash []byte, w io.Writer) (*BlockInfo, error) {
	if c.data != nil {
		r, err := c.Lease(ctx, namespace, hash)
		if err != nil {
			return nil, err
		}
		info := &BlockInfo{Size: uint64(r.Size())}
		for _, s := range r.slots {
			info.Slots = append(info.Slots, SlotSize{K: uint64(len(s.K)), V: uint64(len(s.V))})
			for _, seg := range [][]byte{s.K, s.V} {
				if _, err := w.Write(seg); err != nil {
					_ = r.Release()
					return info, err
				}
			}
		}
		// As in Get: an ended lease means the bytes written may be torn.
		return info, r.release(ctx)
	}
	return c.getStream(ctx, namespace, hash, w)
}

// DeleteOption configures Delete.
type DeleteOption func(*deleteOptions)

type deleteOptions struct{ deferred *bool }

// WasDeferred makes Delete report in *p whether the block's memory stays
// in use after it left the index (a lease or a peer's transfer session
// pins it; it is freed when the last one ends).
func WasDeferred(p *bool) DeleteOption { return func(o *deleteOptions) { o.deferred = p } }

// Delete removes the block from the index (a pinned block's memory stays
// until its last lease ends).
func (c *Client) Delete(ctx context.Context, namespace string, hash []byte, opts ...DeleteOption) error {
	var o deleteOptions
	for _, f := range opts {
		f(&o)
	}
	if o.deferred != nil {
		*o.deferred = false
	}
	res, err := c.local.DeleteBlock(ctx, &pegadv1.DeleteBlockRequest{Namespace: namespace, Hash: hash})
	if err != nil {
		return err
	}
	if o.deferred != nil {
		*o.deferred = res.GetDeferred()
	}
	return nil
}

// reconnectBackoff bounds the wait between the gRPC channel's attempts to
// reach a daemon that is down.
var reconnectBackoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}

// grpcErr is fromStatus(err), or a SocketError when the call found no
// daemon because the socket could not be dialled; after ErrUnavailable
// the channel's backoff is reset, so the next call tries the socket at
// once (a restarted daemon). Nothing is resent: gRPC retries only calls
// that never reached the daemon. Errors it made already pass unchanged.
func (c *Client) grpcErr(err error) error {
	if err == nil || isTyped(err) {
		return err
	}
	if status.Code(err) == codes.Unavailable && c.dials != nil {
		if cause := c.dials.get(); cause != nil {
			err = &SocketError{Socket: c.socket, Err: cause, call: err}
		}
	}
	err = fromStatus(err)
	if c.cc != nil && errors.Is(err, ErrUnavailable) {
		c.cc.ResetConnectBackoff()
	}
	return err
}

// PrefetchOption configures Prefetch.
type PrefetchOption func(*pegadv1.PrefetchRequest)

// FromPeer names the peer daemon (its gRPC host:port) to fetch from.
// Without it the daemon asks its cluster index which nodes hold the blocks
// (pegad --cluster-redis); a daemon without one answers
// ErrNoIndex.
func FromPeer(addr string) PrefetchOption {
	return func(r *pegadv1.PrefetchRequest) { r.Peer = addr }
}

// WithHandoff names the producer's handoff the blocks were handed off
// under (Handoff.Token on the peer's node): the holder ends that
// handoff's pin of each block the prefetch reads. A token naming no live
// handoff changes nothing.
func WithHandoff(token string) PrefetchOption {
	return func(r *pegadv1.PrefetchRequest) { r.HandoffToken = token }
}

// KnownPeerOnly makes the daemon refuse (ErrDenied, nothing fetched) a
// FromPeer address that is neither a live node of the cluster index nor
// checked by the peer port's mTLS against --peer-allow: for addresses
// that come from untrusted input.
func KnownPeerOnly() PrefetchOption {
	return func(r *pegadv1.PrefetchRequest) { r.KnownPeerOnly = true }
}

// WithPrefetchTimeout bounds the fetch on the daemon's side.
func WithPrefetchTimeout(d time.Duration) PrefetchOption {
	return func(r *pegadv1.PrefetchRequest) { r.Timeout = durationpb.New(d) }
}

// PrefetchStatus is the outcome of one block of a Prefetch.
type PrefetchStatus = pegadv1.PrefetchBlockStatus

// PrefetchBlock is one block's outcome; Node is the node it was fetched
// from, when the daemon says.
type PrefetchBlock struct {
	Hash   []byte
	Status PrefetchStatus
	Err    string
	Node   string
}

// PrefetchResult is what a Prefetch did.
type PrefetchResult struct {
	Blocks    []PrefetchBlock
	Bytes     uint64
	Duration  time.Duration
	SessionID string
}

// Prefetch asks the daemon to fetch blocks into its pool: from the peer
// FromPeer names, or without it from the nodes the cluster index says hold
// them. On a failed prefetch the result (when the daemon sent one) says
// which blocks failed and how, beside the error.
//
// The daemon is asked to answer a failed fetch with the failure in the
// response (failure_in_response) rather than as the call's status, whose
// trailer cannot carry thousands of outcomes; the error returned is the
// same either way. A daemon older than that field answers as before.
func (c *Client) Prefetch(ctx context.Context, namespace string, hashes [][]byte, opts ...PrefetchOption) (*PrefetchResult, error) {
	if len(hashes) == 0 {
		// No hashes (a ClusterHit's hashes[Local:N] with nothing
		// missing) is a no-op: an empty result, nothing sent.
		return &PrefetchResult{}, nil
	}
	req := &pegadv1.PrefetchRequest{Namespace: namespace, Hashes: hashes, FailureInResponse: true}
	for _, f := range opts {
		f(req)
	}
	resp, err := c.local.Prefetch(ctx, req)
	if f := resp.GetError(); err == nil && f != nil {
		return prefetchResult(resp), fromStatus(PrefetchFailureStatus(f).Err())
	}
	if err != nil {
		var res *PrefetchResult
		if st, ok := statusOf(err); ok {
			for _, d := range st.Details() {
				if pr, ok := d.(*pegadv1.PrefetchResponse); ok {
					res = prefetchResult(pr)
				}
			}
		}
		return res, err
	}
	return prefetchResult(resp), nil
}

// PrefetchFailureStatus is the gRPC status a failed prefetch's
// PrefetchResponse.error stands for (its code, pegad reason and message),
// for callers of the generated LocalService client that branch on
// status codes or pegaderr reasons. A code of 0 (a malformed answer) is
// Unknown: a failure is never OK.
func PrefetchFailureStatus(f *pegadv1.PrefetchFailure) *status.Status {
	code := codes.Code(f.GetCode())
	if code == codes.OK {
		code = codes.Unknown
	}
	return pegaderr.Status(code, pegaderr.Reason(f.GetReason()), f.GetMessage())
}

func prefetchResult(pr *pegadv1.PrefetchResponse) *PrefetchResult {
	res := &PrefetchResult{Bytes: pr.GetBytes(), Duration: pr.GetDuration().AsDuration(), SessionID: pr.GetSessionId()}
	for _, b := range pr.GetBlocks() {
		res.Blocks = append(res.Blocks, PrefetchBlock{Hash: b.GetHash(), Status: b.GetStatus(), Err: b.GetError(), Node: b.GetNode()})
	}
	return res
}

// keyItem is a wire key, checked only for what the wire can carry (the
// daemon checks the rest).
func keyItem(namespace string, hash []byte) (localwire.Key, error) {
	if len(namespace) > localwire.MaxNamespace || len(hash) > localwire.MaxHash {
		return localwire.Key{}, fmt.Errorf("%w: namespace of %d or hash of %d bytes (max %d, %d)",
			ErrInvalid, len(namespace), len(hash), localwire.MaxNamespace, localwire.MaxHash)
	}
	return localwire.Key{Namespace: namespace, Hash: hash}, nil
}
