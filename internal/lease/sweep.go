package lease

import (
	"context"
	"time"
)

// DefaultSweepInterval is used when Sweep is given a non-positive interval.
const DefaultSweepInterval = time.Second

// Expirer ends every lease whose deadline is not after now and returns how
// many it ended. *Table, the holder's lock table and the local data
// server implement it.
type Expirer interface {
	ExpireBefore(now time.Time) int
}

// Expirers is one Expirer made of several: each sweep gives every one the
// same time, in order.
type Expirers []Expirer

// ExpireBefore ends what each Expirer holds past now; the sum.
func (es Expirers) ExpireBefore(now time.Time) int {
	n := 0
	for _, e := range es {
		n += e.ExpireBefore(now)
	}
	return n
}

// Sweep calls e.ExpireBefore(now()) every interval until ctx is done, then
// returns. now nil means time.Now. It starts no goroutine: the caller runs
// it in one it owns and stops it by cancelling ctx. The sweep costs what
// the Expirer makes it cost; the tables here keep it proportional to what
// expires, so a short interval is cheap.
func Sweep(ctx context.Context, interval time.Duration, e Expirer, now func() time.Time) {
	if interval <= 0 {
		interval = DefaultSweepInterval
	}
	if now == nil {
		now = time.Now
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			e.ExpireBefore(now())
		}
	}
}
