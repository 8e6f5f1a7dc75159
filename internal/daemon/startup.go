package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/pool"
)

// poolProgressEvery is how often start-up says it is still populating the
// pool (mapping and locking a large pool takes seconds).
var poolProgressEvery = 2 * time.Second

// newPool maps the pool, logging before, during (every poolProgressEvery)
// and after, so that a slow start is visibly busy. An allocation failure
// says how the size compares with the host's RAM.
func newPool(size config.ByteSize, hugePages string, nodes []int, log zerolog.Logger) (*pool.Pool, error) {
	// A pool larger than the host's RAM cannot be populated (at best
	// ENOMEM, at worst the OOM killer): the configuration's fault, refused
	// before anything is mapped.
	if ram := memTotal(); ram > 0 && uint64(size) > ram {
		return nil, config.Invalid(fmt.Errorf("pool-size %s is larger than this host's memory (%s RAM)", size, iec(ram)))
	}
	start := time.Now()
	log.Info().Str("pool_size", size.String()).Msg("Populating pool")
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() { // progress; stops when pool.New returns
		defer close(stopped)
		t := time.NewTicker(poolProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				log.Info().Str("pool_size", size.String()).Float64("elapsed", time.Since(start).Seconds()).
					Msg("Still populating pool")
			}
		}
	}()
	p, err := pool.New(pool.Options{Size: uint64(size), Lock: true, Log: log, HugePages: hugePages, Nodes: nodes})
	close(done)
	<-stopped
	if err != nil {
		// pool's errors already start with "pool: ".
		if errors.Is(err, syscall.ENOMEM) {
			if ram := memTotal(); ram > 0 {
				return nil, fmt.Errorf("pool-size %s does not fit in this host's memory (%s RAM): %w", size, iec(ram), err)
			}
			return nil, fmt.Errorf("pool-size %s does not fit in this host's memory: %w", size, err)
		}
		return nil, err
	}
	log.Info().Str("pool_size", size.String()).Float64("took", time.Since(start).Seconds()).Msg("Pool ready")
	return p, nil
}

// memTotal is MemTotal from /proc/meminfo in bytes; 0 when unknown.
func memTotal() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// iec formats n bytes in IEC units with one decimal ("15.6 GiB").
func iec(n uint64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	if n < 1<<10 {
		return strconv.FormatUint(n, 10) + " B"
	}
	v, u := float64(n)/(1<<10), 0
	for v >= 1<<10 && u < len(units)-1 {
		v /= 1 << 10
		u++
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + units[u]
}
