"""GPU results against the float64 formula and the CPU backend on the same inputs; bitwise
stability (repeated calls, schedule metadata); torch's current stream and CUDA-graph capture.

Skipped, with the reason printed, without torch, a CUDA GPU or the CUDA backend.
"""

import time

import numpy as np
import pytest

import mqa_logits
from reference import (FORMATS, as_numpy, check_logits, make_paged, make_prefill, spec_diff,
                       tolerance)
from support import bits, requires_gpu, torch

pytestmark = requires_gpu

# Formats with CUDA kernels; the others are refused on the GPU (tested below).
GPU_FORMATS = ["fp8"]


def assert_bitwise_equal(a, b):
    assert torch.equal(bits(a), bits(b))


def on_poison(call, like):
    """call(), its output allocated where a block of 0xFF bytes (NaN in fp32 and bf16) was just
    freed. torch's caching allocator returns a freed block to the next request of its size on the
    same stream (its free list is as it was before the block was taken), so an element the kernels
    leave unwritten reads NaN; like is an earlier output of the same call, for the size. call must
    allocate nothing on the device before its output (schedule metadata is computed first)."""
    block = torch.full((like.untyped_storage().nbytes(),), 0xFF, dtype=torch.uint8,
                       device=like.device)
    address = block.data_ptr()
    del block
    output = call()
    assert output.data_ptr() == address, "the output was not allocated on the poisoned block"
    return output


def compare_gpu_with_cpu(gpu, cpu, case, clean, bf16):
    """GPU within the contract's tolerance of the oracle and of the CPU backend, same -inf
    pattern."""
    mask = case.mask()
    gpu_values, cpu_values = as_numpy(gpu), as_numpy(cpu)
    check_logits(gpu_values, case.expected(), mask, clean=clean, bf16=bf16, elementwise=False)
    assert spec_diff(gpu_values[mask], cpu_values[mask]) < tolerance(bf16)
    if clean:
        assert np.array_equal(np.isneginf(gpu_values), np.isneginf(cpu_values))


def prefill_on(case, device, **options):
    return mqa_logits.fp8_fp4_mqa_logits(**case.api_args("torch", device), **options)


@pytest.mark.parametrize("fmt", GPU_FORMATS)
@pytest.mark.parametrize("num_heads,head_dim", [(8, 32), (16, 64), (32, 128), (64, 128)])
@pytest.mark.parametrize("logits_dtype", ["float32", "bfloat16"])
def test_prefill_gpu_matches_cpu(rng, fmt, num_heads, head_dim, logits_dtype):
    case = make_prefill(rng, fmt, 190, num_heads, head_dim, 1031)
    gpu = prefill_on(case, "cuda", logits_dtype=logits_dtype)
    assert gpu.is_cuda and gpu.shape == (190, 1031)
    cpu = prefill_on(case, "cpu", logits_dtype=logits_dtype)
    compare_gpu_with_cpu(gpu, cpu, case, clean=True, bf16=logits_dtype == "bfloat16")
    args = case.api_args("torch", "cuda")
    for _ in range(3):
        again = on_poison(lambda: mqa_logits.fp8_fp4_mqa_logits(**args, logits_dtype=logits_dtype),
                          gpu)
        assert_bitwise_equal(again, gpu)


@pytest.mark.parametrize("fmt", GPU_FORMATS)
def test_prefill_schedule_metadata_and_compressed_output(rng, fmt):
    seq_len, seq_len_kv, width = 257, 2000, 512
    start = rng.integers(0, seq_len_kv, size=seq_len).astype(np.int32)
    end = np.minimum(start + rng.integers(0, 700, size=seq_len), seq_len_kv).astype(np.int32)
    case = make_prefill(rng, fmt, seq_len, 64, 128, seq_len_kv, windows=(start, end))
    args = case.api_args("torch", "cuda")
    meta = mqa_logits.get_mqa_logits_metadata(args["cu_seq_len_k_start"],
                                              args["cu_seq_len_k_end"], case.seq_len_kv, 64)
    assert meta.is_cuda and meta.shape == (mqa_logits.get_num_sms() + 1, 2)
    plain = mqa_logits.fp8_fp4_mqa_logits(**args)
    with_meta = on_poison(lambda: mqa_logits.fp8_fp4_mqa_logits(**args, schedule_meta=meta), plain)
    assert_bitwise_equal(with_meta, plain)

    # Windows of up to 700 keys: the GPU drops the columns past the width (the CPU backend
    # refuses such a width), so each row is compared with the CPU's full row from its start.
    compressed = mqa_logits.fp8_fp4_mqa_logits(**args, clean_logits=False, max_seqlen_k=width)
    full = as_numpy(mqa_logits.fp8_fp4_mqa_logits(**case.api_args("torch", "cpu")))
    mask = np.arange(width)[None, :] < np.minimum(end - start, width)[:, None]
    cpu_values = np.zeros((seq_len, width), np.float32)
    for row in range(seq_len):
        count = int(mask[row].sum())
        cpu_values[row, :count] = full[row, start[row]:start[row] + count]
    assert spec_diff(as_numpy(compressed)[mask], cpu_values[mask]) < tolerance(False)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f not in GPU_FORMATS])
def test_formats_without_cuda_kernels_are_refused_on_the_gpu(rng, fmt):
    case = make_prefill(rng, fmt, 8, 64, 128, 64)
    with pytest.raises(ValueError, match="q"):
        prefill_on(case, "cuda")


@pytest.mark.parametrize("logits_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("seq_len,seq_len_kv,max_seqlen_k", [
    (0, 300, 0), (70, 0, 0), (0, 0, 0), (70, 0, 16)])
def test_empty_prefill_on_the_gpu(rng, logits_dtype, seq_len, seq_len_kv, max_seqlen_k):
    """Empty outputs keep 16-byte aligned rows: the validation of device outputs accepts them."""
    case = make_prefill(rng, "fp8", seq_len, 64, 128, seq_len_kv)
    logits = prefill_on(case, "cuda", logits_dtype=logits_dtype, max_seqlen_k=max_seqlen_k)
    assert logits.is_cuda and logits.shape == (seq_len, max_seqlen_k or seq_len_kv)
    assert bool(torch.isneginf(logits).all())


@pytest.mark.parametrize("logits_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch,max_context_len", [(0, 500), (3, 0), (0, 0)])
def test_empty_decode_on_the_gpu(rng, logits_dtype, batch, max_context_len):
    case = make_paged(rng, "fp8", batch=batch, next_n=2, num_heads=64, head_dim=128,
                      block_kv=64, max_context_len=max_context_len)
    logits = paged_on(case, "cuda", clean_logits=True, logits_dtype=logits_dtype)
    assert logits.is_cuda and logits.shape == (2 * batch, max_context_len)


def test_decode_rows_without_context_on_the_gpu(rng):
    case = make_paged(rng, "fp8", batch=4, next_n=2, num_heads=64, head_dim=128, block_kv=64,
                      max_context_len=700)
    case.context_lens[1, :] = 0
    case.context_lens[2, 0] = 0
    gpu = paged_on(case, "cuda", clean_logits=True)
    cpu = paged_on(case, "cpu", clean_logits=True)
    compare_gpu_with_cpu(gpu, cpu, case, clean=True, bf16=False)


def paged_args(case, device):
    """The call's arguments and its schedule metadata."""
    args = case.api_args("torch", device)
    meta = mqa_logits.get_paged_mqa_logits_metadata(args["context_lens"], case.block_kv,
                                                    mqa_logits.get_num_sms(), args["indices"])
    return dict(args, schedule_meta=meta)


def paged_on(case, device, **options):
    return mqa_logits.fp8_fp4_paged_mqa_logits(**paged_args(case, device), **options)


@pytest.mark.parametrize("fmt", GPU_FORMATS)
@pytest.mark.parametrize("next_n", [1, 2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("block_kv", [32, 64])
def test_paged_gpu_matches_cpu(rng, fmt, next_n, block_kv):
    case = make_paged(rng, fmt, batch=9, next_n=next_n, num_heads=64, head_dim=128,
                      block_kv=block_kv, max_context_len=3000, padded_blocks=block_kv == 32)
    gpu = paged_on(case, "cuda", clean_logits=True)
    cpu = paged_on(case, "cpu", clean_logits=True)
    compare_gpu_with_cpu(gpu, cpu, case, clean=True, bf16=False)
    args = paged_args(case, "cuda")
    for _ in range(3):
        again = on_poison(lambda: mqa_logits.fp8_fp4_paged_mqa_logits(**args, clean_logits=True),
                          gpu)
        assert_bitwise_equal(again, gpu)


@pytest.mark.parametrize("lens_2d", [True, False])
def test_paged_varlen_and_context_forms(rng, lens_2d):
    case = make_paged(rng, "fp8", batch=12, next_n=1, num_heads=64, head_dim=128, block_kv=64,
                      max_context_len=2500, lens_2d=lens_2d, varlen=lens_2d)
    gpu = paged_on(case, "cuda", clean_logits=True, logits_dtype="bfloat16")
    cpu = paged_on(case, "cpu", clean_logits=True, logits_dtype="bfloat16")
    compare_gpu_with_cpu(gpu, cpu, case, clean=True, bf16=True)


def test_inputs_on_two_devices_are_refused(rng):
    case = make_prefill(rng, "fp8", 8, 16, 64, 40)
    args = case.api_args("torch", "cuda")
    args["kv"] = tuple(t.cpu() for t in args["kv"])
    with pytest.raises(ValueError, match="kv"):
        mqa_logits.fp8_fp4_mqa_logits(**args)


def test_work_runs_on_the_current_stream(rng):
    case = make_paged(rng, "fp8", 6, 2, 64, 128, 64, 4000)
    expected = paged_on(case, "cuda", clean_logits=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        args = case.api_args("torch", "cuda")
        # q holds poison until a long kernel ends: work queued on any other stream reads it.
        q = torch.empty_like(args["q"])
        q.view(torch.uint8).fill_(0x38)
        torch.cuda._sleep(50_000_000)
        q.copy_(args["q"])
        args["q"] = q
        meta = mqa_logits.get_paged_mqa_logits_metadata(args["context_lens"], 64,
                                                        mqa_logits.get_num_sms())
        result = mqa_logits.fp8_fp4_paged_mqa_logits(schedule_meta=meta, clean_logits=True,
                                                     **args)
    side.synchronize()
    assert_bitwise_equal(result, expected)


def capture(step):
    """A CUDA graph of step() (run once on a side stream first, as torch requires) and its output."""
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        step()
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    return graph, captured


def test_cuda_graph_capture_and_replay(rng):
    """Metadata and logits captured in one graph follow in-place updates of the inputs."""
    first = make_paged(rng, "fp8", 8, 2, 64, 128, 64, 2000)
    second = make_paged(rng, "fp8", 8, 2, 64, 128, 64, 2000)
    static = first.api_args("torch", "cuda")

    def step():
        meta = mqa_logits.get_paged_mqa_logits_metadata(static["context_lens"], 64,
                                                        mqa_logits.get_num_sms())
        return mqa_logits.fp8_fp4_paged_mqa_logits(schedule_meta=meta, clean_logits=True,
                                                   **static)

    graph, captured = capture(step)

    for case in (first, second):
        fresh = case.api_args("torch", "cuda")
        for name in ("q", "kv_cache", "weights", "context_lens", "block_table"):
            static[name].copy_(fresh[name])
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(captured, paged_on(case, "cuda", clean_logits=True))


def test_prefill_cuda_graph_capture(rng):
    case = make_prefill(rng, "fp8", 300, 64, 128, 1500)
    static = case.api_args("torch", "cuda")

    def step():
        meta = mqa_logits.get_mqa_logits_metadata(static["cu_seq_len_k_start"],
                                                  static["cu_seq_len_k_end"], 1500, 64)
        return mqa_logits.fp8_fp4_mqa_logits(schedule_meta=meta, **static)

    expected = step()
    graph, captured = capture(step)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(captured, expected)


def test_host_time_per_call_stays_bounded(rng):
    """A generous bound (bench/python/host_cost.py measures against the real bars), so that a
    regression of the call path shows up: 400 tiny calls, one synchronize at the end."""
    bound_us, calls = 50.0, 400
    case = make_prefill(rng, "fp8", 64, 64, 128, 256)
    args = case.api_args("torch", "cuda")
    for _ in range(50):
        mqa_logits.fp8_mqa_logits(**args, clean_logits=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        mqa_logits.fp8_mqa_logits(**args, clean_logits=False)
    per_call_us = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    assert per_call_us < bound_us


def test_documented_results_of_inputs_the_gpu_does_not_check(rng):
    """Out-of-range block ids give -inf keys, lengths are clamped to [0, what the
    table addresses and max_context_len], a negative key scale multiplies its key's head sum
    (docs/contract.md); the CPU backend refuses them all (test_paged.py)."""
    from test_paged import out_of_range_inputs
    for case, argument in out_of_range_inputs(rng):
        logits = paged_on(case, "cuda", clean_logits=True)
        expected = case.expected()
        if argument == "kv_cache":  # the scale -0.5 of key 0 of the first sequence's rows
            expected[:case.next_n, 0] *= -1
        check_logits(as_numpy(logits), expected, case.mask(), clean=True, bf16=False,
                     elementwise=False)


CHECKING_MODE_SCRIPT = """
import numpy as np, mqa_logits
from test_paged import out_of_range_inputs
from test_gpu import paged_on
for case, argument in out_of_range_inputs(np.random.default_rng(5)):
    try:
        paged_on(case, "cuda", clean_logits=True)
        print("accepted")
    except ValueError as error:
        print(str(error).split(":")[0])
"""


def test_checking_mode_refuses_them_on_the_gpu(rng):
    """MQA_LOGITS_CHECK_INPUTS=1: the same refusals as the CPU backend, on the GPU."""
    import os
    import subprocess
    import sys
    from test_paged import out_of_range_inputs
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, MQA_LOGITS_CHECK_INPUTS="1", PYTHONPATH=here)
    result = subprocess.run([sys.executable, "-c", CHECKING_MODE_SCRIPT], env=env, cwd=here,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    expected = [argument for _, argument in out_of_range_inputs(np.random.default_rng(5))]
    assert result.stdout.split() == expected
