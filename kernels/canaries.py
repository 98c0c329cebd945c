"""Canaries: make the two seed bugs fail in the first requests instead of after millions of tokens.

`nan_kv_tail`: a kernel that reads KV slots at or past `seq_len` multiplies them by a zero
softmax weight; that is harmless for stale finite data and poisons the output for NaN. Filling
the KV cache with NaN when vLLM allocates it (again after warm-up, which writes dummy KV, and
when the block pool hands a used block out again, where the scheduler shares a process with
the model) makes any such read visible.

`high_block_ids`: int32 page offsets only wrap for page ids above 2^31 / page stride. vLLM's
block pool hands out the lowest ids first, so the bug waits for a nearly full KV cache.
Reversing the pool's initial free order (block 0 stays the null block) hands out the highest
ids first.

Each function takes vLLM's own objects (a model runner, a block pool), so the plugin decides
when to call them and the receipt records what they did.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

NAN_KV_TAIL = "nan_kv_tail"
HIGH_BLOCK_IDS = "high_block_ids"
CANARIES = (NAN_KV_TAIL, HIGH_BLOCK_IDS)


def parse_canaries(value: str) -> tuple[str, ...]:
    """'nan_kv_tail, high_block_ids' -> ('nan_kv_tail', 'high_block_ids'); unknown names raise."""
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    unknown = [n for n in names if n not in CANARIES]
    if unknown:
        raise ValueError(f"KVCANARY_CANARIES names unknown canaries {unknown}; known: {', '.join(CANARIES)}")
    return names


class KVPoisoner:
    """The attention KV cache tensors of this process's model runner, and NaN fills of them."""

    def __init__(self) -> None:
        self._tensors: list[Any] = []
        self._num_blocks = 0
        self._reissued: deque[int] = deque()
        self._handed_out: set[int] = set()
        self._lock = threading.Lock()

    @property
    def attached(self) -> bool:
        return bool(self._tensors)

    def attach(self, runner: Any) -> None:
        """Take the attention KV caches of a model runner after `initialize_kv_cache`."""
        self._tensors, _ = attention_kv_caches(runner)
        self._num_blocks = int(runner.kv_cache_config.num_blocks)

    def fill_all(self) -> int:
        """NaN into every attention KV slot; returns the number of elements written."""
        for tensor in self._tensors:
            tensor.fill_(float("nan"))
        return sum(int(t.numel()) for t in self._tensors)

    def refill(self, value: float) -> int:
        """`value` into every attention KV slot and forget which blocks were handed out (an idle
        engine between arms: every block is as new); returns the number of elements written."""
        with self._lock:
            self._reissued.clear()
            self._handed_out.clear()
        for tensor in self._tensors:
            tensor.fill_(value)
        return sum(int(t.numel()) for t in self._tensors)

    def note_handed_out(self, block_ids: list[int]) -> None:
        """Called by the block pool: blocks that were used before must be poisoned again."""
        with self._lock:
            self._reissued.extend(b for b in block_ids if b in self._handed_out)
            self._handed_out.update(block_ids)

    def fill_reissued(self) -> int:
        """NaN into the blocks handed out again since the last step; returns how many."""
        with self._lock:
            if not self._reissued:
                return 0
            ids = sorted(set(self._reissued))
            self._reissued.clear()
        import torch

        for tensor in self._tensors:
            per_block = tensor.shape[0] // self._num_blocks
            index = torch.tensor([b * per_block + i for b in ids for i in range(per_block)], dtype=torch.long).to(
                tensor.device, non_blocking=True
            )
            tensor.index_fill_(0, index, float("nan"))
        return len(ids)

    def reuse_layout_ok(self) -> bool:
        """Reissued-block fills need block-major caches whose first dim is a multiple of the pool."""
        return self.attached and all(self._num_blocks and t.shape[0] % self._num_blocks == 0 for t in self._tensors)


def attention_kv_caches(runner: Any) -> tuple[list[Any], list[str]]:
    """The floating-point attention KV cache tensors a model runner bound to its layers (each
    once), and what was left out and why (Mamba state, integer caches)."""
    import torch
    from vllm.v1.kv_cache_interface import AttentionSpec

    context = runner.compilation_config.static_forward_context
    seen: set[int] = set()
    tensors, skipped = [], []
    for group in runner.kv_cache_config.kv_cache_groups:
        if not isinstance(group.kv_cache_spec, AttentionSpec):
            skipped.append(f"{type(group.kv_cache_spec).__name__} group {group.layer_names[:1]}...")
            continue
        for name in group.layer_names:
            cache = getattr(context.get(name), "kv_cache", None)
            for tensor in cache if isinstance(cache, list | tuple) else [cache]:
                if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0 or tensor.data_ptr() in seen:
                    continue
                seen.add(tensor.data_ptr())
                if tensor.dtype.is_floating_point:
                    tensors.append(tensor)
                else:
                    skipped.append(f"{name}: {tensor.dtype} cache holds no NaN")
    return tensors, skipped


def describe_kv_caches(runner: Any) -> dict[str, Any]:
    """What the receipt says about the KV cache: sizes that decide whether page offsets pass 2^31."""
    tensors, skipped = attention_kv_caches(runner)
    return {
        "num_blocks": int(runner.kv_cache_config.num_blocks),
        "tensors": len(tensors),
        "shapes": sorted({str(tuple(t.shape)) for t in tensors}),
        "block_strides": sorted({int(t.stride(0)) for t in tensors}),
        "dtypes": sorted({str(t.dtype) for t in tensors}),
        "skipped": skipped,
    }


def reverse_free_order(block_pool: Any) -> dict[str, Any]:
    """Make a freshly built block pool hand out its highest block ids first."""
    queue = block_pool.free_block_queue
    null_block = block_pool.null_block
    if block_pool.blocks[0] is not null_block or queue.num_free_blocks != len(block_pool.blocks) - 1:
        raise RuntimeError(
            "high_block_ids: the block pool is not in the state vLLM builds it in (block 0 the null "
            "block, every other block free); this vLLM's BlockPool differs from the verified releases"
        )
    free = list(reversed(block_pool.blocks[1:]))
    for block in free:
        block.prev_free_block = block.next_free_block = None
    block_pool.free_block_queue = type(queue)(free)
    return {
        "num_blocks": len(block_pool.blocks),
        "first_handed_out": free[0].block_id if free else None,
        "null_block": null_block.block_id,
    }
