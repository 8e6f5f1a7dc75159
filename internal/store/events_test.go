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
