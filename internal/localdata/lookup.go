package localdata

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pegaflow/pegad/api/limits"
	"github.com/pegaflow/pegad/api/localwire"
	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/lease"
	"github.com/pegaflow/pegad/internal/store"
)

// A pin (LOOKUP_PIN) is a daemon-owned lease in s.pins under one owner,
// the daemon: it ends at the lease timeout unless a connection ADOPTs it,
// which turns each block into a read lease of that connection (ended with
// it, like any other). Its token is the pin's lease id and a random secret,
// so that a token cannot be guessed from another.
type pinned struct {
	blocks []*store.Block
	secret [pinSecretLen]byte
	uid    uint32 // the pinner's; only the same user may adopt or unpin
	ns     string
}

const (
	pinSecretLen = 16
	pinTokenLen  = 8 + pinSecretLen
	// clusterTimeout bounds LOOKUP_CLUSTER's question to the index.
	clusterTimeout = 5 * time.Second
)

// errNoPin: an ADOPT or UNPIN token that names no live pin.
var errNoPin = errors.New("no such pin: unknown, expired, already adopted or unpinned")

// errDenied: a token of a pin another user made.
var errDenied = errors.New("the pin belongs to another user")

// Locator is what LOOKUP_CLUSTER needs of the cluster index.
type Locator interface {
	Locate(ctx context.Context, namespace string, hashes [][]byte) ([][]index.Holder, error)
}

// endPin gives a pin's blocks back when it ends unadopted (expiry,
// shutdown; UNPIN takes it and unpins itself).
func (s *Server) endPin(p pinned, why lease.Reason) {
	s.store.Unpin(p.blocks)
	if why == lease.Expired {
		s.log.Debug().Str("namespace", p.ns).Int("blocks", len(p.blocks)).Msg("Local pin expired unadopted")
	}
}

// ExpireBefore ends the leases and the unadopted pins whose deadline is
// before now (the lease sweeper's Expirer).
func (s *Server) ExpireBefore(now time.Time) int {
	return s.leases.ExpireBefore(now) + s.pins.ExpireBefore(now)
}

// chainKeys checks a chain against the store's limits (checkChain) and
// returns its keys.
func chainKeys(c localwire.Chain) ([]store.Key, error) {
	if err := checkChain(c); err != nil {
		return nil, err
	}
	keys := make([]store.Key, len(c.Hashes))
	for i, h := range c.Hashes {
		keys[i] = store.Key{Namespace: c.Namespace, Hash: string(h)}
	}
	return keys, nil
}

// checkChain checks a chain against the store's limits (chainKeys without
// the keys).
func checkChain(c localwire.Chain) error {
	return limits.ValidChain(c.Namespace, c.Hashes)
}

// lookup answers LOOKUP: the stored prefix's length; nothing changes.
func (cn *conn) lookup(b []byte, c localwire.Chain) []byte {
	if err := checkChain(c); err != nil {
		return localwire.AppendError(b, localwire.StatusInvalid, err.Error())
	}
	n := cn.s.store.PrefixOf(c.Namespace, c.Hashes)
	cn.s.countLookup(c.Namespace, len(c.Hashes), n)
	return localwire.AppendResult(b, localwire.OpLookup, &localwire.Result{N: uint32(n)})
}

func (s *Server) countLookup(ns string, n, hit int) {
	if s.engine != nil {
		s.engine.Lookup(ns, n, hit)
	}
}

// lookupPin answers LOOKUP_PIN: pins the stored prefix (no more of it than
// one ADOPT answer can carry) under a new token.
func (cn *conn) lookupPin(b []byte, c localwire.Chain) []byte {
	keys, err := chainKeys(c)
	if err != nil {
		return localwire.AppendError(b, localwire.StatusInvalid, err.Error())
	}
	st := cn.s.store
	n := st.Prefix(keys)
	cn.s.countLookup(c.Namespace, len(keys), n)
	blocks, missing := st.Pin(keys[:n])
	if len(missing) > 0 { // removed since Prefix: the prefix ends there
		cut := missing[0]
		st.Unpin(blocks[cut:])
		blocks = blocks[:cut]
	}
	size := localwire.HeaderLen + localwire.AdoptHeaderLen
	for i, blk := range blocks {
		if size += localwire.AdoptResultLen(blk.NumSlots()); size > localwire.MaxFrame {
			st.Unpin(blocks[i:])
			blocks = blocks[:i]
			break
		}
	}
	p := pinned{blocks: blocks, uid: cn.uid, ns: c.Namespace}
	if _, err := rand.Read(p.secret[:]); err != nil {
		st.Unpin(blocks)
		return localwire.AppendError(b, localwire.StatusInternal, err.Error())
	}
	id, err := cn.s.pinOwner.Open(p)
	if err != nil {
		st.Unpin(blocks)
		return localwire.AppendError(b, statusOf(err), err.Error())
	}
	tok := binary.LittleEndian.AppendUint64(make([]byte, 0, pinTokenLen), uint64(id))
	tok = append(tok, p.secret[:]...)
	return localwire.AppendResult(b, localwire.OpLookupPin, &localwire.Result{N: uint32(len(blocks)), Token: tok})
}

// takePin ends the pin tok names, if the caller may, and returns it;
// room is how many leases the caller can still open (-1: none needed).
// On an error nothing changes.
func (cn *conn) takePin(tok []byte, room int) (pinned, error) {
	if len(tok) != pinTokenLen {
		return pinned{}, errNoPin
	}
	id := lease.ID(binary.LittleEndian.Uint64(tok))
	p, err := cn.s.pinOwner.TakeIf(id, func(p pinned) error {
		switch {
		case subtle.ConstantTimeCompare(p.secret[:], tok[8:]) != 1:
			return errNoPin
		case p.uid != cn.uid:
			return errDenied
		case room >= 0 && len(p.blocks) > room:
			return fmt.Errorf("%w: adopting %d blocks would pass this connection's limit", lease.ErrLimit, len(p.blocks))
		}
		return nil
	})
	if errors.Is(err, lease.ErrNoLease) {
		err = errNoPin
	}
	return p, err
}

// pinStatus maps an ADOPT or UNPIN failure to a wire status.
func pinStatus(err error) localwire.Status {
	switch {
	case errors.Is(err, errNoPin):
		return localwire.StatusNotFound
	case errors.Is(err, errDenied):
		return localwire.StatusDenied
	}
	return statusOf(err)
}

// adopt answers ADOPT: the pin's blocks become read leases of this
// connection, in chain order.
func (cn *conn) adopt(b []byte, tok []byte) []byte {
	p, err := cn.takePin(tok, cn.s.maxLeases-cn.owner.Len())
	if err != nil {
		return localwire.AppendError(b, pinStatus(err), err.Error())
	}
	res := localwire.Result{Adopted: make([]localwire.LeasePlace, 0, len(p.blocks))}
	var bytes uint64
	for i, blk := range p.blocks {
		id, err := cn.open(held{block: blk})
		if err != nil { // the table is closing: give back what is left
			cn.s.store.Unpin(p.blocks[i:])
			for j, l := range res.Adopted {
				if _, err := cn.owner.Take(lease.ID(l.Lease)); err == nil {
					cn.s.store.Unpin(p.blocks[j : j+1])
				} // else the closing table ended it
			}
			return localwire.AppendError(b, statusOf(err), err.Error())
		}
		slots := make([]localwire.SlotPlace, blk.NumSlots())
		for j := range slots {
			s := blk.Slot(j)
			slots[j] = localwire.SlotPlace{K: localwire.Segment{Off: s.K.Off, Len: s.K.Len}, V: localwire.Segment{Off: s.V.Off, Len: s.V.Len}}
		}
		res.Adopted = append(res.Adopted, localwire.LeasePlace{Lease: uint64(id), Slots: slots})
		bytes += blk.Size()
	}
	if cn.s.engine != nil {
		cn.s.engine.Load(p.ns, bytes)
	}
	return localwire.AppendResult(b, localwire.OpAdopt, &res)
}

// unpin answers UNPIN: drops a pin nobody adopted.
func (cn *conn) unpin(b []byte, tok []byte) []byte {
	p, err := cn.takePin(tok, -1)
	if err != nil {
		return localwire.AppendError(b, pinStatus(err), err.Error())
	}
	cn.s.store.Unpin(p.blocks)
	return localwire.AppendResult(b, localwire.OpUnpin, &localwire.Result{})
}

// lookupCluster answers LOOKUP_CLUSTER: the local prefix, and the other
// node the index says holds the longest prefix of the chain.
func (cn *conn) lookupCluster(b []byte, c localwire.Chain) []byte {
	keys, err := chainKeys(c)
	if err != nil {
		return localwire.AppendError(b, localwire.StatusInvalid, err.Error())
	}
	local := cn.s.store.Prefix(keys)
	cn.s.countLookup(c.Namespace, len(keys), local)
	if cn.s.locator == nil {
		return localwire.AppendError(b, localwire.StatusInvalid, index.ErrDisabled.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	holders, err := cn.s.locator.Locate(ctx, c.Namespace, c.Hashes)
	if err != nil {
		return localwire.AppendError(b, localwire.StatusInternal, err.Error())
	}
	hit := bestHolder(holders, cn.s.self)
	hit.Local = uint32(local)
	return localwire.AppendResult(b, localwire.OpLookupCluster, &localwire.Result{Cluster: hit})
}

// bestHolder is the node (other than self) holding the longest prefix of
// the chain, by the index's answer per hash; ties go to a node holding
// the first hash in DRAM rather than on its SSD tier, then to the node
// listed first for it.
func onSSD(h index.Holder) int {
	if h.Medium == index.MediumSSD {
		return 1
	}
	return 0
}

func bestHolder(holders [][]index.Holder, self string) localwire.ClusterHit {
	if len(holders) == 0 {
		return localwire.ClusterHit{}
	}
	type run struct {
		h index.Holder
		n int
	}
	var runs []run // nodes still holding every hash so far: DRAM copies of the first hash first, then in its order
	for _, h := range holders[0] {
		if h.NodeID != self {
			runs = append(runs, run{h: h, n: 1})
		}
	}
	slices.SortStableFunc(runs, func(x, y run) int { return cmp.Compare(onSSD(x.h), onSSD(y.h)) })
	best := run{}
	for i := 1; i <= len(holders) && len(runs) > 0; i++ {
		if runs[0].n > best.n {
			best = runs[0]
		}
		if i == len(holders) {
			break
		}
		live := runs[:0]
		for _, r := range runs {
			for _, h := range holders[i] {
				if h.NodeID == r.h.NodeID && h.Incarnation == r.h.Incarnation {
					r.n++
					live = append(live, r)
					break
				}
			}
		}
		runs = live
	}
	if best.n == 0 {
		return localwire.ClusterHit{}
	}
	return localwire.ClusterHit{N: uint32(best.n), PeerID: best.h.NodeID, PeerAddr: best.h.Addr}
}
