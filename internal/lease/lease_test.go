package lease

import (
	"errors"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type ended struct {
	mu  sync.Mutex // guards got
	got map[int]Reason
}

func newTable(t *testing.T, timeout time.Duration, max int) (*Table[int], *clock, *ended) {
	t.Helper()
	c := &clock{t: time.Unix(1000, 0)}
	e := &ended{got: map[int]Reason{}}
	tab := New(timeout, max, func(v int, r Reason) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if _, dup := e.got[v]; dup {
			t.Errorf("value %d ended twice", v)
		}
		e.got[v] = r
	}, c.now)
	return tab, c, e
}

func TestTakeDoesNotEnd(t *testing.T) {
	tab, _, e := newTable(t, time.Second, 0)
	o := tab.NewOwner()
	id, err := o.Open(7)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := o.Take(id); err != nil || v != 7 {
		t.Fatalf("Take = %d, %v", v, err)
	}
	if _, err := o.Take(id); !errors.Is(err, ErrNoLease) {
		t.Fatalf("second Take err %v, want ErrNoLease", err)
	}
	if o.Close() != 0 || len(e.got) != 0 || tab.Len() != 0 {
		t.Fatalf("taken lease ended again: %v len %d", e.got, tab.Len())
	}
}

func TestOwnersAreSeparate(t *testing.T) {
	tab, _, _ := newTable(t, time.Second, 0)
	a, b := tab.NewOwner(), tab.NewOwner()
	id, _ := a.Open(1)
	if _, err := b.Take(id); !errors.Is(err, ErrNoLease) {
		t.Fatalf("another owner took the lease: %v", err)
	}
	if err := b.Renew(id); !errors.Is(err, ErrNoLease) {
		t.Fatalf("another owner renewed the lease: %v", err)
	}
}

func TestExpiry(t *testing.T) {
	tab, c, e := newTable(t, 10*time.Second, 0)
	o := tab.NewOwner()
	id1, _ := o.Open(1)
	c.add(5 * time.Second)
	_, _ = o.Open(2)
	c.add(4 * time.Second)
	if err := o.Renew(id1); err != nil { // 1 now expires at 19s, 2 at 15s
		t.Fatal(err)
	}
	if n := tab.ExpireBefore(c.now()); n != 0 {
		t.Fatalf("expired %d before any deadline", n)
	}
	c.add(6 * time.Second)
	if n := tab.ExpireBefore(c.now()); n != 1 || e.got[2] != Expired {
		t.Fatalf("expired %d (%v), want only 2", n, e.got)
	}
	c.add(4 * time.Second)
	if n := tab.ExpireBefore(c.now()); n != 1 || e.got[1] != Expired {
		t.Fatalf("expired %d (%v), want 1 after its renewal", n, e.got)
	}
	if _, err := o.Take(id1); !errors.Is(err, ErrNoLease) {
		t.Fatalf("expired lease still taken: %v", err)
	}
}

func TestOwnerCloseAndLimit(t *testing.T) {
	tab, _, e := newTable(t, time.Second, 2)
	o, other := tab.NewOwner(), tab.NewOwner()
	_, _ = o.Open(1)
	_, _ = o.Open(2)
	if _, err := o.Open(3); !errors.Is(err, ErrLimit) {
		t.Fatalf("third lease err %v, want ErrLimit", err)
	}
	_, _ = other.Open(4)
	if n := o.Close(); n != 2 || e.got[1] != Disconnected || e.got[2] != Disconnected {
		t.Fatalf("Close ended %d: %v", n, e.got)
	}
	if _, err := o.Open(5); !errors.Is(err, ErrNoLease) {
		t.Fatalf("Open after Close err %v", err)
	}
	if tab.Len() != 1 {
		t.Fatalf("other owner's lease gone: len %d", tab.Len())
	}
	if n := tab.Close(); n != 1 || e.got[4] != Shutdown {
		t.Fatalf("table Close ended %d: %v", n, e.got)
	}
}

// TestConcurrentEndsOnce races Take, owner Close and expiry over the same
// leases: each value must end (or be taken) exactly once.
func TestConcurrentEndsOnce(t *testing.T) {
	tab, c, e := newTable(t, time.Millisecond, 0)
	o := tab.NewOwner()
	const n = 2000
	ids := make([]ID, n)
	for i := range ids {
		ids[i], _ = o.Open(i)
	}
	c.add(time.Second)
	var taken sync.Map
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for i, id := range ids {
			if v, err := o.Take(id); err == nil {
				taken.Store(v, i)
			}
		}
	}()
	go func() { defer wg.Done(); tab.ExpireBefore(c.now()) }()
	go func() { defer wg.Done(); o.Close() }()
	wg.Wait()
	cnt := len(e.got)
	taken.Range(func(k, _ any) bool {
		if _, dup := e.got[k.(int)]; dup {
			t.Errorf("value %v both taken and ended", k)
		}
		cnt++
		return true
	})
	if cnt != n || tab.Len() != 0 {
		t.Fatalf("%d of %d values accounted for, %d live", cnt, n, tab.Len())
	}
}

// TestTakeIf: the check sees the value with the table locked (the lease
// cannot end between check and take), a refused lease stays live, a
// missing one is ErrNoLease without calling the check.
func TestTakeIf(t *testing.T) {
	errKind := errors.New("wrong kind")
	tests := []struct {
		name     string
		take     bool // the check accepts
		missing  bool
		wantErr  error
		wantLive int
	}{
		{"accepted", true, false, nil, 0},
		{"refused", false, false, errKind, 1},
		{"missing", true, true, ErrNoLease, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab, _, e := newTable(t, time.Second, 0)
			o := tab.NewOwner()
			id, err := o.Open(7)
			if err != nil {
				t.Fatal(err)
			}
			if tc.missing {
				id++
			}
			checked := false
			v, err := o.TakeIf(id, func(v int) error {
				checked = true
				if tab.mu.TryLock() {
					tab.mu.Unlock()
					t.Error("check ran without the table's lock held")
				}
				if v != 7 {
					t.Errorf("check saw %d, want 7", v)
				}
				if !tc.take {
					return errKind
				}
				return nil
			})
			if !errors.Is(err, tc.wantErr) || (err == nil) != (v == 7) {
				t.Fatalf("TakeIf = %d, %v; want err %v", v, err, tc.wantErr)
			}
			if checked == tc.missing {
				t.Fatalf("check called: %v, lease missing: %v", checked, tc.missing)
			}
			if tab.Len() != tc.wantLive || o.Len() != tc.wantLive || len(e.got) != 0 {
				t.Fatalf("live %d/%d, ended %v; want %d live, none ended", tab.Len(), o.Len(), e.got, tc.wantLive)
			}
		})
	}
}

// BenchmarkOpenTake: a lease opened and taken among 10000 live ones (the
// data socket's read lease on every lookup).
func BenchmarkOpenTake(b *testing.B) {
	tab := New(time.Minute, 0, func(int, Reason) {}, nil)
	o := tab.NewOwner()
	for i := range 10000 {
		if _, err := o.Open(i); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id, err := o.Open(i)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := o.Take(id); err != nil {
			b.Fatal(err)
		}
	}
}
