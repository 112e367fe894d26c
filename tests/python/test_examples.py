"""The examples run and check themselves (they compare logits with a float64 formula)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import ml_dtypes, NO_ML_DTYPES, requires_gpu, requires_torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name, *arguments):
    script = EXAMPLES / name
    result = subprocess.run([sys.executable, str(script), *arguments], capture_output=True,
                            text=True, timeout=900, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "prefill:" in result.stdout and "decode:" in result.stdout
    return result.stdout


@requires_torch
def test_deepseek_example_on_the_cpu_backend():
    run_example("deepseek_v32_indexer.py", "--device", "cpu", "--small")


@requires_gpu
def test_deepseek_example_on_the_gpu():
    run_example("deepseek_v32_indexer.py", "--device", "cuda")


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "mxfp4"])
def test_numpy_example(fmt):
    """numpy only: no torch, no GPU (MXFP8 values need ml_dtypes' float8)."""
    if fmt == "mxfp8" and ml_dtypes is None:
        pytest.skip(NO_ML_DTYPES)
    stdout = run_example("numpy_indexer.py", "--format", fmt)
    assert f"prefill: {fmt}," in stdout and f"decode: {fmt}," in stdout
