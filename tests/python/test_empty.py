"""Empty and degenerate calls on the CPU backend: no query (S = 0), no key (T = 0), no sequence
(B = 0), no output column, rows with no context. Each returns the documented shape, dtype and
framework, with -inf wherever clean_logits defines an element, for every format and every
weights / logits dtype, through numpy and torch."""

import numpy as np
import pytest

import mqa_logits
from reference import FORMATS, as_numpy, check_logits, make_paged, make_prefill
from support import skip_unless_supported, torch

FRAMEWORKS = ("numpy", "torch")
# (weights dtype, logits dtype): bfloat16 weights need bfloat16 logits.
DTYPES = [("float32", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16")]
DTYPE_IDS = [f"w-{w}-logits-{l}" for w, l in DTYPES]


def head_dim_of(fmt):
    return 64  # every format, MXFP4 included, takes D = 64


def check_empty(logits, framework, shape, logits_dtype, clean):
    """Shape, dtype and framework; every element -inf when clean; rows 16-byte aligned (the
    layout device outputs need), whatever the extents."""
    if framework == "torch":
        assert isinstance(logits, torch.Tensor)
        row_bytes = logits.stride(0) * logits.element_size()
    else:
        assert isinstance(logits, np.ndarray)
        row_bytes = logits.strides[0]
    assert tuple(logits.shape) == shape
    assert logits_dtype in str(logits.dtype)
    assert row_bytes % 16 == 0 and row_bytes > 0
    if clean:
        assert np.isneginf(as_numpy(logits)).all()


# ---- prefill ------------------------------------------------------------------------------------

@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("weights_dtype,logits_dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("seq_len,seq_len_kv", [(0, 16), (5, 0), (0, 0)])
@pytest.mark.parametrize("max_seqlen_k", [0, 8])
def test_prefill_without_queries_or_keys(rng, framework, fmt, weights_dtype, logits_dtype,
                                         seq_len, seq_len_kv, max_seqlen_k):
    skip_unless_supported(fmt, framework, bf16=logits_dtype == "bfloat16")
    case = make_prefill(rng, fmt, seq_len, 8, head_dim_of(fmt), seq_len_kv,
                        bf16_weights=weights_dtype == "bfloat16")
    for clean in (True, False):
        logits = mqa_logits.fp8_fp4_mqa_logits(**case.api_args(framework), clean_logits=clean,
                                               max_seqlen_k=max_seqlen_k,
                                               logits_dtype=logits_dtype)
        width = max_seqlen_k or seq_len_kv
        check_empty(logits, framework, (seq_len, width), logits_dtype, clean)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("weights_dtype,logits_dtype", DTYPES, ids=DTYPE_IDS)
def test_prefill_rows_with_empty_windows(rng, framework, fmt, weights_dtype, logits_dtype):
    """Empty, inverted and out-of-range windows beside ordinary ones: -inf rows, the others
    right."""
    skip_unless_supported(fmt, framework, bf16=logits_dtype == "bfloat16")
    seq_len_kv = 30
    start = np.array([0, 5, 10, 40, -9, 3], np.int32)
    end = np.array([30, 5, 2, 50, -1, 17], np.int32)
    case = make_prefill(rng, fmt, len(start), 16, head_dim_of(fmt), seq_len_kv,
                        bf16_weights=weights_dtype == "bfloat16", windows=(start, end))
    logits = mqa_logits.fp8_fp4_mqa_logits(**case.api_args(framework),
                                           logits_dtype=logits_dtype)
    mask = case.mask()
    assert not mask[1:5].any() and mask[0].all() and mask[5].any()
    check_logits(as_numpy(logits), case.expected(), mask, clean=True,
                 bf16=logits_dtype == "bfloat16")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_legacy_fp8_prefill_without_queries_or_keys(rng, framework):
    skip_unless_supported("fp8", framework)
    for seq_len, seq_len_kv in [(0, 16), (5, 0), (0, 0)]:
        case = make_prefill(rng, "fp8", seq_len, 8, 32, seq_len_kv)
        args = case.api_args(framework)
        logits = mqa_logits.fp8_mqa_logits(args["q"], args["kv"], args["weights"],
                                           args["cu_seq_len_k_start"], args["cu_seq_len_k_end"])
        check_empty(logits, framework, (seq_len, seq_len_kv), "float32", clean=True)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("seq_len,seq_len_kv", [(0, 16), (5, 0), (0, 0)])
def test_prefill_metadata_without_queries_or_keys(rng, framework, seq_len, seq_len_kv):
    skip_unless_supported("fp8", framework)
    case = make_prefill(rng, "fp8", seq_len, 8, 32, seq_len_kv)
    args = case.api_args(framework)
    meta = mqa_logits.get_mqa_logits_metadata(args["cu_seq_len_k_start"],
                                              args["cu_seq_len_k_end"], seq_len_kv, 8)
    assert tuple(meta.shape) == (mqa_logits.get_num_sms() + 1, 2)
    logits = mqa_logits.fp8_fp4_mqa_logits(**args, schedule_meta=meta)
    check_empty(logits, framework, (seq_len, seq_len_kv), "float32", clean=True)


# ---- decode -------------------------------------------------------------------------------------

def run_paged(case, framework, **options):
    args = case.api_args(framework)
    meta = mqa_logits.get_paged_mqa_logits_metadata(args["context_lens"], case.block_kv,
                                                    mqa_logits.get_num_sms(), args["indices"])
    return mqa_logits.fp8_fp4_paged_mqa_logits(schedule_meta=meta, **args, **options)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("weights_dtype,logits_dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("batch,next_n,max_context_len,varlen", [
    (0, 1, 100, False), (0, 2, 100, False), (0, 3, 0, False), (0, 1, 70, True),
    (2, 2, 0, False), (3, 1, 0, True)])
def test_decode_without_sequences_or_columns(rng, framework, fmt, weights_dtype, logits_dtype,
                                             batch, next_n, max_context_len, varlen):
    skip_unless_supported(fmt, framework, bf16=logits_dtype == "bfloat16")
    case = make_paged(rng, fmt, batch=batch, next_n=next_n, num_heads=16,
                      head_dim=head_dim_of(fmt), block_kv=32, max_context_len=max_context_len,
                      varlen=varlen, bf16_weights=weights_dtype == "bfloat16")
    for clean in (True, False):
        logits = run_paged(case, framework, clean_logits=clean, logits_dtype=logits_dtype)
        check_empty(logits, framework, (batch * next_n, max_context_len), logits_dtype, clean)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("weights_dtype,logits_dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lens_2d", [True, False])
def test_decode_rows_with_zero_context(rng, framework, fmt, weights_dtype, logits_dtype,
                                       lens_2d):
    """Whole sequences and single next_n rows with no context (0, or negative in the 1-D
    form): -inf rows when clean, beside rows that are right."""
    skip_unless_supported(fmt, framework, bf16=logits_dtype == "bfloat16")
    case = make_paged(rng, fmt, batch=4, next_n=3, num_heads=16, head_dim=head_dim_of(fmt),
                      block_kv=64, max_context_len=150, lens_2d=lens_2d,
                      bf16_weights=weights_dtype == "bfloat16")
    if lens_2d:
        case.context_lens[1, :] = 0                  # a sequence with no context
        case.context_lens[2, :] = [0, 0, 7]          # its first next_n rows with none
    else:
        case.context_lens[1] = 0                     # rows see 0 - 3 + t + 1 <= 0 keys
        case.context_lens[2] = 2                     # rows see 0, 1, 2 keys
    mask = case.mask()
    assert not mask[3:6].any() and not mask[6].any() and mask[2].all() and mask[8].any()
    logits = run_paged(case, framework, clean_logits=True, logits_dtype=logits_dtype)
    check_logits(as_numpy(logits), case.expected(), mask, clean=True,
                 bf16=logits_dtype == "bfloat16")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_all_rows_without_context(rng, framework):
    skip_unless_supported("fp8", framework)
    case = make_paged(rng, "fp8", batch=3, next_n=2, num_heads=8, head_dim=32, block_kv=32,
                      max_context_len=50)
    case.context_lens[:] = 0
    logits = run_paged(case, framework, clean_logits=True)
    check_empty(logits, framework, (6, 50), "float32", clean=True)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_legacy_fp8_decode_without_sequences(rng, framework):
    skip_unless_supported("fp8", framework)
    case = make_paged(rng, "fp8", batch=0, next_n=2, num_heads=8, head_dim=32, block_kv=32,
                      max_context_len=40)
    args = case.api_args(framework)
    meta = mqa_logits.get_paged_mqa_logits_metadata(args["context_lens"], 32,
                                                    mqa_logits.get_num_sms())
    assert tuple(meta.shape) == (mqa_logits.get_num_sms() + 1, 2)
    logits = mqa_logits.fp8_paged_mqa_logits(args["q"], args["kv_cache"], args["weights"],
                                             args["context_lens"], args["block_table"], meta,
                                             40, True)
    check_empty(logits, framework, (0, 40), "float32", clean=True)


def test_numpy_empty_arrays_cross_whatever_their_strides(rng):
    """numpy 2 gives the dims of an empty array stride 0 (a [0, 3] block table once read as a
    non-contiguous last dim): empty inputs are refused for their shape only."""
    case = make_paged(rng, "fp8", batch=0, next_n=1, num_heads=8, head_dim=32, block_kv=32,
                      max_context_len=90)
    args = case.api_args()
    assert args["block_table"].shape == (0, 3)
    meta = mqa_logits.get_paged_mqa_logits_metadata(args["context_lens"], 32, 2)
    table = np.lib.stride_tricks.as_strided(args["block_table"], (0, 3), (0, 0))
    logits = mqa_logits.fp8_fp4_paged_mqa_logits(**dict(args, block_table=table),
                                                 schedule_meta=meta)
    assert logits.shape == (0, 90)
    with pytest.raises(ValueError, match=r"^block_table: expected shape \[B, max_blocks\]"):
        mqa_logits.fp8_fp4_paged_mqa_logits(**dict(args, block_table=np.zeros((1, 3), np.int32)),
                                             schedule_meta=meta)
