"""Float64 oracle of the indexer logits and random inputs for it (docs/contract.md, "Numerics").

Inputs are generated directly as stored codes (e4m3 bytes, packed e2m1 nibbles, UE8M0 scale
bytes), so the oracle decodes exactly what the library reads, with the formulas written here.
Cases keep numpy arrays; `api_*` methods hand them to the package as numpy arrays or torch
tensors, in the types each framework uses for the format.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from support import ml_dtypes, torch  # each None where it is not installed

FORMATS = ("fp8", "mxfp8", "mxfp4")
MX_BLOCK = 32
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


# ---- codecs -------------------------------------------------------------------------------------

def _e4m3_table() -> np.ndarray:
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> 3) & 0xF
    mantissa = (codes & 0x7).astype(np.float64)
    normal = (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    subnormal = mantissa / 8.0 * 2.0**-6
    values = sign * np.where(exponent == 0, subnormal, normal)
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values


E4M3 = _e4m3_table()


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    return E4M3[codes]


def decode_e2m1(packed: np.ndarray) -> np.ndarray:
    """[..., D/2] bytes -> [..., D]: element 2k in the low nibble of byte k."""
    nibbles = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1],
                                                                     2 * packed.shape[-1])
    sign = np.where(nibbles & 0x8, -1.0, 1.0)
    return sign * E2M1_MAGNITUDES[nibbles & 0x7]


def decode_packed_scales(packed: np.ndarray, head_dim: int) -> np.ndarray:
    """int32 packed UE8M0 [...] -> per-element scales [..., D] (block b in byte b)."""
    scale_bytes = packed.astype("<i4").view(np.uint8).reshape(*packed.shape, 4)
    blocks = head_dim // MX_BLOCK
    scales = np.exp2(scale_bytes[..., :blocks].astype(np.float64) - 127.0)
    return np.repeat(scales, MX_BLOCK, axis=-1)


# ---- random stored values -----------------------------------------------------------------------

def random_e4m3(rng: np.random.Generator, shape) -> np.ndarray:
    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    nan = (codes & 0x7F) == 0x7F
    codes[nan] ^= 1  # 0x7f / 0xff are NaN: use the neighbouring finite code
    return codes


def random_packed_scales(rng: np.random.Generator, shape, head_dim: int) -> np.ndarray:
    """Packed UE8M0 around 1.0; the padding bytes of D < 128 hold garbage (never read)."""
    scale_bytes = rng.integers(0, 256, size=(*shape, 4), dtype=np.uint8)
    blocks = head_dim // MX_BLOCK
    scale_bytes[..., :blocks] = rng.integers(121, 134, size=(*shape, blocks), dtype=np.uint8)
    return scale_bytes.view("<i4").reshape(shape).astype(np.int32)


def random_values(rng: np.random.Generator, fmt: str, shape, head_dim: int) -> np.ndarray:
    """Stored codes of `shape + [D]` elements: e4m3 bytes, or D/2 packed e2m1 bytes."""
    if fmt == "mxfp4":
        return rng.integers(0, 256, size=(*shape, head_dim // 2), dtype=np.uint8)
    return random_e4m3(rng, (*shape, head_dim))


def decode(fmt: str, values: np.ndarray, scales: Optional[np.ndarray], head_dim: int):
    """Stored values and scales -> float64 [..., D] (FP8 key scales are applied separately)."""
    decoded = decode_e2m1(values) if fmt == "mxfp4" else decode_e4m3(values)
    if fmt != "fp8":
        decoded = decoded * decode_packed_scales(scales, head_dim)
    return decoded


def random_windows(rng: np.random.Generator, rows: int, seq_len_kv: int):
    """Per-row [start, end): inside, clamped, inverted, empty and out-of-range windows."""
    start = rng.integers(-3, seq_len_kv + 1, size=rows)
    end = start + rng.integers(-2, seq_len_kv + 4, size=rows)
    return start.astype(np.int32), end.astype(np.int32)


def random_weights(rng: np.random.Generator, shape, bf16: bool) -> np.ndarray:
    weights = rng.standard_normal(shape).astype(np.float32)
    return bf16_round(weights) if bf16 else weights


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), kept as float32."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


# ---- the oracle ---------------------------------------------------------------------------------

def logits_f64(q: np.ndarray, keys: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_h w[i, h] * relu(q[i, h] . k[j]) in float64: q [R, H, D], keys [T, D] -> [R, T]."""
    scores = np.einsum("rhd,td->rht", q, keys, optimize=True)
    return np.einsum("rh,rht->rt", weights.astype(np.float64), np.maximum(scores, 0.0),
                     optimize=True)


def spec_diff(x: np.ndarray, y: np.ndarray) -> float:
    """The contract's metric 1 - 2 sum(xy) / sum(x^2 + y^2), in float64."""
    x = x.astype(np.float64)
    y = y.astype(np.float64)
    denominator = np.sum(x * x + y * y)
    return 0.0 if denominator == 0 else float(1.0 - 2.0 * np.sum(x * y) / denominator)


def tolerance(bf16: bool) -> float:
    return 3e-5 if bf16 else 5e-6


def check_logits(actual: np.ndarray, expected: np.ndarray, mask: np.ndarray, clean: bool,
                 bf16: bool, elementwise: bool = True) -> None:
    """The contract's acceptance: the metric inside the windows (finite, no NaN) and, when
    clean, -inf at exactly the elements outside them. Outside the windows of unclean logits is
    unspecified."""
    with np.errstate(invalid="ignore"):  # unclean elements may hold any bits, NaN included
        actual = np.asarray(actual, dtype=np.float64)
    assert actual.shape == expected.shape
    inside = actual[mask]
    assert np.isfinite(inside).all()
    assert spec_diff(inside, expected[mask]) < tolerance(bf16)
    if elementwise:
        # The CPU backend rounds a float64 sum once: one rounding of the logits dtype.
        rtol = 2.0**-8 if bf16 else 2.0**-23
        scale = np.abs(expected[mask]).max(initial=1.0)
        np.testing.assert_allclose(inside, expected[mask], rtol=rtol, atol=1e-12 * scale)
    if clean:
        assert np.array_equal(np.isneginf(actual), ~mask)


# ---- framework conversion -----------------------------------------------------------------------

def _as_e4m3(codes: np.ndarray, framework: str, device: str):
    if framework == "numpy":
        return codes.view(ml_dtypes.float8_e4m3fn)
    return torch.from_numpy(codes).to(device).view(torch.float8_e4m3fn)


def to_framework(x: Optional[np.ndarray], framework: str, device: str = "cpu"):
    if x is None or framework == "numpy":
        return x
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


def _weights_for(weights: np.ndarray, bf16: bool, framework: str, device: str):
    if not bf16:
        return to_framework(weights, framework, device)
    if framework == "numpy":
        return weights.astype(ml_dtypes.bfloat16)
    return torch.from_numpy(weights).to(device).to(torch.bfloat16)


def _operand_for(fmt: str, values: np.ndarray, scales: Optional[np.ndarray], framework: str,
                 device: str, bare_fp8: bool):
    """FP8 data goes as uint8 codes through numpy (no ml_dtypes needed) and as float8 in torch;
    MXFP8 needs a float8 type; MXFP4 goes as uint8 bytes."""
    if fmt == "fp8" and framework == "numpy":
        values_arg = values
    elif fmt == "mxfp4":
        values_arg = to_framework(values, framework, device)
    else:
        values_arg = _as_e4m3(values, framework, device)
    scales_arg = to_framework(scales, framework, device)
    if bare_fp8 and scales is None:
        return values_arg
    return (values_arg, scales_arg)


def needs_ml_dtypes(fmt: str, framework: str, bf16: bool) -> bool:
    return framework == "numpy" and (fmt == "mxfp8" or bf16)


# ---- prefill ------------------------------------------------------------------------------------

@dataclasses.dataclass
class PrefillCase:
    fmt: str
    num_heads: int
    head_dim: int
    q: np.ndarray
    q_scales: Optional[np.ndarray]
    kv: np.ndarray
    kv_scales: np.ndarray
    weights: np.ndarray
    start: np.ndarray
    end: np.ndarray
    bf16_weights: bool = False

    @property
    def seq_len(self) -> int:
        return self.q.shape[0]

    @property
    def seq_len_kv(self) -> int:
        return self.kv.shape[0]

    def keys_f64(self) -> np.ndarray:
        keys = decode(self.fmt, self.kv, None if self.fmt == "fp8" else self.kv_scales,
                      self.head_dim)
        if self.fmt == "fp8":
            keys = keys * self.kv_scales.astype(np.float64)[:, None]
        return keys

    def mask(self) -> np.ndarray:
        j = np.arange(self.seq_len_kv)
        lo = np.maximum(self.start, 0)[:, None]
        hi = np.minimum(self.end, self.seq_len_kv)[:, None]
        return (j >= lo) & (j < hi)

    def expected(self) -> np.ndarray:
        q = decode(self.fmt, self.q, self.q_scales, self.head_dim)
        return logits_f64(q, self.keys_f64(), self.weights)

    def api_args(self, framework: str = "numpy", device: str = "cpu") -> dict:
        return dict(
            q=_operand_for(self.fmt, self.q, self.q_scales, framework, device, bare_fp8=True),
            kv=_operand_for(self.fmt, self.kv, self.kv_scales, framework, device,
                            bare_fp8=False),
            weights=_weights_for(self.weights, self.bf16_weights, framework, device),
            cu_seq_len_k_start=to_framework(self.start, framework, device),
            cu_seq_len_k_end=to_framework(self.end, framework, device),
        )


def make_prefill(rng: np.random.Generator, fmt: str, seq_len: int, num_heads: int,
                 head_dim: int, seq_len_kv: int, bf16_weights: bool = False,
                 windows=None) -> PrefillCase:
    mx = fmt != "fp8"
    start, end = windows if windows is not None else random_windows(rng, seq_len, seq_len_kv)
    return PrefillCase(
        fmt=fmt,
        num_heads=num_heads,
        head_dim=head_dim,
        q=random_values(rng, fmt, (seq_len, num_heads), head_dim),
        q_scales=random_packed_scales(rng, (seq_len, num_heads), head_dim) if mx else None,
        kv=random_values(rng, fmt, (seq_len_kv,), head_dim),
        kv_scales=(random_packed_scales(rng, (seq_len_kv,), head_dim) if mx else
                   rng.uniform(0.25, 2.0, size=seq_len_kv).astype(np.float32)),
        weights=random_weights(rng, (seq_len, num_heads), bf16_weights),
        start=start,
        end=end,
        bf16_weights=bf16_weights,
    )


# ---- decode (paged) -----------------------------------------------------------------------------

@dataclasses.dataclass
class PagedCase:
    fmt: str
    head_dim: int
    block_kv: int
    q: np.ndarray                 # [B, N, H, D or D/2]
    q_scales: Optional[np.ndarray]
    key_values: np.ndarray        # [num_blocks, block_kv, D or D/2] stored codes
    key_scales: np.ndarray        # [num_blocks, block_kv] fp32 or int32
    cache_buffer: np.ndarray      # [num_blocks, block stride] bytes of the fused cache
    weights: np.ndarray           # [B * N, H]
    context_lens: np.ndarray      # [B, N] or [B]
    block_table: np.ndarray       # [rows of the table, max_blocks]
    max_context_len: int
    indices: Optional[np.ndarray] = None
    bf16_weights: bool = False

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def cache_shape(self):
        return (*self.key_values.shape[:2], 1, self.key_values.shape[2] + 4)

    @property
    def kv_cache(self) -> np.ndarray:
        """The fused cache as the API takes it: [num_blocks, block_kv, 1, token bytes + 4]."""
        return np.lib.stride_tricks.as_strided(self.cache_buffer, shape=self.cache_shape,
                                               strides=_cache_strides(self.cache_buffer,
                                                                      self.cache_shape))

    @property
    def next_n(self) -> int:
        return self.q.shape[1]

    def row_lengths(self) -> np.ndarray:
        """Keys each row sees: its context length, clamped as the contract says."""
        b = np.repeat(np.arange(self.batch), self.next_n)
        t = np.tile(np.arange(self.next_n), self.batch)
        if self.context_lens.ndim == 2:
            lengths = self.context_lens[b, t].astype(np.int64)
        else:
            lengths = self.context_lens[b].astype(np.int64) - self.next_n + t + 1
        addressable = self.block_table.shape[1] * self.block_kv
        return np.clip(lengths, 0, min(self.max_context_len, addressable))

    def table_rows(self) -> np.ndarray:
        """Block-table row of each output row: its sequence's (its own in the varlen form)."""
        return np.repeat(np.arange(self.batch), self.next_n)

    def _keys_of_row(self, row: int):
        """(valid mask over max_context_len, float64 keys of the valid positions)."""
        valid = np.zeros(self.max_context_len, dtype=bool)
        table_row = self.table_rows()[row]
        if not 0 <= table_row < self.block_table.shape[0]:
            return valid, np.zeros((0, self.head_dim))
        positions = np.arange(self.row_lengths()[row])
        blocks = self.block_table[table_row, positions // self.block_kv].astype(np.int64)
        in_cache = (blocks >= 0) & (blocks < self.key_values.shape[0])
        positions, blocks = positions[in_cache], blocks[in_cache]
        valid[positions] = True
        offsets = positions % self.block_kv
        values = self.key_values[blocks, offsets]
        scales = self.key_scales[blocks, offsets]
        if self.fmt == "fp8":
            keys = decode_e4m3(values) * scales.astype(np.float64)[:, None]
        else:
            keys = decode(self.fmt, values, scales, self.head_dim)
        return valid, keys

    def mask(self) -> np.ndarray:
        return np.stack([self._keys_of_row(r)[0] for r in range(self.batch * self.next_n)])

    def expected(self) -> np.ndarray:
        rows = self.batch * self.next_n
        q = decode(self.fmt, self.q, self.q_scales, self.head_dim).reshape(rows, -1,
                                                                          self.head_dim)
        out = np.full((rows, self.max_context_len), -np.inf)
        for r in range(rows):
            valid, keys = self._keys_of_row(r)
            out[r, valid] = logits_f64(q[r:r + 1], keys, self.weights[r:r + 1])[0]
        return out

    def api_args(self, framework: str = "numpy", device: str = "cpu") -> dict:
        return dict(
            q=_operand_for(self.fmt, self.q, self.q_scales, framework, device, bare_fp8=True),
            kv_cache=self._cache_for(framework, device),
            weights=_weights_for(self.weights, self.bf16_weights, framework, device),
            context_lens=to_framework(self.context_lens, framework, device),
            block_table=to_framework(self.block_table, framework, device),
            max_context_len=self.max_context_len,
            indices=to_framework(self.indices, framework, device),
        )


    def _cache_for(self, framework: str, device: str):
        if framework == "numpy":
            return self.kv_cache
        buffer = torch.from_numpy(self.cache_buffer).to(device)
        return buffer.as_strided(self.cache_shape,
                                 _cache_strides(self.cache_buffer, self.cache_shape))


def _cache_strides(buffer: np.ndarray, shape):
    """Byte strides of the fused view: blocks one buffer row apart, tokens dense within."""
    return (buffer.shape[1], shape[3], shape[3], 1)


def fused_cache(rng: np.random.Generator, values: np.ndarray, scales: np.ndarray,
                block_stride: int) -> np.ndarray:
    """Bytes of the fused layout: per block its token values, then their 4-byte scales; the
    bytes between blocks (block_stride > block bytes) hold garbage."""
    num_blocks, block_kv, token_bytes = values.shape
    buffer = rng.integers(0, 256, size=(num_blocks, block_stride), dtype=np.uint8)
    buffer[:, :block_kv * token_bytes] = values.reshape(num_blocks, -1)
    scale_bytes = scales.astype(scales.dtype.newbyteorder("<")).view(np.uint8)
    buffer[:, block_kv * token_bytes:block_kv * (token_bytes + 4)] = scale_bytes.reshape(
        num_blocks, -1)
    return buffer


def make_paged(rng: np.random.Generator, fmt: str, batch: int, next_n: int, num_heads: int,
               head_dim: int, block_kv: int, max_context_len: int, lens_2d: bool = True,
               padded_blocks: bool = False, varlen: bool = False,
               bf16_weights: bool = False) -> PagedCase:
    mx = fmt != "fp8"
    token_bytes = head_dim // 2 if fmt == "mxfp4" else head_dim
    max_blocks = -(-max_context_len // block_kv)
    table_rows = batch  # a row per sequence, or per token (row) in the varlen form
    num_blocks = table_rows * max_blocks + 3
    key_values = random_values(rng, fmt, (num_blocks, block_kv), head_dim)
    key_scales = (random_packed_scales(rng, (num_blocks, block_kv), head_dim) if mx else
                  rng.uniform(0.25, 2.0, size=(num_blocks, block_kv)).astype(np.float32))
    block_bytes = block_kv * (token_bytes + 4)
    block_stride = block_bytes + (512 if padded_blocks else 0)
    block_table = rng.permutation(num_blocks)[:table_rows * max_blocks].reshape(
        table_rows, max_blocks).astype(np.int32)

    lengths = rng.integers(0, max_context_len + 1, size=(batch, next_n))
    if batch:
        lengths[0, :] = max_context_len  # one full sequence
    if lens_2d:
        context_lens = np.sort(lengths, axis=1).astype(np.int32)
    else:
        context_lens = lengths[:, 0].astype(np.int32)
    indices = None
    if varlen:  # runs of equal labels are sequences, whose rows hold the same blocks
        indices = np.sort(rng.integers(0, batch, size=batch)).astype(np.int32)
        block_table = block_table[np.searchsorted(indices, indices)]
    return PagedCase(
        fmt=fmt,
        head_dim=head_dim,
        block_kv=block_kv,
        q=random_values(rng, fmt, (batch, next_n, num_heads), head_dim),
        q_scales=random_packed_scales(rng, (batch, next_n, num_heads), head_dim) if mx else None,
        key_values=key_values,
        key_scales=key_scales,
        cache_buffer=fused_cache(rng, key_values, key_scales, block_stride),
        weights=random_weights(rng, (batch * next_n, num_heads), bf16_weights),
        context_lens=context_lens,
        block_table=block_table,
        max_context_len=max_context_len,
        indices=indices,
        bf16_weights=bf16_weights,
    )


def as_numpy(x: Any) -> np.ndarray:
    """Logits from either framework as float64 numpy (bfloat16 included). Without clean_logits
    the elements outside the windows are unspecified (whatever the buffer held), so their cast
    may meet any bit pattern: the checks read only the windows."""
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(x).astype(np.float64)
