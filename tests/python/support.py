"""Skip markers of the Python tests.

Tests that need torch, ml_dtypes or a GPU skip with a reason (printed by `-rs`, set in
pyproject.toml) instead of disappearing, so a run without them says what it did not cover.
"""

import os

import pytest

import mqa_logits

try:
    import torch
except ImportError:
    torch = None

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

NO_TORCH = "torch is not installed"
NO_ML_DTYPES = "ml_dtypes is not installed (numpy float8 / bfloat16 arrays)"

requires_torch = pytest.mark.skipif(torch is None, reason=NO_TORCH)
requires_ml_dtypes = pytest.mark.skipif(ml_dtypes is None, reason=NO_ML_DTYPES)


def _gpu_skip_reason():
    if torch is None:
        return NO_TORCH
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    if not mqa_logits.cuda_backend_available():
        return "mqa_logits was built without the CUDA backend, or the GPU is not sm_90"
    return None


GPU_SKIP_REASON = _gpu_skip_reason()
# scripts/gpu-check sets MQA_LOGITS_REQUIRE_GPU=1: there a GPU test that would skip is an error.
if os.environ.get("MQA_LOGITS_REQUIRE_GPU") == "1" and GPU_SKIP_REASON is not None:
    raise RuntimeError(f"MQA_LOGITS_REQUIRE_GPU=1, but GPU tests would skip: {GPU_SKIP_REASON}")
requires_gpu = pytest.mark.skipif(GPU_SKIP_REASON is not None, reason=str(GPU_SKIP_REASON))


def bits(x):
    """A torch tensor's bit pattern on the CPU, so -inf, NaN and signed zeros compare exactly."""
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32).cpu()


def skip_unless_supported(fmt, framework, bf16=False):
    """Skip torch cases without torch, and numpy cases whose dtypes only ml_dtypes provides."""
    if framework == "torch" and torch is None:
        pytest.skip(NO_TORCH)
    if framework == "numpy" and ml_dtypes is None and (fmt == "mxfp8" or bf16):
        pytest.skip(NO_ML_DTYPES)


# ---- errors in the caller's words ---------------------------------------------------------------

# Names an error message could use for an argument: every public function's parameters and the
# C++ API's own argument names (which the package translates). A message may only use the ones
# that are parameters of the function that raised it. `block_kv` is left out: messages use it as
# the name of the cache's dim 1 (the contract's), whatever the function.
ARGUMENT_LIKE_NAMES = frozenset({
    "q", "kv", "weights", "cu_seq_len_k_start", "cu_seq_len_k_end", "clean_logits",
    "max_seqlen_k", "logits_dtype", "schedule_meta", "num_kv_tokens", "num_heads",
    "context_lens", "num_sms", "indices", "kv_cache", "block_table", "max_context_len",
    "new_num_sms",
    # the C++ API's names
    "k_start", "k_end", "seq_len_kv", "seq_len", "num_rows", "q_scales", "kv_scales", "out",
})


def leading_argument(message):
    """The argument a message starts with: "name: expected ..." -> "name"."""
    return message.split(": ", 1)[0]


def foreign_names(function, message):
    """Argument-like names in `message` that are not parameters of `function` (names followed
    by "(" are functions, e.g. get_num_sms())."""
    import inspect
    import re

    parameters = inspect.signature(function).parameters
    words = re.findall(r"(?<![\w.])[A-Za-z_]\w*(?![\w(])", message)
    return sorted({w for w in words if w in ARGUMENT_LIKE_NAMES and w not in parameters})
