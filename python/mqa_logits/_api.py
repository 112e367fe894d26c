"""The indexer functions, with the names, arguments and defaults of DeepGEMM's."""

from __future__ import annotations

from typing import Any, Optional

from . import _C
from ._C import DType
from ._arrays import (
    DEFAULT_LOGITS_DTYPE,
    INT32,
    KV_SCALES,
    Q_SCALES,
    WEIGHTS,
    adapt,
    adapt_optional,
    as_bool,
    as_int,
    byte_view,
    logits_dtype_of,
    operand,
    pair_of,
    place_of,
)

__all__ = [
    "fp8_fp4_mqa_logits",
    "fp8_mqa_logits",
    "get_mqa_logits_metadata",
    "get_paged_mqa_logits_metadata",
    "fp8_fp4_paged_mqa_logits",
    "fp8_paged_mqa_logits",
    "get_num_sms",
    "set_num_sms",
]

# `Tensor` in the signatures: a torch.Tensor, or a numpy.ndarray on the CPU path.
Tensor = Any


def fp8_fp4_mqa_logits(
    q: Any,
    kv: Any,
    weights: Tensor,
    cu_seq_len_k_start: Tensor,
    cu_seq_len_k_end: Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
    logits_dtype: Any = DEFAULT_LOGITS_DTYPE,
    schedule_meta: Optional[Tensor] = None,
) -> Tensor:
    """Prefill indexer logits: queries against one contiguous key sequence.

    ``logits[i, j] = sum_h weights[i, h] * relu(s(i, h, j))`` for the keys ``j`` of row ``i``'s
    window ``max(start[i], 0) <= j < min(end[i], T)``, where ``s`` is the scaled dot product of
    query head ``h`` with key ``j``.

    Args:
        q: ``[S, H, D]`` float8_e4m3fn (FP8, MXFP8) or ``[S, H, D/2]`` int8/uint8 (MXFP4), or a
            ``(values, scales)`` pair: scales ``None`` (FP8) or int32 ``[S, H]`` packed UE8M0 (MX).
        kv: ``(values, scales)``: values ``[T, D]`` float8_e4m3fn or ``[T, D/2]`` int8/uint8
            (MXFP4); scales ``[T]`` float32 (FP8) or int32 packed UE8M0 (MX).
        weights: ``[S, H]`` float32 or bfloat16 (bfloat16 needs bfloat16 logits).
        cu_seq_len_k_start: ``[S]`` int32, first key of each row's window.
        cu_seq_len_k_end: ``[S]`` int32, one past the last key of each row's window.
        clean_logits: every element outside a window is exactly ``-inf``; when False those
            elements are unspecified.
        max_seqlen_k: 0, or the width of a compressed ``[S, max_seqlen_k]`` output whose element
            ``[i, c]`` is the logit of key ``start[i] + c``.
        logits_dtype: float32 or bfloat16 (a torch dtype, a numpy dtype or its name).
        schedule_meta: optional result of :func:`get_mqa_logits_metadata` for these windows;
            the output is bitwise identical without it. Without it the CUDA kernel computes the
            same split itself at the start of each call (~2-4 us); with it that is done once
            for the calls that share the windows.

    Returns:
        ``[S, T]`` (or ``[S, max_seqlen_k]``) logits on q's device, allocated with q's framework:
        a view of rows padded to a multiple of 1024 bytes.

    Raises:
        TypeError: an argument of the wrong type or dtype.
        ValueError: any other invalid input (shape, stride, device, unsupported H or D, ...).
    """
    q_operand = operand("q", q, Q_SCALES)
    kv_operand = operand("kv", kv, KV_SCALES)
    weights_array = adapt("weights", weights, WEIGHTS)
    start = adapt("cu_seq_len_k_start", cu_seq_len_k_start, INT32)
    end = adapt("cu_seq_len_k_end", cu_seq_len_k_end, INT32)
    meta = adapt_optional("schedule_meta", schedule_meta, INT32)
    clean = as_bool("clean_logits", clean_logits)
    width = as_int("max_seqlen_k", max_seqlen_k)
    dtype = logits_dtype_of(logits_dtype)

    place = place_of(q_operand.values)
    layout = _C.mqa_logits_output_layout(
        q_operand.values.leading_size(1), kv_operand.values.leading_size(1), width, dtype)
    logits = place.logits(layout, dtype)
    with place.active():
        _C.mqa_logits(q_operand.pair(), kv_operand.pair(), weights_array.pair(), start.pair(),
                      end.pair(), logits.pair(), clean, width, pair_of(meta), place.stream())
    return logits.user


def fp8_mqa_logits(
    q: Tensor,
    kv: Any,
    weights: Tensor,
    cu_seq_len_k_start: Tensor,
    cu_seq_len_k_end: Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
) -> Tensor:
    """FP8 prefill logits, float32: :func:`fp8_fp4_mqa_logits` with q a float8_e4m3fn tensor
    ``[S, H, D]`` and kv ``(values [T, D] float8_e4m3fn, scales [T] float32)``."""
    return fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                              clean_logits, max_seqlen_k, "float32")


def get_mqa_logits_metadata(
    cu_seq_len_k_start: Tensor,
    cu_seq_len_k_end: Tensor,
    num_kv_tokens: int,
    num_heads: int,
) -> Tensor:
    """Schedule metadata for :func:`fp8_fp4_mqa_logits` with these windows, ``num_kv_tokens``
    keys and ``num_heads`` heads: int32 ``[get_num_sms() + 1, 2]`` on the windows' device."""
    start = adapt("cu_seq_len_k_start", cu_seq_len_k_start, INT32)
    end = adapt("cu_seq_len_k_end", cu_seq_len_k_end, INT32)
    seq_len_kv = as_int("num_kv_tokens", num_kv_tokens)
    heads = as_int("num_heads", num_heads, bits=32)

    place = place_of(start)
    rows = _C.schedule_meta_rows(_C.get_num_sms())
    out = place.output("schedule_meta", (rows, 2), DType.int32)
    with place.active():
        _C.get_mqa_logits_metadata(start.pair(), end.pair(), seq_len_kv, heads, out.pair(),
                                   place.stream())
    return out.user


def get_paged_mqa_logits_metadata(
    context_lens: Tensor,
    block_kv: int,
    num_sms: int,
    indices: Optional[Tensor] = None,
) -> Tensor:
    """Schedule metadata for :func:`fp8_fp4_paged_mqa_logits`.

    Args:
        context_lens: ``[B, N]`` or ``[B]`` int32 context lengths, as the decode call gets them.
        block_kv: tokens per KV-cache block (32 or 64).
        num_sms: workers to split the work across; pass :func:`get_num_sms`.
        indices: ``[B]`` int32 block-table rows of the varlen form, or None.

    Returns:
        int32 ``[num_sms + 1, 2]`` on context_lens's device.
    """
    lens = adapt("context_lens", context_lens, INT32)
    indices_array = adapt_optional("indices", indices, INT32)
    block = as_int("block_kv", block_kv, bits=32)
    workers = as_int("num_sms", num_sms, bits=32)

    place = place_of(lens)
    out = place.output("schedule_meta", (_C.schedule_meta_rows(workers), 2), DType.int32)
    with place.active():
        _C.get_paged_mqa_logits_metadata(lens.pair(), block, workers, out.pair(),
                                         pair_of(indices_array), place.stream())
    return out.user


def fp8_fp4_paged_mqa_logits(
    q: Any,
    kv_cache: Tensor,
    weights: Tensor,
    context_lens: Tensor,
    block_table: Tensor,
    schedule_meta: Tensor,
    max_context_len: int,
    clean_logits: bool = False,
    logits_dtype: Any = DEFAULT_LOGITS_DTYPE,
    indices: Optional[Tensor] = None,
) -> Tensor:
    """Decode indexer logits: ``next_n`` queries per sequence against a paged KV cache.

    Args:
        q: ``[B, N, H, D]`` float8_e4m3fn or ``[B, N, H, D/2]`` int8/uint8 (MXFP4), or a
            ``(values, scales)`` pair with scales ``None`` (FP8) or int32 ``[B, N, H]`` (MX).
        kv_cache: ``[num_blocks, block_kv, 1, D + 4]`` bytes (``D/2 + 4`` for MXFP4), any 1-byte
            dtype: each block holds its ``block_kv`` tokens' values, then their 4-byte scales
            (float32 for FP8, packed UE8M0 int32 for MX).
        weights: ``[B * N, H]`` float32 or bfloat16.
        context_lens: ``[B, N]`` int32 (row ``b*N + t`` sees ``context_lens[b, t]`` keys) or
            ``[B]`` (it sees ``context_lens[b] - N + t + 1``).
        block_table: ``[B, max_blocks]`` int32, last dim contiguous.
        schedule_meta: :func:`get_paged_mqa_logits_metadata` of these context lengths.
        max_context_len: output columns.
        clean_logits: columns past a row's context length are exactly ``-inf``.
        logits_dtype: float32 or bfloat16.
        indices: ``[B]`` int32 (varlen form, N = 1): row ``r`` reads block-table row
            ``indices[r]``.

    Returns:
        ``[B * N, max_context_len]`` logits on q's device, allocated with q's framework.

    Raises:
        TypeError: an argument of the wrong type or dtype.
        ValueError: any other invalid input.
    """
    q_operand = operand("q", q, Q_SCALES)
    cache = byte_view("kv_cache", kv_cache)
    weights_array = adapt("weights", weights, WEIGHTS)
    lens = adapt("context_lens", context_lens, INT32)
    table = adapt("block_table", block_table, INT32)
    meta = adapt("schedule_meta", schedule_meta, INT32)
    indices_array = adapt_optional("indices", indices, INT32)
    width = as_int("max_context_len", max_context_len)
    clean = as_bool("clean_logits", clean_logits)
    dtype = logits_dtype_of(logits_dtype)

    place = place_of(q_operand.values)
    layout = _C.paged_mqa_logits_output_layout(q_operand.values.leading_size(2), width, dtype)
    logits = place.logits(layout, dtype)
    with place.active():
        _C.paged_mqa_logits(q_operand.pair(), cache.pair(), weights_array.pair(), lens.pair(),
                            table.pair(), meta.pair(), width, logits.pair(), clean,
                            pair_of(indices_array), place.stream())
    return logits.user


def fp8_paged_mqa_logits(
    q: Tensor,
    kv_cache: Tensor,
    weights: Tensor,
    context_lens: Tensor,
    block_table: Tensor,
    schedule_meta: Tensor,
    max_context_len: int,
    clean_logits: bool = False,
    indices: Optional[Tensor] = None,
) -> Tensor:
    """FP8 decode logits, float32: :func:`fp8_fp4_paged_mqa_logits` with q a float8_e4m3fn
    tensor ``[B, N, H, D]`` and a ``[num_blocks, block_kv, 1, D + 4]`` FP8 cache."""
    return fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table,
                                    schedule_meta, max_context_len, clean_logits, "float32",
                                    indices)


def get_num_sms() -> int:
    """SMs the kernels may use (CPU: worker threads); the current GPU's count unless set."""
    return _C.get_num_sms()


def set_num_sms(new_num_sms: int) -> None:
    """Limit the SMs the kernels may use, e.g. to leave room for kernels running beside them."""
    _C.set_num_sms(as_int("new_num_sms", new_num_sms, bits=32))
