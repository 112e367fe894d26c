"""The package's surface: DeepGEMM's names, argument names, order and defaults; docs and stubs;
the number of SMs; how the extension links."""

import doctest
import importlib.resources
import inspect
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import mqa_logits
from support import ml_dtypes, torch

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


# The package's own functions (not DeepGEMM's): numpy helpers and the backend query.
OWN_SIGNATURES = {
    "quantize_fp8": [("x", REQUIRED)],
    "quantize_mxfp8": [("x", REQUIRED)],
    "quantize_mxfp4": [("x", REQUIRED)],
    "write_paged_kv_cache": [("kv_cache", REQUIRED), ("kv", REQUIRED),
                             ("block_table_row", REQUIRED), ("start", 0)],
    "cuda_backend_available": [],
    "topk_per_row": [("logits", REQUIRED), ("starts", REQUIRED), ("ends", REQUIRED),
                     ("topk", REQUIRED), ("compressed", False), ("absolute_indices", False),
                     ("return_values", False)],
    "merge_topk": [("candidate_values", REQUIRED), ("candidate_indices", REQUIRED),
                   ("topk", REQUIRED), ("return_values", False)],
    "mqa_topk": [("q", REQUIRED), ("kv", REQUIRED), ("weights", REQUIRED),
                 ("cu_seq_len_k_start", REQUIRED), ("cu_seq_len_k_end", REQUIRED),
                 ("topk", REQUIRED), ("absolute_indices", False), ("return_values", False),
                 ("schedule_meta", None), ("logits_dtype", None)],
    "paged_mqa_topk": [("q", REQUIRED), ("kv_cache", REQUIRED), ("weights", REQUIRED),
                       ("context_lens", REQUIRED), ("block_table", REQUIRED),
                       ("schedule_meta", REQUIRED), ("max_context_len", REQUIRED),
                       ("topk", REQUIRED), ("cache_slots", False), ("return_values", False),
                       ("indices", None), ("logits_dtype", None)],
}
PUBLIC_FUNCTIONS = sorted({**SIGNATURES, **OWN_SIGNATURES})


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_matches_deep_gemm(name):
    function = getattr(mqa_logits, name)
    parameters = list(inspect.signature(function).parameters.values())
    assert [(p.name, p.default) for p in parameters] == SIGNATURES[name]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters)


@pytest.mark.parametrize("name", sorted(OWN_SIGNATURES))
def test_own_function_signatures(name):
    parameters = inspect.signature(getattr(mqa_logits, name)).parameters.values()
    assert [(p.name, p.default) for p in parameters] == OWN_SIGNATURES[name]


def test_every_public_function_is_listed_here():
    functions = {name for name in mqa_logits.__all__
                 if inspect.isfunction(getattr(mqa_logits, name))}
    assert functions == set(PUBLIC_FUNCTIONS)


def test_refusals_are_runtime_errors_as_deep_gemm_raises():
    """The package's error classes: ValueError / TypeError for Python code, RuntimeError for
    code written against DeepGEMM, whose every refusal is one."""
    assert {"InvalidArgumentError", "InvalidTypeError"} <= set(mqa_logits.__all__)
    assert issubclass(mqa_logits.InvalidArgumentError, ValueError)
    assert issubclass(mqa_logits.InvalidArgumentError, RuntimeError)
    assert issubclass(mqa_logits.InvalidTypeError, TypeError)
    assert issubclass(mqa_logits.InvalidTypeError, RuntimeError)
    with pytest.raises(RuntimeError, match="^new_num_sms: "):
        mqa_logits.set_num_sms(-1)
    with pytest.raises(RuntimeError, match="^new_num_sms: "):
        mqa_logits.set_num_sms("2")


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_functions_are_exported_and_documented(name):
    assert name in mqa_logits.__all__
    assert len(inspect.getdoc(getattr(mqa_logits, name)) or "") > 40


def docstring_sections(doc):
    """{section title: text} of a Google-style docstring, and {argument: its Args entry}."""
    sections, arguments = {}, {}
    title = current = None
    for line in doc.splitlines():
        heading = re.fullmatch(r"([A-Z][a-z]+):", line)
        if heading:
            title, current = heading.group(1), None
            sections[title] = ""
            continue
        if title is None:
            continue
        sections[title] += line + "\n"
        entry = re.match(r"^    (\w+): (.*)", line)
        if title == "Args" and entry:
            current = entry.group(1)
            arguments[current] = entry.group(2)
        elif title == "Args" and current and line.startswith("        "):
            arguments[current] += " " + line.strip()
    return sections, arguments


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_help_is_complete_on_its_own(name):
    """help(function) documents every argument (shape, dtype or range, default), the return
    value, the errors and an example, without sending the reader elsewhere."""
    function = getattr(mqa_logits, name)
    doc = inspect.getdoc(function)
    sections, arguments = docstring_sections(doc)
    for title in ("Returns", "Raises", "Example"):
        assert sections.get(title, "").strip(), f"{name}: no {title} section"
    assert ">>> " in sections["Example"]
    parameters = inspect.signature(function).parameters.values()
    assert set(arguments) == {p.name for p in parameters}, f"{name}: Args vs signature"
    for parameter in parameters:
        entry = arguments[parameter.name]
        assert len(entry) > 20, f"{name}: {parameter.name} is barely documented"
        if parameter.default is not inspect.Parameter.empty:
            default = (str(parameter.default) if parameter.name != "logits_dtype"
                       or parameter.default is None else "float32")
            assert re.search(rf"Default (``)?[\w.]*{re.escape(default)}", entry), \
                f"{name}: the default of {parameter.name} is not documented"
    for error in re.findall(r"^    (\w+Error):", sections["Raises"], flags=re.M):
        assert error in ("TypeError", "ValueError", "ImportError"), error


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_docstring_mentions_every_parameter(name):
    function = getattr(mqa_logits, name)
    doc = function.__doc__
    for parameter in inspect.signature(function).parameters:
        assert re.search(rf"(?<![\w]){parameter}(?![\w])", doc), f"{name}: {parameter}"


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_docstring_examples_run(name):
    if name == "quantize_mxfp8" and ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed (numpy float8 arrays)")
    function = getattr(mqa_logits, name)
    default = mqa_logits.get_num_sms()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    try:
        for test in doctest.DocTestFinder().find(function, name, globs={}):
            runner.run(test)
    finally:
        mqa_logits.set_num_sms(default)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0


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


def test_set_num_sms_zero_goes_back_to_the_default():
    default = mqa_logits.get_num_sms()
    try:
        mqa_logits.set_num_sms(1)
        mqa_logits.set_num_sms(0)
        assert mqa_logits.get_num_sms() == default
    finally:
        mqa_logits.set_num_sms(0)


@pytest.mark.parametrize("bad", [-1, -3])
def test_set_num_sms_refuses_negative(bad):
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
