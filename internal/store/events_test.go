package store

import (
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
)

// recorder collects change notifications; calling back into the store
// from the subscriber proves it runs outside the store's lock (it would
// deadlock otherwise).
type recorder struct {
	s    *Store
	mu   sync.Mutex // guards got
	got  []string
	held []bool
}

func (r *recorder) note(k Key) {
	has := r.s.Has(k) // takes s.mu: deadlocks if called under it
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, k.Hash)
	r.held = append(r.held, has)
}

func (r *recorder) take() (keys []string, has []bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys, has = r.got, r.held
	r.got, r.held = nil, nil
	return keys, has
}

func TestOnChange(t *testing.T) {
	s, _ := newStore(t, 64*kib)
	r := &recorder{s: s}
	s.OnChange(r.note)
	sz := SlotSize{KSize: 16 * kib}

	steps := []struct {
		name     string
		do       func()
		wantKeys []string
		wantHas  []bool
	}{
		{"put", func() { mustPut(t, s, key(1), 1, sz) }, []string{"h0001"}, []bool{true}},
		{"put existing: no change", func() {
			if c, err := s.Put(key(1), []SlotSize{sz}, func([]byte) error { return nil }); c || err != nil {
				t.Fatalf("Put existing = %v, %v", c, err)
			}
		}, nil, nil},
		{"delete", func() {
			if _, err := s.Delete(key(1)); err != nil {
				t.Fatal(err)
			}
		}, []string{"h0001"}, []bool{false}},
		{"fill the pool", func() {
			for i := 2; i <= 5; i++ {
				mustPut(t, s, key(i), i, sz)
			}
		}, []string{"h0002", "h0003", "h0004", "h0005"}, []bool{true, true, true, true}},
		// The pool holds four such blocks: the fifth evicts the oldest.
		{"evict", func() { mustPut(t, s, key(6), 6, sz) }, []string{"h0002", "h0006"}, []bool{false, true}},
	}
	for _, st := range steps {
		st.do()
		keys, has := r.take()
		if strings.Join(keys, ",") != strings.Join(st.wantKeys, ",") {
			t.Fatalf("%s: notified %v, want %v", st.name, keys, st.wantKeys)
		}
		for i := range has {
			if has[i] != st.wantHas[i] {
				t.Fatalf("%s: Has(%s) in the callback = %v, want %v", st.name, keys[i], has[i], st.wantHas[i])
			}
		}
	}

	s.OnChange(nil)
	mustPut(t, s, key(7), 7, sz)
	if keys, _ := r.take(); len(keys) != 0 {
		t.Fatalf("notified %v after OnChange(nil)", keys)
	}
	var all []string
	for _, k := range s.Keys() {
		all = append(all, k.Hash)
	}
	sort.Strings(all)
	if got := strings.Join(all, ","); got != "h0004,h0005,h0006,h0007" {
		t.Fatalf("Keys() = %s", got)
	}
}

// TestOnEvents: the ordered subscriber gets each locked section's changes
// as one slice, in order and with their kind, while the lock is held (a
// TryLock inside the hook fails), and both subscribers see the same keys.
func TestOnEvents(t *testing.T) {
	s, _ := newStore(t, 64*kib)
	var got [][]string
	var underLock []bool
	s.OnEvents(func(cs []Change) {
		underLock = append(underLock, !s.mu.TryLock())
		var batch []string
		for _, c := range cs {
			batch = append(batch, c.Kind.String()+":"+c.Key.Hash)
		}
		got = append(got, batch)
	})
	r := &recorder{s: s}
	s.OnChange(r.note)
	sz := SlotSize{KSize: 16 * kib}
	for i := 1; i <= 4; i++ {
		mustPut(t, s, key(i), i, sz)
	}
	mustPut(t, s, key(5), 5, sz) // evicts h0001 in AllocExtent, then stores h0005
	if _, err := s.Delete(key(3)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(key(3)); err == nil {
		t.Fatal("second Delete succeeded")
	}
	want := "stored:h0001|stored:h0002|stored:h0003|stored:h0004|evicted:h0001|stored:h0005|deleted:h0003"
	var flat []string
	for _, b := range got {
		flat = append(flat, strings.Join(b, ","))
	}
	if g := strings.Join(flat, "|"); g != want {
		t.Fatalf("events %s\nwant   %s", g, want)
	}
	for i, u := range underLock {
		if !u {
			t.Fatalf("batch %d delivered without the store lock held", i)
		}
	}
	keys, _ := r.take()
	if g := strings.Join(keys, ","); g != "h0001,h0002,h0003,h0004,h0001,h0005,h0003" {
		t.Fatalf("OnChange saw %s", g)
	}
	s.OnEvents(nil)
	mustPut(t, s, key(6), 6, sz)
	if len(got) != len(flat) {
		t.Fatalf("OnEvents(nil) still delivered: %v", got[len(flat):])
	}
}

// TestImports keeps the store a state-only package (ARCHITECTURE.md "One
// owner of state, one adapter to the network"): it must not reach the
// network through gRPC or Redis, not even indirectly.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Skipf("go list unavailable: %v: %s", err, out)
	}
	forbidden := []string{"google.golang.org/grpc", "github.com/redis/", "github.com/pegaflow/pegad/internal/index"}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("internal/store depends on %s (forbidden prefix %s)", dep, f)
			}
		}
	}
}
