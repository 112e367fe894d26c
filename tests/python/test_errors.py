"""Invalid input raises TypeError (types, dtypes) or ValueError (everything else), with a message
in the caller's words: it starts with the argument as the Python function spells it, then says
what was expected and what was given, and names no argument the function does not have. Nothing
crashes the interpreter, whatever the input."""

import inspect
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mqa_logits
from reference import make_paged, make_prefill
from support import (foreign_names, leading_argument, ml_dtypes, requires_ml_dtypes,
                     requires_torch, torch)


def non_contiguous(x):
    """The same values with a non-dense last dim."""
    wide = np.empty((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype)
    view = wide[..., ::2]
    view[...] = x
    return view


def huge_keys(kv):
    """2^31 keys (more than int32 columns) without the memory: every row is the first one."""
    values, scales = kv
    return (np.lib.stride_tricks.as_strided(values, (2**31, values.shape[1]), (0, 1)),
            np.lib.stride_tricks.as_strided(scales, (2**31,), (0,)))


def bf16(x):
    return x.astype(ml_dtypes.bfloat16)


# ---- the cases ---------------------------------------------------------------------------------
#
# (function, argument, description, base arguments, mutation, error type, message prefix). The
# prefix is "argument: " unless given: the scales of a (values, scales) pair are "q: scales
# (q[1]): ", and missing scales "q: pass (values, scales): ".

def prefill_base(fmt="fp8"):
    return lambda rng: make_prefill(rng, fmt, 8, 16, 64, 40).api_args()


def paged_base(fmt="fp8", next_n=2):
    def make(rng):
        case = make_paged(rng, fmt, batch=3, next_n=next_n, num_heads=16, head_dim=64,
                          block_kv=32, max_context_len=90)
        args = case.api_args()
        args["schedule_meta"] = mqa_logits.get_paged_mqa_logits_metadata(
            args["context_lens"], 32, mqa_logits.get_num_sms(), args["indices"])
        return args
    return make


def prefill_metadata_base(rng):
    start = np.zeros(4, np.int32)
    return dict(cu_seq_len_k_start=start, cu_seq_len_k_end=start + 3, num_kv_tokens=10,
                num_heads=16)


def paged_metadata_base(rng):
    return dict(context_lens=np.array([[5, 6]], np.int32), block_kv=32, num_sms=4, indices=None)


def no_arguments(rng):
    return {}


def without(args, *names):
    return {k: v for k, v in args.items() if k not in names}


PREFILL_CASES = [
    # (argument, description, base, mutation, error, prefix or None)
    ("q", "is not an array", prefill_base(), lambda a: dict(a, q="q"), TypeError, None),
    ("q", "is a triple", prefill_base(), lambda a: dict(a, q=(a["q"], None, None)), TypeError,
     None),
    ("q", "is float32", prefill_base(), lambda a: dict(a, q=a["q"].astype(np.float32)),
     TypeError, None),
    ("q", "has 12 heads", prefill_base(), lambda a: dict(a, q=a["q"][:, :12]), ValueError,
     None),
    ("q", "has head dim 48", prefill_base(),
     lambda a: dict(a, q=a["q"][..., :48], kv=(a["kv"][0][:, :48].copy(), a["kv"][1])),
     ValueError, None),
    ("q", "is not contiguous", prefill_base(), lambda a: dict(a, q=non_contiguous(a["q"])),
     ValueError, None),
    ("q", "has 5 dims", prefill_base(), lambda a: dict(a, q=a["q"][None, None]), ValueError,
     None),
    ("q", "MX scales of the wrong shape", prefill_base("mxfp4"),
     lambda a: dict(a, q=(a["q"][0], a["q"][1][:, :8])), ValueError, "q: scales (q[1]): "),
    ("q", "MX scales are float32", prefill_base("mxfp4"),
     lambda a: dict(a, q=(a["q"][0], a["q"][1].astype(np.float32))), TypeError,
     "q: scales (q[1]): "),
    ("kv", "head dim differs from q", prefill_base(),
     lambda a: dict(a, kv=(a["kv"][0][:, :32].copy(), a["kv"][1])), ValueError, None),
    ("kv", "has no scales", prefill_base(), lambda a: dict(a, kv=a["kv"][0]), ValueError,
     "kv: pass (values, scales): "),
    ("kv", "scales of the wrong length", prefill_base(),
     lambda a: dict(a, kv=(a["kv"][0], a["kv"][1][:-1])), ValueError, "kv: scales (kv[1]): "),
    ("kv", "scales are float64", prefill_base(),
     lambda a: dict(a, kv=(a["kv"][0], a["kv"][1].astype(np.float64))), TypeError,
     "kv: scales (kv[1]): "),
    ("kv", "MX scales for FP8 queries", prefill_base(),
     lambda a: dict(a, kv=(a["kv"][0], a["kv"][1].view(np.int32))), ValueError, None),
    ("kv", "more keys than int32 columns", prefill_base(),
     lambda a: dict(a, kv=huge_keys(a["kv"])), ValueError, None),
    ("weights", "are int32", prefill_base(),
     lambda a: dict(a, weights=a["weights"].astype(np.int32)), TypeError, None),
    ("weights", "have the wrong shape", prefill_base(),
     lambda a: dict(a, weights=a["weights"][:, :8]), ValueError, None),
    ("weights", "is an object array", prefill_base(),
     lambda a: dict(a, weights=np.array([[None]] * 8)), TypeError, None),
    ("cu_seq_len_k_start", "is int64", prefill_base(),
     lambda a: dict(a, cu_seq_len_k_start=a["cu_seq_len_k_start"].astype(np.int64)),
     TypeError, None),
    ("cu_seq_len_k_start", "is big-endian", prefill_base(),
     lambda a: dict(a, cu_seq_len_k_start=a["cu_seq_len_k_start"].astype(">i4")), TypeError,
     None),
    ("cu_seq_len_k_start", "has the wrong length", prefill_base(),
     lambda a: dict(a, cu_seq_len_k_start=a["cu_seq_len_k_start"][1:]), ValueError, None),
    ("cu_seq_len_k_start", "is a broadcast", prefill_base(),
     lambda a: dict(a, cu_seq_len_k_start=np.broadcast_to(a["cu_seq_len_k_start"][:1], (8,))),
     ValueError, None),
    ("cu_seq_len_k_end", "is int64", prefill_base(),
     lambda a: dict(a, cu_seq_len_k_end=a["cu_seq_len_k_end"].astype(np.int64)), TypeError,
     None),
    ("cu_seq_len_k_end", "has the wrong length", prefill_base(),
     lambda a: dict(a, cu_seq_len_k_end=a["cu_seq_len_k_end"][1:]), ValueError, None),
    ("cu_seq_len_k_end", "is 2-D", prefill_base(),
     lambda a: dict(a, cu_seq_len_k_end=a["cu_seq_len_k_end"][:, None]), ValueError, None),
    ("clean_logits", "is a string", prefill_base(), lambda a: dict(a, clean_logits="yes"),
     TypeError, None),
    ("max_seqlen_k", "is a float", prefill_base(), lambda a: dict(a, max_seqlen_k=2.0),
     TypeError, None),
    ("max_seqlen_k", "is negative", prefill_base(), lambda a: dict(a, max_seqlen_k=-1),
     ValueError, None),
    ("max_seqlen_k", "overflows int64", prefill_base(), lambda a: dict(a, max_seqlen_k=2**70),
     ValueError, None),
    ("max_seqlen_k", "is wider than int32 columns", prefill_base(),
     lambda a: dict(a, max_seqlen_k=2**31), ValueError, None),
]

# Arguments only fp8_fp4_mqa_logits has.
PREFILL_EXTRA_CASES = [
    ("logits_dtype", "is float16", prefill_base(), lambda a: dict(a, logits_dtype=np.float16),
     TypeError, None),
    ("logits_dtype", "is None", prefill_base(), lambda a: dict(a, logits_dtype=None),
     TypeError, None),
    ("logits_dtype", "is float32 with bfloat16 weights", prefill_base(),
     lambda a: dict(a, weights=bf16(a["weights"]), logits_dtype="float32"), ValueError, None),
    ("schedule_meta", "has the wrong shape", prefill_base(),
     lambda a: dict(a, schedule_meta=np.zeros((1, 2), np.int32)), ValueError, None),
    ("schedule_meta", "is int64", prefill_base(),
     lambda a: dict(a, schedule_meta=np.zeros((5, 2), np.int64)), TypeError, None),
]

PAGED_CASES = [
    ("q", "has next_n 10", paged_base(),
     lambda a: dict(a, q=np.concatenate([a["q"]] * 5, axis=1)), ValueError, None),
    ("q", "is float32", paged_base(), lambda a: dict(a, q=a["q"].astype(np.float32)),
     TypeError, None),
    ("q", "MX scales of the wrong shape", paged_base("mxfp4"),
     lambda a: dict(a, q=(a["q"][0], a["q"][1][:, :1])), ValueError, "q: scales (q[1]): "),
    ("kv_cache", "is float32", paged_base(),
     lambda a: dict(a, kv_cache=a["kv_cache"].view(np.float32)), TypeError, None),
    ("kv_cache", "rows are too short", paged_base(),
     lambda a: dict(a, kv_cache=a["kv_cache"][..., :-1]), ValueError, None),
    ("kv_cache", "has block_kv 16", paged_base(),
     lambda a: dict(a, kv_cache=a["kv_cache"][:, :16]), ValueError, None),
    ("weights", "have the wrong shape", paged_base(),
     lambda a: dict(a, weights=a["weights"][:-1]), ValueError, None),
    ("weights", "are int32", paged_base(),
     lambda a: dict(a, weights=a["weights"].astype(np.int32)), TypeError, None),
    ("context_lens", "have the wrong shape", paged_base(),
     lambda a: dict(a, context_lens=a["context_lens"][:1]), ValueError, None),
    ("context_lens", "are int64", paged_base(),
     lambda a: dict(a, context_lens=a["context_lens"].astype(np.int64)), TypeError, None),
    ("block_table", "is float32", paged_base(),
     lambda a: dict(a, block_table=a["block_table"].astype(np.float32)), TypeError, None),
    ("block_table", "last dim is strided", paged_base(),
     lambda a: dict(a, block_table=non_contiguous(a["block_table"])), ValueError, None),
    ("block_table", "has too few rows", paged_base(),
     lambda a: dict(a, block_table=a["block_table"][:1]), ValueError, None),
    ("schedule_meta", "has 3 columns", paged_base(),
     lambda a: dict(a, schedule_meta=np.zeros((5, 3), np.int32)), ValueError, None),
    ("schedule_meta", "is None", paged_base(), lambda a: dict(a, schedule_meta=None),
     TypeError, None),
    ("max_context_len", "is negative", paged_base(), lambda a: dict(a, max_context_len=-2),
     ValueError, None),
    ("max_context_len", "is a float", paged_base(), lambda a: dict(a, max_context_len=90.0),
     TypeError, None),
    ("clean_logits", "is a string", paged_base(), lambda a: dict(a, clean_logits="yes"),
     TypeError, None),
    ("clean_logits", "is a list", paged_base(), lambda a: dict(a, clean_logits=[True]),
     TypeError, None),
    ("indices", "with next_n 2", paged_base(), lambda a: dict(a, indices=np.zeros(3, np.int32)),
     ValueError, None),
    ("indices", "are int64", paged_base(), lambda a: dict(a, indices=np.zeros(3, np.int64)),
     TypeError, None),
]

PAGED_EXTRA_CASES = [
    ("logits_dtype", "is float16", paged_base(), lambda a: dict(a, logits_dtype="float16"),
     TypeError, None),
    ("logits_dtype", "is float32 with bfloat16 weights", paged_base(),
     lambda a: dict(a, weights=bf16(a["weights"]), logits_dtype="float32"), ValueError, None),
]

CASES = (
    [("fp8_fp4_mqa_logits", *case) for case in PREFILL_CASES + PREFILL_EXTRA_CASES]
    + [("fp8_mqa_logits", *case) for case in PREFILL_CASES]
    + [("fp8_mqa_logits", "weights", "are bfloat16 (float32 logits)", prefill_base(),
        lambda a: dict(a, weights=bf16(a["weights"])), TypeError, None)]
    + [("fp8_fp4_paged_mqa_logits", *case) for case in PAGED_CASES + PAGED_EXTRA_CASES]
    + [("fp8_paged_mqa_logits", *case) for case in PAGED_CASES]
    + [("fp8_paged_mqa_logits", "weights", "are bfloat16 (float32 logits)", paged_base(),
        lambda a: dict(a, weights=bf16(a["weights"])), TypeError, None)]
    + [("get_mqa_logits_metadata", *case) for case in [
        ("cu_seq_len_k_start", "is 2-D", prefill_metadata_base,
         lambda a: dict(a, cu_seq_len_k_start=np.zeros((4, 1), np.int32)), ValueError, None),
        ("cu_seq_len_k_start", "is int64", prefill_metadata_base,
         lambda a: dict(a, cu_seq_len_k_start=np.zeros(4, np.int64)), TypeError, None),
        ("cu_seq_len_k_end", "has the wrong length", prefill_metadata_base,
         lambda a: dict(a, cu_seq_len_k_end=np.zeros(3, np.int32)), ValueError, None),
        ("cu_seq_len_k_end", "is int64", prefill_metadata_base,
         lambda a: dict(a, cu_seq_len_k_end=np.zeros(4, np.int64)), TypeError, None),
        ("num_kv_tokens", "is negative", prefill_metadata_base,
         lambda a: dict(a, num_kv_tokens=-1), ValueError, None),
        ("num_kv_tokens", "is a float", prefill_metadata_base,
         lambda a: dict(a, num_kv_tokens=2.5), TypeError, None),
        ("num_heads", "is 12", prefill_metadata_base, lambda a: dict(a, num_heads=12),
         ValueError, None),
        ("num_heads", "overflows int32", prefill_metadata_base,
         lambda a: dict(a, num_heads=2**40), ValueError, None),
    ]]
    + [("get_paged_mqa_logits_metadata", *case) for case in [
        ("context_lens", "is 3-D", paged_metadata_base,
         lambda a: dict(a, context_lens=a["context_lens"][None]), ValueError, None),
        ("context_lens", "has next_n 9", paged_metadata_base,
         lambda a: dict(a, context_lens=np.zeros((1, 9), np.int32)), ValueError, None),
        ("context_lens", "is int64", paged_metadata_base,
         lambda a: dict(a, context_lens=a["context_lens"].astype(np.int64)), TypeError, None),
        ("block_kv", "is 48", paged_metadata_base, lambda a: dict(a, block_kv=48), ValueError,
         None),
        ("num_sms", "is 0", paged_metadata_base, lambda a: dict(a, num_sms=0), ValueError,
         None),
        ("num_sms", "is -4", paged_metadata_base, lambda a: dict(a, num_sms=-4), ValueError,
         None),
        ("num_sms", "overflows int32", paged_metadata_base, lambda a: dict(a, num_sms=2**40),
         ValueError, None),
        ("indices", "with next_n 2", paged_metadata_base,
         lambda a: dict(a, indices=np.zeros(1, np.int32)), ValueError, None),
        ("indices", "have the wrong length", paged_metadata_base,
         lambda a: dict(a, context_lens=np.array([5, 6], np.int32),
                        indices=np.zeros(3, np.int32)), ValueError, None),
    ]]
    + [("set_num_sms", *case) for case in [
        ("new_num_sms", "is -1", no_arguments, lambda a: dict(new_num_sms=-1), ValueError, None),
        ("new_num_sms", "is -3", no_arguments, lambda a: dict(new_num_sms=-3), ValueError,
         None),
        ("new_num_sms", "is above the limit", no_arguments, lambda a: dict(new_num_sms=10**6),
         ValueError, None),
        ("new_num_sms", "is a float", no_arguments, lambda a: dict(new_num_sms=2.5), TypeError,
         None),
    ]]
)

# ---- the top-k functions: the logits functions' cases for the arguments they share ----------

def with_topk(base, topk=16):
    return lambda rng: dict(base(rng), topk=topk)


def per_row_base(rng):
    return dict(logits=rng.standard_normal((6, 50)).astype(np.float32),
                starts=np.zeros(6, np.int32), ends=np.full(6, 50, np.int32), topk=8)


TOPK_CASES = [
    ("topk", "is 0", lambda a: dict(a, topk=0), ValueError),
    ("topk", "is 2049", lambda a: dict(a, topk=2049), ValueError),
    ("topk", "is a float", lambda a: dict(a, topk=8.0), TypeError),
    ("return_values", "is a string", lambda a: dict(a, return_values="yes"), TypeError),
]

SHARED_WITH_LOGITS = ("clean_logits", "max_seqlen_k")


def merge_base(rng):
    keys = np.sort(rng.choice(1000, size=(2, 5, 8), replace=False), axis=2)
    return dict(candidate_values=rng.standard_normal((2, 5, 8)).astype(np.float32),
                candidate_indices=keys.astype(np.int32), topk=4)

CASES += (
    [("mqa_topk", argument, description, with_topk(base), mutate, error, prefix)
     for argument, description, base, mutate, error, prefix in PREFILL_CASES
     if argument not in SHARED_WITH_LOGITS]
    + [("mqa_topk", argument, description, with_topk(prefill_base()), mutate, error, None)
       for argument, description, mutate, error in TOPK_CASES + [
           ("absolute_indices", "is a string", lambda a: dict(a, absolute_indices="no"),
            TypeError),
           ("schedule_meta", "has the wrong shape",
            lambda a: dict(a, schedule_meta=np.zeros((1, 2), np.int32)), ValueError),
           ("logits_dtype", "is float16", lambda a: dict(a, logits_dtype="float16"), TypeError),
           ("logits_dtype", "is float32 with bfloat16 weights",
            lambda a: dict(a, weights=bf16(a["weights"]), logits_dtype="float32"), ValueError)]]
    + [("paged_mqa_topk", argument, description, with_topk(base), mutate, error, prefix)
       for argument, description, base, mutate, error, prefix in PAGED_CASES
       if argument not in SHARED_WITH_LOGITS]
    + [("paged_mqa_topk", argument, description, with_topk(paged_base()), mutate, error, None)
       for argument, description, mutate, error in TOPK_CASES + [
           ("cache_slots", "is a list", lambda a: dict(a, cache_slots=[1]), TypeError),
           ("logits_dtype", "is float16", lambda a: dict(a, logits_dtype="float16"), TypeError)]]
    + [("merge_topk", argument, description, merge_base, mutate, error, None)
       for argument, description, mutate, error in TOPK_CASES + [
           ("candidate_values", "is int32",
            lambda a: dict(a, candidate_values=a["candidate_values"].astype(np.int32)), TypeError),
           ("candidate_values", "is 2-D",
            lambda a: dict(a, candidate_values=a["candidate_values"][0]), ValueError),
           ("candidate_indices", "are int64",
            lambda a: dict(a, candidate_indices=a["candidate_indices"].astype(np.int64)),
            TypeError),
           ("candidate_indices", "are descending",
            lambda a: dict(a, candidate_indices=a["candidate_indices"][:, :, ::-1].copy()),
            ValueError)]]
    + [("topk_per_row", argument, description, per_row_base, mutate, error, None)
       for argument, description, mutate, error in TOPK_CASES + [
           ("logits", "is int32", lambda a: dict(a, logits=a["logits"].astype(np.int32)),
            TypeError),
           ("logits", "is 3-D", lambda a: dict(a, logits=a["logits"][None]), ValueError),
           ("starts", "have the wrong length", lambda a: dict(a, starts=a["starts"][1:]),
            ValueError),
           ("starts", "are absent for compressed rows",
            lambda a: dict(a, starts=None, compressed=True), ValueError),
           ("ends", "are int64", lambda a: dict(a, ends=a["ends"].astype(np.int64)), TypeError),
           ("compressed", "is a string", lambda a: dict(a, compressed="yes"), TypeError),
           ("absolute_indices", "is a string", lambda a: dict(a, absolute_indices="no"),
            TypeError)]]
)

PACKAGE_ERRORS = {ValueError: mqa_logits.InvalidArgumentError,
                  TypeError: mqa_logits.InvalidTypeError}

NEEDS_ML_DTYPES = {"are bfloat16 (float32 logits)", "is float32 with bfloat16 weights"}


def case_id(case):
    function, argument, description = case[:3]
    return f"{function}-{argument}-{description}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_errors_name_the_argument_as_the_function_spells_it(rng, case):
    function_name, argument, description, base, mutate, error, prefix = case
    if description in NEEDS_ML_DTYPES and ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed (numpy bfloat16 arrays)")
    function = getattr(mqa_logits, function_name)
    default = mqa_logits.get_num_sms()
    try:
        with pytest.raises(error) as info:
            function(**mutate(base(rng)))
    finally:
        mqa_logits.set_num_sms(default)
    message = str(info.value)
    # The package's classes: the ValueError or TypeError asked for, and a RuntimeError as every
    # refusal of DeepGEMM is.
    assert type(info.value) is PACKAGE_ERRORS[error]
    assert isinstance(info.value, RuntimeError)
    assert leading_argument(message) == argument, message
    assert message.startswith(prefix or f"{argument}: "), message
    assert "expected" in message, message
    assert foreign_names(function, message) == [], message


def test_every_argument_of_every_function_has_a_case():
    """The table above covers each argument of each public function that takes one."""
    covered = {}
    for function_name, argument, *_ in CASES:
        covered.setdefault(function_name, set()).add(argument)
    for name in mqa_logits.__all__:
        function = getattr(mqa_logits, name)
        if (not inspect.isfunction(function)
                or name.startswith(("quantize_", "write_"))):
            continue  # the numpy helpers: tests/python/test_quantize.py; the error classes
        parameters = set(inspect.signature(function).parameters)
        assert covered.get(name, set()) == parameters, name


# The C++ library's words for some of these; none of them may reach a Python caller.
@pytest.mark.parametrize("function_name,argument,mutate,cxx_words", [
    ("fp8_fp4_mqa_logits", "cu_seq_len_k_start",
     lambda a: dict(a, cu_seq_len_k_start=a["cu_seq_len_k_start"][1:]), ["k_start"]),
    ("fp8_mqa_logits", "cu_seq_len_k_end",
     lambda a: dict(a, cu_seq_len_k_end=a["cu_seq_len_k_end"][1:]), ["k_end"]),
    ("fp8_fp4_mqa_logits", "kv", lambda a: dict(a, kv=a["kv"][0]), ["kv_scales"]),
    ("fp8_fp4_mqa_logits", "kv", lambda a: dict(a, kv=huge_keys(a["kv"])), ["seq_len_kv"]),
])
def test_cxx_names_are_translated(rng, function_name, argument, mutate, cxx_words):
    args = mutate(make_prefill(rng, "fp8", 8, 16, 64, 40).api_args())
    with pytest.raises(ValueError) as info:
        getattr(mqa_logits, function_name)(**args)
    message = str(info.value)
    assert leading_argument(message) == argument
    for word in cxx_words:
        assert word not in message.replace("cu_seq_len_" + word, "")


def test_prefill_metadata_messages_use_its_names():
    start = np.zeros(4, np.int32)
    with pytest.raises(ValueError) as info:
        mqa_logits.get_mqa_logits_metadata(start, start[:3], 10, 16)
    assert str(info.value) == ("cu_seq_len_k_end: expected shape [S] (as cu_seq_len_k_start) = "
                               "[4], got [3]")
    with pytest.raises(ValueError) as info:
        mqa_logits.get_mqa_logits_metadata(start, start, -1, 16)
    assert str(info.value) == ("num_kv_tokens: expected 0 <= num_kv_tokens <= 2147483647, "
                               "got -1")


def test_set_num_sms_message_uses_its_name():
    with pytest.raises(ValueError) as info:
        mqa_logits.set_num_sms(-1)
    message = str(info.value)
    assert message.startswith("new_num_sms: expected 0 <= new_num_sms <= "), message
    assert message.endswith(", got -1")


def test_missing_and_wrong_scales_say_how_to_pass_them(rng):
    args = make_prefill(rng, "fp8", 8, 16, 64, 40).api_args()
    with pytest.raises(ValueError) as info:
        mqa_logits.fp8_mqa_logits(**dict(args, kv=args["kv"][0]))
    assert str(info.value) == ("kv: pass (values, scales): expected float32 per-token scales "
                               "(q is FP8), got none")
    with pytest.raises(ValueError) as info:
        mqa_logits.fp8_mqa_logits(**dict(args, kv=(args["kv"][0], args["kv"][1][:-1])))
    assert str(info.value) == "kv: scales (kv[1]): expected shape [T] = [40], got [39]"


@requires_ml_dtypes
def test_dtype_names_are_the_frameworks(rng):
    """The library's own name of e4m3 is float8_e4m3; numpy (ml_dtypes) and torch say fn."""
    args = make_prefill(rng, "fp8", 8, 16, 64, 40).api_args()
    with pytest.raises(ValueError) as info:
        mqa_logits.fp8_fp4_mqa_logits(**dict(args, kv=(args["kv"][0], args["kv"][1].view(
            np.int32))))
    assert "float8_e4m3fn" in str(info.value)


@requires_ml_dtypes
def test_float32_functions_never_mention_logits_dtype(rng):
    args = make_prefill(rng, "fp8", 4, 8, 32, 10, bf16_weights=True).api_args()
    with pytest.raises(TypeError) as info:
        mqa_logits.fp8_mqa_logits(**args)
    assert str(info.value) == ("weights: expected dtype float32 (fp8_mqa_logits returns float32 "
                               "logits), got bfloat16")
    with pytest.raises(ValueError) as info:
        mqa_logits.fp8_fp4_mqa_logits(**args, logits_dtype="float32")
    assert str(info.value) == ("logits_dtype: expected dtype bfloat16 (weights are bfloat16), "
                               "got float32")


@requires_torch
def test_torch_dtype_errors_name_the_argument():
    q = torch.zeros(4, 16, 64, dtype=torch.float16)
    kv = (torch.zeros(8, 64, dtype=torch.uint8), torch.ones(8))
    weights = torch.zeros(4, 16)
    start = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(TypeError, match="^q: expected dtype"):
        mqa_logits.fp8_fp4_mqa_logits(q, kv, weights, start, start)
    with pytest.raises(TypeError, match="^cu_seq_len_k_start: expected dtype"):
        mqa_logits.fp8_fp4_mqa_logits(q.to(torch.float8_e4m3fn), kv, weights, start, start)
    with pytest.raises(ValueError, match=r"^cu_seq_len_k_end: expected shape \[S\]"):
        mqa_logits.fp8_fp4_mqa_logits(q.to(torch.float8_e4m3fn), kv, weights,
                                      start.int(), start.int()[1:])


def test_garbage_never_crashes_the_interpreter():
    """Thousands of malformed calls run in a child process: a crash there, or a message that is
    not in the caller's words, fails this test instead of taking the test run down."""
    script = Path(__file__).with_name("fuzz_calls.py")
    result = subprocess.run([sys.executable, str(script), "--calls", "3000"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "calls:" in result.stdout
