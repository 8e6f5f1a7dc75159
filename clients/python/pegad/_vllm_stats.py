"""What pegad.vllm reports to vLLM: its counters as KVConnectorStats (and
Prometheus counters through KVConnectorPromMetrics), and BlockStored KV
events.

It owns the counters' names and how they aggregate; it must never talk to
the daemon, and it degrades to "nothing reported" (None, plain dicts) on a
vLLM without these hooks rather than failing the connector.
"""

import dataclasses

COUNTERS = ("lookups", "hit_blocks", "loaded_blocks", "load_error_blocks", "saved_blocks",
            "save_dropped_blocks", "loaded_bytes", "saved_bytes",
            # P/D (pegad._vllm_pd): producer handoffs given / failed and their
            # blocks; consumer pulls, blocks and bytes they fetched, pulls the
            # daemon refused (a peer it does not know), pulls that failed
            # (peer gone, blocks missing), parameters refused before any pull
            "pd_handoffs", "pd_handoff_failed", "pd_handoff_blocks", "pd_pulls", "pd_pulled_blocks",
            "pd_pulled_bytes", "pd_pull_refused", "pd_pull_failed", "pd_refused_params")
MEDIUM = "PEGAD"  # BlockStored.medium: where these blocks live (vLLM's own are "GPU")

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
except ImportError:  # a vLLM before the stats hooks: they are never called there
    KVConnectorStats = KVConnectorPromMetrics = None

try:
    from vllm.distributed.kv_events import BlockStored
except ImportError:
    BlockStored = None


if KVConnectorStats is not None:
    @dataclasses.dataclass
    class PegadStats(KVConnectorStats):
        """Counter deltas of one interval (data: counter name -> int),
        summed over workers and steps."""

        def reset(self):
            self.data = {}

        def aggregate(self, other):
            for k, v in (other.data or {}).items():
                self.data[k] = self.data.get(k, 0) + v
            return self

        def reduce(self):
            return {k: self.data.get(k, 0) for k in COUNTERS if self.data.get(k)}

        def is_empty(self):
            return not any(self.data.values())
else:
    PegadStats = None


def make_stats(data):
    """data (counter deltas) as vLLM's stats object; None without the hooks."""
    return PegadStats(data=dict(data)) if PegadStats is not None else None


if KVConnectorPromMetrics is not None:
    class PegadPromMetrics(KVConnectorPromMetrics):
        """One Prometheus counter per pegad counter, per engine."""

        def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
            super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
            counter = next(v for k, v in metric_types.items() if getattr(k, "__name__", "") == "Counter")
            self.counters = {
                name: self.make_per_engine(counter(name=f"vllm:pegad_{name}",
                                                   documentation=f"pegad connector: {name.replace('_', ' ')}",
                                                   labelnames=labelnames))
                for name in COUNTERS}

        def observe(self, transfer_stats_data, engine_idx=0):
            for name, v in (transfer_stats_data or {}).items():
                if name in self.counters and v:
                    self.counters[name][engine_idx].inc(v)
else:
    PegadPromMetrics = None


def make_prom(vllm_config, metric_types, labelnames, per_engine_labelvalues):
    if PegadPromMetrics is None:
        return None
    return PegadPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)


def block_stored(hashes, parent, token_ids, block_size):
    """A BlockStored event of blocks saved to pegad (a dict without vLLM's
    event type), built from the fields the installed vLLM has."""
    kw = {"block_hashes": list(hashes), "parent_block_hash": parent, "token_ids": list(token_ids),
          "block_size": block_size, "lora_id": None, "medium": MEDIUM}
    if BlockStored is None:
        return kw
    fields = getattr(BlockStored, "__struct_fields__", None)
    if fields is None and dataclasses.is_dataclass(BlockStored):
        fields = [f.name for f in dataclasses.fields(BlockStored)]
    return BlockStored(**{k: v for k, v in kw.items() if fields is None or k in fields})
