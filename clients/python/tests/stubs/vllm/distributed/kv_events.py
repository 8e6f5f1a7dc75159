"""Test stub of vLLM's KV cache events (vllm/distributed/kv_events.py):
BlockStored's fields as upstream (a msgspec.Struct there, a dataclass here)."""

from dataclasses import dataclass


class KVCacheEvent:
    pass


@dataclass
class BlockStored(KVCacheEvent):
    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: "int | None"
    medium: "str | None"
