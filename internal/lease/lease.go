// Package lease owns leases: records that hold something (a pin, a write
// allocation, a transfer lock) until a deadline, renewable, ended exactly
// once. It has the one implementation of deadline order and expiry used
// by both lease tables of the daemon, and the one sweeper that drives
// them:
//
//   - Queue orders any record that embeds an Item by deadline; Remove,
//     Renew and Expire keep "ends exactly once" (a record leaves the queue
//     to one caller). The holder's lock table keeps one Queue per shard.
//   - Table is a table of leases held by owners (a local client's
//     connection), each with a value and an end function that gives the
//     value back: taken by its owner (commit, release), ended by its
//     owner's disconnect (Owner.Close), or expired (ExpireBefore).
//   - Sweep runs an Expirer (one, or several as Expirers) every interval
//     until its context ends.
//
// It owns only this bookkeeping: it must never touch a socket or decide what
// a value means; the end function, run outside the table's lock, does.
package lease

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

var (
	// ErrNoLease: the id is not a live lease of this owner.
	ErrNoLease = errors.New("lease: no such lease")
	// ErrLimit: the owner holds its maximum number of leases.
	ErrLimit = errors.New("lease: too many leases")
)

// Reason says why a lease's end function runs.
type Reason uint8

const (
	Disconnected Reason = iota + 1 // its owner went away
	Expired                        // its deadline passed
	Shutdown                       // the table was closed
)

func (r Reason) String() string {
	switch r {
	case Disconnected:
		return "disconnected"
	case Expired:
		return "expired"
	case Shutdown:
		return "shutdown"
	}
	return "unknown"
}

// ID names a lease within its owner.
type ID uint64

type entry[V any] struct {
	Item  // guarded by Table.mu
	id    ID
	owner *Owner[V]
	val   V
}

func (e *entry[V]) LeaseItem() *Item { return &e.Item }

// Owner is one holder of leases (a connection). Its ids are its own: an id
// of one owner means nothing to another.
type Owner[V any] struct {
	t      *Table[V]
	leases map[ID]*entry[V] // guarded by t.mu
	next   ID               // guarded by t.mu
	closed bool             // guarded by t.mu
}

// Table is safe for concurrent use.
type Table[V any] struct {
	timeout time.Duration // immutable
	maxPer  int           // immutable
	// end and clock are immutable.
	end   func(V, Reason)
	clock Clock
	// mu guards every owner's leases, next and closed, and byDeadline
	// and isClosed.
	mu         sync.Mutex
	byDeadline Queue[*entry[V]]
	isClosed   bool
}

// New makes a table whose leases live timeout past their last open or
// renew, at most maxPerOwner per owner (0: no limit); end gives a lease's
// value back when it ends other than by Take. now nil means time.Now.
func New[V any](timeout time.Duration, maxPerOwner int, end func(V, Reason), now func() time.Time) *Table[V] {
	return &Table[V]{timeout: timeout, maxPer: maxPerOwner, end: end, clock: NewClock(now)}
}

// Timeout is a lease's lifetime without Renew.
func (t *Table[V]) Timeout() time.Duration { return t.timeout }

// NewOwner registers an owner.
func (t *Table[V]) NewOwner() *Owner[V] {
	return &Owner[V]{t: t, leases: make(map[ID]*entry[V])}
}

func (t *Table[V]) deadlineLocked() Stamp {
	return t.clock.Stamp(t.clock.Now()) + Stamp(t.timeout)
}

// Open adds a lease holding v. ErrLimit when the owner is at its limit,
// ErrNoLease when the owner or the table is closed (v is then the
// caller's to give back).
func (o *Owner[V]) Open(v V) (ID, error) {
	t := o.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if o.closed || t.isClosed {
		return 0, fmt.Errorf("%w: owner closed", ErrNoLease)
	}
	if t.maxPer > 0 && len(o.leases) >= t.maxPer {
		return 0, fmt.Errorf("%w: %d held", ErrLimit, len(o.leases))
	}
	o.next++
	e := &entry[V]{id: o.next, owner: o, val: v}
	o.leases[e.id] = e
	t.byDeadline.Add(e, t.deadlineLocked())
	return e.id, nil
}

// Take ends a lease and hands its value to the caller (who commits or
// releases it) without calling end.
func (o *Owner[V]) Take(id ID) (V, error) {
	t := o.t
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := o.leases[id]
	if !ok {
		var zero V
		return zero, fmt.Errorf("%w: %d", ErrNoLease, id)
	}
	t.removeLocked(e)
	return e.val, nil
}

// TakeIf is Take of a lease whose value ok accepts, checked and taken
// under one hold of the table's lock: the lease cannot end between the
// check and the take, and a finish costs one lock, not two. ok runs with
// the lock held: it must only look at the value. A lease ok refuses is
// left as it was and ok's error returned.
func (o *Owner[V]) TakeIf(id ID, ok func(V) error) (V, error) {
	t := o.t
	t.mu.Lock()
	defer t.mu.Unlock()
	var zero V
	e, found := o.leases[id]
	if !found {
		return zero, fmt.Errorf("%w: %d", ErrNoLease, id)
	}
	if err := ok(e.val); err != nil {
		return zero, err
	}
	t.removeLocked(e)
	return e.val, nil
}

func (t *Table[V]) removeLocked(e *entry[V]) {
	delete(e.owner.leases, e.id)
	t.byDeadline.Remove(e)
}

// Renew pushes a live lease's deadline to now + timeout.
func (o *Owner[V]) Renew(id ID) error {
	t := o.t
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := o.leases[id]
	if !ok {
		return fmt.Errorf("%w: %d", ErrNoLease, id)
	}
	t.byDeadline.Renew(e, t.deadlineLocked())
	return nil
}

// Len is the owner's number of live leases.
func (o *Owner[V]) Len() int {
	o.t.mu.Lock()
	defer o.t.mu.Unlock()
	return len(o.leases)
}

// Close ends every lease of the owner (reason Disconnected) and refuses
// later Opens; it returns how many ended. Idempotent.
func (o *Owner[V]) Close() int {
	t := o.t
	t.mu.Lock()
	o.closed = true
	vals := make([]V, 0, len(o.leases))
	for _, e := range o.leases {
		t.removeLocked(e)
		vals = append(vals, e.val)
	}
	t.mu.Unlock()
	for _, v := range vals {
		t.end(v, Disconnected)
	}
	return len(vals)
}

// ExpireBefore ends every lease whose deadline is not after now and returns
// how many ended (Expirer). It costs O(1) plus O(log n) for each that
// expires.
func (t *Table[V]) ExpireBefore(now time.Time) int {
	t.mu.Lock()
	var vals []V
	t.byDeadline.Expire(t.clock.Stamp(now), func(e *entry[V]) {
		delete(e.owner.leases, e.id)
		vals = append(vals, e.val)
	})
	t.mu.Unlock()
	for _, v := range vals {
		t.end(v, Expired)
	}
	return len(vals)
}

// Close ends every lease (reason Shutdown) and refuses later Opens.
func (t *Table[V]) Close() int {
	t.mu.Lock()
	t.isClosed = true
	var vals []V
	var all []*entry[V]
	t.byDeadline.Each(func(e *entry[V]) { all = append(all, e) })
	for _, e := range all { // not while walking the queue
		t.removeLocked(e)
		vals = append(vals, e.val)
	}
	t.mu.Unlock()
	for _, v := range vals {
		t.end(v, Shutdown)
	}
	return len(vals)
}

// Len is the number of live leases.
func (t *Table[V]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byDeadline.Len()
}
