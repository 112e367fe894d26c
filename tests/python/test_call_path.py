"""The two paths of a call: the torch fast path (python/src/torch_bindings.cpp) and the general
path (array descriptors, python/mqa_logits/_arrays.py). Plain torch tensors take the fast path
when the package was built against this torch; everything else takes the general path. Both
give the same bits and the same refusals.
"""

import numpy as np
import pytest

import mqa_logits
from mqa_logits import _api
from reference import make_paged, make_prefill
from support import bits, requires_torch, torch

pytestmark = requires_torch

requires_fast_path = pytest.mark.skipif(
    _api._torch_C is None,
    reason="built without the torch fast path (pip install --no-build-isolation . with torch)")


def calls(seed=1):
    """(name, call) of every function, on small CPU tensors drawn from `seed`."""
    rng = np.random.default_rng(seed)
    prefill = make_prefill(rng, "fp8", 20, 16, 64, 90).api_args("torch")
    paged = make_paged(rng, "mxfp4", 3, 2, 16, 64, 32, 200).api_args("torch")
    windows = (prefill["cu_seq_len_k_start"], prefill["cu_seq_len_k_end"])
    meta = mqa_logits.get_paged_mqa_logits_metadata(paged["context_lens"], 32, 4)
    return [
        ("fp8_fp4_mqa_logits", lambda: mqa_logits.fp8_fp4_mqa_logits(
            **prefill, clean_logits=True, logits_dtype=torch.bfloat16)),
        ("fp8_mqa_logits", lambda: mqa_logits.fp8_mqa_logits(**prefill, max_seqlen_k=96)),
        ("get_mqa_logits_metadata", lambda: mqa_logits.get_mqa_logits_metadata(*windows, 90, 16)),
        ("get_paged_mqa_logits_metadata", lambda: mqa_logits.get_paged_mqa_logits_metadata(
            paged["context_lens"], 32, 4)),
        ("fp8_fp4_paged_mqa_logits", lambda: mqa_logits.fp8_fp4_paged_mqa_logits(
            **paged, schedule_meta=meta, clean_logits=True)),
    ]


@requires_fast_path
def test_plain_torch_tensors_take_the_fast_path(monkeypatch):
    def general(*args, **kwargs):
        raise AssertionError("a call of plain torch tensors took the general path")

    expected = {name: call() for name, call in calls()}
    monkeypatch.setattr(_api, "prefill_operands", general)
    monkeypatch.setattr(_api, "paged_operands", general)
    monkeypatch.setattr(_api, "describe", general)
    for name, call in calls():
        assert torch.equal(bits(call()), bits(expected[name])), name


@requires_fast_path
def test_both_paths_give_the_same_bits(monkeypatch):
    fast = {name: call() for name, call in calls()}
    monkeypatch.setattr(_api, "_torch_C", None)
    for name, call in calls():
        result = call()
        assert result.shape == fast[name].shape and result.stride() == fast[name].stride()
        assert torch.equal(bits(result), bits(fast[name])), name


def refusals(seed=2):
    """Calls of inputs of the right types that the library refuses."""
    rng = np.random.default_rng(seed)
    prefill = make_prefill(rng, "fp8", 20, 16, 64, 90).api_args("torch")
    short_end = dict(prefill, cu_seq_len_k_end=prefill["cu_seq_len_k_end"][:5])
    paged = make_paged(rng, "fp8", 3, 2, 16, 64, 32, 200).api_args("torch")
    meta = mqa_logits.get_paged_mqa_logits_metadata(paged["context_lens"], 32, 4)
    return [
        lambda: mqa_logits.fp8_mqa_logits(**short_end),
        lambda: mqa_logits.fp8_fp4_mqa_logits(**prefill, max_seqlen_k=-1),
        lambda: mqa_logits.get_paged_mqa_logits_metadata(paged["context_lens"], 48, 4),
        lambda: mqa_logits.fp8_paged_mqa_logits(**dict(paged, max_context_len=-3),
                                                schedule_meta=meta),
        lambda: mqa_logits.fp8_paged_mqa_logits(**dict(paged, weights=paged["weights"][1:]),
                                                schedule_meta=meta),
    ]


def messages():
    result = []
    for call in refusals():
        with pytest.raises(ValueError) as error:
            call()
        result.append(str(error.value))
    return result


@requires_fast_path
def test_both_paths_word_refusals_alike(monkeypatch):
    fast = messages()
    monkeypatch.setattr(_api, "_torch_C", None)
    assert messages() == fast


class _Subclass(torch.Tensor if torch is not None else object):
    pass


@requires_fast_path
def test_what_the_fast_path_leaves_to_the_general_path(rng):
    """A tensor subclass, a numpy array, a refused dtype or a non-bool flag: the fast path returns
    None and the general path takes the call (and words the refusal of a type)."""
    args = make_prefill(rng, "fp8", 20, 16, 64, 90).api_args("torch")
    fp32 = mqa_logits._C.DType.float32
    ordered = [args[k] for k in ("q", "kv", "weights", "cu_seq_len_k_start", "cu_seq_len_k_end")]

    def fast(**changes):
        q, kv, weights, start, end = [changes.get(k, v) for k, v in zip(
            ("q", "kv", "weights", "start", "end"), ordered)]
        return _api._torch_C.mqa_logits(q, kv, weights, start, end, changes.get("clean", True),
                                        0, fp32, None, False)

    assert fast() is not None
    assert fast(weights=args["weights"].as_subclass(_Subclass)) is None
    assert fast(start=args["cu_seq_len_k_start"].numpy()) is None
    assert fast(weights=args["weights"].double()) is None
    assert fast(clean=1) is None
    subclass = args["weights"].as_subclass(_Subclass)
    subclass_result = mqa_logits.fp8_mqa_logits(**dict(args, weights=subclass))
    assert torch.equal(bits(subclass_result), bits(mqa_logits.fp8_mqa_logits(**args)))
    with pytest.raises(TypeError, match=r"^weights: expected dtype float32 \(fp8_mqa_logits"):
        mqa_logits.fp8_mqa_logits(**dict(args, weights=args["weights"].double()))
