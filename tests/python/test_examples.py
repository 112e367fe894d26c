"""The examples run and check themselves (they compare rows with a float64 formula)."""

import os
import subprocess
import sys
from pathlib import Path

from support import requires_gpu, requires_torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(*arguments):
    script = EXAMPLES / "deepseek_v32_indexer.py"
    result = subprocess.run([sys.executable, str(script), *arguments], capture_output=True,
                            text=True, timeout=900, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "prefill:" in result.stdout and "decode:" in result.stdout
    return result.stdout


@requires_torch
def test_deepseek_example_on_the_cpu_backend():
    run_example("--device", "cpu", "--small")


@requires_gpu
def test_deepseek_example_on_the_gpu():
    run_example("--device", "cuda")
