"""The top-k as engines run it, timed in one process (k = 2048, H = 64, D = 128, FP8): this
library's top-k operation (mqa_topk / paged_mqa_topk) against its logits alone (no clean), its
logits followed by topk_per_row, its logits (clean) followed by torch.topk, and, with --impl, the
other implementation's logits (clean) followed by torch.topk, as engines that keep the reference
call it. Before timing, the top-k operation's indices are checked to equal topk_per_row over this
library's logits of the same inputs (exact: ties to the lower key); torch.topk's sets are not
compared (its ties follow no rule). Peak device memory of each path: the most torch allocated
during one call beyond what was allocated before it.

    python3 bench/python/topk_side_by_side.py [--impl deep_gemm] [--quick] [--json FILE]

The prefill patterns are those of the top-k issue (one request 2048 x 32768, square causal
8192^2, packed 8 x 2048 and 32 x 1024, sliding 2048 and context-parallel chunks, 8192 x 65536),
the decode cells B = 64 at 32768 tokens (next_n 1 and 2) and B = 1, 4, 8 at 4096 to 131072.
Timing (timing.py): CUDA graphs of CALLS calls, the paths alternating A, B, A, B.
"""

from __future__ import annotations

import argparse
import importlib

import torch

import mqa_logits
from decode_side_by_side import decode_inputs
from prefill_patterns import prefill_inputs
from timing import announce, ceilings, interleaved, save, stats_text

TOPK = 2048
PREFILL = [{"name": "one request", "S": 2048, "T": 32768, "kind": "causal"},
           {"name": "square causal", "S": 8192, "T": 8192, "kind": "causal"},
           {"name": "packed 8 x 2048", "S": 16384, "T": 16384, "kind": "packed",
            "lengths": [2048] * 8},
           {"name": "packed 32 x 1024", "S": 32768, "T": 32768, "kind": "packed",
            "lengths": [1024] * 32},
           {"name": "sliding 2048", "S": 8192, "T": 65536, "kind": "sliding", "window": 2048},
           {"name": "context parallel", "S": 8192, "T": 65536, "kind": "context_parallel"}]
DECODE = [(64, 1, 32768), (64, 2, 32768), (1, 1, 4096), (1, 1, 131072), (4, 1, 65536),
          (8, 1, 4096), (8, 1, 131072)]


def peak_bytes(fn) -> int:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated() - before


def prefill_paths(case: dict, other) -> dict:
    q, kv, w, start, end = case["q"], (case["k"], case["scale"]), case["weights"], \
        case["start"], case["end"]

    def logits(module, clean):
        return module.fp8_fp4_mqa_logits((q, None), kv, w, start, end, clean_logits=clean,
                                         max_seqlen_k=0, logits_dtype=torch.float32)

    paths = {
        "top-k": lambda: mqa_logits.mqa_topk(q, kv, w, start, end, TOPK),
        "logits": lambda: logits(mqa_logits, False),
        "logits+topk_per_row": lambda: mqa_logits.topk_per_row(logits(mqa_logits, False), start,
                                                              end, TOPK),
        "logits+torch.topk": lambda: torch.topk(logits(mqa_logits, True), TOPK, dim=1).indices,
    }
    if other is not None:
        paths["other+torch.topk"] = lambda: torch.topk(logits(other, True), TOPK, dim=1).indices
    return paths


def decode_paths(case: dict, other) -> dict:
    sms = mqa_logits.get_num_sms()
    meta = mqa_logits.get_paged_mqa_logits_metadata(case["lens"], case["block_kv"], sms)
    args = ((case["q"], None), case["cache"], case["weights"], case["lens"], case["table"])
    lengths = case["lens"].reshape(-1).clamp(0, case["max_len"]).int().contiguous()

    def logits(module, meta_of_module, clean):
        return module.fp8_fp4_paged_mqa_logits(*args, meta_of_module, case["max_len"],
                                               clean_logits=clean, logits_dtype=torch.float32)

    paths = {
        "top-k": lambda: mqa_logits.paged_mqa_topk(*args, meta, case["max_len"], TOPK),
        "logits": lambda: logits(mqa_logits, meta, False),
        "logits+topk_per_row": lambda: mqa_logits.topk_per_row(logits(mqa_logits, meta, False),
                                                              None, lengths, TOPK),
        "logits+torch.topk": lambda: torch.topk(logits(mqa_logits, meta, True), TOPK,
                                                dim=1).indices,
    }
    if other is not None:
        # 1-D lengths (each sequence's last row; the same rows): the reference cleans decode
        # logits only for those.
        lens_1d = case["lens"][:, -1].contiguous()
        other_meta = other.get_paged_mqa_logits_metadata(lens_1d, case["block_kv"], sms)
        paths["other+torch.topk"] = lambda: torch.topk(other.fp8_fp4_paged_mqa_logits(
            *args[:3], lens_1d, args[4], other_meta, case["max_len"], clean_logits=True,
            logits_dtype=torch.float32), TOPK, dim=1).indices
    return paths


def run(name: str, paths: dict) -> dict:
    exact = bool(torch.equal(paths["top-k"](), paths["logits+topk_per_row"]()))
    row = {"case": name, "exact": exact,
           "peak_bytes": {path: peak_bytes(fn) for path, fn in paths.items()}}
    row["times"] = interleaved(paths)
    fused = row["times"]["top-k"]["median_us"]
    print(f"{name:28} exact {str(exact):5}  " + "  ".join(
        f"{path} {stats_text(stats)}" + ("" if path == "top-k" else
                                         f" ({stats['median_us'] / fused:.2f} x top-k)")
        for path, stats in row["times"].items()), flush=True)
    print(f"{'':28} peak MiB: " + ", ".join(f"{path} {b / 2**20:.0f}"
                                             for path, b in row["peak_bytes"].items()),
          flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", help="the other implementation's module, e.g. deep_gemm")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    other = importlib.import_module(args.impl) if args.impl else None
    ceiling = ceilings()
    device = announce(ceiling, args.impl)
    rows = []
    for pattern in PREFILL[:2] if args.quick else PREFILL:
        case = prefill_inputs(pattern, seed=11)
        rows.append(run(f"prefill {pattern['name']}", prefill_paths(case, other)))
        del case
    for batch, next_n, length in DECODE[:3] if args.quick else DECODE:
        case = decode_inputs(batch, next_n, length, 64)
        rows.append(run(f"decode {batch}/{next_n}/{length}", decode_paths(case, other)))
        del case
    save(args.json, device, ceiling, args.impl, rows)
    return 0 if all(row["exact"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
