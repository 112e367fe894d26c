"""Prefill logits on the CPU backend against the float64 formula, through numpy and torch."""

import numpy as np
import pytest

import mqa_logits
from reference import FORMATS, as_numpy, check_logits, make_prefill
from support import requires_ml_dtypes, requires_torch, skip_unless_supported, torch

FRAMEWORKS = ("numpy", "torch")
SHAPES = [(8, 32), (16, 64), (32, 128), (64, 128), (64, 64)]  # (H, D)


def run(case, framework="numpy", **options):
    return mqa_logits.fp8_fp4_mqa_logits(**case.api_args(framework), **options)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_heads,head_dim", SHAPES)
def test_matches_float64_formula(rng, framework, fmt, num_heads, head_dim):
    if fmt == "mxfp4" and head_dim == 32:
        pytest.skip("MXFP4 supports D in {64, 128}")
    skip_unless_supported(fmt, framework)
    case = make_prefill(rng, fmt, seq_len=37, num_heads=num_heads, head_dim=head_dim,
                        seq_len_kv=101)
    logits = run(case, framework)
    assert logits.shape == (case.seq_len, case.seq_len_kv)
    check_logits(as_numpy(logits), case.expected(), case.mask(), clean=True, bf16=False)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_bfloat16_logits_and_weights(rng, framework, fmt):
    skip_unless_supported(fmt, framework, bf16=True)
    for bf16_weights in (False, True):
        case = make_prefill(rng, fmt, 19, 16, 128, 70, bf16_weights=bf16_weights)
        logits = run(case, framework, logits_dtype="bfloat16")
        assert "bfloat16" in str(logits.dtype)
        check_logits(as_numpy(logits), case.expected(), case.mask(), clean=True, bf16=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_unclean_logits_are_right_inside_the_windows(rng, fmt):
    skip_unless_supported(fmt, "numpy")
    case = make_prefill(rng, fmt, 29, 32, 64, 80)
    logits = run(case, clean_logits=False)
    check_logits(logits, case.expected(), case.mask(), clean=False, bf16=False)


@pytest.mark.parametrize("clean", [True, False])
def test_compressed_output(rng, clean):
    seq_len, seq_len_kv, width = 23, 90, 40
    start = rng.integers(0, seq_len_kv, size=seq_len).astype(np.int32)
    end = np.minimum(start + rng.integers(0, width + 1, size=seq_len),
                     seq_len_kv).astype(np.int32)
    case = make_prefill(rng, "fp8", seq_len, 16, 128, seq_len_kv, windows=(start, end))
    logits = run(case, clean_logits=clean, max_seqlen_k=width)
    assert logits.shape == (seq_len, width)
    full = case.expected()
    columns = np.arange(width)
    mask = columns[None, :] < (end - start)[:, None]
    expected = np.full((seq_len, width), -np.inf)
    for i in range(seq_len):
        count = int(mask[i].sum())
        expected[i, :count] = full[i, start[i]:start[i] + count]
    check_logits(logits, expected, mask, clean=clean, bf16=False)


def test_cpu_refuses_what_the_kernels_cannot_use(rng):
    """A compressed output narrower than a window, a negative key scale, metadata of other
    windows: the CPU backend refuses them (the GPU's documented results: test_gpu.py)."""
    case = make_prefill(rng, "fp8", 23, 16, 128, 90)
    widest = int((np.minimum(case.end, 90) - np.maximum(case.start, 0)).max())
    with pytest.raises(ValueError, match=r"^max_seqlen_k: expected at least the widest window"):
        run(case, max_seqlen_k=widest - 1)
    assert run(case, max_seqlen_k=widest).shape == (23, widest)
    case.kv_scales[7] = -1.0
    with pytest.raises(ValueError, match=r"^kv: scales \(kv\[1\]\): expected key scales >= 0"):
        run(case)
    case.kv_scales[7] = 1.0
    longer = (np.zeros_like(case.start), np.full_like(case.end, 1000))  # another call's
    other = mqa_logits.get_mqa_logits_metadata(*longer, 1000, 16)
    with pytest.raises(ValueError, match=r"^schedule_meta: expected get_mqa_logits_metadata"):
        run(case, schedule_meta=other)


def test_logits_are_a_view_of_padded_rows(rng):
    case = make_prefill(rng, "fp8", 5, 8, 64, 77)
    logits = run(case)
    assert logits.shape == (5, 77)
    assert logits.strides[0] % 1024 == 0 and logits.strides[0] >= 77 * 4
    assert logits.ctypes.data % 16 == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_schedule_metadata_changes_no_bit(rng, fmt):
    skip_unless_supported(fmt, "numpy")
    case = make_prefill(rng, fmt, 64, 32, 128, 300)
    meta = mqa_logits.get_mqa_logits_metadata(case.start, case.end, case.seq_len_kv,
                                              case.num_heads)
    assert meta.dtype == np.int32 and meta.shape == (mqa_logits.get_num_sms() + 1, 2)
    plain = run(case)
    scheduled = run(case, schedule_meta=meta)
    assert plain.tobytes() == scheduled.tobytes()


def test_repeated_calls_are_bitwise_identical(rng):
    case = make_prefill(rng, "mxfp4", 40, 64, 128, 150)
    first = run(case)
    for _ in range(3):
        assert run(case).tobytes() == first.tobytes()


def test_result_does_not_depend_on_worker_count(rng):
    case = make_prefill(rng, "fp8", 50, 16, 64, 120)
    default = mqa_logits.get_num_sms()
    expected = run(case).tobytes()
    try:
        mqa_logits.set_num_sms(1)
        assert run(case).tobytes() == expected
    finally:
        mqa_logits.set_num_sms(default)


@pytest.mark.parametrize("seq_len,seq_len_kv", [(0, 16), (4, 0), (0, 0)])
def test_empty_problems(rng, seq_len, seq_len_kv):
    case = make_prefill(rng, "fp8", seq_len, 8, 32, seq_len_kv)
    logits = run(case)
    assert logits.shape == (seq_len, seq_len_kv)
    assert np.isneginf(logits).all()


def test_legacy_fp8_mqa_logits(rng):
    case = make_prefill(rng, "fp8", 21, 64, 128, 66)
    args = case.api_args()
    logits = mqa_logits.fp8_mqa_logits(args["q"], args["kv"], args["weights"],
                                       args["cu_seq_len_k_start"], args["cu_seq_len_k_end"])
    assert logits.dtype == np.float32
    check_logits(logits, case.expected(), case.mask(), clean=True, bf16=False)


@requires_ml_dtypes
def test_numpy_float8_and_byte_codes_agree(rng):
    import ml_dtypes

    case = make_prefill(rng, "fp8", 12, 16, 64, 50)
    args = case.api_args()
    as_float8 = dict(args, q=args["q"].view(ml_dtypes.float8_e4m3fn),
                     kv=(args["kv"][0].view(ml_dtypes.float8_e4m3fn), args["kv"][1]))
    assert (mqa_logits.fp8_fp4_mqa_logits(**as_float8).tobytes()
            == mqa_logits.fp8_fp4_mqa_logits(**args).tobytes())


@requires_torch
def test_deep_gemm_style_call_with_torch(rng):
    """What an inference engine does after `import mqa_logits as deep_gemm`."""
    import mqa_logits as deep_gemm

    case = make_prefill(rng, "fp8", 33, 64, 128, 97)
    args = case.api_args("torch")
    q_fp8, (k_fp8, k_scale) = args["q"], args["kv"]
    assert q_fp8.dtype == torch.float8_e4m3fn
    logits = deep_gemm.fp8_fp4_mqa_logits((q_fp8, None), (k_fp8, k_scale), args["weights"],
                                          args["cu_seq_len_k_start"], args["cu_seq_len_k_end"],
                                          clean_logits=False)
    assert isinstance(logits, torch.Tensor) and logits.dtype == torch.float32
    assert logits.stride(1) == 1 and logits.stride(0) * 4 % 1024 == 0
    check_logits(as_numpy(logits), case.expected(), case.mask(), clean=False, bf16=False)
    legacy = deep_gemm.fp8_mqa_logits(q_fp8, (k_fp8, k_scale), args["weights"],
                                      args["cu_seq_len_k_start"], args["cu_seq_len_k_end"])
    check_logits(as_numpy(legacy), case.expected(), case.mask(), clean=True, bf16=False)


@requires_torch
def test_torch_int8_mxfp4_and_grad_tracking_inputs(rng):
    case = make_prefill(rng, "mxfp4", 17, 32, 128, 64)
    args = case.api_args("torch")
    (q, q_scales), (kv, kv_scales) = args["q"], args["kv"]
    weights = args["weights"].clone().requires_grad_(True)
    logits = mqa_logits.fp8_fp4_mqa_logits(
        (q.view(torch.int8), q_scales), (kv.view(torch.int8), kv_scales), weights,
        args["cu_seq_len_k_start"], args["cu_seq_len_k_end"], logits_dtype=torch.float32)
    check_logits(as_numpy(logits), case.expected(), case.mask(), clean=True, bf16=False)
