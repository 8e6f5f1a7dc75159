package evict

// LRU evicts the least recently used block first; fetched copies enter at
// the least recently used end, so they go first unless touched. It ignores
// chains.
type LRU struct {
	root Node // sentinel: root.next is the most recent, root.prev the least
	n    int
}

// NewLRU makes an empty LRU policy.
func NewLRU() *LRU {
	l := &LRU{}
	l.root.next, l.root.prev = &l.root, &l.root
	return l
}

func (l *LRU) Name() string { return string(KindLRU) }
func (l *LRU) Len() int     { return l.n }

// Insert lists n, most recent (least, when fetched).
func (l *LRU) Insert(n, parent *Node, fetched bool) {
	n.link(parent, fetched)
	at := &l.root
	if fetched {
		at = l.root.prev
	}
	l.insertAfter(n, at)
	l.n++
}

// Access touches the found blocks of a chain (nil: missing) in order;
// LRU needs no ids.
func (l *LRU) Access(chain []*Node, _ []uint64) {
	for _, n := range chain {
		if n != nil && n.next != nil {
			l.unlist(n)
			l.insertAfter(n, &l.root)
		}
	}
}

// Remove forgets n.
func (l *LRU) Remove(n *Node) {
	if n.next == nil {
		return
	}
	l.unlist(n)
	n.unlink()
	l.n--
}

// Walk yields the blocks least recently used first until yield says stop.
// It must not be called back into from yield.
func (l *LRU) Walk(yield func(*Node) bool) {
	for n := l.root.prev; n != &l.root; n = n.prev {
		if !yield(n) {
			return
		}
	}
}

// Stats: LRU has no tuning.
func (l *LRU) Stats() Stats { return Stats{Policy: l.Name()} }

func (l *LRU) insertAfter(n, at *Node) {
	n.prev, n.next = at, at.next
	at.next.prev = n
	at.next = n
}

func (l *LRU) unlist(n *Node) {
	n.prev.next = n.next
	n.next.prev = n.prev
	n.prev, n.next = nil, nil
}

// Demote moves n to the least recently used end, next to be evicted.
func (l *LRU) Demote(n *Node) {
	if n.next == nil {
		return
	}
	l.unlist(n)
	l.insertAfter(n, l.root.prev)
}
