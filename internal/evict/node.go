// Package evict owns pegad's eviction policies: the order in which the
// store gives up unpinned blocks when an allocation needs room. It holds
// no blocks and no memory; the store (internal/store) embeds a Node in
// each block, tells the policy what happens to it (inserted, touched,
// removed) under the store's lock, and asks for victims in order.
//
// Three policies:
//   - Adaptive (issue 35; the default): W-TinyLFU with its window chosen
//     by shadow selection. Six metadata-only shadow caches (windows of 1
//     to 100 %, exact halving-aged counts) see every looked-up chain; the
//     real cache mirrors the one with the most recent prefix hits, so
//     the blocks that shadow did not admit or let go are evicted first
//     (adaptive.go, shadow.go). A put always enters; admission only
//     picks which blocks go first. A chain goes tail first.
//   - LRU: least recently used first (pegad's order before issue 25).
//   - Prefix: chain-aware and adaptive. A block's parent is the block
//     before it in its chain (the store learns it from lookups); a
//     parent always ranks above each of its cached children, so a
//     chain's head never goes before its tail and a block whose
//     descendants are cached is worth at least what they are. Ranks mix
//     recency with frequency (a count-min sketch that remembers evicted
//     blocks too), and a hill climber moves the mix while it watches the
//     prefix hit ratio, as Caffeine's window does.
//
// In all three, fetched copies (blocks another node holds too, prefetched
// from it) go before the blocks only this node holds.
//
// Policies are not safe for concurrent use: the store serialises calls.
// A policy never refuses a block, frees memory or calls the store.
package evict

import "fmt"

// Node is a policy's state for one block, embedded in the block. Value
// and ID are the owner's; the rest belongs to the policy that holds it.
type Node struct {
	Value any    // the owner's block
	ID    uint64 // a hash of the block's key (frequency sketch)

	// parent is the block before this one in its chain, or nil. A parent
	// removed before its children stays pointed at (not live) until a
	// child looks: liveParent drops it then.
	parent  *Node
	kids    int  // live blocks whose parent this is
	fetched bool // a copy another node also holds
	live    bool // held by a policy

	// LRU: list links; nil when not listed.
	prev, next *Node
	// Prefix: heap position (-1 when out) and rank.
	idx  int
	rank rank
	// Adaptive: the list n is in (prev/next are its links there).
	region region
}

// Parent is the cached block before n in its chain, or nil.
func (n *Node) Parent() *Node { return n.liveParent() }

func (n *Node) liveParent() *Node {
	if n.parent != nil && !n.parent.live {
		n.parent = nil
	}
	return n.parent
}

// Fetched reports whether n was inserted as a fetched copy.
func (n *Node) Fetched() bool { return n.fetched }

// link records n's place in the chains: parent (may be nil) gains a child.
// A parent that is not live (or n itself) is ignored.
func (n *Node) link(parent *Node, fetched bool) {
	n.fetched, n.live, n.parent, n.kids = fetched, true, nil, 0
	if parent != nil && parent.live && parent != n {
		n.parent = parent
		parent.kids++
	}
}

// unlink takes n out of the chains: its parent loses a child; its
// children find it not live (liveParent).
func (n *Node) unlink() {
	if p := n.liveParent(); p != nil {
		p.kids--
	}
	n.parent, n.live = nil, false
}

// Kind names a policy (the --eviction flag).
type Kind string

const (
	KindAdaptive Kind = "adaptive"
	KindLRU      Kind = "lru"
	KindPrefix   Kind = "prefix"
)

// Kinds lists the policies, the default first.
var Kinds = []Kind{KindAdaptive, KindPrefix, KindLRU}

// ParseKind checks a --eviction value.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("eviction policy %q: want one of %v", s, Kinds)
}

// Stats is what a policy reports about itself (admin stats).
type Stats struct {
	Policy string
	// Prefix only: the frequency weight the climber holds, the samples
	// it has judged and how often it turned.
	Weight         float64
	Samples, Turns uint64
	// Adaptive only: the window's share of the cache that the shadow
	// followed has (0.01..1; 1 is plain LRU), and how often it switched.
	Window   float64
	Switches uint64
}
