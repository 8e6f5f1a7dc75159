package ssd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

var _ store.Lower = (*Tier)(nil)

// writeHook runs in a path's writer before it writes each job, with no
// lock held; tests hold a writer there.
var writeHook = func(*job) {}

// Spill queues an evicted block for writing (store.Lower). It runs under
// the store's lock: it reserves room in a path's write queue (or drops
// the block and counts why), then copies the block into a fresh record
// buffer through fill with the tier's own lock released, so lookups are
// not held up by the copy; it never waits for a disk. A block the tier
// already holds or has queued is not written again (keys name content).
func (t *Tier) Spill(key store.Key, sizes []store.SlotSize, size uint64, fill func(dst []byte)) {
	t.spill(key, sizes, size, fill, false)
}

// SpillWait is Spill that waits for room in a write queue instead of
// dropping the block, until ctx ends (store.Lower; a clean stop writes
// the pool's blocks with it). It must not be called under the store's
// lock.
func (t *Tier) SpillWait(ctx context.Context, key store.Key, sizes []store.SlotSize, size uint64, fill func(dst []byte)) error {
	for t.spill(key, sizes, size, fill, true) {
		select {
		case <-ctx.Done():
			t.drop(metrics.SSDDropQueueFull)
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// spill is Spill; with wait, a full queue is not a drop: it reports
// retry instead.
func (t *Tier) spill(key store.Key, sizes []store.SlotSize, size uint64, fill func(dst []byte), wait bool) (retry bool) {
	rl := recordLen(key, len(sizes), size)
	t.mu.Lock()
	d, reason := t.reserveLocked(key, rl)
	if d == nil {
		t.mu.Unlock()
		if wait && reason == metrics.SSDDropQueueFull {
			return true
		}
		if reason != "" {
			t.drop(reason)
		}
		return false
	}
	j := &job{key: key, sizes: append([]store.SlotSize(nil), sizes...), dataLen: size, dev: d}
	t.pending[key] = j
	t.mu.Unlock()

	j.rec = getBuf(rl)
	hl := headerLen(key, len(sizes))
	fill(j.rec[hl : hl+size])

	t.mu.Lock()
	defer t.mu.Unlock()
	sent := false
	if !t.closed { // Close closes the queues under mu
		t.seq++ // given as it is queued, under mu: the tier's order (a gap if it is not)
		j.seq = t.seq
		select {
		case d.queue <- j:
			sent = true
		default:
		}
	}
	if !sent {
		d.queuedBytes -= rl
		t.queued--
		if t.pending[key] == j {
			delete(t.pending, key)
		}
		putBuf(j.rec)
		if t.closed {
			t.drop(metrics.SSDDropClosed)
		} else {
			t.drop(metrics.SSDDropQueueFull)
		}
	}
	t.gaugesLocked()
	return false
}

// reserveLocked picks the least loaded path with room for a record of rl
// bytes and counts it queued; nil with a drop reason when none has room,
// nil with "" when key needs no write.
func (t *Tier) reserveLocked(key store.Key, rl uint64) (*device, string) {
	if t.closed {
		return nil, metrics.SSDDropClosed
	}
	if _, ok := t.index[key]; ok {
		return nil, ""
	}
	if t.pending[key] != nil {
		return nil, ""
	}
	var d *device
	for _, c := range t.devs {
		if rl <= c.segSize && c.queuedBytes+rl <= t.opts.QueueBytes && (d == nil || c.queuedBytes < d.queuedBytes) {
			d = c
		}
	}
	if d == nil {
		if rl > t.devs[0].segSize {
			return nil, metrics.SSDDropTooLarge
		}
		return nil, metrics.SSDDropQueueFull
	}
	d.queuedBytes += rl
	t.queued++
	return d, ""
}

// Has reports whether the tier holds key (written, not aged out).
func (t *Tier) Has(key store.Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.index[key]
	return ok
}

// Forget drops key and cancels its queued write (store.Delete). The
// record stays on disk until its segment is reclaimed, so a tombstone is
// queued after it: a restart does not find the block again. A write
// already under way when Forget runs gets its tombstone now, on its path
// behind it and with a higher seq, and before any record of the key
// spilled again after the Forget: that one comes back after a restart.
func (t *Tier) Forget(key store.Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	had := false
	if j := t.pending[key]; j != nil {
		j.forgotten = true
		delete(t.pending, key)
		had = true
		if j.writing {
			t.tombLocked(j.dev, key)
		}
	}
	if l, ok := t.index[key]; ok && t.forgetLocked(key, l) {
		had = true
		t.tombLocked(l.dev, key)
		t.emitLocked(store.Deleted, key)
		t.gaugesLocked()
	}
	return had
}

// tombLocked queues a tombstone of key on d, whose log holds a record of
// it. It never waits (callers hold the store's lock): with d's queue
// full, or the tier closing, the tombstone is lost and counted.
func (t *Tier) tombLocked(d *device, key store.Key) {
	if t.closed {
		t.tombLost(d, key, "tier closing")
		return
	}
	rl := headerLen(key, 0)
	t.seq++
	j := &job{key: key, tomb: true, rec: getBuf(rl), dev: d, seq: t.seq}
	select {
	case d.queue <- j:
		d.queuedBytes += rl
		t.queued++
	default:
		putBuf(j.rec)
		t.tombLost(d, key, "write queue full")
	}
}

func (t *Tier) tombLost(d *device, key store.Key, why string) {
	if t.m != nil {
		t.m.Tombstones.WithLabelValues(metrics.TombstoneLost).Inc()
	}
	t.log.Warn().Str("path", d.path).Str("namespace", key.Namespace).Hex("hash", []byte(key.Hash)).Str("why", why).
		Msg("SSD tombstone not written: a restart may find the dropped block again")
}

// Load reads key's record back, checks it, and hands its slot sizes and
// bytes to use (store.Lower), which must not keep them: the buffer is
// recycled when use returns. use runs without the tier's lock, so it may
// call the store. A record that fails its checksum or cannot be read is
// dropped from the index and counted; a record whose segment was
// reclaimed during the read is reported not found.
func (t *Tier) Load(key store.Key, use func(sizes []store.SlotSize, data []byte) error) error {
	sizes, data, buf, err := t.load(key)
	if err != nil {
		return err
	}
	defer putBuf(buf)
	return use(sizes, data)
}

// load is Load's read and check; data lies in buf, the caller's to
// recycle.
func (t *Tier) load(key store.Key) (sizes []store.SlotSize, data, buf []byte, err error) {
	t.mu.Lock()
	l, ok := t.index[key]
	closed := t.closed
	t.mu.Unlock()
	if !ok || closed {
		return nil, nil, nil, ErrNotFound
	}
	buf = getBuf(uint64(l.hdrLen) + alignUp(l.dataLen))
	_, rerr := l.dev.f.ReadAt(buf, l.off)

	t.mu.Lock()
	defer t.mu.Unlock()
	fail := func(err error) ([]store.SlotSize, []byte, []byte, error) {
		putBuf(buf)
		return nil, nil, nil, err
	}
	if l.dev.segEpoch[l.seg] != l.epoch {
		return fail(ErrNotFound) // aged out while we read: not corruption
	}
	if cur, ok := t.index[key]; !ok || !cur.same(l) {
		return fail(ErrNotFound) // forgotten (deleted) while we read: the delete wins
	}
	if rerr != nil {
		if t.forgetLocked(key, l) {
			t.tombLocked(l.dev, key)
			t.emitLocked(store.Evicted, key)
		}
		t.gaugesLocked()
		if t.m != nil {
			t.m.ReadErrors.Inc()
		}
		t.log.Error().Err(rerr).Str("path", l.dev.path).Int64("offset", l.off).Msg("SSD read failed: block dropped")
		return fail(fmt.Errorf("ssd: read %s: %w", l.dev.path, rerr))
	}
	h, _, err := decodeHeader(buf)
	if err == nil && (h.key != key || h.epoch != l.epoch || h.dataLen != l.dataLen || (h.version == version && h.seq != l.seq)) {
		err = errors.New("header names another block")
	}
	if err == nil {
		data, err = verify(buf, h)
	}
	if err != nil {
		if t.forgetLocked(key, l) {
			t.tombLocked(l.dev, key)
			t.emitLocked(store.Evicted, key)
		}
		t.gaugesLocked()
		if t.m != nil {
			t.m.ChecksumFailures.Inc()
		}
		t.log.Warn().Str("path", l.dev.path).Int64("offset", l.off).Str("namespace", key.Namespace).
			Hex("hash", []byte(key.Hash)).Msg("SSD block failed its checksum: dropped, not served")
		return fail(fmt.Errorf("%w: %s at %d: %w", ErrChecksum, l.dev.path, l.off, err))
	}
	return h.sizes, data, buf, nil
}

// writer writes d's queued records in order until Close closes the queue.
func (t *Tier) writer(d *device) {
	defer t.wg.Done()
	for j := range d.queue {
		t.write(d, j)
	}
}

func (t *Tier) write(d *device, j *job) {
	rl := uint64(len(j.rec))
	t.mu.Lock()
	forgotten := j.forgotten
	j.writing = !forgotten // a Forget from here on queues its tombstone (Forget)
	t.mu.Unlock()
	writeHook(j)
	var err error
	var l loc
	if j.tomb || !forgotten {
		if d.wpos+rl > d.segSize {
			t.advance(d)
		}
		l = loc{dev: d, seg: d.cur, epoch: d.nextEpoch - 1, off: int64(uint64(d.cur)*d.segSize + d.wpos),
			hdrLen: uint32(headerLen(j.key, len(j.sizes))), dataLen: j.dataLen, sizes: j.sizes, seq: j.seq}
		if j.tomb {
			encodeTombstone(j.rec, l.epoch, j.seq, j.key)
		} else {
			encodeHeader(j.rec, l.epoch, j.seq, j.key, j.sizes, j.dataLen)
		}
		_, err = d.f.WriteAt(j.rec, l.off)
		// Even a failed write used the space: the next record goes after
		// it, never over a half-written one.
		d.wpos += rl
	}

	putBuf(j.rec)
	j.rec = nil
	t.mu.Lock()
	defer t.mu.Unlock()
	d.queuedBytes -= rl
	t.queued--
	if t.pending[j.key] == j {
		delete(t.pending, j.key)
	}
	switch {
	case j.tomb && err != nil:
		t.log.Error().Err(err).Str("path", d.path).Int64("offset", l.off).Msg("SSD tombstone write failed")
		t.tombLost(d, j.key, "write failed")
	case j.tomb:
		if t.m != nil {
			t.m.Tombstones.WithLabelValues(metrics.TombstoneWritten).Inc()
		}
	case forgotten:
	case err != nil:
		t.drop(metrics.SSDDropWriteError)
		t.log.Error().Err(err).Str("path", d.path).Int64("offset", l.off).Msg("SSD write failed: block dropped")
	case j.forgotten: // deleted during the write: Forget queued its tombstone behind it
	default:
		t.indexLocked(j.key, l)
		t.emitLocked(store.Stored, j.key)
		if t.m != nil {
			t.m.Written.Inc()
			t.m.WrittenBytes.Add(float64(rl))
		}
	}
	t.gaugesLocked()
}

// advance moves d's writer to the next segment of the ring, reclaiming
// it: the blocks still indexed there are forgotten (aged out) before the
// first byte is written over them, and readers that raced see the epoch
// change (Load).
func (t *Tier) advance(d *device) {
	d.cur = (d.cur + 1) % d.nseg
	d.wpos = 0
	epoch := d.nextEpoch
	d.nextEpoch++
	t.mu.Lock()
	defer t.mu.Unlock()
	var aged []store.Key
	for _, k := range d.segKeys[d.cur] {
		if l, ok := t.index[k]; ok && l.dev == d && l.seg == d.cur && t.forgetLocked(k, l) {
			aged = append(aged, k)
		}
	}
	t.emitLocked(store.Evicted, aged...)
	d.segKeys[d.cur] = nil
	d.segEpoch[d.cur] = epoch
	if t.m != nil {
		t.m.AgedOut.Add(float64(len(aged)))
	}
}

var _ store.LowerLister = (*Tier)(nil)
