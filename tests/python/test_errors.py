"""Invalid input raises TypeError (types, dtypes) or ValueError (the library's message, which
names the argument); nothing crashes the interpreter, whatever the input."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mqa_logits
from reference import make_paged, make_prefill
from support import requires_ml_dtypes, requires_torch, torch


def non_contiguous(x):
    """The same values with a non-dense last dim."""
    wide = np.empty((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype)
    view = wide[..., ::2]
    view[...] = x
    return view


def with_q(args, q):
    return dict(args, q=q)


PREFILL_ERRORS = {
    "q is not an array": (lambda a: with_q(a, "q"), TypeError, "q: expected a torch.Tensor"),
    "q is a triple": (lambda a: with_q(a, (a["q"], None, None)), TypeError, "pair"),
    "q is float32": (lambda a: with_q(a, a["q"].astype(np.float32)), TypeError,
                     "q: expected dtype"),
    "kv scales are float64": (lambda a: dict(a, kv=(a["kv"][0], a["kv"][1].astype(np.float64))),
                              TypeError, "kv_scales: expected dtype"),
    "kv has no scales": (lambda a: dict(a, kv=a["kv"][0]), ValueError, "kv_scales"),
    "weights are int32": (lambda a: dict(a, weights=a["weights"].astype(np.int32)), TypeError,
                          "weights"),
    "start is int64": (lambda a: dict(a, cu_seq_len_k_start=a["cu_seq_len_k_start"].astype(
        np.int64)), TypeError, "cu_seq_len_k_start"),
    "start is big-endian": (lambda a: dict(a, cu_seq_len_k_start=a["cu_seq_len_k_start"].astype(
        ">i4")), TypeError, "byte order"),
    "weights have the wrong shape": (lambda a: dict(a, weights=a["weights"][:, :8]), ValueError,
                                     "weights"),
    "end has the wrong length": (lambda a: dict(a, cu_seq_len_k_end=a["cu_seq_len_k_end"][1:]),
                                 ValueError, "k_end"),
    "unsupported head count": (lambda a: with_q(a, a["q"][:, :12]), ValueError, "q"),
    "unsupported head dim": (lambda a: dict(a, q=a["q"][..., :48], kv=(a["kv"][0][:, :48].copy(),
                                                                      a["kv"][1])),
                             ValueError, "q"),
    "q is not contiguous": (lambda a: with_q(a, non_contiguous(a["q"])), ValueError, "q"),
    "q has 5 dims": (lambda a: with_q(a, a["q"][None, None]), ValueError, "q"),
    "kv head dim differs": (lambda a: dict(a, kv=(a["kv"][0][:, :32].copy(), a["kv"][1])),
                            ValueError, "kv"),
    "MX keys for FP8 queries": (lambda a: dict(a, kv=(a["kv"][0], a["kv"][1].view(np.int32))),
                                ValueError, "kv"),
    "clean_logits is a string": (lambda a: dict(a, clean_logits="yes"), TypeError,
                                 "clean_logits"),
    "max_seqlen_k is a float": (lambda a: dict(a, max_seqlen_k=2.0), TypeError, "max_seqlen_k"),
    "max_seqlen_k is negative": (lambda a: dict(a, max_seqlen_k=-1), ValueError, "max_seqlen_k"),
    "max_seqlen_k overflows": (lambda a: dict(a, max_seqlen_k=2**70), ValueError,
                               "max_seqlen_k"),
    "logits_dtype is float16": (lambda a: dict(a, logits_dtype=np.float16), TypeError,
                                "logits_dtype"),
    "logits_dtype is None": (lambda a: dict(a, logits_dtype=None), TypeError, "logits_dtype"),
    "schedule_meta has the wrong shape": (lambda a: dict(a, schedule_meta=np.zeros(
        (1, 2), np.int32)), ValueError, "schedule_meta"),
    "schedule_meta is int64": (lambda a: dict(a, schedule_meta=np.zeros((5, 2), np.int64)),
                               TypeError, "schedule_meta"),
    "object array": (lambda a: dict(a, weights=np.array([[None]] * 8)), TypeError, "weights"),
}


@pytest.fixture
def prefill_args(rng):
    return make_prefill(rng, "fp8", 8, 16, 64, 40).api_args()


@pytest.mark.parametrize("name", sorted(PREFILL_ERRORS))
def test_prefill_refuses(prefill_args, name):
    mutate, error, fragment = PREFILL_ERRORS[name]
    with pytest.raises(error, match=fragment) as info:
        mqa_logits.fp8_fp4_mqa_logits(**mutate(prefill_args))
    assert "expected" in str(info.value)


@requires_ml_dtypes
def test_bfloat16_weights_need_bfloat16_logits(rng):
    args = make_prefill(rng, "fp8", 4, 8, 32, 10, bf16_weights=True).api_args()
    with pytest.raises(ValueError, match="logits"):
        mqa_logits.fp8_fp4_mqa_logits(**args, logits_dtype="float32")


PAGED_ERRORS = {
    "cache is float32": (lambda a: dict(a, kv_cache=a["kv_cache"].view(np.float32)), TypeError,
                         "kv_cache"),
    "cache rows are too short": (lambda a: dict(a, kv_cache=a["kv_cache"][..., :-1]), ValueError,
                                 "kv_cache"),
    "unsupported block_kv": (lambda a: dict(a, kv_cache=a["kv_cache"][:, :16]), ValueError,
                             "kv_cache"),
    "next_n above 8": (lambda a: dict(a, q=np.concatenate([a["q"]] * 5, axis=1)), ValueError,
                       "next_n"),
    "context_lens have the wrong shape": (lambda a: dict(a, context_lens=a["context_lens"][:1]),
                                          ValueError, "context_lens"),
    "block_table is float32": (lambda a: dict(a, block_table=a["block_table"].astype(
        np.float32)), TypeError, "block_table"),
    "block_table last dim is strided": (lambda a: dict(a, block_table=non_contiguous(
        a["block_table"])), ValueError, "block_table"),
    "schedule_meta has 3 columns": (lambda a: dict(a, schedule_meta=np.zeros((5, 3), np.int32)),
                                    ValueError, "schedule_meta"),
    "indices with next_n 2": (lambda a: dict(a, indices=np.zeros(3, np.int32)), ValueError,
                              "indices"),
    "max_context_len is negative": (lambda a: dict(a, max_context_len=-2), ValueError,
                                    "max_context_len"),
    "weights have the wrong shape": (lambda a: dict(a, weights=a["weights"][:-1]), ValueError,
                                     "weights"),
}


@pytest.fixture
def paged_args(rng):
    case = make_paged(rng, "fp8", batch=3, next_n=2, num_heads=16, head_dim=64, block_kv=32,
                      max_context_len=90)
    args = case.api_args()
    args["schedule_meta"] = mqa_logits.get_paged_mqa_logits_metadata(
        args["context_lens"], 32, mqa_logits.get_num_sms())
    return args


@pytest.mark.parametrize("name", sorted(PAGED_ERRORS))
def test_paged_refuses(paged_args, name):
    mutate, error, fragment = PAGED_ERRORS[name]
    with pytest.raises(error, match=fragment) as info:
        mqa_logits.fp8_fp4_paged_mqa_logits(**mutate(paged_args))
    assert "expected" in str(info.value)


@pytest.mark.parametrize("block_kv,num_sms,fragment", [
    (32, 0, "num_sms"), (32, -4, "num_sms"), (48, 4, "block_kv"), (32, 2**40, "num_sms")])
def test_paged_metadata_refuses(block_kv, num_sms, fragment):
    lens = np.array([[5, 6]], dtype=np.int32)
    with pytest.raises(ValueError, match=fragment):
        mqa_logits.get_paged_mqa_logits_metadata(lens, block_kv, num_sms)


def test_prefill_metadata_refuses():
    start = np.zeros(4, np.int32)
    with pytest.raises(ValueError, match="num_heads"):
        mqa_logits.get_mqa_logits_metadata(start, start + 3, 10, 12)
    with pytest.raises(TypeError, match="cu_seq_len_k_end"):
        mqa_logits.get_mqa_logits_metadata(start, start.astype(np.int64), 10, 16)


@requires_torch
def test_torch_dtype_errors_name_the_argument():
    q = torch.zeros(4, 16, 64, dtype=torch.float16)
    kv = (torch.zeros(8, 64, dtype=torch.uint8), torch.ones(8))
    weights = torch.zeros(4, 16)
    start = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(TypeError, match="q: expected dtype"):
        mqa_logits.fp8_fp4_mqa_logits(q, kv, weights, start, start)
    with pytest.raises(TypeError, match="cu_seq_len_k_start"):
        mqa_logits.fp8_fp4_mqa_logits(q.to(torch.float8_e4m3fn), kv, weights, start, start)


def test_garbage_never_crashes_the_interpreter():
    """Thousands of malformed calls run in a child process: a crash there fails this test
    instead of taking the test run down."""
    script = Path(__file__).with_name("fuzz_calls.py")
    result = subprocess.run([sys.executable, str(script), "--calls", "3000"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "calls:" in result.stdout
