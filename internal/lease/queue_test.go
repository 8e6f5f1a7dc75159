package lease

import (
	"math/rand"
	"slices"
	"testing"
)

type rec struct {
	Item
	n int
}

func (r *rec) LeaseItem() *Item { return &r.Item }

// TestQueueAgainstModel drives a Queue with random adds, removes, renewals
// and expiries and checks each against a plain map of deadlines: every
// record leaves exactly once, expiry takes exactly the lapsed ones,
// earliest first, Due agrees with the earliest deadline, and a renewal
// never shortens a lease or revives one.
func TestQueueAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	var q Queue[*rec]
	model := map[*rec]Stamp{}
	var all []*rec
	now := Stamp(0)
	for step := range 20000 {
		switch op := rng.Intn(10); {
		case op < 4:
			r := &rec{n: step}
			d := now + Stamp(rng.Intn(100))
			q.Add(r, d)
			model[r] = d
			all = append(all, r)
		case op < 6 && len(all) > 0:
			r := all[rng.Intn(len(all))]
			_, live := model[r]
			if got := q.Remove(r); got != live {
				t.Fatalf("step %d: Remove = %v, record live %v", step, got, live)
			}
			delete(model, r)
		case op < 8 && len(all) > 0:
			r := all[rng.Intn(len(all))]
			old, live := model[r]
			d := now + Stamp(rng.Intn(100))
			if got := q.Renew(r, d); got != live {
				t.Fatalf("step %d: Renew = %v, record live %v", step, got, live)
			}
			if live {
				model[r] = max(old, d)
			}
		default:
			now += Stamp(rng.Intn(20))
			var got []*rec
			q.Expire(now, func(r *rec) { got = append(got, r) })
			var want []Stamp
			for _, d := range model {
				if d <= now {
					want = append(want, d)
				}
			}
			slices.Sort(want)
			if len(got) != len(want) {
				t.Fatalf("step %d: expired %d, want %d", step, len(got), len(want))
			}
			for i, r := range got {
				if r.Deadline() != want[i] || model[r] != want[i] {
					t.Fatalf("step %d: expiry %d has deadline %d, want %d in order", step, i, r.Deadline(), want[i])
				}
				delete(model, r)
			}
		}
		if q.Len() != len(model) {
			t.Fatalf("step %d: queue holds %d, model %d", step, q.Len(), len(model))
		}
		due := false
		for _, d := range model {
			due = due || d <= now+10
		}
		if q.Due(now+10) != due {
			t.Fatalf("step %d: Due = %v, model says %v", step, !due, due)
		}
	}
	for r, d := range model {
		if !r.Queued() || r.Deadline() != d {
			t.Fatalf("record %d: queued %v deadline %d, want %d", r.n, r.Queued(), r.Deadline(), d)
		}
	}
}

// TestQueueRenewals: every renewal of a queued lease counts, later or not;
// one of a removed lease neither counts nor queues it again.
func TestQueueRenewals(t *testing.T) {
	var q Queue[*rec]
	r := &rec{}
	q.Add(r, 10)
	q.Renew(r, 5) // earlier: counted, deadline kept
	q.Renew(r, 20)
	if r.Renewals() != 2 || r.Deadline() != 20 {
		t.Fatalf("renewals %d deadline %d, want 2 and 20", r.Renewals(), r.Deadline())
	}
	if !q.Remove(r) || q.Remove(r) {
		t.Fatal("Remove must report the record once")
	}
	if q.Renew(r, 30) || r.Queued() || r.Renewals() != 2 || q.Len() != 0 {
		t.Fatalf("renewal revived a removed lease: queued %v renewals %d len %d", r.Queued(), r.Renewals(), q.Len())
	}
}
