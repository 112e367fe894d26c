"""Host time per call of the Python functions on torch CUDA tensors.

Engines run prefill eagerly (61 layers a forward pass), so the host's time per call adds up
whatever the kernels take. Each figure is a loop of CALLS calls on a tiny problem with one
synchronize at the end: the loop's time before that synchronize, per call, is the host's time
(the kernels queue up behind it); the time with the synchronize is printed beside it.

    python3 bench/python/host_cost.py [--json FILE]

Exits 1 when a call is over its bar (15 us per logits call, 10 us per metadata call).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import mqa_logits

CALLS = 400
WARMUP_CALLS = 50
LOGITS_BAR_US = 15.0
METADATA_BAR_US = 10.0

# Tiny problems: the kernels take a few microseconds, so the loop measures the host.
S, T, H, D = 64, 256, 64, 128
BATCH, CONTEXT, BLOCK_KV = 4, 256, 64


def fp8(*shape):
    return torch.randn(*shape, device="cuda").to(torch.float8_e4m3fn)


def prefill_inputs():
    q = fp8(S, H, D)
    kv = (fp8(T, D), torch.rand(T, device="cuda") + 0.5)
    weights = torch.randn(S, H, device="cuda")
    end = torch.arange(T - S + 1, T + 1, dtype=torch.int32, device="cuda")
    start = torch.zeros(S, dtype=torch.int32, device="cuda")
    return q, kv, weights, start, end


def decode_inputs():
    blocks_per_sequence = CONTEXT // BLOCK_KV
    num_blocks = BATCH * blocks_per_sequence
    values = fp8(num_blocks, BLOCK_KV * D).view(torch.uint8)
    scales = (torch.rand(num_blocks, BLOCK_KV, device="cuda") + 0.5).view(torch.uint8)
    cache = torch.cat([values, scales], dim=1).view(num_blocks, BLOCK_KV, 1, D + 4)
    table = torch.randperm(num_blocks, device="cuda").to(torch.int32)
    table = table.view(BATCH, blocks_per_sequence)
    lens = torch.full((BATCH,), CONTEXT, dtype=torch.int32, device="cuda")
    q = fp8(BATCH, 1, H, D)
    weights = torch.randn(BATCH, H, device="cuda")
    return q, cache, weights, lens, table


def host_cost(call):
    """(host us per call, us per call with the final synchronize)."""
    for _ in range(WARMUP_CALLS):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    issued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    return (issued - start) / CALLS * 1e6, (done - start) / CALLS * 1e6


def measure():
    q, kv, weights, start, end = prefill_inputs()
    dq, cache, dweights, lens, table = decode_inputs()
    num_sms = mqa_logits.get_num_sms()
    meta = mqa_logits.get_paged_mqa_logits_metadata(lens, BLOCK_KV, num_sms)
    calls = [
        ("prefill, clean", LOGITS_BAR_US,
         lambda: mqa_logits.fp8_mqa_logits(q, kv, weights, start, end, clean_logits=True)),
        ("prefill, no clean", LOGITS_BAR_US,
         lambda: mqa_logits.fp8_mqa_logits(q, kv, weights, start, end, clean_logits=False)),
        ("paged decode", LOGITS_BAR_US,
         lambda: mqa_logits.fp8_paged_mqa_logits(dq, cache, dweights, lens, table, meta,
                                                 CONTEXT, clean_logits=False)),
        ("decode metadata", METADATA_BAR_US,
         lambda: mqa_logits.get_paged_mqa_logits_metadata(lens, BLOCK_KV, num_sms)),
        ("prefill metadata", METADATA_BAR_US,
         lambda: mqa_logits.get_mqa_logits_metadata(start, end, T, H)),
    ]
    rows = []
    for name, bar, call in calls:
        host_us, with_sync_us = host_cost(call)
        rows.append(dict(call=name, host_us=host_us, with_sync_us=with_sync_us, bar_us=bar))
    return rows


def breakdown():
    """Where a prefill call's host time goes: the two paths of a call, and steps of the general
    path, each timed alone."""
    from mqa_logits import _api, _arrays, _C
    q, kv, weights, start, end = prefill_inputs()
    dtype = _C.DType.float32
    q_array = _arrays.describe("q", q, _arrays.BYTES)
    _, kv_array, kv_scales = _arrays.operand("kv", kv, _arrays.KV_SCALES)
    weights_array = _arrays.describe("weights", weights, _arrays.WEIGHTS)
    start_array = _arrays.describe("start", start, _arrays.INT32)
    end_array = _arrays.describe("end", end, _arrays.INT32)
    layout = _C.mqa_logits_output_layout(S, T, 0, dtype)
    logits, logits_array = _arrays.new_logits(q, layout, dtype)
    stream = _arrays.stream_of(q_array)

    def call():
        return mqa_logits.fp8_mqa_logits(q, kv, weights, start, end, clean_logits=False)

    def general_path():
        fast, _api._torch_C = _api._torch_C, None
        try:
            return call()
        finally:
            _api._torch_C = fast

    steps = [
        ("whole call" + (" (torch fast path)" if _api._torch_C else ""), call),
        ("whole call, general path", general_path),
        ("  describe one tensor", lambda: _arrays.describe("weights", weights, _arrays.WEIGHTS)),
        ("  allocate the logits", lambda: _arrays.new_logits(q, layout, dtype)),
        ("  current stream", lambda: _arrays.stream_of(q_array)),
        ("  C++: validate + launch", lambda: _C.mqa_logits(
            q_array, None, kv_array, kv_scales, weights_array, start_array, end_array,
            logits_array, False, 0, None, stream)),
    ]
    return [dict(step=name, host_us=host_cost(step)[0]) for name, step in steps]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    if not (torch.cuda.is_available() and mqa_logits.cuda_backend_available()):
        print("host_cost.py: needs an sm_90 GPU and the CUDA backend", file=sys.stderr)
        return 3
    rows = measure()
    print(f"Python host cost per call ({torch.cuda.get_device_name()}, {CALLS} calls on one "
          f"stream; prefill S={S} T={T} H={H} D={D}, decode B={BATCH} context {CONTEXT})")
    print(f"{'call':24s} {'host us':>8s} {'+sync us':>9s} {'bar us':>7s}")
    for row in rows:
        verdict = "ok" if row["host_us"] <= row["bar_us"] else "over the bar"
        print(f"{row['call']:24s} {row['host_us']:8.2f} {row['with_sync_us']:9.2f} "
              f"{row['bar_us']:7.1f}   {verdict}")
    steps = breakdown()
    print("where the host time of a prefill call (no clean) goes, each step timed alone:")
    for step in steps:
        print(f"  {step['step']:30s} {step['host_us']:8.2f} us")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows, steps=steps), out,
                      indent=1)
    return 0 if all(row["host_us"] <= row["bar_us"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
