// Package ssd is pegad's SSD tier: blocks the pool evicts are written to a
// log on one or more local disks (--ssd-path, one directory per device)
// and read back into the pool when a lookup asks for them (store.Lower).
//
// It owns the log files (one per path, preallocated to --ssd-size), the
// in-memory index of what they hold, and one writer goroutine per path.
// Each log is a ring of equal segments written sequentially, record after
// record (record.go): space is never rewritten in place; when the ring
// wraps, the oldest segment is reclaimed whole and the blocks in it are
// forgotten (aged out, in write order: FIFO over evictions). At start the
// index is rebuilt from the records' headers (recover.go), so blocks
// survive a restart, clean or kill -9. A block deleted or dropped from
// the tier gets a tombstone record after it, so it stays gone. Every
// record carries the tier's write order over all paths (seq): at start a
// key's newest record, a block or a tombstone, wins, on whichever path.
//
// It must never make the store wait: Spill (under the store's lock) only
// copies the block into a queue buffer, or drops it and counts why when
// the queue is full. It must never serve a wrong byte: every read back is
// checked against the record's CRC32C, and a block that fails is dropped,
// counted and reported missing. It never calls the store.
package ssd

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// Sizing defaults (docs/tiering.md "Sizing").
const (
	// MinSize is the smallest --ssd-size: four segments of 1 MiB.
	MinSize = 4 << 20
	// DefaultQueueBytes bounds each path's write queue: evicted blocks
	// copied out of the pool and not yet written (Go heap memory).
	DefaultQueueBytes = 256 << 20
	// LogName is the log file inside each --ssd-path directory.
	LogName = "pegad-ssd.log"

	targetSegment = 256 << 20
	minSegments   = 4
	maxSegments   = 4096
)

var (
	// ErrNotFound: the tier does not hold the block.
	ErrNotFound = errors.New("ssd: block not on the SSD tier")
	// ErrUnusable: a path cannot hold a log (not a directory, not
	// writable, no room for --ssd-size, in use by another pegad).
	ErrUnusable = errors.New("ssd: path unusable")
)

// Options configure a Tier.
type Options struct {
	Paths []string // one directory per device
	Size  uint64   // log bytes per path (rounded down to Align)
	// SegmentSize is the ring's unit (0: Size/4..Size/4096, near 256 MiB).
	// The largest block the tier takes is one segment less a header.
	SegmentSize uint64
	QueueBytes  uint64        // per path; 0: DefaultQueueBytes
	Metrics     *metrics.Tier // may be nil
	Log         zerolog.Logger
}

// loc is where a block's record lives.
type loc struct {
	dev     *device
	seg     int
	epoch   uint64 // the segment's epoch when written: stale once reclaimed
	off     int64  // record offset in the file
	hdrLen  uint32
	dataLen uint64
	sizes   []store.SlotSize // the block's slots (listing)
	// seq is the record's place in the tier's write order (on disk in
	// version 2; recover numbers version 1 records below them): the
	// newest record of a key wins at start, and listings page by it.
	seq uint64
}

// same reports whether a and b are the same record.
func (a loc) same(b loc) bool { return a.dev == b.dev && a.off == b.off && a.epoch == b.epoch }

// job is an evicted block waiting for its writer.
type job struct {
	key     store.Key
	sizes   []store.SlotSize
	rec     []byte // aligned record: header room, then the data
	dataLen uint64
	tomb    bool    // a tombstone of key (rec is its header room)
	dev     *device // the path whose queue it is on
	seq     uint64  // its record's seq, given when queued

	// Guarded by Tier.mu.
	forgotten bool // deleted while queued or being written
	writing   bool // its writer has started writing the record
}

// Tier is safe for concurrent use.
type Tier struct {
	opts Options
	m    *metrics.Tier
	log  zerolog.Logger
	devs []*device // immutable after Open

	// mu guards index, pending, bytes, closed, and every device's
	// queued, segEpoch and segKeys. It is a leaf: the store calls Spill,
	// Has and Forget holding its own lock, so nothing here calls out
	// while holding mu, and no I/O happens under it.
	mu      sync.Mutex
	index   map[store.Key]loc
	pending map[store.Key]*job // queued, not yet written
	bytes   uint64             // data bytes of the indexed blocks
	seq     uint64             // last record seq given out (recover resumes after the highest on disk)
	queued  int                // jobs queued over all devices
	closed  bool
	// Subscribers (hooks.go), called under mu.
	onChange func(store.Key)
	onEvents func([]store.Change)

	wg sync.WaitGroup // writer goroutines; they end when Close closes the queues
}

// device is one path's log.
type device struct {
	path    string // the log file
	f       *os.File
	direct  bool
	segSize uint64
	nseg    int
	queue   chan *job // closed by Close (under Tier.mu)

	// Guarded by Tier.mu.
	queuedBytes uint64
	segEpoch    []uint64      // epoch of each segment's records; 0: none
	segKeys     [][]store.Key // keys written in each segment (some may have moved or gone)

	// Owned by the writer goroutine (set by Open before it starts).
	cur       int    // segment being written
	wpos      uint64 // next write offset in it
	nextEpoch uint64
}

// geometry picks the segment size of a log of size bytes.
func geometry(size, seg uint64) (segSize uint64, nseg int) {
	if seg == 0 {
		n := min(max(size/targetSegment, minSegments), maxSegments)
		seg = size / n
	}
	seg &^= Align - 1
	return seg, int(size / seg)
}

// Open opens (creating) the log of every path and rebuilds the index from
// what they hold. An error wraps ErrUnusable when a path is at fault.
func Open(o Options) (*Tier, error) {
	if len(o.Paths) == 0 {
		return nil, fmt.Errorf("%w: no path", ErrUnusable)
	}
	o.Size &^= Align - 1
	if o.Size < MinSize {
		return nil, fmt.Errorf("%w: size %d is below the minimum %d", ErrUnusable, o.Size, MinSize)
	}
	if o.QueueBytes == 0 {
		o.QueueBytes = DefaultQueueBytes
	}
	t := &Tier{opts: o, m: o.Metrics, log: o.Log, index: make(map[store.Key]loc), pending: make(map[store.Key]*job)}
	for _, p := range o.Paths {
		d, err := t.openDevice(p)
		if err != nil {
			t.closeFiles()
			return nil, err
		}
		t.devs = append(t.devs, d)
	}
	if err := t.recover(); err != nil {
		t.closeFiles()
		return nil, err
	}
	if t.m != nil {
		t.m.Capacity.Set(float64(o.Size) * float64(len(o.Paths)))
	}
	t.mu.Lock()
	t.gaugesLocked()
	t.mu.Unlock()
	for _, d := range t.devs {
		t.wg.Add(1)
		go t.writer(d)
	}
	return t, nil
}

func (t *Tier) openDevice(dir string) (*device, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnusable, err)
	}
	path := filepath.Join(dir, LogName)
	f, direct, err := openLog(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnusable, err)
	}
	fail := func(err error) (*device, error) {
		_ = f.Close()
		return nil, fmt.Errorf("%w: %s: %w", ErrUnusable, path, err)
	}
	if err := lockLog(f); err != nil {
		return fail(err)
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	segSize, nseg := geometry(t.opts.Size, t.opts.SegmentSize)
	if nseg < 1 || segSize < Align*2 {
		return fail(fmt.Errorf("segment size %d does not fit size %d", segSize, t.opts.Size))
	}
	lf, why, err := readFormat(f, uint64(fi.Size()), t.opts.Size, segSize)
	if err != nil {
		return fail(err)
	}
	if why != "" {
		// Another size or format means records this pegad cannot find
		// again or read: start empty rather than misread them.
		t.log.Warn().Str("path", path).Int64("was", fi.Size()).Uint64("size", t.opts.Size).Str("why", why).
			Msg("SSD log has another size or format: starting it empty")
		if err := f.Truncate(0); err != nil {
			return fail(err)
		}
	}
	if lf == formatV1 {
		t.log.Info().Str("path", path).Msg("SSD log of format 1: its records are read, new ones are format 2")
	}
	prealloc, err := reserve(f, int64(t.opts.Size+Align)) // the ring, then its format page
	if err != nil {
		return fail(fmt.Errorf("reserve %d bytes: %w", t.opts.Size+Align, err))
	}
	if lf != formatMarked {
		if err := markFormat(f, t.opts.Size, segSize); err != nil {
			return fail(err)
		}
	}
	if !direct {
		t.log.Warn().Str("path", path).Msg("File system refuses O_DIRECT: SSD tier uses buffered I/O (page cache)")
	}
	if !prealloc {
		t.log.Warn().Str("path", path).Msg("File system lacks fallocate: SSD log is sparse and may meet a full disk")
	}
	return &device{
		path: path, f: f, direct: direct, segSize: segSize, nseg: nseg,
		queue:    make(chan *job, 1<<16),
		segEpoch: make([]uint64, nseg), segKeys: make([][]store.Key, nseg),
	}, nil
}

func (t *Tier) closeFiles() {
	for _, d := range t.devs {
		_ = d.f.Close()
	}
}

// Close stops accepting blocks, writes what is queued, and closes the
// logs. The index stays readable until Close returns; Load after it fails.
func (t *Tier) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	for _, d := range t.devs {
		close(d.queue)
	}
	t.mu.Unlock()
	t.wg.Wait()
	var errs []error
	for _, d := range t.devs {
		errs = append(errs, d.f.Sync(), d.f.Close())
	}
	return errors.Join(errs...)
}

// Direct reports, per path, whether the log uses direct I/O.
func (t *Tier) Direct() []bool {
	out := make([]bool, len(t.devs))
	for i, d := range t.devs {
		out[i] = d.direct
	}
	return out
}

// Stats is a snapshot.
type Stats struct {
	Blocks, Bytes, Capacity uint64
	Queued                  int
}

// Stats returns the tier's counts.
func (t *Tier) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Stats{Blocks: uint64(len(t.index)), Bytes: t.bytes, Capacity: t.opts.Size * uint64(len(t.devs)), Queued: t.queued}
}

// Keys lists the keys the tier holds.
func (t *Tier) Keys() []store.Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]store.Key, 0, len(t.index))
	for k := range t.index {
		keys = append(keys, k)
	}
	return keys
}

func (t *Tier) gaugesLocked() {
	if t.m == nil {
		return
	}
	t.m.Blocks.Set(float64(len(t.index)))
	t.m.Bytes.Set(float64(t.bytes))
	t.m.QueueDepth.Set(float64(t.queued))
}

func (t *Tier) drop(reason string) {
	if t.m != nil {
		t.m.Drops.WithLabelValues(reason).Inc()
	}
}

// indexLocked records key at l (l.seq set), replacing an older copy.
func (t *Tier) indexLocked(key store.Key, l loc) {
	if old, ok := t.index[key]; ok {
		t.bytes -= old.dataLen
	}
	t.index[key] = l
	t.bytes += l.dataLen
	l.dev.segKeys[l.seg] = append(l.dev.segKeys[l.seg], key)
}

// forgetLocked drops key if it is still at l.
func (t *Tier) forgetLocked(key store.Key, l loc) bool {
	if cur, ok := t.index[key]; !ok || !cur.same(l) {
		return false
	}
	delete(t.index, key)
	t.bytes -= l.dataLen
	return true
}

// Page lists up to limit blocks of ns ("" = all) indexed before seq
// before (0: from the newest), newest first, leaving out those skip
// reports (store.LowerLister: the store skips its own). The tier's lock
// is held only to copy the candidates; sorting and skip run after, so a
// listing costs O(n log n) in the blocks on the tier but never holds up
// spills for long.
func (t *Tier) Page(ns string, before uint64, limit int, skip func(store.Key) bool) (entries []store.LowerEntry, next uint64) {
	t.mu.Lock()
	cands := make([]store.LowerEntry, 0, len(t.index))
	for k, l := range t.index {
		if (ns == "" || k.Namespace == ns) && (before == 0 || l.seq < before) {
			cands = append(cands, store.LowerEntry{Key: k, Slots: l.sizes, Size: l.dataLen, Seq: l.seq})
		}
	}
	t.mu.Unlock()
	slices.SortFunc(cands, func(a, b store.LowerEntry) int { return cmp.Compare(b.Seq, a.Seq) })
	for _, e := range cands {
		if skip != nil && skip(e.Key) {
			continue
		}
		if len(entries) == limit {
			return entries, entries[len(entries)-1].Seq
		}
		e.Slots = append([]store.SlotSize(nil), e.Slots...)
		entries = append(entries, e)
	}
	return entries, 0
}
