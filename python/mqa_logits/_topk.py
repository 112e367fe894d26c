"""Top-k key indices per row (operation 3 of the contract): topk_per_row over logits the caller
holds, and mqa_topk / paged_mqa_topk from the indexer's inputs.

Every row selects the ``topk`` keys of largest logit, ties to the lower key, keys whose logit is
-inf (or NaN) never; its indices come in ascending key order, then -1 where its window holds fewer
than ``topk`` selectable keys (the values there are -inf). The set is the top-k of exactly the
logits ``fp8_fp4_mqa_logits`` / ``fp8_fp4_paged_mqa_logits`` return for the same inputs (float32,
or bfloat16 with bfloat16 weights), on every backend bitwise the same.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

from . import _C
from ._arrays import (
    INT32,
    KV_SCALES,
    Q_SCALES,
    WEIGHTS,
    Accepted,
    as_bool,
    as_int,
    byte_view,
    describe,
    describe_optional,
    leading_size,
    new_array,
    operand,
    stream_of,
)
from ._errors import Vocabulary

try:
    from torch.compiler import is_compiling as _compiling

    from . import _torch_ops
except ImportError:
    _torch_ops = None

    def _compiling() -> bool:
        return False

Tensor = Any
Selection = Union[Tensor, Tuple[Tensor, Tensor]]

_LOGITS = Accepted(_C.DType.float32, _C.DType.bfloat16)
_PER_ROW_WORDS = Vocabulary({}, {})
_WINDOWS = {"k_start": "cu_seq_len_k_start", "k_end": "cu_seq_len_k_end"}
_PREFILL_WORDS = Vocabulary({**_WINDOWS, "seq_len_kv": "kv", "seq_len": "q"},
                            {**_WINDOWS, "seq_len_kv": "T (dim 0)", "seq_len": "S (dim 0)"})
_PAGED_WORDS = Vocabulary({"num_rows": "q"}, {"num_rows": "B * N"})


def _outputs(like: Any, rows: int, topk: int, with_values: bool):
    _C.mqa_topk_workspace_bytes(0, 0, topk)  # refuses a topk out of [1, MAX_TOPK] by name
    indices, indices_array = new_array(like, (rows, topk), (topk, 1), _C.DType.int32)
    if not with_values:
        return indices, indices_array, None, None
    values, values_array = new_array(like, (rows, topk), (topk, 1), _C.DType.float32)
    return indices, indices_array, values, values_array


def _workspace(like: Any, nbytes: int):
    return new_array(like, (nbytes,), (1,), _C.DType.uint8)


def topk_per_row(logits: Tensor, starts: Optional[Tensor], ends: Tensor, topk: int,
                 compressed: bool = False, absolute_indices: bool = False,
                 return_values: bool = False) -> Selection:
    """Top-k key indices of every row of logits the caller holds.

    Args:
        logits: ``[R, C]`` float32 or bfloat16, last dim contiguous: full prefill rows (column c
            is key c), compressed rows (``compressed=True``: column c is key ``starts[i] + c``)
            or decode rows.
        starts: ``[R]`` int32 window starts, or None (every row starts at key 0).
        ends: ``[R]`` int32; row i selects among keys ``max(starts[i], 0) <= j < ends[i]`` that
            have a column (decode rows: the row lengths).
        topk: 1 to 2048.
        compressed: the rows are compressed (``max_seqlen_k``) output.
        absolute_indices: indices are keys; by default ``key - starts[i]``.
        return_values: also return the selected logits (float32).

    Returns:
        int32 ``[R, topk]`` indices (and float32 ``[R, topk]`` values) on the logits' device.
    """
    if _compiling():
        return _torch_ops.topk_per_row(logits, starts, ends, topk, compressed, absolute_indices,
                                       return_values)
    logits_array = describe("logits", logits, _LOGITS)
    starts_array = describe_optional("starts", starts, INT32)
    ends_array = describe("ends", ends, INT32)
    k = as_int("topk", topk)
    with _PER_ROW_WORDS:
        indices, indices_array, values, values_array = _outputs(
            logits, leading_size(logits_array, 1), k, return_values)
        _C.topk_per_row(logits_array, starts_array, ends_array, k, indices_array, values_array,
                        as_bool("compressed", compressed),
                        as_bool("absolute_indices", absolute_indices), stream_of(logits_array))
    return (indices, values) if return_values else indices


def mqa_topk(q: Any, kv: Any, weights: Tensor, cu_seq_len_k_start: Tensor,
             cu_seq_len_k_end: Tensor, topk: int, absolute_indices: bool = False,
             return_values: bool = False, schedule_meta: Optional[Tensor] = None) -> Selection:
    """Prefill top-k: each query row's ``topk`` best keys, without returning the logits.

    Arguments as :func:`fp8_fp4_mqa_logits` (FP8, MXFP8 or MXFP4 operands; float32 or bfloat16
    weights), then ``topk`` (1 to 2048). Indices are ``key - cu_seq_len_k_start[i]`` (as vLLM and
    SGLang consume them), or keys with ``absolute_indices``.

    Returns:
        int32 ``[S, topk]`` indices (and float32 values with ``return_values``).
    """
    if _compiling():
        return _torch_ops.mqa_topk(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, topk,
                                   absolute_indices, return_values, schedule_meta)
    q_values, q_array, q_scales = operand("q", q, Q_SCALES)
    _, kv_array, kv_scales = operand("kv", kv, KV_SCALES)
    weights_array = describe("weights", weights, WEIGHTS)
    start = describe("cu_seq_len_k_start", cu_seq_len_k_start, INT32)
    end = describe("cu_seq_len_k_end", cu_seq_len_k_end, INT32)
    meta = describe_optional("schedule_meta", schedule_meta, INT32)
    k = as_int("topk", topk)
    with _PREFILL_WORDS:
        rows, keys = leading_size(q_array, 1), leading_size(kv_array, 1)
        _, workspace_array = _workspace(q_values, _C.mqa_topk_workspace_bytes(rows, keys, k))
        indices, indices_array, values, values_array = _outputs(q_values, rows, k, return_values)
        _C.mqa_topk(q_array, q_scales, kv_array, kv_scales, weights_array, start, end, k,
                    indices_array, workspace_array, values_array,
                    as_bool("absolute_indices", absolute_indices), meta, stream_of(q_array))
    return (indices, values) if return_values else indices


def paged_mqa_topk(q: Any, kv_cache: Tensor, weights: Tensor, context_lens: Tensor,
                   block_table: Tensor, schedule_meta: Tensor, max_context_len: int, topk: int,
                   cache_slots: bool = False, return_values: bool = False,
                   indices: Optional[Tensor] = None) -> Selection:
    """Decode top-k: each row's ``topk`` best key positions, without returning the logits.

    Arguments as :func:`fp8_fp4_paged_mqa_logits`, then ``topk`` (1 to 2048). Indices are key
    positions p, or with ``cache_slots`` the slots ``block_table[b, p // block_kv] * block_kv +
    p % block_kv`` that sparse decode attention reads.

    Returns:
        int32 ``[B * N, topk]`` indices (and float32 values with ``return_values``).
    """
    if _compiling():
        return _torch_ops.paged_mqa_topk(q, kv_cache, weights, context_lens, block_table,
                                         schedule_meta, max_context_len, topk, cache_slots,
                                         return_values, indices)
    q_values, q_array, q_scales = operand("q", q, Q_SCALES)
    cache = byte_view("kv_cache", kv_cache)
    weights_array = describe("weights", weights, WEIGHTS)
    lens = describe("context_lens", context_lens, INT32)
    table = describe("block_table", block_table, INT32)
    meta = describe("schedule_meta", schedule_meta, INT32)
    indices_array = describe_optional("indices", indices, INT32)
    width = as_int("max_context_len", max_context_len)
    k = as_int("topk", topk)
    with _PAGED_WORDS:
        rows = leading_size(q_array, 2)
        _, workspace_array = _workspace(q_values,
                                        _C.paged_mqa_topk_workspace_bytes(rows, width, k))
        out, out_array, values, values_array = _outputs(q_values, rows, k, return_values)
        _C.paged_mqa_topk(q_array, q_scales, cache, weights_array, lens, table, meta, width, k,
                          out_array, workspace_array, values_array,
                          as_bool("cache_slots", cache_slots), indices_array, stream_of(q_array))
    return (out, values) if return_values else out
