// Package lease is a table of leases held by owners (a local client's
// connection): each lease carries a value (what it holds: a pin, a write
// allocation), a deadline, and an end function that gives the value back.
// A lease ends exactly once: taken by its owner (commit, release), ended
// by its owner's disconnect (EndOwner), or expired by the sweeper
// (ExpireBefore, the gc.Expirer interface the holder's lock table also
// implements).
//
// It owns only this bookkeeping: it must never touch a socket or decide what
// a value means; the end function, run outside the table's lock, does.
//
// Every lease has the same timeout, so deadlines are ordered like the
// leases' last open or renew: one list, oldest first, gives O(1) open,
// renew and end and an expiry sweep that costs only what expires.
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
	id         ID
	owner      *Owner[V]
	val        V
	deadline   time.Time
	prev, next *entry[V] // deadline order; guarded by Table.mu
}

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
	// end and now are immutable.
	end func(V, Reason)
	now func() time.Time
	// mu guards every owner's leases, next and closed, and head (the
	// deadline list), live and isClosed.
	mu       sync.Mutex
	head     entry[V] // sentinel of the deadline list: head.next is the oldest
	live     int
	isClosed bool
}

// New makes a table whose leases live timeout past their last open or
// renew, at most maxPerOwner per owner (0: no limit); end gives a lease's
// value back when it ends other than by Take. now nil means time.Now.
func New[V any](timeout time.Duration, maxPerOwner int, end func(V, Reason), now func() time.Time) *Table[V] {
	if now == nil {
		now = time.Now
	}
	t := &Table[V]{timeout: timeout, maxPer: maxPerOwner, end: end, now: now}
	t.head.prev, t.head.next = &t.head, &t.head
	return t
}

// Timeout is a lease's lifetime without Renew.
func (t *Table[V]) Timeout() time.Duration { return t.timeout }

// NewOwner registers an owner.
func (t *Table[V]) NewOwner() *Owner[V] {
	return &Owner[V]{t: t, leases: make(map[ID]*entry[V])}
}

func (t *Table[V]) pushLocked(e *entry[V]) {
	last := t.head.prev
	e.prev, e.next = last, &t.head
	last.next = e
	t.head.prev = e
}

func (t *Table[V]) unlinkLocked(e *entry[V]) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
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
	e := &entry[V]{id: o.next, owner: o, val: v, deadline: t.now().Add(t.timeout)}
	o.leases[e.id] = e
	t.pushLocked(e)
	t.live++
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
	t.unlinkLocked(e)
	t.live--
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
	e.deadline = t.now().Add(t.timeout)
	t.unlinkLocked(e)
	t.pushLocked(e)
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
// how many ended (gc.Expirer). It costs O(1) plus what expires.
func (t *Table[V]) ExpireBefore(now time.Time) int {
	t.mu.Lock()
	var vals []V
	for e := t.head.next; e != &t.head && !e.deadline.After(now); e = t.head.next {
		t.removeLocked(e)
		vals = append(vals, e.val)
	}
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
	for e := t.head.next; e != &t.head; e = t.head.next {
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
	return t.live
}
