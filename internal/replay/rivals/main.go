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

// simulate is evict.Simulate over a trace's requests.
func simulate(reqs []replay.Request, capacity int, p evict.Simulated) replay.Ratio {
	hits, accesses := evict.Simulate(replay.Chains(reqs), capacity, p)
	return replay.Ratio{Hits: hits, Accesses: accesses}
}
