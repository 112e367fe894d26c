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
    SHAPE,
    WEIGHTS,
    Accepted,
    as_bool,
    as_int,
    describe,
    describe_optional,
    leading_size,
    logits_dtype_of,
    new_array,
    paged_operands,
    prefill_operands,
    stream_of,
)
from ._api import (
    _PAGED_ARGUMENTS,
    _PAGED_TERMS,
    _PREFILL_ARGUMENTS,
    _PREFILL_TERMS,
    _compiling,
    _torch_ops,
)
from ._errors import Vocabulary

Tensor = Any
Selection = Union[Tensor, Tuple[Tensor, Tensor]]

_LOGITS = Accepted(_C.DType.float32, _C.DType.bfloat16)
_VALUES = Accepted(_C.DType.float32)
_PER_ROW_WORDS = Vocabulary({}, {})
# Messages about the operands in the logits functions' words (_api.py).
_PREFILL_WORDS = Vocabulary(_PREFILL_ARGUMENTS, _PREFILL_TERMS)
_PAGED_WORDS = Vocabulary(_PAGED_ARGUMENTS, _PAGED_TERMS)


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

    Each row selects the ``topk`` keys of largest logit, ties to the lower key, never a key
    whose logit is -inf or NaN; its indices come in ascending key order, then -1 where the
    window holds fewer selectable keys. CPU and GPU give the same rows, bitwise.

    Args:
        logits: ``[R, C]`` float32 or bfloat16, last dim contiguous: full prefill rows (column c
            is key c), compressed rows (column c is key ``starts[i] + c``) or decode rows, as
            the logits functions return them.
        starts: ``[R]`` int32 window starts, or None (every row starts at key 0: decode rows).
        ends: ``[R]`` int32; row i selects among the keys ``max(starts[i], 0) <= j < ends[i]``
            that have a column (decode rows: the row lengths).
        topk: keys a row selects, 1 to 2048.
        compressed: the rows are compressed (``max_seqlen_k``) output, whose column c is key
            ``starts[i] + c``. Default False.
        absolute_indices: indices are keys; otherwise ``key - starts[i]`` (the column of
            compressed output). Default False.
        return_values: also return the selected logits (float32, -inf at the -1 indices).
            Default False.

    Returns:
        int32 ``[R, topk]`` indices, and with return_values float32 ``[R, topk]`` values, on
        the logits' device and of their framework.

    Raises:
        TypeError: an argument of the wrong type or dtype, e.g. ``"ends: expected dtype int32,
            got int64"``.
        ValueError: any other invalid input, e.g. ``"topk: expected 1 <= topk <= 2048, got
            0"``. Nothing is launched or written on refusal.

    Example:
        >>> import numpy as np
        >>> import mqa_logits
        >>> logits = np.array([[0.5, 3.0, -np.inf, 3.0, 1.0]], np.float32)
        >>> mqa_logits.topk_per_row(logits, None, np.array([5], np.int32), 3)
        array([[1, 3, 4]], dtype=int32)
    """

    if _compiling():
        return _torch_ops.topk_per_row(logits, starts, ends, topk, compressed, absolute_indices,
                                       return_values)
    with_values = as_bool("return_values", return_values)
    logits_array = describe("logits", logits, _LOGITS)
    starts_array = describe_optional("starts", starts, INT32)
    ends_array = describe("ends", ends, INT32)
    k = as_int("topk", topk)
    with _PER_ROW_WORDS:
        indices, indices_array, values, values_array = _outputs(
            logits, leading_size(logits_array, 1), k, with_values)
        _C.topk_per_row(logits_array, starts_array, ends_array, k, indices_array, values_array,
                        as_bool("compressed", compressed),
                        as_bool("absolute_indices", absolute_indices), stream_of(logits_array))
    return (indices, values) if with_values else indices


def merge_topk(candidate_values: Tensor, candidate_indices: Tensor, topk: int,
               return_values: bool = False) -> Selection:
    """The top-k over R candidate lists per row: what context parallelism merges.

    Each of R ranks selects over its shard of the keys (with ``absolute_indices`` and
    ``return_values``, its indices mapped to the global keys) and sends its ``[S, K]`` lists; the
    merge gives each row's top-k over all of them with the rules of :func:`topk_per_row`: ties to
    the lower key, ascending key order, -1 after, never a -inf value.

    Args:
        candidate_values: ``[R, S, K]`` float32, contiguous: the candidates' logits (what
            ``return_values=True`` returns, stacked over the ranks).
        candidate_indices: ``[R, S, K]`` int32, contiguous: their global keys, each list in
            ascending order with -1 after its last key, a row's keys distinct across the lists.
        topk: keys a row selects, 1 to 2048.
        return_values: also return the selected values (float32). Default False.

    Returns:
        int32 ``[S, topk]`` keys (and float32 values with return_values) on the candidates'
        device.

    Raises:
        TypeError: an argument of the wrong type or dtype, e.g. ``"candidate_indices: expected
            dtype int32, got int64"``.
        ValueError: any other invalid input, e.g. lists out of order on the CPU
            (``"candidate_indices: expected each list in ascending order, ..."``), or more than
            16384 candidates a row on a CUDA device. Nothing is launched or written on refusal.

    Example:
        >>> import numpy as np
        >>> import mqa_logits
        >>> values = np.array([[[3.0, 1.0]], [[2.0, 2.0]]], np.float32)   # 2 ranks, 1 row
        >>> keys = np.array([[[4, 9]], [[2, 7]]], np.int32)
        >>> mqa_logits.merge_topk(values, keys, 2)
        array([[2, 4]], dtype=int32)
    """
    if _compiling():
        return _torch_ops.merge_topk(candidate_values, candidate_indices, topk, return_values)
    with_values = as_bool("return_values", return_values)
    values_array = describe("candidate_values", candidate_values, _VALUES)
    indices_array = describe("candidate_indices", candidate_indices, INT32)
    k = as_int("topk", topk)
    with _PER_ROW_WORDS:
        shape = values_array[SHAPE]
        rows = shape[1] if len(shape) == 3 else 0  # validation names a wrong rank
        out, out_array, values, values_out = _outputs(candidate_values, rows, k, with_values)
        _C.merge_topk(values_array, indices_array, k, out_array, values_out,
                      stream_of(values_array))
    return (out, values) if with_values else out


def mqa_topk(q: Any, kv: Any, weights: Tensor, cu_seq_len_k_start: Tensor,
             cu_seq_len_k_end: Tensor, topk: int, absolute_indices: bool = False,
             return_values: bool = False, schedule_meta: Optional[Tensor] = None,
             logits_dtype: Any = None) -> Selection:
    """Prefill top-k: each query row's ``topk`` best keys, without returning the logits.

    The selected set is the top-k of exactly the logits :func:`fp8_fp4_mqa_logits` returns for
    the same inputs (float32, or bfloat16 with bfloat16 weights), with the rules of
    :func:`topk_per_row`: ties to the lower key, ascending key order, -1 past the window.

    Args:
        q: ``[S, H, D]`` queries as :func:`fp8_fp4_mqa_logits` takes them (FP8 values, or an
            MX ``(values, scales)`` pair).
        kv: ``(values, scales)`` of the ``T`` keys, as :func:`fp8_fp4_mqa_logits` takes them.
        weights: ``[S, H]`` float32 or bfloat16 per-head weights; last dim contiguous.
        cu_seq_len_k_start: ``[S]`` int32, first key of each row's window (clamped at 0).
        cu_seq_len_k_end: ``[S]`` int32, one past the last key of each row's window.
        topk: keys a row selects, 1 to 2048.
        absolute_indices: indices are keys; otherwise ``key - cu_seq_len_k_start[i]``, as vLLM
            and SGLang consume them. Default False.
        return_values: also return the selected logits (float32). Default False.
        schedule_meta: optional result of :func:`get_mqa_logits_metadata` for these windows.
            Default None.
        logits_dtype: the dtype of the logits the selection is over, as
            :func:`fp8_fp4_mqa_logits` would return them: float32 or bfloat16 (bfloat16 weights
            need bfloat16). Default None: the weights' dtype.

    Returns:
        int32 ``[S, topk]`` indices (and float32 ``[S, topk]`` values with return_values) on
        q's device. The call uses a workspace of the logits' size, allocated with q's framework.

    Raises:
        TypeError: an argument of the wrong type or dtype, e.g. ``"weights: expected dtype
            float32 or bfloat16, got int32"``.
        ValueError: any other invalid input, e.g. ``"topk: expected 1 <= topk <= 2048, got
            0"``. Nothing is launched or written on refusal.

    Example:
        >>> import numpy as np
        >>> import mqa_logits
        >>> rng = np.random.default_rng(0)
        >>> S, T, H, D = 4, 300, 8, 64
        >>> q, q_scales = mqa_logits.quantize_fp8(rng.standard_normal((S, H * D)))
        >>> k, k_scales = mqa_logits.quantize_fp8(rng.standard_normal((T, D)))
        >>> weights = (rng.standard_normal((S, H)) * q_scales[:, None]).astype(np.float32)
        >>> starts = np.zeros(S, np.int32)
        >>> ends = np.arange(T - S + 1, T + 1, dtype=np.int32)
        >>> top = mqa_logits.mqa_topk(q.reshape(S, H, D), (k, k_scales), weights, starts, ends,
        ...                           topk=64)
        >>> top.shape, top.dtype, bool((np.diff(top, axis=1) > 0).all())
        ((4, 64), dtype('int32'), True)
    """

    if _compiling():
        return _torch_ops.mqa_topk(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, topk,
                                   absolute_indices, return_values, schedule_meta, logits_dtype)
    with_values = as_bool("return_values", return_values)
    q_values, q_array, q_scales, kv_array, kv_scales, weights_array, start, end = \
        prefill_operands(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, WEIGHTS)
    meta = describe_optional("schedule_meta", schedule_meta, INT32)
    k = as_int("topk", topk)
    dtype = None if logits_dtype is None else logits_dtype_of(logits_dtype)
    with _PREFILL_WORDS:
        rows, keys = leading_size(q_array, 1), leading_size(kv_array, 1)
        _, workspace_array = _workspace(q_values, _C.mqa_topk_workspace_bytes(rows, keys, k))
        indices, indices_array, values, values_array = _outputs(q_values, rows, k, with_values)
        _C.mqa_topk(q_array, q_scales, kv_array, kv_scales, weights_array, start, end, k,
                    indices_array, workspace_array, values_array,
                    as_bool("absolute_indices", absolute_indices), meta, dtype,
                    stream_of(q_array))
    return (indices, values) if with_values else indices


def paged_mqa_topk(q: Any, kv_cache: Tensor, weights: Tensor, context_lens: Tensor,
                   block_table: Tensor, schedule_meta: Tensor, max_context_len: int, topk: int,
                   cache_slots: bool = False, return_values: bool = False,
                   indices: Optional[Tensor] = None, logits_dtype: Any = None) -> Selection:
    """Decode top-k: each row's ``topk`` best key positions, without returning the logits.

    The selected set is the top-k of exactly the logits :func:`fp8_fp4_paged_mqa_logits`
    returns for the same inputs, with the rules of :func:`topk_per_row`; a key in a block whose
    id is outside the cache is never selected.

    Args:
        q: ``[B, N, H, D]`` queries as :func:`fp8_fp4_paged_mqa_logits` takes them.
        kv_cache: the fused paged cache ``[num_blocks, block_kv, 1, D + 4]`` of bytes.
        weights: ``[B * N, H]`` float32 or bfloat16 per-head weights.
        context_lens: ``[B]`` or ``[B, N]`` int32 context lengths, as for the logits.
        block_table: ``[B, max_blocks]`` int32 block ids of each sequence.
        schedule_meta: the result of :func:`get_paged_mqa_logits_metadata` for these lengths.
        max_context_len: the logits' width; a row's keys are clamped to it.
        topk: keys a row selects, 1 to 2048.
        cache_slots: indices are the slots ``block_table[b, p // block_kv] * block_kv + p %
            block_kv`` that sparse decode attention reads; otherwise the positions p. Default
            False.
        return_values: also return the selected logits (float32). Default False.
        indices: ``[B]`` int32 sequence labels of the varlen form (next_n 1), as for the
            logits. Default None.
        logits_dtype: the dtype of the logits the selection is over, as
            :func:`fp8_fp4_paged_mqa_logits` would return them: float32 or bfloat16. Default
            None: the weights' dtype.

    Returns:
        int32 ``[B * N, topk]`` indices (and float32 values with return_values) on q's device.
        The call uses a workspace of the logits' size, allocated with q's framework.

    Raises:
        TypeError: an argument of the wrong type or dtype, e.g. ``"block_table: expected dtype
            int32, got float32"``.
        ValueError: any other invalid input, e.g. ``"topk: expected 1 <= topk <= 2048, got
            0"``. Nothing is launched or written on refusal.

    Example:
        >>> import numpy as np
        >>> import mqa_logits
        >>> rng = np.random.default_rng(0)
        >>> B, H, D, block_kv, blocks = 2, 8, 64, 64, 4
        >>> cache = np.zeros((blocks, block_kv, 1, D + 4), np.uint8)
        >>> table = np.array([[0, 1], [2, 3]], np.int32)
        >>> for b in range(B):
        ...     keys = mqa_logits.quantize_fp8(rng.standard_normal((2 * block_kv, D)))
        ...     mqa_logits.write_paged_kv_cache(cache, keys, table[b])
        >>> q, q_scales = mqa_logits.quantize_fp8(rng.standard_normal((B, H * D)))
        >>> weights = (rng.standard_normal((B, H)) * q_scales[:, None]).astype(np.float32)
        >>> lens = np.array([100, 128], np.int32)
        >>> meta = mqa_logits.get_paged_mqa_logits_metadata(lens, block_kv,
        ...                                                 mqa_logits.get_num_sms())
        >>> top = mqa_logits.paged_mqa_topk(q.reshape(B, 1, H, D), cache, weights, lens, table,
        ...                                 meta, 128, topk=16, cache_slots=True)
        >>> top.shape, bool((top[0] < 2 * block_kv).all()), bool((top[1] >= 2 * block_kv).all())
        ((2, 16), True, True)
    """

    if _compiling():
        return _torch_ops.paged_mqa_topk(q, kv_cache, weights, context_lens, block_table,
                                         schedule_meta, max_context_len, topk, cache_slots,
                                         return_values, indices, logits_dtype)
    with_values = as_bool("return_values", return_values)
    q_values, q_array, q_scales, cache, weights_array, lens, table, meta = paged_operands(
        q, kv_cache, weights, context_lens, block_table, schedule_meta, WEIGHTS)
    indices_array = describe_optional("indices", indices, INT32)
    width = as_int("max_context_len", max_context_len)
    k = as_int("topk", topk)
    dtype = None if logits_dtype is None else logits_dtype_of(logits_dtype)
    with _PAGED_WORDS:
        rows = leading_size(q_array, 2)
        _, workspace_array = _workspace(q_values,
                                        _C.paged_mqa_topk_workspace_bytes(rows, width, k))
        out, out_array, values, values_array = _outputs(q_values, rows, k, with_values)
        _C.paged_mqa_topk(q_array, q_scales, cache, weights_array, lens, table, meta, width, k,
                          out_array, workspace_array, values_array,
                          as_bool("cache_slots", cache_slots), indices_array, dtype,
                          stream_of(q_array))
    return (out, values) if with_values else out
