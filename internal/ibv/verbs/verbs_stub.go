//go:build !linux || !cgo || noverbs

package verbs

import "github.com/pegaflow/pegad/internal/ibv"

// errBuiltWithout is what every entry point returns in a build without the
// cgo implementation.
var errBuiltWithout = unavailable("built without cgo (or with -tags noverbs): only the tcp transport is available", nil)

// Devices reports ibv.ErrUnavailable: this build has no libibverbs support.
func (p *Provider) Devices() ([]ibv.DeviceInfo, error) { return nil, errBuiltWithout }

// Open reports ibv.ErrUnavailable: this build has no libibverbs support.
func (p *Provider) Open(name string) (ibv.Device, error) { return nil, errBuiltWithout }
