package reliability

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pegaflow/pegad/client"
)

// Every goroutine the suite starts (traffic, delay-line pumps, dialers,
// clients) must be gone when it ends; the spawner lives as long as the
// binary on purpose. With envLeaseHelper set, the binary is instead a
// local client process holding leases (leaseHelper).
func TestMain(m *testing.M) {
	if os.Getenv(envLeaseHelper) != "" {
		leaseHelper()
		return
	}
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/pegaflow/pegad/internal/reliability.init.0.func1"),
		goleak.Cleanup(func(code int) {
			if binaries.dir != "" {
				_ = os.RemoveAll(binaries.dir)
			}
			os.Exit(code)
		}))
}

// The lease helper: the test binary re-executed as a client of the daemon
// whose socket envLeaseHelper names.
const (
	envLeaseHelper = "RELIABILITY_LEASE_HELPER_SOCKET"
	envLeaseHashes = "RELIABILITY_LEASE_HASHES" // hex, comma-separated, namespace ns
	leaseAllocSize = 1 << 20
)

// leaseHelper leases every block of envLeaseHashes (zero-copy, in place),
// prints "block <hash> <sha256 of the leased bytes>" for each, allocates
// a block of leaseAllocSize bytes and writes half of it, prints "ready"
// and waits to be killed.
func leaseHelper() {
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, os.Getenv(envLeaseHelper))
	if err != nil {
		fail(err)
	}
	var hashes [][]byte
	for _, h := range strings.Split(os.Getenv(envLeaseHashes), ",") {
		b, err := hex.DecodeString(h)
		if err != nil {
			fail(err)
		}
		hashes = append(hashes, b)
	}
	res, err := c.LeaseBatch(ctx, ns, hashes)
	if err != nil {
		fail(err)
	}
	for i, r := range res {
		if r.Err != nil {
			fail(r.Err)
		}
		sum := sha256.Sum256(r.Reader.Bytes())
		fmt.Printf("block %x %x\n", hashes[i], sum)
	}
	w, err := c.Alloc(ctx, ns, []byte("reliability-half-written"), leaseAllocSize)
	if err != nil {
		fail(err)
	}
	for i := range w.Bytes()[:leaseAllocSize/2] {
		w.Bytes()[i] = byte(i)
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
	os.Exit(3)
}
