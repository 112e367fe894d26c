"""The package's surface: DeepGEMM's names, argument names, order and defaults; docs and stubs;
the number of SMs; how the extension links."""

import importlib.resources
import inspect
import shutil
import subprocess
import sys

import numpy as np
import pytest

import mqa_logits
from support import torch

REQUIRED = inspect.Parameter.empty
FLOAT32 = torch.float32 if torch is not None else np.float32

# DeepGEMM's indexer API, argument by argument.
SIGNATURES = {
    "fp8_fp4_mqa_logits": [
        ("q", REQUIRED), ("kv", REQUIRED), ("weights", REQUIRED),
        ("cu_seq_len_k_start", REQUIRED), ("cu_seq_len_k_end", REQUIRED),
        ("clean_logits", True), ("max_seqlen_k", 0), ("logits_dtype", FLOAT32),
        ("schedule_meta", None),
    ],
    "fp8_mqa_logits": [
        ("q", REQUIRED), ("kv", REQUIRED), ("weights", REQUIRED),
        ("cu_seq_len_k_start", REQUIRED), ("cu_seq_len_k_end", REQUIRED),
        ("clean_logits", True), ("max_seqlen_k", 0),
    ],
    "get_mqa_logits_metadata": [
        ("cu_seq_len_k_start", REQUIRED), ("cu_seq_len_k_end", REQUIRED),
        ("num_kv_tokens", REQUIRED), ("num_heads", REQUIRED),
    ],
    "get_paged_mqa_logits_metadata": [
        ("context_lens", REQUIRED), ("block_kv", REQUIRED), ("num_sms", REQUIRED),
        ("indices", None),
    ],
    "fp8_fp4_paged_mqa_logits": [
        ("q", REQUIRED), ("kv_cache", REQUIRED), ("weights", REQUIRED),
        ("context_lens", REQUIRED), ("block_table", REQUIRED), ("schedule_meta", REQUIRED),
        ("max_context_len", REQUIRED), ("clean_logits", False), ("logits_dtype", FLOAT32),
        ("indices", None),
    ],
    "fp8_paged_mqa_logits": [
        ("q", REQUIRED), ("kv_cache", REQUIRED), ("weights", REQUIRED),
        ("context_lens", REQUIRED), ("block_table", REQUIRED), ("schedule_meta", REQUIRED),
        ("max_context_len", REQUIRED), ("clean_logits", False), ("indices", None),
    ],
    "get_num_sms": [],
    "set_num_sms": [("new_num_sms", REQUIRED)],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_matches_deep_gemm(name):
    function = getattr(mqa_logits, name)
    parameters = list(inspect.signature(function).parameters.values())
    assert [(p.name, p.default) for p in parameters] == SIGNATURES[name]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_functions_are_exported_and_documented(name):
    assert name in mqa_logits.__all__
    assert len(inspect.getdoc(getattr(mqa_logits, name)) or "") > 40


def test_package_documents_formats_and_version():
    doc = inspect.getdoc(mqa_logits)
    for word in ("FP8", "MXFP8", "MXFP4", "numpy", "CUDA graph"):
        assert word in doc
    assert mqa_logits.__version__.count(".") == 2


def test_typing_files_ship_with_the_package():
    package = importlib.resources.files("mqa_logits")
    assert package.joinpath("py.typed").is_file()
    stub = package.joinpath("_C.pyi").read_text()
    for name in ("def mqa_logits(", "def paged_mqa_logits(", "class DType",
                 "def get_paged_mqa_logits_metadata("):
        assert name in stub


def test_num_sms_round_trips():
    default = mqa_logits.get_num_sms()
    assert default >= 1
    try:
        mqa_logits.set_num_sms(1)
        assert mqa_logits.get_num_sms() == 1
    finally:
        mqa_logits.set_num_sms(default)
    assert mqa_logits.get_num_sms() == default


@pytest.mark.parametrize("bad", [0, -3])
def test_set_num_sms_refuses_non_positive(bad):
    with pytest.raises(ValueError, match="num_sms"):
        mqa_logits.set_num_sms(bad)


def test_set_num_sms_refuses_non_int():
    with pytest.raises(TypeError, match="new_num_sms"):
        mqa_logits.set_num_sms(2.5)


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("readelf") is None,
                    reason="needs Linux and readelf")
def test_extension_links_the_cpp_runtime_dynamically():
    # A C++ runtime linked statically into the extension clashes with torch's once both load.
    dynamic = subprocess.run(["readelf", "-d", mqa_logits._C.__file__], check=True,
                             capture_output=True, text=True).stdout
    assert "libstdc++.so.6" in dynamic or "libc++.so" in dynamic, dynamic
