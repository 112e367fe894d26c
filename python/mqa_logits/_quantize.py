"""numpy helpers that prepare the indexer's inputs: quantizers to FP8, MXFP8 and MXFP4 and a writer
of the fused paged KV cache (docs/contract.md, "What is computed" and "Decode").

The quantizers follow the rules of the C++ library's (``include/mqa_logits/formats.hpp``), so
numpy and C++ callers store the same codes: values are divided by their scale in float32, then
rounded to the nearest code, ties to even, saturating at the format's largest value.
"""

from __future__ import annotations

import operator
from typing import Any, Tuple

import numpy as np

from ._errors import InvalidArgumentError, InvalidTypeError

try:
    import ml_dtypes  # numpy float8_e4m3fn (MXFP8 values)
except ImportError:
    ml_dtypes = None

__all__ = ["quantize_fp8", "quantize_mxfp8", "quantize_mxfp4", "write_paged_kv_cache"]

MX_BLOCK = 32  # elements per UE8M0 scale
_MAX_MX_BLOCKS = 4  # scales of one vector packed into one int32
_UE8M0_BIAS = 127
_E4M3_MAX = 448.0
_E2M1_MAX = 6.0
_BLOCK_KV = (32, 64)
_SCALE_BYTES = 4


class _Minifloat:
    """A sign-magnitude minifloat without infinities (e4m3 "fn", e2m1)."""

    def __init__(self, mantissa_bits: int, min_exponent: int, sign_bit: int, max_code: int,
                 max_value: float) -> None:
        self.mantissa_bits = mantissa_bits
        self.min_exponent = min_exponent  # exponent of the smallest normal value
        self.sign_bit = sign_bit
        self.max_code = max_code  # largest finite magnitude code
        self.max_value = max_value

    def encode(self, values: np.ndarray) -> np.ndarray:
        """float32 values -> codes (uint8): nearest, ties to even, saturating at max_value."""
        magnitude = np.abs(values).astype(np.float64)  # exact
        _, binade = np.frexp(magnitude)  # magnitude = m * 2**binade with m in [0.5, 1)
        exponent = np.maximum(binade.astype(np.int64) - 1, self.min_exponent)
        # Count in steps of the code spacing at the value's exponent (the subnormal spacing below
        # the normal range); a carry into the next binade lands on the next code, as codes of
        # consecutive binades are consecutive integers. np.rint rounds half to even.
        steps = np.rint(np.ldexp(magnitude, self.mantissa_bits - exponent)).astype(np.int64)
        codes = ((exponent - self.min_exponent) << self.mantissa_bits) + steps
        codes = np.where(magnitude >= self.max_value, self.max_code, codes)
        codes = np.where(magnitude == 0.0, 0, codes)
        return (codes | np.where(np.signbit(values), self.sign_bit, 0)).astype(np.uint8)


_E4M3 = _Minifloat(mantissa_bits=3, min_exponent=-6, sign_bit=0x80, max_code=0x7E,
                   max_value=_E4M3_MAX)
_E2M1 = _Minifloat(mantissa_bits=1, min_exponent=0, sign_bit=0x8, max_code=0x7,
                   max_value=_E2M1_MAX)


def _as_float32(x: Any) -> np.ndarray:
    """`x` as a float32 array of at least one dim, refusing what has no real values or no scale."""
    try:
        array = np.asarray(x)
    except Exception as error:  # e.g. a CUDA tensor, or a ragged list
        raise InvalidTypeError(
            f"x: expected a numpy array of real numbers, got {type(x).__name__} "
            f"({error})") from None
    if array.dtype.kind in "bcOSUMm":
        raise InvalidTypeError(
            f"x: expected real numbers (float or integer dtype), got {array.dtype}")
    if array.ndim == 0:
        raise InvalidArgumentError(
            "x: expected at least one dimension (vectors along the last), got a "
            "scalar")
    try:
        values = array.astype(np.float32)
    except (TypeError, ValueError):
        raise InvalidTypeError(
            f"x: expected real numbers (float or integer dtype), got {array.dtype}") \
            from None
    finite = np.isfinite(values)
    if not finite.all():
        raise InvalidArgumentError(f"x: expected finite values, got {values[~finite].flat[0]}")
    return values


def _mx_blocks(values: np.ndarray) -> np.ndarray:
    """[..., D] -> [..., D / 32, 32], refusing a head dim that is no whole number of blocks."""
    dim = values.shape[-1]
    if dim == 0 or dim % MX_BLOCK != 0 or dim // MX_BLOCK > _MAX_MX_BLOCKS:
        raise InvalidArgumentError(
            f"x: expected a last dim of 32, 64, 96 or 128 (the head dim), got {dim}")
    return values.reshape(*values.shape[:-1], dim // MX_BLOCK, MX_BLOCK)


def _quantize_mx(x: Any, element: _Minifloat) -> Tuple[np.ndarray, np.ndarray]:
    """Per 32-element block, the smallest power-of-two scale ``2^k`` with ``amax / 2^k`` within
    the element range (an all-zero block gets ``k = 0``); returns (codes [..., D], packed int32
    scales [...])."""
    blocks = _mx_blocks(_as_float32(x))
    amax = np.abs(blocks).max(axis=-1).astype(np.float64)
    _, binade = np.frexp(amax)
    _, max_binade = np.frexp(element.max_value)
    # ilogb(amax) - ilogb(max) is within one of the answer: start one below, step up.
    k = binade.astype(np.int64) - max_binade - 1
    for _ in range(3):
        k = np.where(np.ldexp(amax, -k) > element.max_value, k + 1, k)
    k = np.where(amax == 0.0, 0, np.maximum(k, -_UE8M0_BIAS))
    scaled = np.ldexp(blocks, (-k)[..., None].astype(np.int32))  # float32, a power-of-two rescale
    codes = element.encode(scaled).reshape(*blocks.shape[:-2], blocks.shape[-2] * MX_BLOCK)
    scale_bytes = np.zeros((*blocks.shape[:-2], _MAX_MX_BLOCKS), dtype=np.uint8)
    scale_bytes[..., :blocks.shape[-2]] = (k + _UE8M0_BIAS).astype(np.uint8)
    packed = scale_bytes.view("<i4").reshape(blocks.shape[:-2]).astype(np.int32)
    return codes, packed


def quantize_fp8(x: Any) -> Tuple[np.ndarray, np.ndarray]:
    """Quantize vectors (along the last dim) to FP8 with one float32 scale per vector.

    The FP8 format of the indexer's keys: ``scale = amax / 448`` over the vector (1 for an
    all-zero vector), ``values = e4m3(x / scale)`` rounded to nearest, ties to even (the rule of
    the C++ library's ``quantize_fp8_token``).

    Args:
        x: ``[..., D]`` real numbers (any float or integer numpy dtype, ml_dtypes bfloat16 too;
            converted to float32 first), for example keys ``[T, D]``. Queries take no scales in
            FP8: quantize each query token as one vector, ``x = q.reshape(S, H * D)``, and fold
            its scale into the weights (``weights * scales[:, None]``), as DeepSeek does.

    Returns:
        ``(values, scales)``: values ``[..., D]`` uint8 e4m3 codes (what the logits functions
        take as FP8 through numpy; ``values.view(ml_dtypes.float8_e4m3fn)`` gives their
        values), scales ``[...]`` float32. ``x ~= decode(values) * scales[..., None]``. The pair
        is what ``kv`` of :func:`fp8_mqa_logits` and :func:`write_paged_kv_cache` take.

    Raises:
        TypeError: ``x`` holds no real numbers (bool, complex, strings, objects).
        ValueError: ``x`` is a scalar or holds NaN or an infinity.

    Example:
        >>> import numpy as np
        >>> import mqa_logits
        >>> values, scales = mqa_logits.quantize_fp8(np.array([[448.0, 1.0, -2.0, 0.0]]))
        >>> values, scales
        (array([[126,  56, 192,   0]], dtype=uint8), array([1.], dtype=float32))
    """
    values = _as_float32(x)
    amax = np.abs(values).max(axis=-1, initial=0.0)
    # The floor keeps the scale positive when amax / 448 underflows (amax below ~6e-43).
    tiny = np.finfo(np.float32).smallest_subnormal
    scales = np.where(amax == 0.0, np.float32(1.0),
                      np.maximum(amax / np.float32(_E4M3_MAX), tiny)).astype(np.float32)
    codes = _E4M3.encode(values / scales[..., None])
    return codes, scales


def quantize_mxfp8(x: Any) -> Tuple[np.ndarray, np.ndarray]:
    """Quantize vectors (along the last dim) to MXFP8: e4m3 values, one UE8M0 scale per block of
    32 elements, the vector's scales packed into one int32.

    Per block, the scale is the smallest power of two ``2^k`` with ``amax / 2^k <= 448`` (an
    all-zero block gets ``2^0``); values are ``e4m3(x / 2^k)``, nearest, ties to even. UE8M0
    code ``k + 127`` of block ``b`` is byte ``b`` of the packed int32 (little-endian); the bytes
    past the last block are 0.

    Args:
        x: ``[..., D]`` real numbers with D = 32, 64, 96 or 128 (the library takes 32, 64 and
            128), e.g. queries ``[S, H, D]`` or keys ``[T, D]``; converted to float32 first.

    Returns:
        ``(values, scales)``: values ``[..., D]`` ``ml_dtypes.float8_e4m3fn`` (MXFP8 values must
        reach the logits functions as float8: uint8 with int32 scales reads as MXFP4), scales
        ``[...]`` int32 packed UE8M0.

    Raises:
        ImportError: the ml_dtypes package, which gives numpy its float8 type, is missing.
        TypeError: ``x`` holds no real numbers.
        ValueError: ``x`` is a scalar, holds NaN or an infinity, or its last dim is not 32, 64,
            96 or 128.

    Example:
        >>> import numpy as np
        >>> import mqa_logits
        >>> values, scales = mqa_logits.quantize_mxfp8(np.full((2, 32), 3.0))
        >>> values.dtype.name, hex(int(scales[0]))  # 3 / 2^-7 = 384 <= 448: k = -7, code 120
        ('float8_e4m3fn', '0x78')
    """
    if ml_dtypes is None:
        raise ImportError("quantize_mxfp8: MXFP8 values are float8_e4m3fn arrays, which numpy "
                          "has only through the ml_dtypes package (pip install ml_dtypes)")
    codes, scales = _quantize_mx(x, _E4M3)
    return codes.view(ml_dtypes.float8_e4m3fn), scales


def quantize_mxfp4(x: Any) -> Tuple[np.ndarray, np.ndarray]:
    """Quantize vectors (along the last dim) to MXFP4: e2m1 values packed two per byte, one
    UE8M0 scale per block of 32 elements, the vector's scales packed into one int32.

    Per block, the scale is the smallest power of two ``2^k`` with ``amax / 2^k <= 6`` (an
    all-zero block gets ``2^0``); values are ``e2m1(x / 2^k)`` (±{0, 0.5, 1, 1.5, 2, 3, 4, 6}),
    nearest, ties to even. Element ``2i`` goes to the low nibble of byte ``i``, element ``2i+1``
    to the high nibble; bit 3 of a nibble is the sign. Scales are packed as in
    :func:`quantize_mxfp8`.

    Args:
        x: ``[..., D]`` real numbers with D = 32, 64, 96 or 128 (the library takes 64 and 128
            for MXFP4); converted to float32 first.

    Returns:
        ``(values, scales)``: values ``[..., D / 2]`` uint8 (two e2m1 per byte), scales
        ``[...]`` int32 packed UE8M0: the MXFP4 operands of the logits functions.

    Raises:
        TypeError: ``x`` holds no real numbers.
        ValueError: ``x`` is a scalar, holds NaN or an infinity, or its last dim is not 32, 64,
            96 or 128.

    Example:
        >>> import numpy as np
        >>> import mqa_logits
        >>> x = np.zeros(64)
        >>> x[:3] = [6.0, 1.0, -0.5]
        >>> values, scales = mqa_logits.quantize_mxfp4(x)
        >>> values.shape, hex(values[0]), hex(values[1]), hex(int(scales))  # 6|1, -0.5|0; k = 0
        ((32,), '0x27', '0x9', '0x7f7f')
    """
    codes, scales = _quantize_mx(x, _E2M1)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return packed, scales


def write_paged_kv_cache(kv_cache: np.ndarray, kv: Tuple[np.ndarray, np.ndarray],
                         block_table_row: Any, start: int = 0) -> None:
    """Write one sequence's quantized keys into a fused paged KV cache (numpy), in place.

    Key position ``p`` (``start <= p < start + T``) lives in block ``block_table_row[p //
    block_kv]`` at offset ``p % block_kv``. Each block is one run of bytes: first the values of
    its ``block_kv`` tokens, token-major (``block_kv * token_bytes`` bytes), then
    their 4-byte scales (float32 for FP8, packed UE8M0 int32 for MXFP8 / MXFP4), one per token,
    little-endian. Blocks may be further apart than their size (``kv_cache.strides[0]``); the
    bytes between blocks are left as they are, and so are the tokens not written.

    Args:
        kv_cache: ``[num_blocks, block_kv, 1, token_bytes + 4]`` numpy array of a 1-byte dtype
            (uint8, int8 or float8), writable, dense within each block, blocks a multiple of 4
            bytes apart; block_kv 32 or 64; token_bytes is D (FP8, MXFP8) or D / 2 (MXFP4).
            Allocate one with ``np.zeros((num_blocks, block_kv, 1, token_bytes + 4),
            np.uint8)``; it is what ``kv_cache`` of :func:`fp8_paged_mqa_logits` takes.
        kv: ``(values, scales)`` of ``T`` tokens, as the quantizers return them: values
            ``[T, token_bytes]`` of a 1-byte dtype, scales ``[T]`` float32 (FP8) or int32 (MX).
        block_table_row: the sequence's row of the block table, ``[max_blocks]`` integers:
            block ids in ``[0, num_blocks)`` for every block the positions reach.
        start: position of the first token (e.g. the sequence's length before these tokens
            when appending the keys of a decode step). Default 0.

    Returns:
        None: ``kv_cache`` is written in place.

    Raises:
        TypeError: an argument of the wrong type or dtype (e.g. a torch tensor for kv_cache:
            index a torch cache with torch instead, as examples/deepseek_v32_indexer.py does).
        ValueError: shapes that do not fit together, a cache that is not the fused layout or
            not writable, a block_table_row too short or with block ids out of range, a
            negative start. Nothing is written then.

    Example:
        >>> import numpy as np
        >>> import mqa_logits
        >>> keys = np.random.default_rng(0).standard_normal((100, 128))
        >>> cache = np.zeros((4, 64, 1, 128 + 4), np.uint8)   # 4 blocks of 64 tokens
        >>> mqa_logits.write_paged_kv_cache(cache, mqa_logits.quantize_fp8(keys), [2, 0])
        >>> bool(cache[1].any()), bool(cache[2].any())         # tokens 0-63 in block 2
        (False, True)
    """
    cache = _cache_bytes(kv_cache)
    if not isinstance(kv, (tuple, list)) or len(kv) != 2:
        raise InvalidTypeError(f"kv: expected a (values, scales) pair, got {type(kv).__name__}")
    values, scales = kv
    num_blocks, block_kv, _, row_bytes = cache.shape
    token_bytes = row_bytes - _SCALE_BYTES
    if not isinstance(values, np.ndarray) or values.dtype.itemsize != 1:
        raise InvalidTypeError(
            "kv: values (kv[0]): expected a numpy array of a 1-byte dtype (uint8, "
            f"int8 or float8), got {_describe(values)}")
    if values.ndim != 2 or values.shape[1] != token_bytes:
        raise InvalidArgumentError(
            f"kv: values (kv[0]): expected shape [T, {token_bytes}] (the cache's "
            f"dim 3 less 4 scale bytes), got {list(values.shape)}")
    if not isinstance(scales, np.ndarray) or scales.dtype not in (np.float32, np.int32):
        raise InvalidTypeError(
            "kv: scales (kv[1]): expected a numpy array of dtype float32 (FP8) or "
            f"int32 (MXFP8, MXFP4), got {_describe(scales)}")
    num_tokens = values.shape[0]
    if scales.shape != (num_tokens,):
        raise InvalidArgumentError(
            f"kv: scales (kv[1]): expected shape [T] = [{num_tokens}], got "
            f"{list(scales.shape)}")
    try:
        first = operator.index(start)
    except TypeError:
        raise InvalidTypeError(f"start: expected an int, got {type(start).__name__}") from None
    if first < 0:
        raise InvalidArgumentError(f"start: expected start >= 0, got {first}")
    try:
        row = np.asarray(block_table_row)
    except Exception:
        row = np.asarray([None])
    if row.ndim != 1 or (row.size and row.dtype.kind not in "iu"):
        raise InvalidTypeError(
            "block_table_row: expected a 1-D sequence of integers (one row of the "
            f"block table), got {_describe(block_table_row)}")
    positions = first + np.arange(num_tokens, dtype=np.int64)
    needed = -(-(first + num_tokens) // block_kv) if num_tokens else 0
    if row.shape[0] < needed:
        raise InvalidArgumentError(
            f"block_table_row: expected at least {needed} blocks for positions "
            f"{first} to {first + num_tokens - 1} of {block_kv}-token blocks, got "
            f"{row.shape[0]}")
    block_ids = row[positions // block_kv].astype(np.int64)
    outside = (block_ids < 0) | (block_ids >= num_blocks)
    if outside.any():
        raise InvalidArgumentError(
            f"block_table_row: expected block ids in [0, {num_blocks}) (the cache's "
            f"blocks), got {block_ids[outside][0]}")

    block_stride = cache.strides[0] if num_blocks > 1 else block_kv * row_bytes
    blocks = np.lib.stride_tricks.as_strided(cache, (num_blocks, block_kv * row_bytes),
                                             (block_stride, 1))
    value_slots = np.lib.stride_tricks.as_strided(blocks, (num_blocks, block_kv, token_bytes),
                                                  (block_stride, token_bytes, 1))
    scale_slots = np.lib.stride_tricks.as_strided(blocks[:, block_kv * token_bytes:],
                                                  (num_blocks, block_kv, _SCALE_BYTES),
                                                  (block_stride, _SCALE_BYTES, 1))
    offsets = positions % block_kv
    value_slots[block_ids, offsets] = values.view(np.uint8)
    little_endian = scales.astype(scales.dtype.newbyteorder("<"))
    scale_slots[block_ids, offsets] = little_endian.view(np.uint8).reshape(num_tokens,
                                                                          _SCALE_BYTES)


def _describe(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype} array of shape {list(x.shape)}"
    return type(x).__name__


def _cache_bytes(kv_cache: Any) -> np.ndarray:
    """The fused cache as a uint8 view, after checking the layout the writer relies on."""
    if not isinstance(kv_cache, np.ndarray) or kv_cache.dtype.itemsize != 1:
        raise InvalidTypeError(
            "kv_cache: expected a numpy array of a 1-byte dtype (uint8, int8 or "
            f"float8), got {_describe(kv_cache)}")
    if kv_cache.ndim != 4 or kv_cache.shape[2] != 1 or kv_cache.shape[3] <= _SCALE_BYTES:
        raise InvalidArgumentError(
            "kv_cache: expected shape [num_blocks, block_kv, 1, token_bytes + 4], "
            f"got {list(kv_cache.shape)}")
    num_blocks, block_kv, _, row_bytes = kv_cache.shape
    if block_kv not in _BLOCK_KV:
        raise InvalidArgumentError(
            f"kv_cache: expected block_kv (dim 1) in {{32, 64}}, got {block_kv}")
    if kv_cache.strides[3] != 1 or kv_cache.strides[1] != row_bytes:
        raise InvalidArgumentError(
            f"kv_cache: expected dense blocks (stride 1 = {row_bytes}, stride 3 = "
            f"1), got strides {kv_cache.strides[1]} and {kv_cache.strides[3]}")
    block_bytes = block_kv * row_bytes
    block_stride = kv_cache.strides[0] if num_blocks > 1 else block_bytes
    if block_stride < block_bytes or block_stride % _SCALE_BYTES != 0:
        raise InvalidArgumentError(
            "kv_cache: expected a block stride (stride 0) that is a multiple of 4 "
            f"and at least {block_bytes} bytes, got {block_stride}")
    if not kv_cache.flags.writeable:
        raise InvalidArgumentError("kv_cache: expected a writable array, got a read-only one")
    return kv_cache.view(np.uint8)
