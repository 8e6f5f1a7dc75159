// Package gc is the lock sweeper: on every tick it asks an Expirer (the
// holder's lock table) to end the sessions whose deadline has passed.
//
// It owns no state and starts no goroutine: the daemon runs Run in a
// goroutine it owns and stops it by cancelling the context. It must never
// decide what expires; the Expirer does, from the time it is given.
package gc

import (
	"context"
	"time"
)

// DefaultInterval is used when Run is given a non-positive interval.
const DefaultInterval = time.Second

// Expirer ends every session whose deadline is not after now and returns
// how many it ended. *holder.LockTable implements it.
type Expirer interface {
	ExpireBefore(now time.Time) int
}

// Run calls e.ExpireBefore(now()) every interval until ctx is done, then
// returns. now nil means time.Now. The sweep cost is the Expirer's; the
// holder's lock table keeps it proportional to what expires, not to what
// is live, so a short interval is cheap.
func Run(ctx context.Context, interval time.Duration, e Expirer, now func() time.Time) {
	if interval <= 0 {
		interval = DefaultInterval
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
