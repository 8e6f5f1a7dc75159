package testutil

import (
	"sync"
	"unsafe"
)

// FakeNUMA is a pool.MemPolicy for a topology this host does not have
// (two sockets on a one-node machine): Bind records the policy the pool
// would set, instead of calling mbind, and NodeOf answers from what was
// recorded, as the kernel would once the bound pages are populated.
type FakeNUMA struct {
	mu    sync.Mutex // guards binds
	binds []NUMABind
}

// NUMABind is one recorded binding: [Addr, Addr+Len) to Node (MPOL_BIND).
type NUMABind struct {
	Addr, Len uint64
	Node      int
}

func (f *FakeNUMA) Bind(mem []byte, node int) error {
	if len(mem) == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.binds = append(f.binds, NUMABind{uint64(uintptr(unsafe.Pointer(&mem[0]))), uint64(len(mem)), node})
	return nil
}

// NodeOf is the node of the binding holding addr; 0 (this host's node)
// for unbound memory.
func (f *FakeNUMA) NodeOf(addr uint64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.binds {
		if addr >= b.Addr && addr-b.Addr < b.Len {
			return b.Node
		}
	}
	return 0
}

// Binds returns the bindings recorded so far, in order.
func (f *FakeNUMA) Binds() []NUMABind {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]NUMABind(nil), f.binds...)
}
