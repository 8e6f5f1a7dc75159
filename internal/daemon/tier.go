package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/ssd"
)

// openTier opens the SSD tier (--ssd-path) under the store and installs
// it as the store's lower tier; nothing without --ssd-path. Its metrics
// are registered either way. A path that cannot hold a log is the
// configuration's fault (exit 78): restarting does not make a directory
// writable or a disk larger.
func (d *Daemon) openTier() error {
	tm := metrics.NewTier(d.reg)
	paths := d.cfg.SSDPaths()
	if len(paths) == 0 {
		return nil
	}
	start := time.Now()
	t, err := ssd.Open(ssd.Options{
		Paths:   paths,
		Size:    uint64(d.cfg.SSDSize),
		Metrics: tm,
		Log:     d.log.With().Str("component", "ssd").Logger(),
	})
	if err != nil {
		if errors.Is(err, ssd.ErrUnusable) {
			err = config.Invalid(err)
		}
		return fmt.Errorf("ssd-path: %w", err)
	}
	d.tier = t
	d.store.SetLower(t, tm)
	st := t.Stats()
	d.log.Info().Strs("paths", paths).Str("ssd_size", d.cfg.SSDSize.String()).Uint64("blocks", st.Blocks).
		Uint64("bytes", st.Bytes).Float64("took", time.Since(start).Seconds()).Msg("SSD tier ready")
	return nil
}

// closeTier writes the pool's blocks the tier lacks (most recently used
// first, until by), then what is queued, and closes the logs; after every
// user of the store has stopped, so that a clean restart finds the pool's
// blocks on SSD.
func (d *Daemon) closeTier(by time.Time) error {
	if d.tier == nil {
		return nil
	}
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), by)
	n, err := d.store.FlushLower(ctx)
	cancel()
	ev := d.log.Info()
	if err != nil {
		ev = d.log.Warn().Err(err)
	}
	ev.Int("blocks", n).Float64("took", time.Since(start).Seconds()).Msg("Wrote the pool's blocks to the SSD tier")
	if err := d.tier.Close(); err != nil {
		return fmt.Errorf("ssd tier: %w", err)
	}
	return nil
}
