"""The numpy helpers against the formats' definitions (docs/contract.md, "What is computed"
and "Decode").

Codes are checked with reference.py's decoders, which are written from the definitions and
share nothing with the package: each stored code must be the nearest representable value to the
scaled input (ties to the even code), each scale the one the definition asks for. ml_dtypes,
when installed, is a second, independent encoder to agree with.
"""

import numpy as np
import pytest

import mqa_logits
from reference import (E2M1_MAGNITUDES, E4M3, MX_BLOCK, bf16_round, decode_e2m1,
                       decode_packed_scales, logits_f64, spec_diff)
from support import ml_dtypes, requires_ml_dtypes

E4M3_MAX = 448.0
E2M1_MAX = 6.0
FINITE_E4M3_CODES = np.array([c for c in range(256) if (c & 0x7F) != 0x7F])
E2M1_VALUES = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES])  # nibbles 0-7, then 8-15


def wide_range_rows(rng, rows, dim):
    """Rows of very different magnitudes (one binade each, 2^-40 to 2^40), a zero row, a row of
    float32 subnormals, and exact ties between codes."""
    x = rng.standard_normal((rows, dim)) * np.exp2(rng.integers(-40, 40, size=(rows, 1)))
    x[0] = 0.0
    x[1] = rng.standard_normal(dim) * 1e-40
    x[[2, 5]] = 0.0
    x[2, :8] = [448.0, -448.0, 1.0625, 1.1875, 3 * 2.0**-10, 2.0**-10, 432.0, -0.0]  # e4m3 ties
    x[5, :8] = [6.0, 2.5, 5.0, 0.25, 1.25, 1.75, -2.5, -5.0]  # e2m1 ties (amax 6: scale 1)
    return x.astype(np.float32)


def assert_nearest_ties_to_even(scaled, codes, code_values, code_ids):
    """codes[i] decodes to a value nearest `scaled[i]` among `code_values` (of codes `code_ids`),
    and to the even code when two values are equally near."""
    scaled = scaled.astype(np.float64).ravel()
    codes = codes.ravel()
    table = dict(zip(code_ids.tolist(), code_values.tolist()))
    chosen = np.array([table[c] for c in codes.tolist()])
    distance = np.abs(code_values[None, :] - scaled[:, None])
    nearest = distance.min(axis=1)
    assert np.array_equal(np.abs(chosen - scaled), nearest)
    # A tie: values on both sides of the input at the same distance.
    below = np.where(code_values[None, :] <= scaled[:, None], code_values[None, :], -np.inf)
    above = np.where(code_values[None, :] >= scaled[:, None], code_values[None, :], np.inf)
    low, high = below.max(axis=1), above.min(axis=1)
    tie = (low != high) & np.isclose(scaled - low, high - scaled, rtol=0, atol=0)
    assert np.all(codes[tie] % 2 == 0)
    return int(tie.sum())


# ---- FP8 ----------------------------------------------------------------------------------------

def test_fp8_hand_examples():
    """Scale amax / 448 = 1, so these are e4m3 codes of the values themselves."""
    x = np.array([[448.0, 1.0, -2.0, 0.0, 2.0**-9, 2.0**-10, 3 * 2.0**-10, 1.0625, 1.1875,
                   240.0, 432.0]])
    values, scales = mqa_logits.quantize_fp8(x)
    assert values.dtype == np.uint8 and scales.dtype == np.float32
    assert scales.tolist() == [1.0]
    # 448 = 1.75 * 2^8; 1 = 2^0 (biased exponent 7); -2: sign bit, exponent 8; 2^-9 the smallest
    # subnormal; 2^-10 ties 0 and 2^-9 (even: 0); 3 * 2^-10 ties codes 1 and 2 (even: 2);
    # 1.0625 ties 1 and 1.125 (0x38); 1.1875 ties 1.125 and 1.25 (0x3a); 240 = 1.875 * 2^7;
    # 432 ties 416 (0x7d) and 448 (0x7e).
    assert values.tolist() == [[0x7E, 0x38, 0xC0, 0x00, 0x01, 0x00, 0x02, 0x38, 0x3A, 0x77,
                                0x7E]]


def test_fp8_scales_and_nearest_codes(rng):
    x = wide_range_rows(rng, 64, 128)
    values, scales = mqa_logits.quantize_fp8(x)
    assert values.shape == x.shape and scales.shape == (64,)
    amax = np.abs(x).max(axis=1)
    expected_scales = np.where(amax == 0, np.float32(1.0), amax / np.float32(E4M3_MAX))
    assert np.array_equal(scales, expected_scales.astype(np.float32))
    scaled = x / scales[:, None]  # float32, as the definition divides
    # Within the e4m3 range, but for row 1, whose scale is a float32 subnormal (amax / 448 loses
    # bits there): its largest elements saturate to 448, still the nearest finite value.
    normal = scales >= np.finfo(np.float32).tiny
    assert not normal[1] and np.abs(scaled[normal]).max() <= E4M3_MAX * (1 + 2.0**-22)
    ties = assert_nearest_ties_to_even(scaled, values, E4M3[FINITE_E4M3_CODES],
                                       FINITE_E4M3_CODES)
    assert ties >= 4
    decoded = E4M3[values] * scales[:, None]
    assert np.all(np.abs(decoded - x) <= np.abs(x) * 2.0**-4 + scales[:, None] * 2.0**-10)


def test_fp8_keeps_leading_dims(rng):
    x = rng.standard_normal((3, 5, 64))
    values, scales = mqa_logits.quantize_fp8(x)
    assert values.shape == (3, 5, 64) and scales.shape == (3, 5)
    flat_values, flat_scales = mqa_logits.quantize_fp8(x.reshape(15, 64))
    assert np.array_equal(values.reshape(15, 64), flat_values)
    assert np.array_equal(scales.reshape(15), flat_scales)


@requires_ml_dtypes
def test_fp8_agrees_with_ml_dtypes(rng):
    x = wide_range_rows(rng, 64, 128)
    values, scales = mqa_logits.quantize_fp8(x)
    expected = (x / scales[:, None]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(values, expected)


def test_fp8_takes_bfloat16_and_integer_input(rng):
    x = bf16_round(rng.standard_normal((4, 64)).astype(np.float32))
    assert np.array_equal(mqa_logits.quantize_fp8(x.astype(np.int32))[0],
                          mqa_logits.quantize_fp8(x.astype(np.int32).astype(np.float32))[0])
    if ml_dtypes is not None:
        for got, want in zip(mqa_logits.quantize_fp8(x.astype(ml_dtypes.bfloat16)),
                             mqa_logits.quantize_fp8(x)):
            assert np.array_equal(got, want)


# ---- MX -----------------------------------------------------------------------------------------

MX_FORMATS = {"mxfp8": E4M3_MAX, "mxfp4": E2M1_MAX}


def mx_codes(fmt, values, dim):
    """Per-element codes of stored MX values: e4m3 bytes, or the nibbles of packed e2m1 bytes
    (element 2k in the low nibble of byte k)."""
    if fmt == "mxfp8":
        return values.view(np.uint8)
    return np.stack([values & 0xF, values >> 4], axis=-1).reshape(*values.shape[:-1], dim)


def quantize_mx(fmt, x):
    if fmt == "mxfp8" and ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed (numpy float8 arrays)")
    return getattr(mqa_logits, f"quantize_{fmt}")(x)


@pytest.mark.parametrize("fmt", sorted(MX_FORMATS))
@pytest.mark.parametrize("dim", [32, 64, 96, 128])
def test_mx_scales_and_nearest_codes(rng, fmt, dim):
    element_max = MX_FORMATS[fmt]
    x = wide_range_rows(rng, 48, dim)
    x[3, :MX_BLOCK] = 0.0  # one all-zero block beside non-zero ones
    x[4] = np.float32(1e30) * rng.standard_normal(dim).astype(np.float32)
    values, scales = quantize_mx(fmt, x)
    blocks = dim // MX_BLOCK
    assert scales.dtype == np.int32 and scales.shape == (48,)
    if fmt == "mxfp8":
        assert values.dtype == ml_dtypes.float8_e4m3fn and values.shape == (48, dim)
    else:
        assert values.dtype == np.uint8 and values.shape == (48, dim // 2)

    scale_bytes = scales.astype("<i4").view(np.uint8).reshape(48, 4)
    assert np.all(scale_bytes[:, blocks:] == 0)  # padding bytes
    exponents = scale_bytes[:, :blocks].astype(np.int64) - 127
    amax = np.abs(x.astype(np.float64)).reshape(48, blocks, MX_BLOCK).max(axis=-1)
    scale = np.exp2(exponents.astype(np.float64))
    assert np.all(amax <= element_max * scale)                      # fits
    smallest = (amax > element_max * scale / 2) | (exponents == -127)
    assert np.all(np.where(amax == 0, exponents == 0, smallest))    # and is the smallest
    assert np.array_equal(decode_packed_scales(scales, dim),
                          np.repeat(scale, MX_BLOCK, axis=-1))

    scaled = x.astype(np.float64) / np.repeat(scale, MX_BLOCK, axis=-1)
    codes = mx_codes(fmt, values, dim)
    if fmt == "mxfp8":
        ties = assert_nearest_ties_to_even(scaled, codes, E4M3[FINITE_E4M3_CODES],
                                           FINITE_E4M3_CODES)
    else:
        ties = assert_nearest_ties_to_even(scaled, codes, E2M1_VALUES, np.arange(16))
        assert np.array_equal(decode_e2m1(values), E2M1_VALUES[codes])
    assert ties >= 1


@requires_ml_dtypes
@pytest.mark.parametrize("fmt", sorted(MX_FORMATS))
def test_mx_agrees_with_ml_dtypes(rng, fmt):
    target = {"mxfp8": "float8_e4m3fn", "mxfp4": "float4_e2m1fn"}[fmt]
    if not hasattr(ml_dtypes, target):
        pytest.skip(f"this ml_dtypes has no {target}")
    x = wide_range_rows(rng, 32, 128)
    values, scales = quantize_mx(fmt, x)
    scale = decode_packed_scales(scales, 128)
    expected = (x / scale).astype(np.float32).astype(getattr(ml_dtypes, target)).view(np.uint8)
    assert np.array_equal(mx_codes(fmt, values, 128), expected & 0xFF)


def test_mxfp4_hand_examples():
    x = np.zeros((2, 64))
    x[0, :4] = [6.0, 1.0, -0.5, 0.0]     # amax 6: scale 2^0 (code 127) in both blocks
    x[1, :2] = [12.0, 2.0]               # amax 12: scale 2^1 (code 128); 6 and 1 stored
    x[1, 32] = 0.25                      # block 1: amax 0.25 = 0.5 * 2^-1 ... smallest 2^-5
    values, scales = mqa_logits.quantize_mxfp4(x)
    # e2m1: 6 = 0b0111, 1 = 0b0010, -0.5 = 0b1001; element 2k in the low nibble of byte k.
    assert values[0, :2].tolist() == [0x27, 0x09] and not values[0, 2:].any()
    assert values[1, 0] == 0x27
    assert int(scales[0]) == 0x7F7F
    # Block 1 of row 1: 0.25 / 2^-5 = 8 > 6, 0.25 / 2^-4 = 4 <= 6: code 127 - 4 = 123; 4 = 0b0110.
    assert int(scales[1]) == (123 << 8) | 128 and values[1, 16] == 0x06


@requires_ml_dtypes
def test_mxfp8_hand_example():
    x = np.zeros(64)
    x[0], x[32] = 3.0, -448.0 * 4
    values, scales = mqa_logits.quantize_mxfp8(x)
    # 3 / 2^-7 = 384 <= 448 < 768: code 120; 1792 / 2^2 = 448: code 129.
    assert int(scales) == (129 << 8) | 120
    # 384 = 1.5 * 2^8: exponent field 15, mantissa 4; -448: sign, 15, 6.
    assert values.view(np.uint8)[[0, 32]].tolist() == [0x7C, 0xFE]
    assert float(values[0]) == 384.0 and float(values[32]) == -448.0


def test_mxfp8_needs_ml_dtypes(monkeypatch):
    import mqa_logits._quantize as quantize

    monkeypatch.setattr(quantize, "ml_dtypes", None)
    with pytest.raises(ImportError, match="ml_dtypes"):
        mqa_logits.quantize_mxfp8(np.zeros((2, 32)))


@pytest.mark.parametrize("function", ["quantize_fp8", "quantize_mxfp8", "quantize_mxfp4"])
@pytest.mark.parametrize("x,error,fragment", [
    (np.array([[1.0, np.nan] * 16]), ValueError, "^x: expected finite values"),
    (np.array([[1.0, -np.inf] * 16]), ValueError, "^x: expected finite values"),
    (np.ones((2, 32), np.complex64), TypeError, "^x: expected real numbers"),
    (np.array(["a"] * 32), TypeError, "^x: expected real numbers"),
    (np.ones(32, bool), TypeError, "^x: expected real numbers"),
    (np.float32(1.0), ValueError, "^x: expected at least one dimension"),
])
def test_quantizers_refuse(function, x, error, fragment):
    if function == "quantize_mxfp8" and ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed (numpy float8 arrays)")
    with pytest.raises(error, match=fragment):
        getattr(mqa_logits, function)(x)


@pytest.mark.parametrize("function", ["quantize_mxfp8", "quantize_mxfp4"])
@pytest.mark.parametrize("dim", [0, 16, 48, 160])
def test_mx_quantizers_refuse_partial_blocks(function, dim):
    if function == "quantize_mxfp8" and ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed (numpy float8 arrays)")
    with pytest.raises(ValueError, match=rf"^x: expected a last dim of 32, 64, 96 or 128.*{dim}$"):
        getattr(mqa_logits, function)(np.ones((2, dim)))


# ---- the paged KV cache writer ------------------------------------------------------------------

def cache_with_block_stride(rng, num_blocks, block_kv, token_bytes, block_stride):
    """(buffer [num_blocks, block_stride] of garbage, the [num_blocks, block_kv, 1, token_bytes
    + 4] fused view of it with blocks block_stride bytes apart)."""
    buffer = rng.integers(0, 256, size=(num_blocks, block_stride), dtype=np.uint8)
    row = token_bytes + 4
    view = np.lib.stride_tricks.as_strided(buffer, (num_blocks, block_kv, 1, row),
                                           (block_stride, row, row, 1))
    return buffer, view


def expected_cache(buffer, values, scales, row, start, block_kv):
    """docs/contract.md, "Decode", token by token: position p in block row[p // block_kv] at offset
    p % block_kv; the block's values first (token-major), then one 4-byte scale per token."""
    expected = buffer.copy()
    token_bytes = values.shape[1]
    for t in range(values.shape[0]):
        p = start + t
        block, offset = row[p // block_kv], p % block_kv
        expected[block, offset * token_bytes:(offset + 1) * token_bytes] = values[t].view(np.uint8)
        at = block_kv * token_bytes + 4 * offset
        expected[block, at:at + 4] = np.frombuffer(scales[t:t + 1].astype(
            scales.dtype.newbyteorder("<")).tobytes(), np.uint8)
    return expected


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "mxfp4"])
@pytest.mark.parametrize("block_kv", [32, 64])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("start", [0, 37])
def test_writer_stores_the_fused_layout(rng, fmt, block_kv, padded, start):
    dim = 128
    keys = rng.standard_normal((150, dim))
    values, scales = (mqa_logits.quantize_fp8(keys) if fmt == "fp8" else quantize_mx(fmt, keys))
    token_bytes = values.shape[1]
    num_blocks = 12
    block_stride = block_kv * (token_bytes + 4) + (132 if padded else 0)
    buffer, cache = cache_with_block_stride(rng, num_blocks, block_kv, token_bytes, block_stride)
    row = rng.permutation(num_blocks)[:-(-(start + 150) // block_kv)]
    expected = expected_cache(buffer, values, scales, row, start, block_kv)
    mqa_logits.write_paged_kv_cache(cache, (values, scales), row, start)
    assert np.array_equal(buffer, expected)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "mxfp4"])
def test_written_cache_meets_spec_accuracy(rng, fmt):
    """Quantize float keys and queries, write the cache, run decode: within the contract's bound
    of the float64 formula on the unquantized (bf16) inputs."""
    heads, dim, block_kv, next_n = 32, 128, 64, 2
    lengths = [300, 77, 1]
    quantize = mqa_logits.quantize_fp8 if fmt == "fp8" else lambda x: quantize_mx(fmt, x)
    token_bytes = dim // 2 if fmt == "mxfp4" else dim
    cache = np.zeros((20, block_kv, 1, token_bytes + 4), np.uint8)
    table = rng.permutation(20)[:15].reshape(3, 5).astype(np.int32)
    keys = [bf16_round(rng.standard_normal((n, dim)).astype(np.float32)) for n in lengths]
    for b, k in enumerate(keys):
        half = len(k) // 2  # a prefix, then an append, as prefill and decode write them
        mqa_logits.write_paged_kv_cache(cache, quantize(k[:half]), table[b])
        mqa_logits.write_paged_kv_cache(cache, quantize(k[half:]), table[b], start=half)
    queries = bf16_round(rng.standard_normal((3, next_n, heads, dim)).astype(np.float32))
    weights = rng.standard_normal((3 * next_n, heads)).astype(np.float32)
    if fmt == "fp8":
        q_values, q_scales = quantize(queries.reshape(3 * next_n, heads * dim))
        q = q_values.reshape(3, next_n, heads, dim)
        q_weights = weights * q_scales[:, None]
    else:
        q, q_weights = quantize(queries), weights
    context_lens = np.array([[n - 1, n] for n in lengths], np.int32)
    meta = mqa_logits.get_paged_mqa_logits_metadata(context_lens, block_kv,
                                                    mqa_logits.get_num_sms())
    logits = mqa_logits.fp8_fp4_paged_mqa_logits(q, cache, q_weights, context_lens, table, meta,
                                                 320, clean_logits=True)
    actual, expected = [], []
    for r in range(3 * next_n):
        b, t = divmod(r, next_n)
        length = int(context_lens[b, t])
        expected.append(logits_f64(queries[b, t][None].astype(np.float64),
                                   keys[b][:length].astype(np.float64), weights[r:r + 1])[0])
        actual.append(logits[r, :length])
        assert np.isneginf(logits[r, length:]).all()
    # The contract's metric over every element inside the windows.
    assert spec_diff(np.concatenate(actual), np.concatenate(expected)) < (
        2e-2 if fmt == "mxfp4" else 1e-3)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "mxfp4"])
def test_quantized_prefill_meets_spec_accuracy(rng, fmt):
    seq_len, seq_len_kv, heads, dim = 40, 90, 16, 128
    quantize = mqa_logits.quantize_fp8 if fmt == "fp8" else lambda x: quantize_mx(fmt, x)
    queries = bf16_round(rng.standard_normal((seq_len, heads, dim)).astype(np.float32))
    keys = bf16_round(rng.standard_normal((seq_len_kv, dim)).astype(np.float32))
    weights = rng.standard_normal((seq_len, heads)).astype(np.float32)
    if fmt == "fp8":
        q_values, q_scales = quantize(queries.reshape(seq_len, heads * dim))
        q, q_weights = q_values.reshape(seq_len, heads, dim), weights * q_scales[:, None]
    else:
        q, q_weights = quantize(queries), weights
    starts = np.zeros(seq_len, np.int32)
    ends = np.full(seq_len, seq_len_kv, np.int32)
    logits = mqa_logits.fp8_fp4_mqa_logits(q, quantize(keys), q_weights, starts, ends)
    expected = logits_f64(queries.astype(np.float64), keys.astype(np.float64), weights)
    assert spec_diff(logits, expected) < (2e-2 if fmt == "mxfp4" else 1e-3)


def fp8_kv(rng, tokens=40, dim=64):
    return mqa_logits.quantize_fp8(rng.standard_normal((tokens, dim)))


@pytest.mark.parametrize("mutate,error,prefix", [
    (lambda c, kv, r: (list(c), kv, r, 0), TypeError, "kv_cache: "),
    (lambda c, kv, r: (c.view(np.int16), kv, r, 0), TypeError, "kv_cache: "),
    (lambda c, kv, r: (c[:, :16], kv, r, 0), ValueError, "kv_cache: "),
    (lambda c, kv, r: (c[..., :-1], kv, r, 0), ValueError, "kv_cache: "),
    (lambda c, kv, r: (c[:, :, 0], kv, r, 0), ValueError, "kv_cache: "),
    (lambda c, kv, r: (c[::-1], kv, r, 0), ValueError, "kv_cache: "),
    (lambda c, kv, r: (np.lib.stride_tricks.as_strided(c, writeable=False), kv, r, 0),
     ValueError, "kv_cache: "),
    (lambda c, kv, r: (c, kv[0], r, 0), TypeError, "kv: "),
    (lambda c, kv, r: (c, (kv[0][:, :32], kv[1]), r, 0), ValueError, "kv: values (kv[0]): "),
    (lambda c, kv, r: (c, (kv[0].astype(np.float32), kv[1]), r, 0), TypeError,
     "kv: values (kv[0]): "),
    (lambda c, kv, r: (c, (kv[0], kv[1][:-1]), r, 0), ValueError, "kv: scales (kv[1]): "),
    (lambda c, kv, r: (c, (kv[0], kv[1].astype(np.float64)), r, 0), TypeError,
     "kv: scales (kv[1]): "),
    (lambda c, kv, r: (c, kv, r[:1], 0), ValueError, "block_table_row: "),
    (lambda c, kv, r: (c, kv, [0, 99], 0), ValueError, "block_table_row: "),
    (lambda c, kv, r: (c, kv, [-1, 0], 0), ValueError, "block_table_row: "),
    (lambda c, kv, r: (c, kv, [[0, 1]], 0), TypeError, "block_table_row: "),
    (lambda c, kv, r: (c, kv, [0.0, 1.0], 0), TypeError, "block_table_row: "),
    (lambda c, kv, r: (c, kv, r, -1), ValueError, "start: "),
    (lambda c, kv, r: (c, kv, r, 1.5), TypeError, "start: "),
    (lambda c, kv, r: (c, kv, r, 40), ValueError, "block_table_row: "),
])
def test_writer_refuses_and_writes_nothing(rng, mutate, error, prefix):
    cache = np.zeros((3, 32, 1, 64 + 4), np.uint8)
    arguments = mutate(cache, fp8_kv(rng), np.array([2, 0], np.int32))
    with pytest.raises(error) as info:
        mqa_logits.write_paged_kv_cache(*arguments)
    assert str(info.value).startswith(prefix), str(info.value)
    assert "expected" in str(info.value)
    assert not cache.any()
