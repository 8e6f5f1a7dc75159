"""The worker side of pegad.vllm: one vLLM worker's loads and saves.

It owns the step's copies between the worker's paged KV cache and pegad
(through pegad._device, one copy per layer and run of blocks, in chunks
whose daemon calls, pegad._blocks, overlap the copies of the others), the
pins it adopts or leases for a load, the room it reserves for a save, and what
it reports back (finished loads, failed blocks, counters). It must never
raise a daemon failure into vLLM (a failure is a load error or a dropped
save), never depend on vLLM's layer hooks (full CUDA graph replay skips
them) and never block the forward on a copy: loads run on the load thread,
a save's commit on the save thread.
"""

import concurrent.futures
import dataclasses
import logging
import threading

from . import _blocks, _device, _engine, errors

log = logging.getLogger("pegad.vllm")

# Loads and saves go in chunks of this many bytes (at least CHUNK_MIN
# blocks), so that the daemon's work on one chunk overlaps the copy of
# another.
CHUNK_BYTES = 32 << 20
CHUNK_MIN = 16
HANDOFF_COMMIT_WAIT = 5.0  # seconds a P/D producer's step waits for its commit at most
# A P/D pull goes in prefetches of this many bytes (at least one block),
# one after another on the pull thread, so that the copy of one into the
# cache overlaps the READ of the next (0: one prefetch).
PULL_CHUNK_BYTES = 64 << 20


class Worker:
    """Loads and saves of one worker (tensor-/pipeline-parallel rank)."""

    def __init__(self, link, namespace, count, saves=True):
        self.link = link
        self.namespace = namespace
        self._count = count  # count(**deltas): the connector's stats
        self.saves = saves  # False: a rank that only loads (MLA, TP rank > 0)
        self.copier = None
        self.block_bytes = 0
        self._saver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pegad-save")
        self._loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pegad-load")
        # A load's LEASE and RELEASE calls, off the thread that copies.
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pegad-load-io")
        # A P/D load's prefetches, in order (the last one ends the handoff).
        self._puller = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pegad-pull")
        self.pull_chunk_bytes = PULL_CHUNK_BYTES
        self._mu = threading.Lock()  # guards _done (the load thread appends)
        self._done = []  # (req_id, failed block ids) of loads finished since the last get_finished
        self._errors = set()  # failed block ids reported by the next get_block_ids_with_load_errors
        self._failed_now = set()  # requests whose synchronous load failed this step: their saves are dropped

    def register(self, kv_caches, block_size, heads=None, head_size=None, num_blocks=None):
        """Resolve every layer's cache (pegad._device.resolve) in model order."""
        layers = [_device.resolve(name, t, block_size, heads, head_size, num_blocks) for name, t in kv_caches.items()]
        if self.copier is not None:
            self.copier.close()
        self.copier = _device.Copier(layers)
        self.block_bytes = self.copier.block_bytes

    # ------------------------------------------------------------- loads

    def start_loads(self, loads, sync):
        """Load each run: inline when sync (vLLM calls start_load_kv before
        the forward then), else on the load thread, finished through
        finished()."""
        for run in loads:
            if sync:
                failed = self._load(run)
                self._errors.update(failed)
                if failed:
                    self._failed_now.add(run.req_id)
            else:
                self._loader.submit(self._load_async, run)

    def _load_async(self, run):
        failed = self._load(run)
        with self._mu:
            self._done.append((run.req_id, failed))

    def _load(self, run):
        """Pin (adopt the scheduler's pin or lease), copy, release. The
        block ids that could not be loaded: a missing block and every later
        one of the chain (vLLM recomputes them)."""
        client = self.link.get()
        if client is None or self.copier is None:
            return self._failed(run, 0)
        if run.remote is not None and len(run.hashes) > self._pull_step():
            return self._load_pulled(client, run)
        if run.remote is not None:
            self._pull(client, run, run.hashes, True)
        try:
            loaded = self._copy_in(client, run)
        except _engine.FAILURES as e:
            # A call that failed, an ended lease, or a connection that broke
            # (a daemon restart): nothing proves the bytes were not reused.
            if not isinstance(e, errors.LeaseEnded):
                self.link.failed(client, e)
            return self._failed(run, 0)
        self._count(loaded_blocks=loaded, loaded_bytes=loaded * self.block_bytes)
        return self._failed(run, loaded) if loaded < len(run.hashes) else []

    def _load_pulled(self, client, run):
        """A P/D load in parts of _pull_step blocks: the pull thread
        prefetches them one after another (the last with end_handoff, so
        once every other has returned), while this thread copies each part
        that arrived into the cache. After a part not wholly loaded no
        later part is fetched, and one prefetch of its first missing block
        ends the handoff (the producer's pins go now, not at the ttl)."""
        n, step = len(run.hashes), self._pull_step()
        stop, ended = threading.Event(), threading.Event()  # ended: the handoff is ended, or cannot be

        def part(a, b):
            if stop.is_set():
                return
            if b == n:
                ended.set()
            if not self._pull(client, run, run.hashes[a:b], b == n, a == 0):
                stop.set()  # a failed prefetch: neither the next part nor an end would fare better
                ended.set()

        bounds = [(a, min(a + step, n)) for a in range(0, n, step)]
        pulls = [self._puller.submit(part, a, b) for a, b in bounds]
        loaded = 0
        try:
            for (a, b), f in zip(bounds, pulls):
                f.result()
                got = self._copy_in(client, dataclasses.replace(run, block_ids=run.block_ids[a:b],
                                                                hashes=run.hashes[a:b], pins=None, remote=None))
                loaded += got
                if got < b - a:  # after a missing block nothing of the chain is loaded
                    break
        except _engine.FAILURES as e:
            if not isinstance(e, errors.LeaseEnded):
                self.link.failed(client, e)
            loaded = -1
        if loaded < n:
            stop.set()
            first = max(loaded, 0)
            # Runs after the part in flight, if any: that one ended the handoff, or this one does.
            self._puller.submit(lambda: ended.is_set() or
                                self._pull(client, run, run.hashes[first:first + 1], True, False))
        if loaded < 0:
            return self._failed(run, 0)
        self._count(loaded_blocks=loaded, loaded_bytes=loaded * self.block_bytes)
        return self._failed(run, loaded) if loaded < n else []

    def _pull_step(self):
        """Blocks per prefetch of a P/D pull (a huge number: one prefetch)."""
        if self.pull_chunk_bytes <= 0:
            return 1 << 62
        return max(1, self.pull_chunk_bytes // max(self.block_bytes, 1))

    def _copy_in(self, client, run):
        """Copy run's blocks from the first on into the paged cache, a chunk
        at a time, while the I/O thread leases the next chunks and releases
        the copied ones (after their device copy). How many blocks from the
        first were loaded; raises what failed."""
        n, bb, step = len(run.hashes), self.block_bytes, self._chunk()
        pinned = self._adopt(client, run)
        if pinned is not None:  # one lease set, copied and released a chunk at a time
            parts = [(pos, pos, pinned) for pos in range(0, n, step)]
        else:
            parts = [(0, 0, _blocks.lease(client, self.namespace, run.hashes[:step]))] + \
                [(pos, 0, self._io.submit(_blocks.lease, client, self.namespace, run.hashes[pos:pos + step]))
                 for pos in range(step, n, step)]
        releases, loaded = [], 0
        try:
            for pos, base, part in parts:
                res = part.result() if isinstance(part, concurrent.futures.Future) else part
                m = min(step, n - pos)
                good = res.prefix(bb, base, base + m)
                if good:
                    ev = self.copier.load(self.copier.pool_tensor(res.pool),
                                          _device.runs(run.block_ids[pos:pos + good], res.offsets[base:base + good], bb))
                    releases.append(self._io.submit(_release, res, range(base, base + good), ev))
                    loaded += good
                if good < m:  # after a missing block nothing of the chain is loaded
                    break
        finally:
            for _, _, part in parts:  # the rest, once leased (the I/O thread runs in order)
                self._io.submit(_drop, part)
        for f in releases:
            f.result()  # LeaseEnded: the bytes may have been reused during the copy
        return loaded

    def _chunk(self):
        """Blocks per chunk of a load or save."""
        return max(CHUNK_MIN, CHUNK_BYTES // max(self.block_bytes, 1))

    def _pull(self, client, run, hashes, last, first=True):
        """P/D: fetch hashes (run's blocks, or a part of them) from the
        producer's pegad into this node's, in one prefetch, with the
        handoff token, so the producer's pin of each block ends as it is
        read; last: with end_handoff, this prefetch ends the consumer's
        pull, so that the pins of blocks it does not read, found local
        here or past what it loads, end with it, not at the ttl;
        known_peer_only: the daemon dials only a node the cluster index or
        --peer-allow knows. What it could not fetch is missing from the
        lease after it: a load error, recomputed. first: the part that
        counts the pull (pd_pulls). False when it failed (refused, the
        producer unreachable, a partial result with an error): the next
        part would fare no better."""
        pull = run.remote
        try:
            res = client.prefetch(self.namespace, hashes, peer=pull.peer, timeout=pull.timeout,
                                  handoff=pull.tokens.get(self.namespace), known_peer_only=True,
                                  end_handoff=last)
        except PermissionError as e:  # errors.Denied: a peer the daemon does not know
            log.warning("P/D pull of %d blocks from %s refused: %s", len(hashes), pull.peer, e)
            self._count(pd_pull_refused=1)
            return False
        except _engine.FAILURES as e:
            log.warning("P/D pull of %d blocks from %s failed: %s", len(hashes), pull.peer, e)
            self._count(pd_pull_failed=1)
            res = getattr(e, "result", None)
            if res is not None:
                fetched = sum(1 for b in res.blocks if b.status == "fetched")
                self._count(pd_pulls=int(first), pd_pulled_blocks=fetched, pd_pulled_bytes=res.bytes)
            return False
        fetched = sum(1 for b in res.blocks if b.status == "fetched")
        self._count(pd_pulls=int(first), pd_pulled_blocks=fetched, pd_pulled_bytes=res.bytes)
        return True

    def _adopt(self, client, run):
        """The leases (pegad._blocks.Leases) of the scheduler's pin for
        this rank, in chain order, padded with NotFound for blocks it did
        not pin; None when there is no pin to adopt (lapsed, taken), so the
        blocks are leased instead."""
        token = (run.pins or {}).get(self.namespace)
        if token is None or not hasattr(client, "adopt"):
            return None
        try:
            res = _blocks.adopt(client, token)
        except (errors.NotFound, errors.Denied, errors.InvalidArgument, errors.LeaseEnded,
                errors.FailedPrecondition) as e:
            log.info("pin of %d blocks not adopted (%s): leasing them", len(run.hashes), e)
            return None
        res.fit(len(run.hashes))  # a pin taken at lookup may cover more than the blocks allocated
        return res

    def _failed(self, run, i):
        ids = list(run.block_ids[i:])
        self._count(load_error_blocks=len(ids))
        return ids

    def finished(self):
        """Requests whose asynchronous load ended since the last call; their
        failed blocks join the next get_block_ids_with_load_errors (vLLM
        asks for them after get_finished, in the same step)."""
        if not self._done:
            return None
        with self._mu:
            done, self._done = self._done, []
        out = set()
        for rid, failed in done:
            out.add(rid)
            self._errors.update(failed)
        return out

    def take_errors(self):
        out, self._errors = self._errors, set()
        return out

    # ------------------------------------------------------------- saves

    def save(self, runs):
        """Reserve room for the step's full blocks, copy them out of the
        paged cache (CPU: now; CUDA: on the connector's stream, the compute
        stream waiting on it) and commit on the save thread."""
        failed, self._failed_now = self._failed_now, set()
        runs = [r for r in runs if r.req_id not in failed]  # computed on a prefix that failed to load
        if not runs or not self.saves or self.copier is None:
            return
        client = self.link.get()
        n = sum(len(r.block_ids) for r in runs)
        if client is None:
            self._count(save_dropped_blocks=n)
            return
        hashes = [h for r in runs for h in r.hashes]
        block_ids = [b for r in runs for b in r.block_ids]
        # In chunks, so that the daemon's work (ALLOC evicting room, COMMIT
        # indexing) runs on the save thread while this one copies: every
        # chunk's room is taken before any commit (the saver runs in order),
        # so no part of this save can be evicted to make room for the rest.
        step = self._chunk()
        starts = range(0, n, step)
        allocs = [self._alloc(client, hashes[:step])] + \
            [self._saver.submit(self._alloc, client, hashes[pos:pos + step]) for pos in starts[1:]]
        done = None
        for k, pos in enumerate(starts):
            writers = allocs[k].result() if k else allocs[0]
            held = [] if writers is None else [i for i, off in enumerate(writers.offsets) if off is not None]
            if not held:
                continue
            try:
                ev = self.copier.save(self.copier.pool_tensor(writers.pool),
                                      _device.runs([block_ids[pos + i] for i in held],
                                                   [writers.offsets[i] for i in held], self.block_bytes))
            except Exception as e:  # a copy that cannot run must not stop the engine: the blocks are given back
                log.warning("save of %d blocks failed, dropped: %s", n - pos, e)
                self._saver.submit(self._abort, client, writers)
                for f in allocs[k + 1:]:  # returned by then: the saver runs in order
                    self._saver.submit(lambda f=f: f.result() is not None and self._abort(client, f.result()))
                return
            done = self._saver.submit(self._commit, client, writers, ev, len(held))
        if done is not None and any(r.handoff for r in runs):
            # A P/D producer's prompt: committed before the step's output
            # reaches the scheduler, whose request_finished hands it off.
            # The saver runs in order, so its last commit ends the save.
            try:
                done.result(HANDOFF_COMMIT_WAIT)
            except concurrent.futures.TimeoutError:
                log.warning("save of %d blocks not committed in %.0f s: the handoff may miss them",
                            n, HANDOFF_COMMIT_WAIT)

    def _alloc(self, client, hashes):
        """Room for hashes' blocks (pegad._blocks.Reservations), the blocks
        that got none counted as dropped (Exists: stored already, by us or
        another engine, so nothing to write); None when the call failed."""
        if not hashes:
            return None
        try:
            writers = _blocks.alloc(client, self.namespace, hashes, self.block_bytes, numa_node=self.copier.numa_node)
        except _engine.FAILURES as e:
            self.link.failed(client, e)
            self._count(save_dropped_blocks=len(hashes))
            return None
        dropped = sum(1 for e in writers.errors if e is not None and not isinstance(e, errors.Exists))
        if dropped:
            self._count(save_dropped_blocks=dropped)
        return writers

    def _commit(self, client, writers, ev, n):
        """Commit the n blocks writers holds (pegad._blocks.Reservations)."""
        if ev is not None:
            ev.synchronize()  # the save thread waits for the device copy, never the forward
        try:
            res = writers.commit()
        except _engine.FAILURES as e:
            self._count(save_dropped_blocks=n)
            self.link.failed(client, e)
            return
        failed = [r for _, r in res if isinstance(r, Exception)]
        saved = len(res) - len(failed)
        self._count(saved_blocks=saved, saved_bytes=saved * self.block_bytes, save_dropped_blocks=len(failed))
        broken = next((e for e in failed if not isinstance(e, (errors.Exists, errors.LeaseEnded))), None)
        if broken is not None:
            self.link.failed(client, broken)

    def _abort(self, client, writers):
        self._count(save_dropped_blocks=len(writers.held))
        try:
            writers.abort()
        except _engine.FAILURES as e:
            self.link.failed(client, e)

    def flush(self, timeout=None):
        """Wait until queued loads and saves are done (tests, shutdown)."""
        self._loader.submit(lambda: None).result(timeout)
        self._io.submit(lambda: None).result(timeout)
        self._puller.submit(lambda: None).result(timeout)
        self._saver.submit(lambda: None).result(timeout)

    def shutdown(self):
        self._loader.shutdown(wait=True)
        self._io.shutdown(wait=True)
        self._puller.shutdown(wait=True)
        self._saver.shutdown(wait=True)
        if self.copier is not None:
            self.copier.close()


def _release(leases, which, ev):
    """Release which of leases once the device copy out of them (ev) is done."""
    if ev is not None:
        ev.synchronize()  # the I/O thread waits, never the forward
    leases.release(which)


def _drop(part):
    """Release what part (pegad._blocks.Leases, or the Future of one) still
    holds; a lease call that failed holds nothing."""
    try:
        res = part.result() if isinstance(part, concurrent.futures.Future) else part
    except Exception:  # the failure was reported where the chunk was needed
        return
    res.release(quiet=True)
