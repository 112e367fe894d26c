"""Skip markers of the Python tests.

Tests that need torch, ml_dtypes or a GPU skip with a reason (printed by `-rs`, set in
pyproject.toml) instead of disappearing, so a run without them says what it did not cover.
"""

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
requires_gpu = pytest.mark.skipif(GPU_SKIP_REASON is not None, reason=str(GPU_SKIP_REASON))


def skip_unless_supported(fmt, framework, bf16=False):
    """Skip torch cases without torch, and numpy cases whose dtypes only ml_dtypes provides."""
    if framework == "torch" and torch is None:
        pytest.skip(NO_TORCH)
    if framework == "numpy" and ml_dtypes is None and (fmt == "mxfp8" or bf16):
        pytest.skip(NO_ML_DTYPES)
