package requester

import (
	"sync"

	"github.com/pegaflow/pegad/internal/store"
)

// flight is one block's in-flight fetch. The owner sets status, err and
// ownerGone and then closes done; joiners read them after done is closed.
type flight struct {
	peer   string // the peer it fetches from
	done   chan struct{}
	status Status
	err    error
	// ownerGone: the owner's own context ended (its cancel or deadline),
	// which says nothing about a joiner's; a joiner fetches again.
	ownerGone bool
}

// flightTable is the in-flight table: each block being fetched maps to its
// one in-flight fetch, and concurrent prefetches of the block from the
// same peer wait on it instead of fetching it twice.
type flightTable struct {
	mu sync.Mutex // guards m
	m  map[store.Key]*flight
}

// joinedBlock is a block another call is fetching, waited on.
type joinedBlock struct {
	key store.Key
	f   *flight
}

// claimed sorts a round's hashes: owned (this call fetches them; the
// flight is nil where the block is fetched unregistered), joined (another
// call fetches them from the same peer) and local (already in the store).
type claimed struct {
	owned        []store.Key
	ownedFlights []*flight
	joined       []joinedBlock
	local        []store.Key
}

// claim registers this call as the fetcher, from peer, of every hash of ns
// that is neither in flight nor local (has).
func (t *flightTable) claim(peer, ns string, hashes [][]byte, has func(store.Key) bool) claimed {
	var c claimed
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, h := range hashes {
		key := store.Key{Namespace: ns, Hash: string(h)}
		f, inFlight := t.m[key]
		switch {
		case inFlight && f.peer == peer:
			c.joined = append(c.joined, joinedBlock{key, f})
		case inFlight:
			// Being fetched from another peer, which may not have it:
			// fetch it from ours too (Insert keeps the first copy).
			c.owned = append(c.owned, key)
			c.ownedFlights = append(c.ownedFlights, nil)
		case has(key):
			// Checked under mu: an owner completes its flight only after
			// indexing, so a block is either in flight or visible here.
			c.local = append(c.local, key)
		default:
			f := &flight{peer: peer, done: make(chan struct{}), status: StatusFailed, err: ErrPanic}
			t.m[key] = f
			c.owned = append(c.owned, key)
			c.ownedFlights = append(c.ownedFlights, f)
		}
	}
	return c
}

// complete ends the owned flights with the fetch's outcomes (out aligned
// with owned; a flight past out's end keeps ErrPanic) and wakes their
// joiners; gone says the owner's own context ended. Joiners must never
// wait forever: the owner calls it whatever happened in the fetch.
func (t *flightTable) complete(owned []store.Key, flights []*flight, out fetchOut, gone bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, key := range owned {
		f := flights[i]
		if f == nil {
			continue
		}
		if i < len(out.status) {
			f.status, f.err = out.status[i], out.errs[i]
		}
		f.ownerGone = gone
		delete(t.m, key)
		close(f.done)
	}
}
