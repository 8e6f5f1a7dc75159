package daemon

import (
	"errors"
	"fmt"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/store"
)

// Namespace quotas (--namespace-quota): the store enforces them
// (internal/store's quota.go); the daemon sets them at start and again on
// every SIGHUP from the configuration read afresh.

// errNoReload: the daemon was started without a way to read its
// configuration again (WithConfigReload), so SIGHUP keeps the quotas.
var errNoReload = errors.New("no configuration source to reload")

// WithConfigReload gives the daemon load, which reads the configuration
// again as start-up did (flags, environment, file); SIGHUP applies the
// namespace quotas of what it returns. Without it SIGHUP reloads only the
// peer TLS files.
func WithConfigReload(load func() (config.Config, error)) Option {
	return func(o *options) { o.reload = load }
}

// storeQuotas is cfg's namespace-quota key as the store takes it.
func storeQuotas(cfg *config.Config) ([]store.Quota, error) {
	qs, err := cfg.NamespaceQuotas()
	if err != nil {
		return nil, config.Invalid(fmt.Errorf("namespace-quota: %w", err))
	}
	out := make([]store.Quota, len(qs))
	for i, q := range qs {
		out[i] = store.Quota{Prefix: q.NS, Bytes: uint64(q.Size)}
	}
	return out, nil
}

// applyQuotas sets cfg's quotas on the store (evicting at once where a
// namespace holds more than its new quota).
func (d *Daemon) applyQuotas(cfg *config.Config) error {
	qs, err := storeQuotas(cfg)
	if err != nil {
		return err
	}
	if err := d.store.SetQuotas(qs); err != nil {
		return config.Invalid(fmt.Errorf("namespace-quota: %w", err))
	}
	for _, q := range qs {
		d.log.Info().Str("namespace", q.Prefix).Uint64("quota_bytes", q.Bytes).Msg("Namespace quota")
	}
	return nil
}

// ReloadQuotas reads the configuration again (WithConfigReload) and
// applies its namespace quotas, as SIGHUP does. On error the quotas in
// force stay.
func (d *Daemon) ReloadQuotas() error {
	if d.opts.reload == nil {
		return errNoReload
	}
	cfg, err := d.opts.reload()
	if err != nil {
		return fmt.Errorf("reload configuration: %w", err)
	}
	return d.applyQuotas(&cfg)
}

// reloadQuotasOnHUP is SIGHUP's quota part: logged, never fatal.
func (d *Daemon) reloadQuotasOnHUP() {
	err := d.ReloadQuotas()
	switch {
	case errors.Is(err, errNoReload):
	case err != nil:
		d.log.Error().Err(err).Msg("SIGHUP: namespace quotas not reloaded; the quotas in force stay")
	default:
		d.log.Info().Int("quotas", len(d.store.Quotas())).Msg("SIGHUP: namespace quotas reloaded")
	}
}
