"""Test stub of vLLM's KVConnectorBase_V1 (see ../../../../../README.md).

Method names and parameter lists copied from vllm-project/vllm
vllm/distributed/kv_transfer/kv_connector/v1/base.py at commit
00f4240ee6458263d76cf51ca7901ce1350bb4d1. Bodies are upstream's defaults
(return None / False / empty); torch and vLLM types are string annotations.
"""

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

UPSTREAM_COMMIT = "00f4240ee6458263d76cf51ca7901ce1350bb4d1"


@dataclass
class KVConnectorTransferResults:
    finished_sending: set = field(default_factory=set)
    finished_recving: set = field(default_factory=set)
    failed_recving: set = field(default_factory=set)
    prefix_replay_checkpoints: dict = field(default_factory=dict)


class SupportsHMA(ABC):
    @abstractmethod
    def request_finished_all_groups(self, request: "Request",
                                    block_ids: "tuple[list[int], ...]") -> "tuple[bool, dict[str, Any] | None]":
        raise NotImplementedError


def supports_hma(connector: Any) -> bool:
    if isinstance(connector, type):
        return issubclass(connector, SupportsHMA)
    return isinstance(connector, SupportsHMA)


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorHandshakeMetadata(ABC):  # noqa: B024
    pass


class KVConnectorMetadata(ABC):  # noqa: B024
    pass


class KVConnectorWorkerMetadata(ABC):
    @abstractmethod
    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        pass


class KVConnectorBase_V1(ABC):
    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        return self._kv_transfer_config.is_kv_producer

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is not None:
            self._kv_transfer_config = vllm_config.kv_transfer_config
        else:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_cache_config = kv_cache_config
        self._kv_cache_manager = None
        self._role = role

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    # Worker-side methods

    def get_mem_pool_context(self) -> "AbstractContextManager | None":
        return None

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches: "dict[str, torch.Tensor]"):
        return

    def set_host_xfer_buffer_ops(self, copy_operation: "CopyBlocksOp"):
        return

    def finish_forward(self) -> None:
        return

    def reset_capture_state(self) -> None:
        return

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata):
        return

    @abstractmethod
    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        pass

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor", attn_metadata: "AttentionMetadata",
                      **kwargs: Any) -> None:
        pass

    @abstractmethod
    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids: "set[str]") -> "tuple[set[str] | None, set[str] | None]":
        return None, None

    def get_transfer_results(self, finished_req_ids: "set[str]") -> KVConnectorTransferResults:
        finished_sending, finished_recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(finished_sending=set(finished_sending or ()),
                                          finished_recving=set(finished_recving or ()))

    def get_block_ids_with_load_errors(self) -> "set[int]":
        return set()

    def shutdown(self):
        return None

    def get_kv_connector_stats(self) -> "KVConnectorStats | None":
        return None

    def get_kv_connector_kv_cache_events(self) -> "KVConnectorKVEvents | None":
        return None

    def get_handshake_metadata(self) -> "KVConnectorHandshakeMetadata | None":
        return None

    def build_connector_worker_meta(self) -> "KVConnectorWorkerMetadata | None":
        return None

    # Scheduler-side methods

    def bind_kv_cache_manager(self, kv_cache_manager: "KVCacheManager") -> None:
        self._kv_cache_manager = kv_cache_manager
        self.bind_gpu_block_pool(kv_cache_manager.block_pool)

    def bind_gpu_block_pool(self, gpu_block_pool: "BlockPool") -> None:
        return

    @abstractmethod
    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> "tuple[int | None, bool]":
        pass

    @abstractmethod
    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        pass

    @abstractmethod
    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        pass

    def on_new_request(self, request: "Request") -> None:
        return

    def update_connector_output(self, connector_output: "KVConnectorOutput"):
        return

    def can_load_prefix_replay_checkpoint(self, request: "Request", num_local_tokens: int,
                                          num_external_tokens: int) -> bool:
        return False

    def consume_prefix_replay_checkpoint(self, request: "Request", num_hit_tokens: int) -> bool:
        return False

    def request_finished(self, request: "Request", block_ids: "list[int]") -> "tuple[bool, dict[str, Any] | None]":
        return False, None

    def register_finished_partial_tail(self, request: "Request", block_ids: "tuple[list[int], ...]",
                                       partial_tail_offloads: "list[tuple[int, int, int]]") -> bool:
        return False

    def take_events(self) -> "Iterable[KVCacheEvent]":
        return ()

    def has_pending_block_frees(self) -> bool:
        return False

    def has_pending_push_work(self) -> bool:
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> "str | None":
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract base class")
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: "dict[str, Any]") -> bool:
        return False

    def get_finished_count(self) -> "int | None":
        return None

    @classmethod
    def build_kv_connector_stats(cls, data: "dict[str, Any] | None" = None) -> "KVConnectorStats | None":
        return None

    def set_xfer_handshake_metadata(self, metadata: "dict[int, KVConnectorHandshakeMetadata]") -> None:
        return None

    def set_xfer_handshake_metadata_pp_aware(
            self, metadata: "dict[tuple[int, int], KVConnectorHandshakeMetadata]") -> None:
        if any(pp_rank != 0 for pp_rank, _ in metadata):
            raise ValueError(f"{type(self).__name__} received pp_rank > 0 handshake metadata")
        self.set_xfer_handshake_metadata({tp_rank: meta for (_, tp_rank), meta in metadata.items()})

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: "dict", labelnames: "list[str]",
                           per_engine_labelvalues: "dict[int, list[object]]") -> "KVConnectorPromMetrics | None":
        return None

    def reset_cache(self) -> "bool | None":
        return None
