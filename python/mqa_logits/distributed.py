"""Context-parallel top-k over torch.distributed: each rank holds a shard of the keys, selects
over it, and the ranks' candidates are all-gathered and merged into every query row's top-k over
all the keys, on every rank.

A shard is described by where its keys sit among the sequence's: local key ``j`` of a rank is
global key ``key_offset + key_stride * j``. Contiguous chunks have ``key_stride=1`` and the chunk's
first key as ``key_offset``; keys interleaved over R ranks (as vLLM's decode context parallelism
lays out its cache: token ``p`` on rank ``p % R``) have ``key_stride=R`` and ``key_offset=rank``.

Each rank sends its ``S x k`` candidates (float32 values and int32 keys: ``S * k * 8`` bytes)
through the process group's all-gather, NCCL on GPUs or gloo on CPUs; no other transport. The
merge is :func:`mqa_logits.merge_topk`: the result is the top-k of the whole key range with the
same rules as one process's (ties to the lower key, ascending key order, -1 after), bitwise.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch
import torch.distributed as dist

from ._topk import merge_topk, mqa_topk, paged_mqa_topk
from ._api import get_num_sms, get_paged_mqa_logits_metadata

__all__ = ["context_parallel_mqa_topk", "context_parallel_paged_mqa_topk", "local_key_range"]

Tensor = torch.Tensor
Selection = Union[Tensor, Tuple[Tensor, Tensor]]


def _ceil_div(a: Tensor, b: int) -> Tensor:
    return torch.div(a + (b - 1), b, rounding_mode="floor")


def local_key_range(start: Tensor, end: Tensor, key_offset: int, key_stride: int,
                    local_keys: int) -> Tuple[Tensor, Tensor]:
    """The local keys ``[lo, hi)`` of a shard whose global keys ``[start, end)`` a row sees:
    local ``j`` is global ``key_offset + key_stride * j``, for ``0 <= j < local_keys``."""
    offset = start.new_tensor(key_offset, dtype=torch.int64)
    lo = _ceil_div(start.to(torch.int64) - offset, key_stride).clamp(0, local_keys)
    hi = _ceil_div(end.to(torch.int64) - offset, key_stride).clamp(0, local_keys)
    return lo.to(torch.int32), torch.maximum(lo, hi).to(torch.int32)


def _gather_and_merge(values: Tensor, keys: Tensor, topk: int, group: Any,
                      return_values: bool) -> Selection:
    ranks = dist.get_world_size(group)
    all_values = [torch.empty_like(values) for _ in range(ranks)]
    all_keys = [torch.empty_like(keys) for _ in range(ranks)]
    dist.all_gather(all_values, values.contiguous(), group=group)
    dist.all_gather(all_keys, keys.contiguous(), group=group)
    return merge_topk(torch.stack(all_values), torch.stack(all_keys), topk, return_values)


def _to_global(local: Tensor, key_offset: int, key_stride: int) -> Tensor:
    return torch.where(local >= 0, local * key_stride + key_offset, local).to(torch.int32)


def context_parallel_mqa_topk(q: Any, kv: Any, weights: Tensor, cu_seq_len_k_start: Tensor,
                              cu_seq_len_k_end: Tensor, topk: int, key_offset: int,
                              key_stride: int = 1, group: Any = None,
                              absolute_indices: bool = False,
                              return_values: bool = False) -> Selection:
    """Prefill top-k of every query row over the keys of all ranks of ``group``.

    Args:
        q: ``[S, H, D]`` queries, the same rows on every rank (as :func:`mqa_topk`).
        kv: this rank's keys ``(values [T_r, D], scales [T_r])``.
        weights: ``[S, H]`` weights, the same on every rank.
        cu_seq_len_k_start: ``[S]`` int32 window starts, in global keys.
        cu_seq_len_k_end: ``[S]`` int32 window ends, in global keys.
        topk: keys a row selects, 1 to 2048.
        key_offset: the global key of this rank's local key 0.
        key_stride: global keys between consecutive local keys (1: a contiguous chunk; R: keys
            interleaved over R ranks). Default 1.
        group: the process group (NCCL on GPUs, gloo on CPUs); None: the default group.
        absolute_indices: global keys; otherwise ``key - cu_seq_len_k_start[i]``. Default False.
        return_values: also return the selected logits (float32). Default False.

    Returns:
        int32 ``[S, topk]`` indices (and float32 values with return_values), the same on every
        rank.
    """
    keys = kv[0].shape[0] if isinstance(kv, (tuple, list)) else kv.shape[0]
    lo, hi = local_key_range(cu_seq_len_k_start, cu_seq_len_k_end, key_offset, key_stride, keys)
    local, values = mqa_topk(q, kv, weights, lo, hi, topk, absolute_indices=True,
                             return_values=True)
    merged = _gather_and_merge(values, _to_global(local, key_offset, key_stride), topk, group,
                               return_values)
    indices = merged[0] if return_values else merged
    if not absolute_indices:
        start = cu_seq_len_k_start.to(torch.int32)[:, None]
        indices = torch.where(indices >= 0, indices - start, indices)
    return (indices, merged[1]) if return_values else indices


def context_parallel_paged_mqa_topk(q: Any, kv_cache: Tensor, weights: Tensor,
                                    context_lens: Tensor, block_table: Tensor,
                                    max_context_len: int, topk: int, key_offset: int,
                                    key_stride: int = 1, shard_keys: Optional[int] = None,
                                    group: Any = None, return_values: bool = False) -> Selection:
    """Decode top-k of every row over the cached keys of all ranks of ``group``.

    Args:
        q: ``[B, N, H, D]`` queries, the same on every rank (as :func:`paged_mqa_topk`).
        kv_cache: this rank's paged cache, holding its keys of each sequence at local positions.
        weights: ``[B * N, H]`` weights, the same on every rank.
        context_lens: ``[B]`` or ``[B, N]`` int32 global context lengths (as the logits take).
        block_table: this rank's ``[B, max_blocks]`` block table of its local positions.
        max_context_len: the longest global row; keys past it are not selected.
        topk: keys a row selects, 1 to 2048.
        key_offset: the global position of this rank's local position 0.
        key_stride: global positions between consecutive local ones (R for tokens interleaved
            over R ranks). Default 1.
        shard_keys: the most positions of a sequence this rank holds (a contiguous shard's
            length); None: as many as the lengths reach (interleaved shards). Default None.
        group: the process group; None: the default group.
        return_values: also return the selected logits (float32). Default False.

    Returns:
        int32 ``[B * N, topk]`` global key positions (and float32 values with return_values),
        the same on every rank. The schedule metadata is computed here, for the local lengths.
    """
    batch, next_n = q[0].shape[:2] if isinstance(q, (tuple, list)) else q.shape[:2]
    lens = context_lens.to(torch.int64)
    if lens.dim() == 1:  # row t of sequence b: lens[b] - N + t + 1
        lens = lens[:, None] - next_n + 1 + torch.arange(next_n, device=lens.device)[None, :]
    lens = lens.clamp(max=max_context_len)
    local_width = max(0, -(-(max_context_len - key_offset) // key_stride))
    if shard_keys is not None:
        local_width = min(local_width, shard_keys)
    local_lens = _ceil_div(lens - key_offset, key_stride).clamp(0, local_width)
    local_lens = local_lens.to(torch.int32).contiguous()
    block_kv = kv_cache.shape[1]
    meta = get_paged_mqa_logits_metadata(local_lens, block_kv, get_num_sms())
    local, values = paged_mqa_topk(q, kv_cache, weights, local_lens, block_table, meta,
                                   local_width, topk, return_values=True)
    return _gather_and_merge(values, _to_global(local, key_offset, key_stride), topk, group,
                             return_values)
