"""Test stub of vLLM's connector stats classes (see ../../../../../README.md):
KVConnectorStats and KVConnectorPromMetrics with upstream's fields and
helpers (vllm/distributed/kv_transfer/kv_connector/v1/metrics.py)."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVConnectorStats:
    data: "dict[str, Any]" = field(default_factory=dict)

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        raise NotImplementedError

    def reduce(self) -> "dict[str, int | float]":
        raise NotImplementedError

    def is_empty(self) -> bool:
        raise NotImplementedError


class KVConnectorPromMetrics:
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._labelnames = labelnames
        self._per_engine_labelvalues = per_engine_labelvalues

    def make_per_engine(self, metric):
        return {idx: metric.labels(*values) for idx, values in self._per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: "dict[str, Any]", engine_idx: int = 0):
        raise NotImplementedError
