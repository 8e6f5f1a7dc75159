package reliability

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the suite starts (traffic, delay-line pumps, dialers,
// clients) must be gone when it ends; the spawner lives as long as the
// binary on purpose.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/pegaflow/pegad/internal/reliability.init.0.func1"))
}
