"""Decode (paged_mqa_logits) side by side: this library against another implementation with the
same Python API (the reference library, `deep_gemm`), timed in one process on the same inputs.

Each cell builds its inputs once (H = 64, D = 128, FP8 e4m3, contexts uniform in [0.7, 1.3] x L,
2-D context lengths as speculative decoding sends them, random block tables, fp32 weights and
logits, no clean_logits: the reference refuses clean with 2-D lengths), computes each
implementation's schedule metadata outside the timing, and checks that both write the same
logits (the contract's diff over in-window elements, below AGREEMENT) before timing them; a cell
where they disagree is marked and the exit status is 1. Timing (timing.py): CUDA graphs of
CALLS calls, replayed back to back for WARM_MS, then SAMPLES replays; the implementations
alternate A, B, A, B, and each one's median and p10-p90 are taken over the samples of both its
rounds (each round's median is printed too). The floor is max(bytes / copy bandwidth, FLOPs /
FP8 GEMM rate), both measured here; each row keeps its bytes and FLOPs, so that scripts/bars
takes the floor against the C++ benchmark's ceilings instead (this process copies through
torch's copy kernel, ~30% below the benchmark's copy rate).

    python3 bench/python/decode_side_by_side.py --impl deep_gemm [--cells issue|grid] [--cold] \\
        [--json FILE]

--cold gives each call of a graph its own copy of the KV cache (where it is under COLD_BYTES),
so that no call finds its keys in L2, left there by the call before, as an engine's decode step
does not; without it the graph's calls share one input set.

Prints one row per cell: both medians and p10-p90, each round's median, their ratio (this
library / the other), and this library's % of the floor. A cell the other implementation
refuses is marked so.
"""

from __future__ import annotations

import argparse
import importlib
import itertools

import torch

import mqa_logits
from timing import (CALLS, agreement, announce, ceilings, diff, interleaved, save, versus,
                    versus_header)

HEADS, HEAD_DIM = 64, 128
COLD_BYTES = 1 << 30  # larger caches leave L2 between calls by themselves (50 MB)

# (B, next_n, L, block_kv): the cells of the decode issue's table, then the grid's quick subset.
ISSUE_CELLS = [(1, 1, 4096, 64), (1, 2, 4096, 64), (1, 2, 32768, 64), (8, 1, 32768, 64),
               (8, 2, 32768, 64), (32, 1, 4096, 64), (32, 2, 4096, 64), (32, 2, 32768, 64),
               (128, 2, 4096, 64), (128, 1, 32768, 64), (64, 2, 32768, 64),
               (256, 2, 65536, 64), (64, 4, 32768, 64), (128, 4, 65536, 64)]
GRID_CELLS = [(b, n, l, 64) for b in (1, 4, 8, 16, 32, 64, 128, 256, 512) for l in (4096, 32768)
              for n in (1, 2, 4)]


def decode_inputs(batch: int, next_n: int, avg: int, block_kv: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(batch * 1000003 + next_n * 1009 + avg)
    ctx = torch.randint(int(0.7 * avg), int(1.3 * avg) + 1, (batch,), device="cuda",
                        dtype=torch.int32, generator=gen)
    blocks = (ctx + block_kv - 1) // block_kv
    max_blocks, total = int(blocks.max()), int(blocks.sum())
    values = torch.randn(total, block_kv, HEAD_DIM, device="cuda", generator=gen)
    scales = values.abs().amax(dim=2).clamp(min=1e-4) / 448.0
    cache = torch.empty(total, block_kv * (HEAD_DIM + 4), dtype=torch.uint8, device="cuda")
    cache[:, :block_kv * HEAD_DIM] = (values / scales[..., None]).to(
        torch.float8_e4m3fn).view(total, -1).view(torch.uint8)
    cache[:, block_kv * HEAD_DIM:] = scales.view(torch.uint8).view(total, -1)
    cache = cache.view(total, block_kv, 1, HEAD_DIM + 4)
    order = torch.randperm(total, device="cuda", dtype=torch.int32, generator=gen)
    table = torch.full((batch, max_blocks), -1, dtype=torch.int32, device="cuda")
    first = 0
    for row, count in enumerate(blocks.tolist()):
        table[row, :count] = order[first:first + count]
        first += count
    steps = torch.arange(next_n, device="cuda", dtype=torch.int32)
    lens = (ctx[:, None] - next_n + 1 + steps[None, :]).int().contiguous()
    q = torch.randn(batch, next_n, HEADS, HEAD_DIM, device="cuda", generator=gen).to(
        torch.float8_e4m3fn)
    weights = torch.randn(batch * next_n, HEADS, device="cuda", generator=gen)
    return {"q": q, "cache": cache, "weights": weights, "lens": lens, "table": table,
            "max_len": max_blocks * block_kv, "block_kv": block_kv,
            "keys": int(ctx.sum()), "pairs": int(lens.clamp(min=0).sum()),
            "blocks": total}


def floor_terms(case: dict) -> tuple[int, float]:
    """Bytes and FLOPs as the C++ benchmark counts them: keys and scales, block ids, q and
    weights, lengths and the logits written (no clean), each once; two FLOPs a (pair, head,
    dimension)."""
    rows = case["lens"].numel()
    traffic = (case["keys"] * (HEAD_DIM + 4) + 4 * case["blocks"] +
               rows * HEADS * (HEAD_DIM + 4) + 4 * rows + 4 * case["pairs"])
    return traffic, 2.0 * HEADS * HEAD_DIM * case["pairs"]


def floor_us(traffic: int, flops: float, ceiling: dict) -> float:
    return max(traffic / ceiling["copy_tbps"], flops / ceiling["fp8_tflops"]) / 1e6


def call_of(module, case: dict, sms: int, caches: list):
    """The call on `case`, its metadata computed once; each call reads the next of `caches`
    (copies of the case's cache) in turn, so a graph of CALLS calls captures each once."""
    meta = module.get_paged_mqa_logits_metadata(case["lens"], case["block_kv"], sms)
    turn = itertools.count()
    return lambda: module.fp8_fp4_paged_mqa_logits(
        (case["q"], None), caches[next(turn) % len(caches)], case["weights"], case["lens"],
        case["table"], meta, case["max_len"], clean_logits=False, logits_dtype=torch.float32)


def run_cell(cell, other, sms: int, ceiling: dict, cold: bool) -> dict:
    batch, next_n, avg, block_kv = cell
    case = decode_inputs(batch, next_n, avg, block_kv)
    traffic, flops = floor_terms(case)
    row = {"B": batch, "N": next_n, "L": avg, "block_kv": block_kv,
           "floor_us": floor_us(traffic, flops, ceiling), "traffic_bytes": traffic, "flops": flops}
    # Cold caches: the graph's CALLS calls each read their own copy of the KV cache (the other
    # inputs shared) where it is smaller than COLD_BYTES, so that each call finds its keys
    # evicted from L2 by the calls between, as at an engine's decode step, which reads a layer's
    # cache once after every other layer has run; its q, weights, lengths, block table and
    # metadata were written just before, and stay shared.
    caches = [case["cache"]]
    if cold and case["cache"].numel() < COLD_BYTES:
        caches += [case["cache"].clone() for _ in range(1, CALLS)]
    row["cache_copies"] = len(caches)
    calls = {"mqa_logits": call_of(mqa_logits, case, sms, caches)}
    try:
        other_call = call_of(other, case, sms, caches)
        theirs = other_call()  # both first calls read the case's own cache
    except Exception as error:  # the other implementation refuses the cell: time ours alone
        row["other_error"] = repr(error)[:200]
    else:
        calls["other"] = other_call
        ours = calls["mqa_logits"]()
        cols = torch.arange(ours.shape[1], device="cuda")
        row["diff"] = diff(ours, theirs, cols[None, :] < case["lens"].reshape(-1, 1))
    row.update(interleaved(calls))
    del case, caches
    torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", required=True, help="module of the other implementation")
    parser.add_argument("--cells", choices=("issue", "grid"), default="issue")
    parser.add_argument("--cold", action="store_true",
                        help="each call of a graph reads its own copy of the KV cache (cold in L2)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    other = importlib.import_module(args.impl)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ceiling = ceilings()
    device = announce(ceiling, args.impl)
    print(f"{'B/N/L/bk':18} {versus_header(args.impl)} {'%floor':>7} {'diff':>8}")
    rows = []
    for cell in ISSUE_CELLS if args.cells == "issue" else GRID_CELLS:
        row = run_cell(cell, other, sms, ceiling, args.cold)
        rows.append(row)
        name = "/".join(str(v) for v in cell)
        floor_percent = 100.0 * row["floor_us"] / row["mqa_logits"]["median_us"]
        print(f"{name:18} {versus(row, True)} {floor_percent:6.1f}% {agreement(row)}",
              flush=True)
    return save(args.json, device, ceiling, args.impl, rows)


if __name__ == "__main__":
    raise SystemExit(main())
