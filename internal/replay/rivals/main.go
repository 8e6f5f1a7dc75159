// Command rivals is `make replay`'s simulator side (issue 35): for a
// trace and a capacity it prints, as one JSON object, the prefix hit
// ratio of the fixed rivals (LRU, W-TinyLFU, S3-FIFO), Belady's optimum,
// and pegad's own policies run in process (the daemon's figure comes
// from pegactl bench replay beside it). With -half first|second it
// replays that half of the trace alone: tuning used the first half of
// the synthetic trace, the second is the held-out check. It never
// starts a daemon.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/replay"
)

func main() {
	trace := flag.String("trace", "", "trace file (JSONL, .gz too)")
	capacity := flag.Int("capacity", 0, "cache capacity in blocks (0: -share of the unique blocks)")
	share := flag.Int("share", 0, "capacity as a percentage of the (half) trace's unique blocks")
	half := flag.String("half", "", "first or second: replay that half of the trace only")
	flag.Parse()
	reqs, err := replay.ReadTraceFile(*trace)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rivals:", err)
		os.Exit(2)
	}
	switch *half {
	case "first":
		reqs = reqs[:len(reqs)/2]
	case "second":
		reqs = reqs[len(reqs)/2:]
	case "":
	default:
		fmt.Fprintln(os.Stderr, "rivals: -half is first or second")
		os.Exit(2)
	}
	c := *capacity
	if c == 0 {
		_, u := replay.Stats(reqs)
		c = replay.CapacityAt(u, *share)
	}
	out := map[string]any{
		"capacity": c,
		"lru":      replay.LRU(reqs, c).Value(),
		"wtinylfu": replay.WTinyLFU(reqs, c).Value(),
		"s3fifo":   replay.S3FIFO(reqs, c).Value(),
		"belady":   replay.Belady(reqs, c).Value(),
		"adaptive": simulate(reqs, c, evict.NewAdaptive()).Value(),
		"prefix":   simulate(reqs, c, evict.NewPrefix()).Value(),
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}

type policy interface {
	Insert(n, parent *evict.Node, fetched bool)
	Access(chain []*evict.Node, ids []uint64)
	Remove(n *evict.Node)
	Walk(yield func(*evict.Node) bool)
	Len() int
}

// simulate replays reqs as the daemon sees them (replay.Drive): a
// request looks its chain up, its longest held prefix counts, and the
// missing blocks after it are put, evicting the policy's first victim
// while capacity blocks are held.
func simulate(reqs []replay.Request, capacity int, p policy) replay.Ratio {
	var r replay.Ratio
	at := make(map[uint64]*evict.Node)
	for _, req := range reqs {
		chain := make([]*evict.Node, len(req.HashIDs))
		hit := -1
		for i, h := range req.HashIDs {
			chain[i] = at[h]
			if chain[i] == nil && hit < 0 {
				hit = i
			}
		}
		if hit < 0 {
			hit = len(chain)
		}
		r.Hits += uint64(hit)
		r.Accesses += uint64(len(chain))
		p.Access(chain, req.HashIDs)
		// The daemon allocates the request's missing blocks in one batch
		// (AllocBatch), evicting for each, and indexes them all at commit:
		// all the evictions come before any insert.
		var put []int
		for i := hit; i < len(chain); i++ {
			if at[req.HashIDs[i]] == nil {
				put = append(put, i)
			}
		}
		for p.Len() > 0 && p.Len()+len(put) > capacity {
			var v *evict.Node
			p.Walk(func(n *evict.Node) bool { v = n; return false })
			p.Remove(v)
			delete(at, v.ID)
		}
		for _, i := range put[max(0, len(put)-capacity):] {
			h := req.HashIDs[i]
			n := &evict.Node{ID: h}
			var parent *evict.Node
			if i > 0 {
				parent = at[req.HashIDs[i-1]]
			}
			p.Insert(n, parent, false)
			at[h] = n
		}
	}
	return r
}
