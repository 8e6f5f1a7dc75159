package evict

// nlist is an intrusive list of Nodes (their prev/next links) around a
// sentinel: front (root.next) most recent, back (root.prev) least. A node
// is in at most one list; its links are nil when it is in none.
type nlist struct {
	root Node
	n    int
}

func (l *nlist) init() { l.root.next, l.root.prev = &l.root, &l.root }

// back is the least recent node, or nil.
func (l *nlist) back() *Node {
	if l.n == 0 {
		return nil
	}
	return l.root.prev
}

// older is the node after n toward the back, or nil past the end.
func (l *nlist) older(n *Node) *Node {
	if n.prev == &l.root {
		return nil
	}
	return n.prev
}

func (l *nlist) pushFront(n *Node) {
	n.prev, n.next = &l.root, l.root.next
	l.root.next.prev = n
	l.root.next = n
	l.n++
}

// pushBack lists n least recent: next to go.
func (l *nlist) pushBack(n *Node) {
	n.prev, n.next = l.root.prev, &l.root
	l.root.prev.next = n
	l.root.prev = n
	l.n++
}

func (l *nlist) remove(n *Node) {
	n.prev.next = n.next
	n.next.prev = n.prev
	n.prev, n.next = nil, nil
	l.n--
}

// leafFirst yields the nodes of order (a full order, lowest first) but
// holds each back until every live child of it was yielded: a block whose
// parent is gone can never be a prefix hit, so a chain goes tail first.
// It changes nothing and stops when yield says so.
func leafFirst(order func(yield func(*Node) bool), yield func(*Node) bool) {
	var (
		given   map[*Node]int // children yielded, per parent
		waiting map[*Node]bool
	)
	var give func(n *Node) bool
	give = func(n *Node) bool {
		if !yield(n) {
			return false
		}
		par := n.liveParent()
		if par == nil {
			return true
		}
		if given == nil {
			given = make(map[*Node]int)
		}
		given[par]++
		if waiting[par] && given[par] >= par.kids {
			delete(waiting, par)
			return give(par)
		}
		return true
	}
	order(func(n *Node) bool {
		if n.kids > given[n] {
			if waiting == nil {
				waiting = make(map[*Node]bool)
			}
			waiting[n] = true
			return true
		}
		return give(n)
	})
}
