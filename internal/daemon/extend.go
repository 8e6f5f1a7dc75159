package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// A large pool on many NICs takes longer to start (populate, mlock, one
// registration per NIC) than systemd's default 90 s start timeout; a unit
// killed mid-start loops on Restart=on-failure. While Start runs, pegad
// asks systemd for more time with EXTEND_TIMEOUT_USEC (sd_notify(3)).
var (
	extendEvery = 10 * time.Second // how often Start asks
	extendBy    = 30 * time.Second // how much more time each ask gives
)

// extendStart sends EXTEND_TIMEOUT_USEC through notify every extendEvery
// until stop is called (before READY=1, or on a failed start); stop waits
// for the sender and may be called more than once.
func extendStart(notify func(string)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(extendEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				notify(fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", extendBy.Microseconds()))
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}
