"""The indexer functions, with the names, arguments and defaults of DeepGEMM's."""

from __future__ import annotations

from typing import Any, Optional

from . import _C
from ._C import DType
from ._arrays import (
    DEFAULT_LOGITS_DTYPE,
    INT32,
    Accepted,
    WEIGHTS,
    as_bool,
    as_int,
    describe,
    describe_optional,
    leading_size,
    logits_dtype_of,
    new_array,
    new_logits,
    paged_operands,
    prefill_operands,
    stream_of,
)
from ._errors import Vocabulary

try:  # torch.compile traces the functions (and _topk.py's) into torch custom ops (_torch_ops.py)
    from torch.compiler import is_compiling as _compiling

    from . import _torch_ops
except ImportError:  # no torch: nothing compiles
    _torch_ops = None

    def _compiling() -> bool:
        return False

try:  # the torch fast path (python/src/torch_bindings.cpp), when built against this torch
    from . import _torch_C
except ImportError:
    _torch_C = None

__all__ = [
    "fp8_fp4_mqa_logits",
    "fp8_mqa_logits",
    "get_mqa_logits_metadata",
    "get_paged_mqa_logits_metadata",
    "fp8_fp4_paged_mqa_logits",
    "fp8_paged_mqa_logits",
    "get_num_sms",
    "set_num_sms",
    "cuda_backend_available",
]

# `Tensor` in the signatures: a torch.Tensor, or a numpy.ndarray on the CPU path.
Tensor = Any

# How each function words the library's messages (see _errors.py): the C++ API names the windows
# k_start / k_end, the key count seq_len_kv and the output logits; the output's dtype is the
# caller's logits_dtype where the function has one.
_WINDOWS = {"k_start": "cu_seq_len_k_start", "k_end": "cu_seq_len_k_end"}
_PREFILL_ARGUMENTS = {**_WINDOWS, "seq_len_kv": "kv", "seq_len": "q"}
_PREFILL_TERMS = {**_WINDOWS, "seq_len_kv": "T (dim 0)", "seq_len": "S (dim 0)"}
_PAGED_ARGUMENTS = {"num_rows": "q"}
_PAGED_TERMS = {"num_rows": "B * N"}
_OUTPUT = "logits (the output)"  # never refused for a caller's input when logits are float32

_PREFILL_WORDS = Vocabulary({**_PREFILL_ARGUMENTS, "logits": "logits_dtype"}, _PREFILL_TERMS)
_FP8_PREFILL_WORDS = Vocabulary({**_PREFILL_ARGUMENTS, "logits": _OUTPUT}, _PREFILL_TERMS)
_PAGED_WORDS = Vocabulary({**_PAGED_ARGUMENTS, "logits": "logits_dtype"}, _PAGED_TERMS)
_FP8_PAGED_WORDS = Vocabulary({**_PAGED_ARGUMENTS, "logits": _OUTPUT}, _PAGED_TERMS)
_PREFILL_METADATA_WORDS = Vocabulary({**_WINDOWS, "seq_len_kv": "num_kv_tokens"},
                                     {**_WINDOWS, "seq_len_kv": "num_kv_tokens"})
_PAGED_METADATA_WORDS = Vocabulary({}, {})
_SET_NUM_SMS_WORDS = Vocabulary({"num_sms": "new_num_sms"}, {"num_sms": "new_num_sms"})

_FP8_PREFILL_WEIGHTS = Accepted(DType.float32, reason="fp8_mqa_logits returns float32 logits")
_FP8_PAGED_WEIGHTS = Accepted(DType.float32,
                              reason="fp8_paged_mqa_logits returns float32 logits")


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
    """Prefill indexer logits (FP8, MXFP8 or MXFP4): queries against one contiguous key sequence.

    ``logits[i, j] = sum_h weights[i, h] * relu(s(i, h, j))`` for the keys ``j`` of row ``i``'s
    window ``max(start[i], 0) <= j < min(end[i], T)``, where ``s`` is the scaled dot product of
    query ``i``'s head ``h`` with key ``j`` (docs/contract.md, "What is computed"). The format
    follows from the dtypes: float8_e4m3fn values with no query scales and float32 key scales
    are FP8; float8_e4m3fn values with int32 scales MXFP8; int8/uint8 values with int32 scales
    MXFP4 (two e2m1 per byte, low nibble first). numpy passes FP8 values as uint8 e4m3 codes.

    Args:
        q: ``[S, H, D]`` float8_e4m3fn (FP8, MXFP8) or ``[S, H, D/2]`` int8/uint8 (MXFP4), or a
            ``(values, scales)`` pair: scales ``None`` (FP8) or int32 ``[S, H]`` packed UE8M0
            (MX). H in @HEADS@; D in @DIMS@ (MXFP4: @MXFP4_DIMS@). Contiguous.
        kv: ``(values, scales)``: values ``[T, D]`` float8_e4m3fn or ``[T, D/2]`` int8/uint8
            (MXFP4); scales ``[T]`` float32 (FP8: one per key token) or int32 packed UE8M0
            (MX). Contiguous.
        weights: ``[S, H]`` float32 or bfloat16 (bfloat16 needs bfloat16 logits); last dim
            contiguous.
        @PREFILL_SHARED_ARGS@
        max_seqlen_k: 0 for ``[S, T]`` logits, or the width of a compressed ``[S, max_seqlen_k]``
            output whose element ``[i, c]`` is the logit of key ``start[i] + c``, at least the
            widest window counted from its start (``end - start`` columns, also where start is
            negative; the CPU backend and the checking mode refuse a narrower one; the GPU
            drops window columns past the width). Default 0.
        logits_dtype: float32 or bfloat16: a torch dtype, a numpy dtype (bfloat16 from
            ml_dtypes) or the name ``"float32"`` / ``"bfloat16"``. Default ``torch.float32``
            (``numpy.float32`` without torch).
        schedule_meta: None, or :func:`get_mqa_logits_metadata` of these windows, T and H: the
            output is bitwise identical without it. Without it the CUDA kernel computes the
            same split itself at the start of each call (a pass over the windows); with it that
            is done once for the calls that share the windows. Default None.

    Returns:
        The logits, ``[S, T]`` (or ``[S, max_seqlen_k]``) of logits_dtype, on q's device and of
        q's framework (torch tensor or numpy array): a view of rows padded to a multiple of
        1024 bytes, as DeepGEMM returns them. Empty calls work on every device and format:
        ``S = 0`` gives ``[0, T]`` logits, ``T = 0`` gives ``[S, 0]`` (or, compressed,
        ``[S, max_seqlen_k]`` of ``-inf`` when clean_logits), and a row whose window holds no
        key is all ``-inf`` when clean_logits.

    Raises:
        TypeError: an argument of the wrong type or dtype, e.g. ``"cu_seq_len_k_start:
            expected dtype int32, got int64"``.
        ValueError: any other invalid input (shape, stride, alignment, device, unsupported H
            or D, metadata of the wrong size), e.g. ``"cu_seq_len_k_end: expected shape [S] =
            [4], got [3]"`` or ``"kv: pass (values, scales): expected float32 per-token scales
            (q is FP8), got none"``. Messages name the argument as this function spells it
            (the scales of a pair as ``"kv: scales (kv[1])"``), then what was expected and
            what was given. Nothing is launched or written on refusal.

    Example:
        >>> import numpy as np
        >>> import mqa_logits as deep_gemm
        >>> rng = np.random.default_rng(0)
        >>> S, T, H, D = 4, 6, 8, 64
        >>> q, q_scales = deep_gemm.quantize_fp8(rng.standard_normal((S, H * D)))
        >>> kv = deep_gemm.quantize_fp8(rng.standard_normal((T, D)))   # (values, scales)
        >>> weights = (rng.standard_normal((S, H)) * q_scales[:, None]).astype(np.float32)
        >>> ends = np.arange(T - S + 1, T + 1, dtype=np.int32)          # causal windows
        >>> starts = ends - 3                                           # of 3 keys
        >>> logits = deep_gemm.fp8_fp4_mqa_logits(q.reshape(S, H, D), kv, weights, starts, ends)
        >>> logits.shape, logits.dtype
        ((4, 6), dtype('float32'))
        >>> bool(np.isneginf(logits[0, 3:]).all()), bool(np.isfinite(logits[3, 3:]).all())
        (True, True)
        >>> q4 = deep_gemm.quantize_mxfp4(rng.standard_normal((S, H, D)))   # MXFP4 pairs
        >>> kv4 = deep_gemm.quantize_mxfp4(rng.standard_normal((T, D)))
        >>> deep_gemm.fp8_fp4_mqa_logits(q4, kv4, weights, starts, ends, max_seqlen_k=3).shape
        (4, 3)
    """
    if _compiling():
        return _torch_ops.fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start,
                                             cu_seq_len_k_end,
                                             as_bool("clean_logits", clean_logits), max_seqlen_k,
                                             logits_dtype, schedule_meta)
    return _prefill(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                    max_seqlen_k, logits_dtype_of(logits_dtype), schedule_meta, WEIGHTS,
                    _PREFILL_WORDS)


def fp8_mqa_logits(
    q: Tensor,
    kv: Any,
    weights: Tensor,
    cu_seq_len_k_start: Tensor,
    cu_seq_len_k_end: Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
) -> Tensor:
    """FP8 prefill indexer logits, float32: queries against one contiguous key sequence.

    With ``(k, scale) = kv``, ``logits[i, j] = sum_h weights[i, h] * relu(scale[j] * (q[i, h] .
    k[j]))`` for the keys ``j`` of row ``i``'s window ``max(start[i], 0) <= j < min(end[i],
    T)``. FP8 queries carry no scale: fold a per-token query scale into the weights. This is
    :func:`fp8_fp4_mqa_logits` with float32 logits; like it, it also takes MXFP8 and MXFP4
    operands.

    Args:
        q: ``[S, H, D]`` float8_e4m3fn (numpy: uint8 e4m3 codes), or ``(values, None)``. H in
            @HEADS@, D in @DIMS@. Contiguous.
        kv: ``(values, scales)``: values ``[T, D]`` float8_e4m3fn (numpy: uint8 codes), scales
            ``[T]`` float32, one per key token. Contiguous.
        weights: ``[S, H]`` float32 (bfloat16 weights need bfloat16 logits:
            :func:`fp8_fp4_mqa_logits`); last dim contiguous.
        @PREFILL_SHARED_ARGS@
        max_seqlen_k: 0 for ``[S, T]`` logits, or the width of a compressed ``[S, max_seqlen_k]``
            output whose element ``[i, c]`` is the logit of key ``start[i] + c``, at least the
            widest window counted from its start (``end - start`` columns). Default 0.

    Returns:
        float32 logits ``[S, T]`` (or ``[S, max_seqlen_k]``) on q's device and of q's framework:
        a view of rows padded to a multiple of 1024 bytes. ``S = 0`` gives ``[0, T]``, ``T = 0``
        gives ``[S, 0]`` (compressed: ``[S, max_seqlen_k]`` of ``-inf`` when clean_logits), and a
        row whose window holds no key is all ``-inf`` when clean_logits.

    Raises:
        TypeError: an argument of the wrong type or dtype, e.g. ``"weights: expected dtype
            float32 (fp8_mqa_logits returns float32 logits), got bfloat16"``.
        ValueError: any other invalid input (shape, stride, alignment, device, unsupported H
            or D), e.g. ``"q: expected heads (dim 1) in @HEADS@, got 12"``. Messages
            name the argument as this function spells it. Nothing is launched or written on
            refusal.

    Example:
        >>> import numpy as np
        >>> import mqa_logits as deep_gemm
        >>> rng = np.random.default_rng(0)
        >>> S, T, H, D = 4, 6, 8, 64
        >>> q, q_scales = deep_gemm.quantize_fp8(rng.standard_normal((S, H * D)))
        >>> k_fp8, k_scales = deep_gemm.quantize_fp8(rng.standard_normal((T, D)))
        >>> weights = (rng.standard_normal((S, H)) * q_scales[:, None]).astype(np.float32)
        >>> starts = np.zeros(S, np.int32)
        >>> ends = np.arange(T - S + 1, T + 1, dtype=np.int32)          # causal windows
        >>> logits = deep_gemm.fp8_mqa_logits(q.reshape(S, H, D), (k_fp8, k_scales), weights,
        ...                                   starts, ends)
        >>> logits.shape, logits.dtype
        ((4, 6), dtype('float32'))
        >>> bool(np.isneginf(logits[0, 3:]).all())
        True
    """
    if _compiling():
        return _torch_ops.fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                                         as_bool("clean_logits", clean_logits), max_seqlen_k)
    return _prefill(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                    max_seqlen_k, DType.float32, None, _FP8_PREFILL_WEIGHTS, _FP8_PREFILL_WORDS)


def _prefill(q: Any, kv: Any, weights: Tensor, cu_seq_len_k_start: Tensor,
             cu_seq_len_k_end: Tensor, clean_logits: Any, max_seqlen_k: Any, dtype: DType,
             schedule_meta: Optional[Tensor], weights_accepted: Accepted,
             words: Vocabulary) -> Tensor:
    if _torch_C is not None:
        with words:
            logits = _torch_C.mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                                         clean_logits, max_seqlen_k, dtype, schedule_meta,
                                         weights_accepted is not WEIGHTS)
        if logits is not None:
            return logits
    q_values, q_array, q_scales, kv_array, kv_scales, weights_array, start, end = \
        prefill_operands(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, weights_accepted)
    meta = describe_optional("schedule_meta", schedule_meta, INT32)
    clean = as_bool("clean_logits", clean_logits)
    width = as_int("max_seqlen_k", max_seqlen_k)

    with words:
        layout = _C.mqa_logits_output_layout(leading_size(q_array, 1), leading_size(kv_array, 1),
                                             width, dtype)
        logits, logits_array = new_logits(q_values, layout, dtype)
        _C.mqa_logits(q_array, q_scales, kv_array, kv_scales, weights_array, start, end,
                      logits_array, clean, width, meta, stream_of(q_array))
    return logits


def get_mqa_logits_metadata(
    cu_seq_len_k_start: Tensor,
    cu_seq_len_k_end: Tensor,
    num_kv_tokens: int,
    num_heads: int,
) -> Tensor:
    """Schedule metadata of the prefill logits for these windows (docs/contract.md).

    An even split of the windows' work across :func:`get_num_sms` workers, computed once and
    passed as ``schedule_meta`` to every :func:`fp8_fp4_mqa_logits` call with the same windows,
    ``T`` and ``H`` (the layers of one forward pass). It changes no bit of the logits.

    Args:
        cu_seq_len_k_start: ``[S]`` int32, first key of each row's window, as the logits call
            gets it. Contiguous.
        cu_seq_len_k_end: ``[S]`` int32, one past the last key of each row's window.
        num_kv_tokens: T, the number of keys of the logits call (``>= 0``).
        num_heads: H of the logits call, one of @HEADS@.

    Returns:
        int32 ``[get_num_sms() + 1, 2]`` on the windows' device and of their framework.
        ``S = 0`` and ``num_kv_tokens = 0`` are valid (the split of no work).

    Raises:
        TypeError: an argument of the wrong type or dtype, e.g. ``"num_kv_tokens: expected an
            int, got float"``.
        ValueError: any other invalid input, e.g. ``"num_heads: expected num_heads in {8, 16,
            32, 64}, got 12"`` or ``"cu_seq_len_k_end: expected shape [S] (as
            cu_seq_len_k_start) = [4], got [3]"``.

    Example:
        >>> import numpy as np
        >>> import mqa_logits as deep_gemm
        >>> starts = np.zeros(4, np.int32)
        >>> ends = np.arange(3, 7, dtype=np.int32)
        >>> meta = deep_gemm.get_mqa_logits_metadata(starts, ends, 6, 8)
        >>> meta.shape == (deep_gemm.get_num_sms() + 1, 2), meta.dtype
        (True, dtype('int32'))
    """
    if _compiling():
        return _torch_ops.get_mqa_logits_metadata(cu_seq_len_k_start, cu_seq_len_k_end,
                                                  num_kv_tokens, num_heads)
    if _torch_C is not None:
        with _PREFILL_METADATA_WORDS:
            out = _torch_C.get_mqa_logits_metadata(cu_seq_len_k_start, cu_seq_len_k_end,
                                                   num_kv_tokens, num_heads)
        if out is not None:
            return out
    start = describe("cu_seq_len_k_start", cu_seq_len_k_start, INT32)
    end = describe("cu_seq_len_k_end", cu_seq_len_k_end, INT32)
    seq_len_kv = as_int("num_kv_tokens", num_kv_tokens)
    heads = as_int("num_heads", num_heads, bits=32)

    with _PREFILL_METADATA_WORDS:
        rows = _C.schedule_meta_rows(_C.get_num_sms())
        out, out_array = new_array(cu_seq_len_k_start, (rows, 2), (2, 1), DType.int32)
        _C.get_mqa_logits_metadata(start, end, seq_len_kv, heads, out_array, stream_of(start))
    return out


def get_paged_mqa_logits_metadata(
    context_lens: Tensor,
    block_kv: int,
    num_sms: int,
    indices: Optional[Tensor] = None,
) -> Tensor:
    """Schedule metadata of the decode logits for these context lengths (docs/contract.md).

    A static split of the decode work into ``num_sms`` equal segments; compute it once per
    decode step (it depends only on the context lengths) and pass it as ``schedule_meta`` to
    :func:`fp8_fp4_paged_mqa_logits`, whose kernel reads exactly this encoding.

    Args:
        context_lens: ``[B, N]`` or ``[B]`` int32 context lengths, exactly as the decode call
            gets them. Contiguous.
        block_kv: tokens per KV-cache block: 32 or 64.
        num_sms: workers to split the work across (``>= 1``); pass :func:`get_num_sms`.
        indices: None, or ``[B]`` int32 sequence labels of the varlen form (N = 1), as the
            decode call gets them. Default None.

    Returns:
        int32 ``[num_sms + 1, 2]`` on context_lens's device and of its framework. ``B = 0`` and
        zero context lengths are valid (the split of no work).

    Raises:
        TypeError: an argument of the wrong type or dtype, e.g. ``"context_lens: expected dtype
            int32, got int64"``.
        ValueError: any other invalid input, e.g. ``"block_kv: expected block_kv in {32, 64},
            got 48"`` or ``"num_sms: expected num_sms >= 1, got 0"``.

    Example:
        >>> import numpy as np
        >>> import mqa_logits as deep_gemm
        >>> context_lens = np.array([[99, 100], [39, 40]], np.int32)
        >>> meta = deep_gemm.get_paged_mqa_logits_metadata(context_lens, 64,
        ...                                                deep_gemm.get_num_sms())
        >>> meta.shape == (deep_gemm.get_num_sms() + 1, 2), meta.dtype
        (True, dtype('int32'))
    """
    if _compiling():
        return _torch_ops.get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices)
    if _torch_C is not None:
        with _PAGED_METADATA_WORDS:
            out = _torch_C.get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices)
        if out is not None:
            return out
    lens = describe("context_lens", context_lens, INT32)
    indices_array = describe_optional("indices", indices, INT32)
    block = as_int("block_kv", block_kv, bits=32)
    workers = as_int("num_sms", num_sms, bits=32)

    with _PAGED_METADATA_WORDS:
        rows = _C.schedule_meta_rows(workers)
        out, out_array = new_array(context_lens, (rows, 2), (2, 1), DType.int32)
        _C.get_paged_mqa_logits_metadata(lens, block, workers, out_array, indices_array,
                                         stream_of(lens))
    return out


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
    """Decode indexer logits (FP8, MXFP8 or MXFP4): ``next_n`` queries per sequence against a
    paged KV cache.

    Row ``r = b * N + t`` holds ``sum_h weights[r, h] * relu(s(r, h, p))`` for key positions
    ``0 <= p < L``, ``L = context_lens[b, t]`` (2-D) or ``context_lens[b] - N + t + 1`` (1-D);
    position ``p`` lives in block ``block_table[b, p // block_kv]`` at offset ``p % block_kv``.
    The format follows from the dtypes as in :func:`fp8_fp4_mqa_logits`.

    Args:
        q: ``[B, N, H, D]`` float8_e4m3fn (numpy FP8: uint8 codes) or ``[B, N, H, D/2]``
            int8/uint8 (MXFP4), or a ``(values, scales)`` pair with scales ``None`` (FP8) or
            int32 ``[B, N, H]`` packed UE8M0 (MX). N (next_n) from 1 to @MAX_NEXT_N@, H in
            @HEADS@, D in @DIMS@ (MXFP4: @MXFP4_DIMS@). Contiguous.
        kv_cache: ``[num_blocks, block_kv, 1, D + 4]`` bytes (``D/2 + 4`` for MXFP4), any 1-byte
            dtype, block_kv 32 or 64: each block holds its ``block_kv`` tokens' values, then
            their 4-byte scales (float32 for FP8, packed UE8M0 int32 for MX); dense within a
            block, blocks any multiple of 4 bytes apart. :func:`write_paged_kv_cache` writes it
            from numpy.
        weights: ``[B * N, H]`` float32 or bfloat16 (bfloat16 needs bfloat16 logits).
            Contiguous.
        @PAGED_SHARED_ARGS@
        logits_dtype: float32 or bfloat16: a torch dtype, a numpy dtype (bfloat16 from
            ml_dtypes) or the name ``"float32"`` / ``"bfloat16"``. Default ``torch.float32``
            (``numpy.float32`` without torch).
        indices: None, or ``[B]`` int32 (varlen form, N = 1): sequence labels; consecutive
            rows with equal labels are one sequence, whose keys are loaded once (its rows must
            hold the same block ids over its keys: the CPU backend checks). Default None.

    Returns:
        The logits, ``[B * N, max_context_len]`` of logits_dtype, on q's device and of q's
        framework: a view of rows padded to a multiple of 1024 bytes. ``B = 0`` gives ``[0,
        max_context_len]``, ``max_context_len = 0`` gives ``[B * N, 0]``, and a row of no keys
        (context length 0, or below 1 by the 1-D formula) is all ``-inf`` when clean_logits.
        Stored negative lengths and block ids out of range are refused by the CPU backend; the
        CUDA backend reads no key through such ids (docs/contract.md).

    Raises:
        TypeError: an argument of the wrong type or dtype, e.g. ``"block_table: expected dtype
            int32, got float32"``.
        ValueError: any other invalid input (shape, stride, alignment, device, unsupported
            N, H or D, metadata of the wrong size), e.g. ``"kv_cache: expected block_kv (dim 1)
            in {32, 64}, got 16"``. Messages name the argument as this function spells it (q's
            scales as ``"q: scales (q[1])"``). Nothing is launched or written on refusal.

    Example:
        >>> import numpy as np
        >>> import mqa_logits as deep_gemm
        >>> rng = np.random.default_rng(0)
        >>> B, N, H, D, block_kv = 2, 2, 16, 64, 32
        >>> cache = np.zeros((8, block_kv, 1, D + 4), np.uint8)        # 8 blocks of 32 tokens
        >>> block_table = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.int32)
        >>> for b, length in enumerate([100, 40]):                    # each sequence's keys
        ...     keys = deep_gemm.quantize_fp8(rng.standard_normal((length, D)))
        ...     deep_gemm.write_paged_kv_cache(cache, keys, block_table[b])
        >>> q, q_scales = deep_gemm.quantize_fp8(rng.standard_normal((B * N, H * D)))
        >>> weights = (rng.standard_normal((B * N, H)) * q_scales[:, None]).astype(np.float32)
        >>> context_lens = np.array([[99, 100], [39, 40]], np.int32)   # token t sees itself
        >>> meta = deep_gemm.get_paged_mqa_logits_metadata(context_lens, block_kv,
        ...                                                deep_gemm.get_num_sms())
        >>> logits = deep_gemm.fp8_fp4_paged_mqa_logits(q.reshape(B, N, H, D), cache, weights,
        ...                                             context_lens, block_table, meta, 128,
        ...                                             clean_logits=True)
        >>> logits.shape, [int(np.isfinite(row).sum()) for row in logits]
        ((4, 128), [99, 100, 39, 40])
    """
    if _compiling():
        return _torch_ops.fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens,
                                                   block_table, schedule_meta, max_context_len,
                                                   as_bool("clean_logits", clean_logits),
                                                   logits_dtype, indices)
    return _paged(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                  max_context_len, clean_logits, logits_dtype_of(logits_dtype), indices,
                  WEIGHTS, _PAGED_WORDS)


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
    """FP8 decode indexer logits, float32: ``next_n`` queries per sequence against a paged FP8
    KV cache.

    Row ``r = b * N + t`` holds ``sum_h weights[r, h] * relu(scale[p] * (q[b, t, h] . k[p]))``
    for key positions ``0 <= p < L``, ``L = context_lens[b, t]`` (2-D) or ``context_lens[b] - N
    + t + 1`` (1-D), where ``k[p]`` and ``scale[p]`` are the e4m3 values and float32 scale that
    the cache holds for position ``p``: in block ``block_table[b, p // block_kv]`` at offset
    ``p % block_kv``. This is :func:`fp8_fp4_paged_mqa_logits` with float32 logits; like it, it
    also takes MXFP8 and MXFP4 operands.

    Args:
        q: ``[B, N, H, D]`` float8_e4m3fn (numpy: uint8 e4m3 codes), or ``(values, None)``.
            N (next_n) from 1 to @MAX_NEXT_N@, H in @HEADS@, D in @DIMS@. Contiguous.
        kv_cache: ``[num_blocks, block_kv, 1, D + 4]`` bytes, any 1-byte dtype, block_kv 32 or
            64: each block holds its ``block_kv`` tokens' e4m3 values, then their float32
            scales; dense within a block, blocks any multiple of 4 bytes apart.
            :func:`write_paged_kv_cache` writes it from numpy.
        weights: ``[B * N, H]`` float32 (bfloat16 weights need bfloat16 logits:
            :func:`fp8_fp4_paged_mqa_logits`). Contiguous.
        @PAGED_SHARED_ARGS@
        indices: None, or ``[B]`` int32 (varlen form, N = 1): sequence labels, as for
            :func:`fp8_fp4_paged_mqa_logits`. Default None.

    Returns:
        float32 logits ``[B * N, max_context_len]`` on q's device and of q's framework: a view
        of rows padded to a multiple of 1024 bytes. ``B = 0`` gives ``[0, max_context_len]``,
        ``max_context_len = 0`` gives ``[B * N, 0]``, and a row of no keys (context length 0, or
        below 1 by the 1-D formula) is all ``-inf`` when clean_logits.

    Raises:
        TypeError: an argument of the wrong type or dtype, e.g. ``"weights: expected dtype
            float32 (fp8_paged_mqa_logits returns float32 logits), got bfloat16"``.
        ValueError: any other invalid input (shape, stride, alignment, device, unsupported N,
            H or D, metadata of the wrong size), e.g. ``"q: expected next_n (dim 1) in {1, 2,
            3, 4, 5, 6, 7, 8}, got 10"``. Messages name the argument as this function spells
            it. Nothing is launched or written on refusal.

    Example:
        >>> import numpy as np
        >>> import mqa_logits as deep_gemm
        >>> rng = np.random.default_rng(0)
        >>> B, N, H, D, block_kv = 2, 1, 16, 64, 64
        >>> cache = np.zeros((4, block_kv, 1, D + 4), np.uint8)
        >>> block_table = np.array([[3, 1], [0, 2]], np.int32)
        >>> for b, length in enumerate([70, 5]):
        ...     keys = deep_gemm.quantize_fp8(rng.standard_normal((length, D)))
        ...     deep_gemm.write_paged_kv_cache(cache, keys, block_table[b])
        >>> q, q_scales = deep_gemm.quantize_fp8(rng.standard_normal((B * N, H * D)))
        >>> weights = (rng.standard_normal((B * N, H)) * q_scales[:, None]).astype(np.float32)
        >>> context_lens = np.array([70, 5], np.int32)
        >>> meta = deep_gemm.get_paged_mqa_logits_metadata(context_lens, block_kv,
        ...                                                deep_gemm.get_num_sms())
        >>> logits = deep_gemm.fp8_paged_mqa_logits(q.reshape(B, N, H, D), cache, weights,
        ...                                         context_lens, block_table, meta, 80, True)
        >>> logits.shape, [int(np.isfinite(row).sum()) for row in logits]
        ((2, 80), [70, 5])
    """
    if _compiling():
        return _torch_ops.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table,
                                               schedule_meta, max_context_len,
                                               as_bool("clean_logits", clean_logits), indices)
    return _paged(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                  max_context_len, clean_logits, DType.float32, indices, _FP8_PAGED_WEIGHTS,
                  _FP8_PAGED_WORDS)


def _paged(q: Any, kv_cache: Tensor, weights: Tensor, context_lens: Tensor, block_table: Tensor,
           schedule_meta: Tensor, max_context_len: Any, clean_logits: Any, dtype: DType,
           indices: Optional[Tensor], weights_accepted: Accepted, words: Vocabulary) -> Tensor:
    if _torch_C is not None:
        with words:
            logits = _torch_C.paged_mqa_logits(q, kv_cache, weights, context_lens, block_table,
                                               schedule_meta, max_context_len, clean_logits,
                                               dtype, indices, weights_accepted is not WEIGHTS)
        if logits is not None:
            return logits
    q_values, q_array, q_scales, cache, weights_array, lens, table, meta = paged_operands(
        q, kv_cache, weights, context_lens, block_table, schedule_meta, weights_accepted)
    indices_array = describe_optional("indices", indices, INT32)
    width = as_int("max_context_len", max_context_len)
    clean = as_bool("clean_logits", clean_logits)

    with words:
        layout = _C.paged_mqa_logits_output_layout(leading_size(q_array, 2), width, dtype)
        logits, logits_array = new_logits(q_values, layout, dtype)
        _C.paged_mqa_logits(q_array, q_scales, cache, weights_array, lens, table, meta, width,
                            logits_array, clean, indices_array, stream_of(q_array))
    return logits


def get_num_sms() -> int:
    """The number of SMs the kernels may use (on the CPU backend: worker threads).

    Returns:
        The value of the last :func:`set_num_sms`, else the current CUDA device's SM count,
        else (no CUDA device visible) the number of hardware threads. Pass it to
        :func:`get_paged_mqa_logits_metadata`; :func:`get_mqa_logits_metadata` sizes its
        output with it.

    Raises:
        Nothing: it takes no argument.

    Example:
        >>> import mqa_logits as deep_gemm
        >>> deep_gemm.get_num_sms() >= 1
        True
    """
    if _compiling():
        return _torch_ops.get_num_sms()
    return _C.get_num_sms()


def set_num_sms(new_num_sms: int) -> None:
    """Limit the SMs the kernels may use, e.g. to leave room for kernels running beside them.

    Metadata computed before the change was sized for the old count: compute it again.

    Args:
        new_num_sms: from 1 to the current CUDA device's SM count (4096 without a CUDA
            device), or 0 for the default: the current device's SM count (the hardware thread
            count without a CUDA device), as DeepGEMM's ``set_num_sms(0)``.

    Returns:
        None.

    Raises:
        TypeError: new_num_sms is not an int, e.g. ``"new_num_sms: expected an int, got
            float"``.
        ValueError: new_num_sms out of range, e.g. ``"new_num_sms: expected 0 <= new_num_sms <=
            132 (the SMs of cuda:0), got -1"``.

    Example:
        >>> import mqa_logits as deep_gemm
        >>> default = deep_gemm.get_num_sms()
        >>> deep_gemm.set_num_sms(1)
        >>> deep_gemm.get_num_sms()
        1
        >>> deep_gemm.set_num_sms(default)
    """
    workers = as_int("new_num_sms", new_num_sms, bits=32)
    with _SET_NUM_SMS_WORDS:
        _C.set_num_sms(workers)


def cuda_backend_available() -> bool:
    """Whether CUDA tensors can run here: this build has the CUDA backend (sm_90a kernels) and a
    GPU of compute capability 9.0 (H100, H200) is visible.

    Returns:
        True or False. When False, calls with CUDA tensors raise ValueError (nothing falls back
        to the CPU); CPU tensors and numpy arrays always run the CPU backend.

    Raises:
        Nothing: it takes no argument.

    Example:
        >>> import mqa_logits as deep_gemm
        >>> isinstance(deep_gemm.cuda_backend_available(), bool)
        True
    """
    return bool(_C.cuda_backend_available())


# Placeholders in the docstrings: the supported sets come from the capability table
# (mqa_logits/capabilities.hpp).
def _set_text(values) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


_CAPABILITIES = {"@HEADS@": _set_text(_C.HEAD_COUNTS), "@DIMS@": _set_text(_C.HEAD_DIMS),
                 "@MXFP4_DIMS@": _set_text(_C.MXFP4_HEAD_DIMS), "@MAX_NEXT_N@": str(_C.MAX_NEXT_N)}

# Args entries that the fp8_fp4_* functions and their float32 twins (fp8_*) share word for word,
# written once; continuation lines are indented relative to the entry.
_SHARED_ARGS = {
    "@PREFILL_SHARED_ARGS@": """\
cu_seq_len_k_start: ``[S]`` int32, first key of each row's window (clamped at 0).
cu_seq_len_k_end: ``[S]`` int32, one past the last key of each row's window (clamped at
    T); an empty or inverted window is an empty row.
clean_logits: when True, every element outside a window is exactly ``-inf``; when False
    those elements are unspecified. Default True (a bool, 0 or 1, or None:
    False).""",
    "@PAGED_SHARED_ARGS@": """\
context_lens: ``[B, N]`` int32 (row ``b*N + t`` sees ``context_lens[b, t]`` keys) or
    ``[B]`` (it sees ``context_lens[b] - N + t + 1``). Contiguous.
block_table: ``[B, max_blocks]`` int32 block ids, a row per sequence (per row of q in
    the varlen form, the rows of a sequence holding its blocks, as ``repeat_interleave``
    gives them), last dim contiguous, any row stride ``>= 0``.
schedule_meta: :func:`get_paged_mqa_logits_metadata` of these context lengths (and
    indices), this block_kv and :func:`get_num_sms` workers.
max_context_len: output columns (``>= 0``).
clean_logits: when True, the columns at or past a row's context length are exactly
    ``-inf``; when False they are unspecified. Default False (a bool, 0 or
    1, or None: False).""",
}
_ARGS_INDENT = " " * 8  # of an Args entry in a function's docstring

_DOC_TEXTS = {**{word: text.replace("\n", "\n" + _ARGS_INDENT)
                 for word, text in _SHARED_ARGS.items()},
              **_CAPABILITIES}  # the shared entries first: their text may name capabilities
for _function in (fp8_fp4_mqa_logits, fp8_mqa_logits, get_mqa_logits_metadata,
                  fp8_fp4_paged_mqa_logits, fp8_paged_mqa_logits):
    for _word, _text in _DOC_TEXTS.items():
        _function.__doc__ = _function.__doc__.replace(_word, _text)
