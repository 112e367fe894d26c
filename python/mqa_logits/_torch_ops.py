"""The indexer functions as torch custom ops (``torch.ops.mqa_logits.*``), for torch.compile.

Eager calls do not pass through these ops: the dispatch of a Python custom op costs more than a
whole call's budget of host time. The public functions take them only while torch.compile traces
(``torch.compiler.is_compiling()``), so a compiled model holds each call as one graph node whose
output shape, dtype and strides come from the fake implementations below, without running
anything. At run time each op calls the eager function, which queues its kernels on torch's
current stream without synchronizing, so CUDA-graph capture keeps working (``torch.cuda.graph``,
``mode="reduce-overhead"``). Errors are raised at run time, in the caller's words, as eager.

Tensor arguments of a custom op cannot be ``(values, scales)`` pairs: each pair crosses as two
arguments, the scales optional.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from . import _C
from ._arrays import TORCH_OUTPUTS, logits_dtype_of

Tensor = torch.Tensor

# Rows of logits are padded to this many bytes, as the library lays them out.
_ROW_BYTES = _C.LOGITS_ROW_ALIGNMENT_BYTES


def _split(x: Any) -> Tuple[Any, Optional[Tensor]]:
    """An operand as (values, scales or None)."""
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return x[0], x[1]
    return x, None


def _join(values: Tensor, scales: Optional[Tensor]) -> Any:
    return values if scales is None else (values, scales)


def _fake_logits(like: Tensor, rows: Any, cols: Any, dtype: torch.dtype) -> Tensor:
    """Logits of the library's layout: rows padded to _ROW_BYTES, at least one padded row apart
    (_arrays.new_logits)."""
    unit = _ROW_BYTES // torch.empty((), dtype=dtype).element_size()
    row_stride = torch.sym_max((cols + unit - 1) // unit * unit, unit)
    return like.new_empty_strided((rows, cols), (row_stride, 1), dtype=dtype)


def _fake_metadata(like: Tensor, workers: Any) -> Tensor:
    return like.new_empty((workers + 1, 2), dtype=torch.int32)


def _prefill_columns(kv: Tensor, max_seqlen_k: Any) -> Any:
    return max_seqlen_k if max_seqlen_k > 0 else kv.shape[0]


# ---- prefill ---------------------------------------------------------------------------------

@torch.library.custom_op("mqa_logits::fp8_fp4_mqa_logits", mutates_args=())
def _fp8_fp4_mqa_logits(q: Tensor, q_scales: Optional[Tensor], kv: Tensor,
                        kv_scales: Optional[Tensor], weights: Tensor,
                        cu_seq_len_k_start: Tensor, cu_seq_len_k_end: Tensor,
                        clean_logits: bool, max_seqlen_k: int, logits_dtype: torch.dtype,
                        schedule_meta: Optional[Tensor]) -> Tensor:
    from ._api import fp8_fp4_mqa_logits
    return fp8_fp4_mqa_logits(_join(q, q_scales), _join(kv, kv_scales), weights,
                              cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k,
                              logits_dtype, schedule_meta)


@_fp8_fp4_mqa_logits.register_fake
def _(q, q_scales, kv, kv_scales, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
      max_seqlen_k, logits_dtype, schedule_meta):
    return _fake_logits(q, q.shape[0], _prefill_columns(kv, max_seqlen_k), logits_dtype)


@torch.library.custom_op("mqa_logits::fp8_mqa_logits", mutates_args=())
def _fp8_mqa_logits(q: Tensor, q_scales: Optional[Tensor], kv: Tensor,
                    kv_scales: Optional[Tensor], weights: Tensor, cu_seq_len_k_start: Tensor,
                    cu_seq_len_k_end: Tensor, clean_logits: bool, max_seqlen_k: int) -> Tensor:
    from ._api import fp8_mqa_logits
    return fp8_mqa_logits(_join(q, q_scales), _join(kv, kv_scales), weights, cu_seq_len_k_start,
                          cu_seq_len_k_end, clean_logits, max_seqlen_k)


@_fp8_mqa_logits.register_fake
def _(q, q_scales, kv, kv_scales, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
      max_seqlen_k):
    return _fake_logits(q, q.shape[0], _prefill_columns(kv, max_seqlen_k), torch.float32)


@torch.library.custom_op("mqa_logits::get_mqa_logits_metadata", mutates_args=())
def _get_mqa_logits_metadata(cu_seq_len_k_start: Tensor, cu_seq_len_k_end: Tensor,
                             num_kv_tokens: int, num_heads: int) -> Tensor:
    from ._api import get_mqa_logits_metadata
    return get_mqa_logits_metadata(cu_seq_len_k_start, cu_seq_len_k_end, num_kv_tokens,
                                   num_heads)


@_get_mqa_logits_metadata.register_fake
def _(cu_seq_len_k_start, cu_seq_len_k_end, num_kv_tokens, num_heads):
    return _fake_metadata(cu_seq_len_k_start, _C.get_num_sms())


# ---- decode ----------------------------------------------------------------------------------

@torch.library.custom_op("mqa_logits::fp8_fp4_paged_mqa_logits", mutates_args=())
def _fp8_fp4_paged_mqa_logits(q: Tensor, q_scales: Optional[Tensor], kv_cache: Tensor,
                              weights: Tensor, context_lens: Tensor, block_table: Tensor,
                              schedule_meta: Tensor, max_context_len: int, clean_logits: bool,
                              logits_dtype: torch.dtype, indices: Optional[Tensor]) -> Tensor:
    from ._api import fp8_fp4_paged_mqa_logits
    return fp8_fp4_paged_mqa_logits(_join(q, q_scales), kv_cache, weights, context_lens,
                                    block_table, schedule_meta, max_context_len, clean_logits,
                                    logits_dtype, indices)


@_fp8_fp4_paged_mqa_logits.register_fake
def _(q, q_scales, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
      clean_logits, logits_dtype, indices):
    return _fake_logits(q, q.shape[0] * q.shape[1], max_context_len, logits_dtype)


@torch.library.custom_op("mqa_logits::fp8_paged_mqa_logits", mutates_args=())
def _fp8_paged_mqa_logits(q: Tensor, q_scales: Optional[Tensor], kv_cache: Tensor,
                          weights: Tensor, context_lens: Tensor, block_table: Tensor,
                          schedule_meta: Tensor, max_context_len: int, clean_logits: bool,
                          indices: Optional[Tensor]) -> Tensor:
    from ._api import fp8_paged_mqa_logits
    return fp8_paged_mqa_logits(_join(q, q_scales), kv_cache, weights, context_lens, block_table,
                                schedule_meta, max_context_len, clean_logits, indices)


@_fp8_paged_mqa_logits.register_fake
def _(q, q_scales, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
      clean_logits, indices):
    return _fake_logits(q, q.shape[0] * q.shape[1], max_context_len, torch.float32)


@torch.library.custom_op("mqa_logits::get_paged_mqa_logits_metadata", mutates_args=())
def _get_paged_mqa_logits_metadata(context_lens: Tensor, block_kv: int, num_sms: int,
                                   indices: Optional[Tensor]) -> Tensor:
    from ._api import get_paged_mqa_logits_metadata
    return get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices)


@_get_paged_mqa_logits_metadata.register_fake
def _(context_lens, block_kv, num_sms, indices):
    return _fake_metadata(context_lens, num_sms)


# ---- top-k: each op returns (indices, values), values empty unless asked for -----------------

def _fake_selection(like: Tensor, rows: Any, topk: int, return_values: bool):
    values_rows = rows if return_values else 0
    return (like.new_empty((rows, topk), dtype=torch.int32),
            like.new_empty((values_rows, topk), dtype=torch.float32))


def _selection(result: Any, like: Tensor, return_values: bool):
    if return_values:
        return result
    return result, like.new_empty((0, result.shape[1]), dtype=torch.float32)


@torch.library.custom_op("mqa_logits::topk_per_row", mutates_args=())
def _topk_per_row(logits: Tensor, starts: Optional[Tensor], ends: Tensor, topk: int,
                  compressed: bool, absolute_indices: bool,
                  return_values: bool) -> Tuple[Tensor, Tensor]:
    from ._topk import topk_per_row
    return _selection(topk_per_row(logits, starts, ends, topk, compressed, absolute_indices,
                                   return_values), logits, return_values)


@_topk_per_row.register_fake
def _(logits, starts, ends, topk, compressed, absolute_indices, return_values):
    return _fake_selection(logits, logits.shape[0], topk, return_values)


@torch.library.custom_op("mqa_logits::mqa_topk", mutates_args=())
def _mqa_topk(q: Tensor, q_scales: Optional[Tensor], kv: Tensor, kv_scales: Optional[Tensor],
              weights: Tensor, cu_seq_len_k_start: Tensor, cu_seq_len_k_end: Tensor, topk: int,
              absolute_indices: bool, return_values: bool, schedule_meta: Optional[Tensor],
              logits_dtype: Optional[torch.dtype]) -> Tuple[Tensor, Tensor]:
    from ._topk import mqa_topk
    return _selection(mqa_topk(_join(q, q_scales), _join(kv, kv_scales), weights,
                               cu_seq_len_k_start, cu_seq_len_k_end, topk, absolute_indices,
                               return_values, schedule_meta, logits_dtype), q, return_values)


@_mqa_topk.register_fake
def _(q, q_scales, kv, kv_scales, weights, cu_seq_len_k_start, cu_seq_len_k_end, topk,
      absolute_indices, return_values, schedule_meta, logits_dtype):
    return _fake_selection(q, q.shape[0], topk, return_values)


@torch.library.custom_op("mqa_logits::paged_mqa_topk", mutates_args=())
def _paged_mqa_topk(q: Tensor, q_scales: Optional[Tensor], kv_cache: Tensor, weights: Tensor,
                    context_lens: Tensor, block_table: Tensor, schedule_meta: Tensor,
                    max_context_len: int, topk: int, cache_slots: bool, return_values: bool,
                    indices: Optional[Tensor],
                    logits_dtype: Optional[torch.dtype]) -> Tuple[Tensor, Tensor]:
    from ._topk import paged_mqa_topk
    return _selection(paged_mqa_topk(_join(q, q_scales), kv_cache, weights, context_lens,
                                     block_table, schedule_meta, max_context_len, topk,
                                     cache_slots, return_values, indices, logits_dtype), q,
                      return_values)


@_paged_mqa_topk.register_fake
def _(q, q_scales, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
      topk, cache_slots, return_values, indices, logits_dtype):
    return _fake_selection(q, q.shape[0] * q.shape[1], topk, return_values)


@torch.library.custom_op("mqa_logits::merge_topk", mutates_args=())
def _merge_topk(candidate_values: Tensor, candidate_indices: Tensor, topk: int,
                return_values: bool) -> Tuple[Tensor, Tensor]:
    from ._topk import merge_topk
    return _selection(merge_topk(candidate_values, candidate_indices, topk, return_values),
                      candidate_values, return_values)


@_merge_topk.register_fake
def _(candidate_values, candidate_indices, topk, return_values):
    return _fake_selection(candidate_values, candidate_values.shape[1], topk, return_values)


# ---- what the public functions call while torch.compile traces ------------------------------

def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                       max_seqlen_k, logits_dtype, schedule_meta):
    dtype = TORCH_OUTPUTS[logits_dtype_of(logits_dtype)]
    return _fp8_fp4_mqa_logits(*_split(q), *_split(kv), weights, cu_seq_len_k_start,
                               cu_seq_len_k_end, clean_logits, max_seqlen_k, dtype,
                               schedule_meta)


def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                   max_seqlen_k):
    return _fp8_mqa_logits(*_split(q), *_split(kv), weights, cu_seq_len_k_start,
                           cu_seq_len_k_end, clean_logits, max_seqlen_k)


def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                             max_context_len, clean_logits, logits_dtype, indices):
    dtype = TORCH_OUTPUTS[logits_dtype_of(logits_dtype)]
    return _fp8_fp4_paged_mqa_logits(*_split(q), kv_cache, weights, context_lens, block_table,
                                     schedule_meta, max_context_len, clean_logits, dtype, indices)


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                         max_context_len, clean_logits, indices):
    return _fp8_paged_mqa_logits(*_split(q), kv_cache, weights, context_lens, block_table,
                                 schedule_meta, max_context_len, clean_logits, indices)


def topk_per_row(logits, starts, ends, topk, compressed, absolute_indices, return_values):
    indices, values = _topk_per_row(logits, starts, ends, topk, compressed, absolute_indices,
                                    return_values)
    return (indices, values) if return_values else indices


def _torch_dtype(logits_dtype):
    return None if logits_dtype is None else TORCH_OUTPUTS[logits_dtype_of(logits_dtype)]


def mqa_topk(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, topk, absolute_indices,
             return_values, schedule_meta, logits_dtype):
    indices, values = _mqa_topk(*_split(q), *_split(kv), weights, cu_seq_len_k_start,
                                cu_seq_len_k_end, topk, absolute_indices, return_values,
                                schedule_meta, _torch_dtype(logits_dtype))
    return (indices, values) if return_values else indices


def paged_mqa_topk(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                   max_context_len, topk, cache_slots, return_values, indices, logits_dtype):
    out, values = _paged_mqa_topk(*_split(q), kv_cache, weights, context_lens, block_table,
                                  schedule_meta, max_context_len, topk, cache_slots,
                                  return_values, indices, _torch_dtype(logits_dtype))
    return (out, values) if return_values else out


def merge_topk(candidate_values, candidate_indices, topk, return_values):
    out, values = _merge_topk(candidate_values, candidate_indices, topk, return_values)
    return (out, values) if return_values else out


get_mqa_logits_metadata = _get_mqa_logits_metadata
get_paged_mqa_logits_metadata = _get_paged_mqa_logits_metadata


@torch.compiler.assume_constant_result
def get_num_sms() -> int:
    """A constant of the traced graph: the SM count does not change under a compiled model."""
    return _C.get_num_sms()
