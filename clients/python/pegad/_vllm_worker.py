"""The worker side of pegad.vllm: one vLLM worker's loads and saves.

It owns the step's copies between the worker's paged KV cache and pegad
(through pegad._device, one copy per layer and run of blocks), the pins
it adopts or leases for a load, the room it reserves for a save, and what
it reports back (finished loads, failed blocks, counters). It must never
raise a daemon failure into vLLM (a failure is a load error or a dropped
save), never depend on vLLM's layer hooks (full CUDA graph replay skips
them) and never block the forward on a copy: loads run on the load thread,
a save's commit on the save thread.
"""

import concurrent.futures
import logging
import threading

from . import _device, _engine, errors

log = logging.getLogger("pegad.vllm")


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
        self.layout = layers[0].layout if layers else None
        return layers

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
        res = None
        if client is not None and self.copier is not None:
            try:
                res = self._adopt(client, run)
                if res is None:
                    res = client.lease_batch(self.namespace, run.hashes)
            except _engine.FAILURES as e:
                self.link.failed(client, e)
                res = None
        if res is None:
            return self._failed(run, 0)
        bad = next((i for i, r in enumerate(res) if not _usable(r, self.block_bytes)), len(res))
        good = res[:bad]
        extra = [r for r in res[bad:] if not isinstance(r, Exception)]
        if extra:  # after a missing block nothing of the chain is loaded
            _release(client, extra)
        if not good:
            return self._failed(run, 0)
        try:
            pool = good[0].pool
            pool_t = self.copier.pool_tensor(pool)
            ev = self.copier.load(pool_t, _device.runs(run.block_ids[:bad], [r.buffer for r in good],
                                                        pool, self.block_bytes))
            if ev is not None:
                ev.synchronize()  # the load thread waits, never the forward
            client.release_batch(good)
        except _engine.FAILURES as e:
            # An ended lease, or a connection that broke (a daemon restart):
            # nothing proves the bytes were not reused meanwhile.
            if not isinstance(e, errors.LeaseEnded):
                self.link.failed(client, e)
            return self._failed(run, 0)
        self._count(loaded_blocks=bad, loaded_bytes=bad * self.block_bytes)
        return self._failed(run, bad) if bad < len(res) else []

    def _adopt(self, client, run):
        """The readers of the scheduler's pin for this rank, in chain order,
        padded with NotFound for blocks it did not pin; None when there is
        no pin to adopt (lapsed, taken), so the blocks are leased instead."""
        token = (run.pins or {}).get(self.namespace)
        if token is None or not hasattr(client, "adopt"):
            return None
        try:
            readers = client.adopt(token)
        except (errors.NotFound, errors.Denied, errors.InvalidArgument, errors.LeaseEnded,
                errors.FailedPrecondition) as e:
            log.info("pin of %d blocks not adopted (%s): leasing them", len(run.hashes), e)
            return None
        n = len(run.hashes)
        if len(readers) > n:  # a pin taken at lookup may cover more than the blocks allocated
            _release(client, readers[n:])
        return list(readers[:n]) + [errors.NotFound("not pinned by the scheduler")] * (n - min(n, len(readers)))

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
        try:
            res = client.alloc_batch([(self.namespace, h, self.block_bytes) for r in runs for h in r.hashes])
        except _engine.FAILURES as e:
            self.link.failed(client, e)
            self._count(save_dropped_blocks=n)
            return
        writers, ids = [], []
        for bid, w in zip((b for r in runs for b in r.block_ids), res):
            if isinstance(w, errors.Exists):
                continue  # stored already (by us or another engine): nothing to write
            if isinstance(w, Exception):
                self._count(save_dropped_blocks=1)
                continue
            writers.append(w)
            ids.append(bid)
        if not writers:
            return
        try:
            pool = writers[0].pool
            ev = self.copier.save(self.copier.pool_tensor(pool),
                                  _device.runs(ids, [w.buffer for w in writers], pool, self.block_bytes))
        except Exception as e:  # a copy that cannot run must not stop the engine: the blocks are given back
            log.warning("save of %d blocks failed, dropped: %s", len(writers), e)
            self._saver.submit(self._abort, client, writers)
            return
        self._saver.submit(self._commit, client, writers, ev)

    def _commit(self, client, writers, ev):
        if ev is not None:
            ev.synchronize()  # the save thread waits for the device copy, never the forward
        try:
            client.commit_batch(writers)
            self._count(saved_blocks=len(writers), saved_bytes=len(writers) * self.block_bytes)
        except _engine.FAILURES as e:
            self._count(save_dropped_blocks=len(writers))
            if not isinstance(e, (errors.Exists, errors.LeaseEnded)):
                self.link.failed(client, e)

    def _abort(self, client, writers):
        self._count(save_dropped_blocks=len(writers))
        try:
            client.abort_batch(writers)
        except _engine.FAILURES as e:
            self.link.failed(client, e)

    def flush(self, timeout=None):
        """Wait until queued loads and saves are done (tests, shutdown)."""
        self._loader.submit(lambda: None).result(timeout)
        self._saver.submit(lambda: None).result(timeout)

    def shutdown(self):
        self._loader.shutdown(wait=True)
        self._saver.shutdown(wait=True)
        if self.copier is not None:
            self.copier.close()


def _usable(r, size):
    return not isinstance(r, Exception) and r.buffer is not None and r.size == size


def _release(client, readers):
    try:
        client.release_batch(readers)
    except _engine.FAILURES:
        pass  # the pins end with the connection anyway
