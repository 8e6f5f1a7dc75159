package lease

import (
	"math"
	"time"
)

// Stamp is a time as nanoseconds since a Clock's epoch: 8 bytes instead of
// time.Time's 24 and, with the real clock, taken from the monotonic
// reading, so wall-clock steps do not move deadlines.
type Stamp int64

// Clock reads the time for a table and turns it into Stamps. Immutable.
type Clock struct {
	epoch time.Time
	now   func() time.Time
}

// NewClock is a clock reading now (nil: time.Now) whose epoch is now's
// reading at this call.
func NewClock(now func() time.Time) Clock {
	if now == nil {
		now = time.Now
	}
	return Clock{epoch: now(), now: now}
}

// Now reads the clock.
func (c Clock) Now() time.Time { return c.now() }

// Stamp is t as a Stamp of this clock.
func (c Clock) Stamp(t time.Time) Stamp { return Stamp(t.Sub(c.epoch)) }

// At is the time of s.
func (c Clock) At(s Stamp) time.Time { return c.epoch.Add(time.Duration(s)) }

// Item is the lease of one record: its deadline, its place in the Queue
// that orders it, and how often it was renewed. A record embeds it (16
// bytes) and hands it out through Leased; only the Queue changes it, under
// whatever lock guards the Queue.
type Item struct {
	deadline Stamp
	pos      int32 // 1 + index in its Queue; 0 when in none
	renewals int32 // saturates at MaxInt32
}

// Deadline is when the lease lapses.
func (it *Item) Deadline() Stamp { return it.deadline }

// Lapsed is the one rule of when a lease is over: at its deadline, whether
// or not a sweep has run since.
func (it *Item) Lapsed(now Stamp) bool { return it.deadline <= now }

// Renewals is how many times Renew was called on the lease.
func (it *Item) Renewals() int32 { return it.renewals }

// Queued says whether the lease is in a Queue (not yet removed or expired).
func (it *Item) Queued() bool { return it.pos > 0 }

// Leased is a record with a lease: a pointer type whose LeaseItem is the
// same Item for the record's whole life.
type Leased interface {
	comparable
	LeaseItem() *Item
}

// Queue orders leased records by deadline: a min-heap whose entries carry
// their index, so that Remove and Renew cost O(log n) and Expire costs
// only what lapses. A record leaves it exactly once (Remove or Expire
// reports it to one caller). Not safe for concurrent use: the owner's lock
// guards it.
type Queue[E Leased] struct {
	h []E
	// first is h[0]'s deadline (when h is not empty), kept here so that a
	// sweep of a queue where nothing lapsed reads one field, not a record.
	first Stamp
}

// Due says whether the earliest lease has lapsed at now: a sweep's O(1)
// check before PopLapsed.
func (q *Queue[E]) Due(now Stamp) bool { return len(q.h) > 0 && q.first <= now }

// Len is the number of queued records.
func (q *Queue[E]) Len() int { return len(q.h) }

// Add queues e, which must be in no queue, with deadline.
func (q *Queue[E]) Add(e E, deadline Stamp) {
	it := e.LeaseItem()
	if it.pos != 0 {
		panic("lease: Add of a queued record")
	}
	it.deadline = deadline
	q.h = append(q.h, e)
	it.pos = int32(len(q.h))
	q.up(len(q.h) - 1)
	q.first = q.h[0].LeaseItem().deadline
}

// Remove takes e out of the queue; false when it was not queued (another
// Remove or an Expire took it first).
func (q *Queue[E]) Remove(e E) bool {
	it := e.LeaseItem()
	if it.pos == 0 {
		return false
	}
	q.removeAt(int(it.pos - 1))
	return true
}

// Renew counts a renewal of queued e and moves its deadline to deadline
// when that is later (a renewal never shortens a lease). False when e is
// not queued: a lease that ended is not revived.
func (q *Queue[E]) Renew(e E, deadline Stamp) bool {
	it := e.LeaseItem()
	if it.pos == 0 {
		return false
	}
	if it.renewals < math.MaxInt32 {
		it.renewals++
	}
	if deadline > it.deadline {
		it.deadline = deadline
		q.down(int(it.pos - 1))
		q.first = q.h[0].LeaseItem().deadline
	}
	return true
}

// Expire removes every record whose lease has lapsed at now, earliest
// deadline first, and calls ended on each (with the owner's lock still
// held: ended must only collect). It returns how many.
func (q *Queue[E]) Expire(now Stamp, ended func(E)) int {
	n := 0
	for e, ok := q.PopLapsed(now); ok; e, ok = q.PopLapsed(now) {
		ended(e)
		n++
	}
	return n
}

// PopLapsed removes and returns the record with the earliest deadline if
// its lease has lapsed at now; false when none has. A sweep calls it until
// false: it costs O(1) when nothing lapsed, and needs no callback.
func (q *Queue[E]) PopLapsed(now Stamp) (E, bool) {
	if !q.Due(now) {
		var zero E
		return zero, false
	}
	e := q.h[0]
	q.removeAt(0)
	return e, true
}

// Each calls f for every queued record, in no order; f must not change
// the queue.
func (q *Queue[E]) Each(f func(E)) {
	for _, e := range q.h {
		f(e)
	}
}

func (q *Queue[E]) removeAt(i int) {
	var zero E
	last := len(q.h) - 1
	e := q.h[i]
	if i != last {
		q.swap(i, last)
	}
	q.h[last] = zero
	q.h = q.h[:last]
	e.LeaseItem().pos = 0
	if i != last {
		q.down(i)
		q.up(i)
	}
	if len(q.h) > 0 {
		q.first = q.h[0].LeaseItem().deadline
	}
}

func (q *Queue[E]) less(i, j int) bool {
	return q.h[i].LeaseItem().deadline < q.h[j].LeaseItem().deadline
}

func (q *Queue[E]) swap(i, j int) {
	q.h[i], q.h[j] = q.h[j], q.h[i]
	q.h[i].LeaseItem().pos = int32(i + 1)
	q.h[j].LeaseItem().pos = int32(j + 1)
}

func (q *Queue[E]) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !q.less(j, i) {
			break
		}
		q.swap(i, j)
		j = i
	}
}

func (q *Queue[E]) down(i int) {
	n := len(q.h)
	for {
		j := 2*i + 1
		if j >= n {
			return
		}
		if r := j + 1; r < n && q.less(r, j) {
			j = r
		}
		if !q.less(j, i) {
			return
		}
		q.swap(i, j)
		i = j
	}
}
