"""Decode (paged KV cache) logits on the CPU backend against the float64 formula."""

import numpy as np
import pytest

import mqa_logits
from reference import FORMATS, as_numpy, check_logits, make_paged
from support import requires_torch, skip_unless_supported, torch


def run(case, framework="numpy", **options):
    args = case.api_args(framework)
    meta = mqa_logits.get_paged_mqa_logits_metadata(args["context_lens"], case.block_kv,
                                                    mqa_logits.get_num_sms(), args["indices"])
    return mqa_logits.fp8_fp4_paged_mqa_logits(schedule_meta=meta, **args, **options)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("next_n", [1, 2, 3, 4, 5, 6, 8])
def test_matches_float64_formula(rng, framework, fmt, next_n):
    skip_unless_supported(fmt, framework)
    case = make_paged(rng, fmt, batch=3, next_n=next_n, num_heads=32, head_dim=128,
                      block_kv=64, max_context_len=300)
    logits = run(case, framework, clean_logits=True)
    assert logits.shape == (3 * next_n, 300)
    check_logits(as_numpy(logits), case.expected(), case.mask(), clean=True, bf16=False)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block_kv", [32, 64])
@pytest.mark.parametrize("lens_2d", [True, False])
@pytest.mark.parametrize("padded_blocks", [False, True])
def test_cache_layouts_and_context_length_forms(rng, fmt, block_kv, lens_2d, padded_blocks):
    skip_unless_supported(fmt, "numpy")
    case = make_paged(rng, fmt, batch=4, next_n=2, num_heads=16, head_dim=64,
                      block_kv=block_kv, max_context_len=200, lens_2d=lens_2d,
                      padded_blocks=padded_blocks)
    logits = run(case, clean_logits=True)
    check_logits(logits, case.expected(), case.mask(), clean=True, bf16=False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_unclean_and_bfloat16(rng, fmt):
    skip_unless_supported(fmt, "numpy", bf16=True)
    case = make_paged(rng, fmt, 3, 1, 64, 128, 64, 257, bf16_weights=True)
    logits = run(case, logits_dtype="bfloat16")
    check_logits(as_numpy(logits), case.expected(), case.mask(), clean=False, bf16=True)


def test_varlen_indices(rng):
    case = make_paged(rng, "fp8", batch=6, next_n=1, num_heads=32, head_dim=128, block_kv=64,
                      max_context_len=180, varlen=True)
    logits = run(case, clean_logits=True)
    check_logits(logits, case.expected(), case.mask(), clean=True, bf16=False)


def test_clean_logits_takes_what_the_reference_binding_takes(rng):
    """clean_logits as pybind11 converts it: None (False), a bool, a number (nonzero is True:
    2 and 0.5 as well) or a one-element tensor."""
    case = make_paged(rng, "fp8", batch=2, next_n=1, num_heads=16, head_dim=64, block_kv=64,
                      max_context_len=130)
    clean = as_numpy(run(case, clean_logits=True))
    flags = [1, 2, 0.5, np.bool_(True), np.int64(1)] + (
        [torch.tensor(True), torch.tensor([3])] if torch else [])
    for flag in flags:
        np.testing.assert_array_equal(as_numpy(run(case, clean_logits=flag)), clean)
    for flag in (0, 0.0, None, np.bool_(False)) + ((torch.tensor(0),) if torch else ()):
        check_logits(as_numpy(run(case, clean_logits=flag)), case.expected(), case.mask(),
                     clean=False, bf16=False)


def test_varlen_indices_only_label_sequences(rng):
    """The indices tell which consecutive rows are one sequence, whatever their values; the
    rows of a sequence must hold the same blocks over its keys (the CPU backend checks)."""
    case = make_paged(rng, "fp8", batch=8, next_n=1, num_heads=16, head_dim=64, block_kv=32,
                      max_context_len=150, varlen=True)
    logits = as_numpy(run(case, clean_logits=True))
    starts = np.flatnonzero(np.diff(case.indices, prepend=case.indices[0] - 1))
    relabeled = np.repeat(np.arange(len(starts)) * -7 + 1000, np.diff(np.append(starts, 8)))
    case.indices = relabeled.astype(np.int32)
    np.testing.assert_array_equal(as_numpy(run(case, clean_logits=True)), logits)
    run_rows = [r for r in range(1, 8) if case.indices[r] == case.indices[r - 1]]
    if not run_rows:
        case.indices[1] = case.indices[0]
        case.block_table[1] = case.block_table[0]
        run_rows = [1]
    row = run_rows[0]
    case.context_lens[row - 1] = case.context_lens[row] = 150  # every block inside the keys
    case.block_table[row, 0] = (case.block_table[row - 1, 0] + 1) % case.cache_buffer.shape[0]
    with pytest.raises(ValueError, match=r"^block_table: expected the rows of one varlen "):
        run(case)


def out_of_range_inputs(rng):
    """(what to break, the argument refused) for each device-resident input the CPU backend
    checks (the GPU's documented results for them: test_gpu.py)."""
    def case_with(change, varlen=False):
        case = make_paged(rng, "fp8", batch=3, next_n=1 if varlen else 2, num_heads=8,
                          head_dim=32, block_kv=32, max_context_len=100, varlen=varlen)
        change(case)
        return case

    def negative_scale(case):
        # The scale of token 0 of the first sequence's first block (key position 0 of its rows)
        # made -0.5 in the cache. The kernels multiply a key's head sum by its scale (outside the
        # relu, as the formula allows for scales >= 0), so the oracle holds +0.5 and the logit
        # at that position is the oracle's negated (test_gpu.py).
        block = case.block_table[0, 0]
        case.key_scales[block, 0] = 0.5
        case.cache_buffer[block, case.block_kv * case.head_dim:][:4] = (
            np.array([-0.5], "<f4").view(np.uint8))

    return [
        (case_with(lambda c: c.block_table.__setitem__((0, 1), -1)), "block_table"),
        (case_with(lambda c: c.block_table.__setitem__((1, 0), 10**9)), "block_table"),
        (case_with(lambda c: c.context_lens.__setitem__((2, 0), 2**31 - 1)), "context_lens"),
        (case_with(lambda c: c.context_lens.__setitem__((2, 1), -5)), "context_lens"),
        (case_with(lambda c: c.context_lens.__setitem__((0, 0), 101)), "context_lens"),
        (case_with(negative_scale), "kv_cache"),
    ]


def test_cpu_refuses_what_the_kernels_cannot_use(rng):
    for case, argument in out_of_range_inputs(rng):
        args = case.api_args()
        meta = np.asarray(mqa_logits.get_paged_mqa_logits_metadata(
            np.maximum(args["context_lens"], 0), case.block_kv, 4, args["indices"]))
        with pytest.raises(ValueError, match=rf"^{argument}: expected "):
            mqa_logits.fp8_fp4_paged_mqa_logits(schedule_meta=meta, **args)


def test_cpu_refuses_metadata_of_other_lengths(rng):
    case = make_paged(rng, "fp8", 4, 2, 16, 64, 64, 400)
    args = case.api_args()
    other = np.maximum(args["context_lens"] - 70, 0)
    for lens, workers in ((other, 4), (args["context_lens"][:3], 4)):
        meta = mqa_logits.get_paged_mqa_logits_metadata(lens, 64, workers)
        with pytest.raises(ValueError, match=r"^schedule_meta: expected "
                                             r"get_paged_mqa_logits_metadata of this call"):
            mqa_logits.fp8_fp4_paged_mqa_logits(schedule_meta=meta, **args)
    # Metadata of another batch is named by its fingerprint, whatever rows differ before it.
    meta = mqa_logits.get_paged_mqa_logits_metadata(args["context_lens"][:3], 64, 4)
    with pytest.raises(ValueError, match=r"got the fingerprint of other inputs at \[4, 1\]"):
        mqa_logits.fp8_fp4_paged_mqa_logits(schedule_meta=meta, **args)


def test_metadata_shape_device_and_determinism(rng):
    case = make_paged(rng, "fp8", 5, 2, 16, 64, 64, 400)
    first = mqa_logits.get_paged_mqa_logits_metadata(case.context_lens, 64, 7)
    assert first.dtype == np.int32 and first.shape == (8, 2)
    again = mqa_logits.get_paged_mqa_logits_metadata(case.context_lens, 64, 7)
    assert np.array_equal(first, again)


def test_repeated_calls_are_bitwise_identical(rng):
    case = make_paged(rng, "mxfp4", 4, 3, 64, 128, 64, 333)
    first = run(case, clean_logits=True)
    for _ in range(3):
        assert run(case, clean_logits=True).tobytes() == first.tobytes()


def test_legacy_fp8_paged_mqa_logits(rng):
    case = make_paged(rng, "fp8", 2, 2, 64, 128, 64, 130)
    args = case.api_args()
    meta = mqa_logits.get_paged_mqa_logits_metadata(args["context_lens"], 64,
                                                    mqa_logits.get_num_sms())
    logits = mqa_logits.fp8_paged_mqa_logits(args["q"], args["kv_cache"], args["weights"],
                                             args["context_lens"], args["block_table"], meta,
                                             args["max_context_len"], True)
    assert logits.dtype == np.float32
    check_logits(logits, case.expected(), case.mask(), clean=True, bf16=False)


@requires_torch
@pytest.mark.parametrize("cache_dtype", ["uint8", "int8", "float8_e4m3fn"])
def test_torch_cache_in_any_byte_dtype(rng, cache_dtype):
    case = make_paged(rng, "fp8", 2, 1, 32, 128, 64, 150)
    args = case.api_args("torch")
    args["kv_cache"] = args["kv_cache"].view(getattr(torch, cache_dtype))
    meta = mqa_logits.get_paged_mqa_logits_metadata(args["context_lens"], 64,
                                                    mqa_logits.get_num_sms())
    assert isinstance(meta, torch.Tensor) and meta.dtype == torch.int32
    logits = mqa_logits.fp8_paged_mqa_logits(schedule_meta=meta, clean_logits=True, **args)
    assert isinstance(logits, torch.Tensor)
    check_logits(as_numpy(logits), case.expected(), case.mask(), clean=True, bf16=False)
