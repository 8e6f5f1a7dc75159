package evict

// TEMPORARY diagnostics (helper issue 35); deleted before the report.

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

type shadowSim struct {
	sh *shadow
	c  *counts
}

func (s shadowSim) Has(id uint64) bool { return s.sh.has(id) }
func (s shadowSim) Access(id uint64)   { s.c.add(id); s.sh.access(id, s.c) }

func TestDiag(t *testing.T) {
	cells, traces := tuneCells(t)
	halves := os.Getenv("HALVES")
	if halves == "" {
		halves = "full"
	}
	type out struct{ sh, real []float64 }
	res := make([]out, len(cells))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for i, c := range cells {
		if !containsWord(halves, c.Half) {
			continue
		}
		reqs := traces[c.Trace+"/"+c.Half]
		res[i] = out{make([]float64, len(shadowShares)), make([]float64, len(shadowShares))}
		for j, share := range shadowShares {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				cn := newCounts()
				cn.period = countPeriod * c.Cap
				sh := newShadow(share)
				sh.resize(c.Cap)
				res[i].sh[j] = runSim(reqs, shadowSim{sh, cn})
				a := NewAdaptive()
				a.sh.fixed, a.sh.best = true, j
				res[i].real[j] = simulate(t, reqs, c.Cap, a).Value()
			}()
		}
	}
	wg.Wait()
	for i, c := range cells {
		if !containsWord(halves, c.Half) {
			continue
		}
		best := max(c.LRU, c.WT, c.S3)
		fmt.Printf("%-6s %-6s %2d%% best %.3f  shadow:", c.Trace[8:14], c.Half, c.Share, best)
		for _, v := range res[i].sh {
			fmt.Printf(" %.3f", v/best)
		}
		fmt.Printf("  real:")
		for _, v := range res[i].real {
			fmt.Printf(" %.3f", v/best)
		}
		fmt.Println()
	}
}
