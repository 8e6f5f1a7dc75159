package conn

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// The requester side of memory windows (windows.go): the keys a holder
// granted with a lock, and which QP each must be used on.

// ErrStaleGrant: a lock's windows were bound on another handshake's QPs
// than the connection's (it reconnected after the lock): their keys work
// on none of its QPs. The lock is released and asked for again.
var ErrStaleGrant = errors.New("conn: memory windows bound on another handshake")

// Grant is the memory windows a holder granted with a transfer lock; a
// ReadOp that carries one is read with its keys, on its QPs, instead of
// the pool rkey. Immutable once made.
type Grant struct {
	handshakeID string
	nics        map[int]grantNIC // by the index of the requester's NIC in the handshake
}

type grantNIC struct {
	qp   int
	keys []*pegadv1.WindowKey // by base; no two overlap
}

// NewGrant checks a lock answer's windows: nil when there are none (the
// holder reads through its pool rkey). An error (malformed: duplicate NIC,
// empty or overlapping or wrapping windows) wraps ErrRemoteMemory.
func NewGrant(ws []*pegadv1.MemoryWindows, handshakeID string) (*Grant, error) {
	if len(ws) == 0 {
		return nil, nil
	}
	g := &Grant{handshakeID: handshakeID, nics: make(map[int]grantNIC, len(ws))}
	for _, w := range ws {
		nic := int(w.GetNic())
		if _, dup := g.nics[nic]; dup || nic >= maxNICs || int(w.GetQp()) >= maxQPsPerPeer {
			return nil, fmt.Errorf("%w: window grant for nic %d qp %d", ErrRemoteMemory, nic, w.GetQp())
		}
		keys := slices.Clone(w.GetKeys())
		slices.SortFunc(keys, func(a, b *pegadv1.WindowKey) int { return cmp.Compare(a.GetBase(), b.GetBase()) })
		for i, k := range keys {
			if k.GetLength() == 0 || k.GetBase()+k.GetLength() < k.GetBase() ||
				(i > 0 && keys[i-1].GetBase()+keys[i-1].GetLength() > k.GetBase()) {
				return nil, fmt.Errorf("%w: window [%#x,+%d) on nic %d empty, wrapping or overlapping", ErrRemoteMemory,
					k.GetBase(), k.GetLength(), nic)
			}
		}
		g.nics[nic] = grantNIC{qp: int(w.GetQp()), keys: keys}
	}
	return g, nil
}

// has reports whether the grant serves the requester's NIC nic.
func (g *Grant) has(nic int) bool {
	_, ok := g.nics[nic]
	return ok
}

// lookup finds the window holding [addr, addr+n) on NIC nic: its rkey and
// the QP (endpoint index) it must be read on.
func (g *Grant) lookup(nic int, addr, n uint64) (qp int, rkey uint32, ok bool) {
	gn, found := g.nics[nic]
	if !found {
		return 0, 0, false
	}
	i, _ := slices.BinarySearchFunc(gn.keys, addr, func(k *pegadv1.WindowKey, a uint64) int {
		switch {
		case k.GetBase()+k.GetLength() <= a:
			return -1
		case k.GetBase() > a:
			return 1
		}
		return 0
	})
	if i == len(gn.keys) {
		return 0, 0, false
	}
	k := gn.keys[i]
	if addr < k.GetBase() || addr+n < addr || addr+n > k.GetBase()+k.GetLength() {
		return 0, 0, false
	}
	return gn.qp, k.GetRkey(), true
}
