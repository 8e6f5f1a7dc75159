package store

import "iter"

// blockIndex maps keys to indexed blocks: one map per namespace, keyed by
// the hash alone. A chain lookup (PrefixOf) finds its namespace's map once
// and then hashes and compares only each hash, not a (namespace, hash)
// pair per block: that pair cost two string hashes and two compares a
// block, most of a 1,000-hash LOOKUP's time in the daemon
// (docs/performance.md). The store's locks guard it (Store.mu, idxMu).
type blockIndex struct {
	byNS map[string]map[string]*Block // a namespace's map goes with its last block
	n    int                          // blocks in all maps
}

func newBlockIndex() blockIndex { return blockIndex{byNS: make(map[string]map[string]*Block)} }

// get is key's block, or nil.
func (x *blockIndex) get(k Key) *Block { return x.byNS[k.Namespace][k.Hash] }

// namespace is ns's map (nil when ns holds no block); callers only read it.
func (x *blockIndex) namespace(ns string) map[string]*Block { return x.byNS[ns] }

// add indexes b, whose key must not be indexed.
func (x *blockIndex) add(b *Block) {
	m := x.byNS[b.key.Namespace]
	if m == nil {
		m = make(map[string]*Block)
		x.byNS[b.key.Namespace] = m
	}
	m[b.key.Hash] = b
	x.n++
}

// remove drops k (nothing when k is not indexed).
func (x *blockIndex) remove(k Key) {
	m := x.byNS[k.Namespace]
	if _, ok := m[k.Hash]; !ok {
		return
	}
	delete(m, k.Hash)
	x.n--
	if len(m) == 0 {
		delete(x.byNS, k.Namespace)
	}
}

func (x *blockIndex) len() int { return x.n }

// all yields every indexed block with its key, in no order.
func (x *blockIndex) all() iter.Seq2[Key, *Block] {
	return func(yield func(Key, *Block) bool) {
		for _, m := range x.byNS {
			for _, b := range m {
				if !yield(b.key, b) {
					return
				}
			}
		}
	}
}
