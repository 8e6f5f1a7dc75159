package verbs

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the provider-independent suite against real RDMA
// hardware: three contexts of one device (PEGAD_TEST_VERBS_DEVICE, else the
// first usable one) talk to each other through the NIC's loopback. It skips
// where verbs is unavailable, which is every host without RDMA.
func TestConformance(t *testing.T) {
	p := New()
	devs, err := p.Devices()
	if err != nil {
		t.Skipf("verbs conformance needs an RDMA device: %v", err)
	}
	name := os.Getenv("PEGAD_TEST_VERBS_DEVICE")
	if name == "" {
		name = devs[0].Name
	}
	t.Logf("%s; testing %s", describeDevices(devs), name)
	ibvtest.Run(t, func(t *testing.T) ibvtest.Env {
		open := func() ibv.Device {
			t.Helper()
			d, err := p.Open(name)
			if err != nil {
				t.Fatalf("open %s: %v", name, err)
			}
			t.Cleanup(func() {
				if err := d.Close(); err != nil {
					t.Errorf("close %s: %v", name, err)
				}
			})
			return d
		}
		return ibvtest.Env{Requester: open(), Peer1: open(), Peer2: open()}
	})
}
