package daemon

import (
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

// closeTier writes what is queued and closes the logs; after every user
// of the store has stopped.
func (d *Daemon) closeTier() error {
	if d.tier == nil {
		return nil
	}
	if err := d.tier.Close(); err != nil {
		return fmt.Errorf("ssd tier: %w", err)
	}
	return nil
}
