"""torch.compile and the torch custom ops (python/mqa_logits/_torch_ops.py).

Each op passes torch.library.opcheck (schema, fake-tensor implementation against the real one,
dynamic shapes), and a model that calls the public functions compiles with fullgraph=True and
gives the eager result bit for bit: on the CPU with the aot_eager backend (no code generation),
on the GPU with inductor, also with its CUDA graphs (mode="reduce-overhead").
"""

import pytest

import mqa_logits
from reference import make_paged, make_prefill
from support import GPU_SKIP_REASON, bits, requires_torch, torch

pytestmark = requires_torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    GPU_SKIP_REASON is not None, reason=str(GPU_SKIP_REASON)))]


# opcheck's test_schema compares inputs before and after the call with arithmetic that torch
# does not implement for float8 tensors; the ops' schemas (no input mutated, nothing aliased) are
# checked by the rest: the fake implementations against the real outputs and AOT dispatch.
OPCHECK_TESTS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def opcheck(op, args):
    torch.library.opcheck(op, args, test_utils=OPCHECK_TESTS)


def assert_same(a, b):
    assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
    assert torch.equal(bits(a), bits(b))


def prefill_case(rng, device):
    case = make_prefill(rng, "fp8", 70, 64, 128, 300)
    return case.api_args("torch", device)


def paged_case(rng, device):
    case = make_paged(rng, "fp8", 3, 2, 64, 128, 64, 500)
    args = case.api_args("torch", device)
    args["schedule_meta"] = mqa_logits.get_paged_mqa_logits_metadata(
        args["context_lens"], 64, mqa_logits.get_num_sms())
    return args


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_ops_pass_opcheck(rng, device):
    args = prefill_case(rng, device)
    (q, q_scales), (kv, kv_scales) = (args["q"], None), args["kv"]
    windows = (args["cu_seq_len_k_start"], args["cu_seq_len_k_end"])
    meta = torch.ops.mqa_logits.get_mqa_logits_metadata(*windows, kv.shape[0], 64)
    opcheck(torch.ops.mqa_logits.get_mqa_logits_metadata.default,
                          (*windows, kv.shape[0], 64))
    # clean_logits: outputs are compared whole, and without it the masked elements are undefined.
    for width, dtype, schedule in ((0, torch.float32, None), (0, torch.bfloat16, meta),
                                   (300, torch.float32, meta)):
        opcheck(torch.ops.mqa_logits.fp8_fp4_mqa_logits.default,
                              (q, q_scales, kv, kv_scales, args["weights"], *windows, True, width,
                      dtype, schedule))
    opcheck(torch.ops.mqa_logits.fp8_mqa_logits.default,
                          (q, q_scales, kv, kv_scales, args["weights"], *windows, True, 0))


@pytest.mark.parametrize("device", DEVICES)
def test_decode_ops_pass_opcheck(rng, device):
    args = paged_case(rng, device)
    lens = args["context_lens"]
    opcheck(torch.ops.mqa_logits.get_paged_mqa_logits_metadata.default,
                          (lens, 64, mqa_logits.get_num_sms(), None))
    common = (args["q"], None, args["kv_cache"], args["weights"], lens, args["block_table"],
              args["schedule_meta"], args["max_context_len"])
    opcheck(torch.ops.mqa_logits.fp8_fp4_paged_mqa_logits.default,
                          (*common, True, torch.bfloat16, None))
    opcheck(torch.ops.mqa_logits.fp8_paged_mqa_logits.default, (*common, True, None))


def indexer_step(q, kv, weights, start, end, paged):
    """What an engine's indexer does in one compiled forward: metadata, logits, top-k."""
    meta = mqa_logits.get_mqa_logits_metadata(start, end, kv[0].shape[0], q.shape[1])
    logits = mqa_logits.fp8_fp4_mqa_logits(q, kv, weights, start, end, clean_logits=False,
                                           logits_dtype=torch.bfloat16, schedule_meta=meta)
    columns = torch.arange(logits.shape[1], device=logits.device)
    masked = logits.float().masked_fill((columns < start[:, None]) | (columns >= end[:, None]),
                                        float("-inf"))
    fp8 = mqa_logits.fp8_mqa_logits(q, kv, weights, start, end)
    paged_meta = mqa_logits.get_paged_mqa_logits_metadata(paged["context_lens"], 64,
                                                          mqa_logits.get_num_sms())
    decode = mqa_logits.fp8_paged_mqa_logits(
        paged["q"], paged["kv_cache"], paged["weights"], paged["context_lens"],
        paged["block_table"], paged_meta, paged["max_context_len"], clean_logits=True)
    return masked.topk(8, dim=-1).indices, masked, fp8, decode


def compile_and_compare(rng, device, **compile_options):
    args = prefill_case(rng, device)
    paged = paged_case(rng, device)
    inputs = (args["q"], args["kv"], args["weights"], args["cu_seq_len_k_start"],
              args["cu_seq_len_k_end"], paged)
    eager = indexer_step(*inputs)
    compiled = torch.compile(indexer_step, fullgraph=True, **compile_options)
    for _ in range(3):  # reduce-overhead records its graph on the first calls, then replays
        for got, expected in zip(compiled(*inputs), eager):
            assert_same(got, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_fullgraph_compile_matches_eager(rng, device):
    compile_and_compare(rng, device, backend="aot_eager")


@pytest.mark.skipif(GPU_SKIP_REASON is not None, reason=str(GPU_SKIP_REASON))
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_inductor_compile_matches_eager_on_the_gpu(rng, mode):
    torch._dynamo.reset()
    compile_and_compare(rng, "cuda", mode=mode)


def test_eager_calls_do_not_dispatch_through_the_ops(rng, monkeypatch):
    """The ops are for tracing only: their dispatch would cost more than a whole eager call."""
    from mqa_logits import _torch_ops

    def refuse(*args, **kwargs):
        raise AssertionError("an eager call went through a custom op")

    for name in ("fp8_fp4_mqa_logits", "fp8_mqa_logits", "get_mqa_logits_metadata"):
        monkeypatch.setattr(_torch_ops, name, refuse)
    args = prefill_case(rng, "cpu")
    mqa_logits.get_mqa_logits_metadata(args["cu_seq_len_k_start"], args["cu_seq_len_k_end"],
                                       300, 64)
    assert mqa_logits.fp8_mqa_logits(**args).shape == (70, 300)
