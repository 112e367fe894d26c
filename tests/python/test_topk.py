"""Top-k (operation 3) through Python: topk_per_row against a brute-force numpy oracle, and
mqa_topk / paged_mqa_topk against that oracle over the logits the logits functions return for the
same inputs, on the CPU (numpy, torch) and, where a GPU is present, on it. torch.compile traces
the three as custom ops."""

import numpy as np
import pytest

import mqa_logits
from reference import make_paged, make_prefill
from support import requires_gpu, requires_ml_dtypes, requires_torch, torch


def oracle(logits, first, count, topk, excluded=None):
    """The selected columns of one row: largest logits, ties to the lower column, -inf and NaN
    never; ascending column order."""
    cols = [c for c in range(first, first + count)
            if not (np.isnan(logits[c]) or logits[c] == -np.inf)
            and (excluded is None or not excluded(c))]
    cols.sort(key=lambda c: (-float(logits[c]), c))
    return sorted(cols[:topk])


def to_numpy(x):
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().float().numpy() if x.is_floating_point() else x.cpu().numpy()
    return np.asarray(x)


def expect_rows(indices, values, logits, windows, topk):
    """windows: per row (first column, count, index of column 0)."""
    indices, values, logits = to_numpy(indices), to_numpy(values), to_numpy(logits)
    assert indices.shape == (len(windows), topk) and indices.dtype == np.int32
    for r, (first, count, offset) in enumerate(windows):
        cols = oracle(logits[r], first, count, topk)
        want = np.full(topk, -1, np.int64)
        want[:len(cols)] = np.array(cols, np.int64) + offset
        np.testing.assert_array_equal(indices[r], want)
        np.testing.assert_array_equal(values[r, :len(cols)], logits[r, cols])
        assert np.all(values[r, len(cols):] == -np.inf)


def random_rows(rng, rows, cols):
    logits = rng.standard_normal((rows, cols)).astype(np.float32)
    logits[:, ::7] = np.round(logits[:, ::7])  # ties
    logits[0, : cols // 3] = -np.inf
    return logits


@pytest.mark.parametrize("topk", [1, 100, 2048])
@pytest.mark.parametrize("absolute", [False, True])
def test_topk_per_row_full_rows(rng, topk, absolute):
    rows, cols = 9, 3000
    logits = random_rows(rng, rows, cols)
    starts = rng.integers(-50, cols, size=rows).astype(np.int32)
    ends = (starts + rng.integers(0, 2600, size=rows)).astype(np.int32)
    indices, values = mqa_logits.topk_per_row(logits, starts, ends, topk,
                                              absolute_indices=absolute, return_values=True)
    windows = []
    for s, e in zip(starts.tolist(), ends.tolist()):
        first = max(s, 0)
        count = max(min(e, cols) - first, 0)
        windows.append((first, count, 0 if absolute else -s))
    expect_rows(indices, values, logits, windows, topk)


def test_topk_per_row_compressed_and_decode_rows(rng):
    logits = random_rows(rng, 5, 700)
    starts = np.array([0, 10, 300, 5, 2], np.int32)
    ends = np.array([700, 500, 1000, 5, 600], np.int32)
    indices, values = mqa_logits.topk_per_row(logits, starts, ends, 64, compressed=True,
                                              return_values=True)
    windows = [(0, min(e - s, 700), 0) for s, e in zip(starts.tolist(), ends.tolist())]
    expect_rows(indices, values, logits, windows, 64)
    lengths = np.array([700, 0, 33, 650, 1], np.int32)
    indices, values = mqa_logits.topk_per_row(logits, None, lengths, 64, return_values=True)
    expect_rows(indices, values, logits, [(0, n, 0) for n in lengths.tolist()], 64)


def test_topk_per_row_refuses_bad_topk():
    logits = np.zeros((2, 8), np.float32)
    ends = np.full(2, 8, np.int32)
    for topk in (0, 2049):
        with pytest.raises(mqa_logits.InvalidArgumentError, match="topk"):
            mqa_logits.topk_per_row(logits, None, ends, topk)


def prefill_windows(case, absolute):
    return [(max(s, 0), max(min(e, case.seq_len_kv) - max(s, 0), 0), 0 if absolute else -s)
            for s, e in zip(case.start.tolist(), case.end.tolist())]


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
@pytest.mark.parametrize("absolute", [False, True])
def test_mqa_topk_matches_oracle_over_its_logits(rng, fmt, absolute):
    case = make_prefill(rng, fmt, seq_len=21, num_heads=16, head_dim=64, seq_len_kv=2300)
    args = case.api_args("numpy")
    logits = mqa_logits.fp8_fp4_mqa_logits(**args, clean_logits=False)
    indices, values = mqa_logits.mqa_topk(**args, topk=2048, absolute_indices=absolute,
                                          return_values=True)
    expect_rows(indices, values, logits, prefill_windows(case, absolute), 2048)


@requires_ml_dtypes
def test_mqa_topk_over_bfloat16_logits(rng):
    case = make_prefill(rng, "fp8", seq_len=15, num_heads=8, head_dim=64, seq_len_kv=2500)
    args = case.api_args("numpy")
    logits = mqa_logits.fp8_fp4_mqa_logits(**args, clean_logits=False, logits_dtype="bfloat16")
    indices, values = mqa_logits.mqa_topk(**args, topk=300, return_values=True,
                                          logits_dtype="bfloat16")
    expect_rows(indices, values, np.asarray(logits, np.float32), prefill_windows(case, False),
                300)


def paged_windows(case, rows):
    """Every block of make_paged's tables is in the cache: a row's window is its length."""
    next_n = rows // case.batch
    lens = case.context_lens
    windows = []
    for r in range(rows):
        length = (int(lens.reshape(-1)[r]) if lens.ndim == 2
                  else int(lens[r // next_n]) - next_n + r % next_n + 1)
        windows.append((0, max(min(length, case.max_context_len), 0), 0))
    return windows


@pytest.mark.parametrize("lens_2d", [False, True])
def test_paged_mqa_topk_matches_oracle_over_its_logits(rng, lens_2d):
    case = make_paged(rng, "fp8", batch=3, next_n=2, num_heads=16, head_dim=128, block_kv=64,
                      max_context_len=2500, lens_2d=lens_2d)
    args = case.api_args("numpy")
    meta = mqa_logits.get_paged_mqa_logits_metadata(args["context_lens"], 64,
                                                    mqa_logits.get_num_sms())
    logits = mqa_logits.fp8_fp4_paged_mqa_logits(**{**args, "schedule_meta": meta})
    indices, values = mqa_logits.paged_mqa_topk(**{**args, "schedule_meta": meta}, topk=2048,
                                                return_values=True)
    expect_rows(indices, values, logits, paged_windows(case, logits.shape[0]), 2048)
    slots = mqa_logits.paged_mqa_topk(**{**args, "schedule_meta": meta}, topk=2048,
                                      cache_slots=True)
    positions = to_numpy(indices)
    for r in range(positions.shape[0]):
        table = case.block_table[r // 2]
        taken = positions[r] >= 0
        want = table[positions[r][taken] // 64] * 64 + positions[r][taken] % 64
        np.testing.assert_array_equal(to_numpy(slots)[r][taken], want)
        assert np.all(to_numpy(slots)[r][~taken] == -1)


@requires_torch
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_gpu)])
def test_torch_tensors_and_compile(rng, device):
    case = make_prefill(rng, "fp8", seq_len=17, num_heads=8, head_dim=64, seq_len_kv=3000)
    args = case.api_args("torch", device)
    logits = mqa_logits.fp8_fp4_mqa_logits(**args, clean_logits=False)
    eager = mqa_logits.mqa_topk(**args, topk=512)
    assert eager.device.type == device and eager.dtype == torch.int32

    def selection(q, kv, weights, starts, ends):
        return mqa_logits.mqa_topk(q, kv, weights, starts, ends, 512)

    compiled = torch.compile(selection, fullgraph=True)(
        args["q"], args["kv"], args["weights"], args["cu_seq_len_k_start"],
        args["cu_seq_len_k_end"])
    assert torch.equal(compiled, eager)
    per_row = mqa_logits.topk_per_row(logits, args["cu_seq_len_k_start"],
                                      args["cu_seq_len_k_end"], 512)
    assert torch.equal(per_row, eager)
