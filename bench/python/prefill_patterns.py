"""Prefill (fp8_fp4_mqa_logits) at the window patterns engines send, through the Python API: this
library alone, or side by side with another implementation of the same API (the reference
library, `deep_gemm`), in one process on the same inputs.

The patterns are those of `mqa-logits-bench patterns` at H = 64, D = 128: one request (queries
at the end of their keys), square causal, packed requests (equal and uneven, 256 to 16384
tokens), sliding windows, a context-parallel rank's two causal chunks, and random windows with
empty rows among them. Inputs: FP8 e4m3 queries and keys with a float32 scale per key, float32
weights and logits, no schedule metadata (the call as the reference's API makes it). Each
pattern is timed without and with clean_logits. With --impl, both implementations' logits are
first checked to agree (the contract's diff over the in-window elements of up to 1024 sampled
rows, below AGREEMENT); a pattern where they disagree is marked and the exit status is 1.
Timing (timing.py): CUDA graphs of CALLS calls, the implementations alternating A, B, A, B.
FLOPs count only window pairs (2 H D a pair); % is of the FP8 GEMM rate measured here.

    python3 bench/python/prefill_patterns.py [--impl deep_gemm] [--quick] [--pattern NAME] \\
        [--json FILE]

Prints one row per pattern and clean setting: the median and p10-p90 of each implementation,
each round's median, their ratio (this library / the other), and this library's TFLOPS and %.
"""

from __future__ import annotations

import argparse
import importlib
import random

import torch

import mqa_logits
from timing import (agreement, announce, ceilings, diff, interleaved, save, versus,
                    versus_header)

HEADS, HEAD_DIM = 64, 128
SAMPLED_ROWS = 1024


def causal_ends(s: int, t: int) -> torch.Tensor:
    """Row i of s queries at the end of t keys sees keys [0, t - s + i + 1)."""
    return t - s + torch.arange(s, device="cuda", dtype=torch.int64) + 1


def uneven_lengths(count: int, total: int, seed: int, lo: int = 256, hi: int = 16384) -> list:
    """`count` request lengths in [lo, hi] summing to `total`, spread over the octaves between."""
    rng = random.Random(seed)
    octaves = 1
    while (lo << octaves) < hi:
        octaves += 1
    drawn = []
    for _ in range(count):
        base = lo << rng.randint(0, octaves - 1)
        drawn.append(rng.randint(base, min(hi, 2 * base)))
    lengths = [min(hi, max(lo, length * total // sum(drawn))) for length in drawn]
    left = total - sum(lengths)
    while left != 0:  # hand out (or take back) what is left, one token a request at a time
        for i in range(count):
            step = 1 if left > 0 else -1
            if left != 0 and lo <= lengths[i] + step <= hi:
                lengths[i] += step
                left -= step
    return lengths


def windows(pattern: dict, gen: torch.Generator) -> tuple:
    """k_start and k_end of every row, int32 on the GPU."""
    s, t, kind = pattern["S"], pattern["T"], pattern["kind"]
    rows = torch.arange(s, device="cuda", dtype=torch.int64)
    start = torch.zeros(s, device="cuda", dtype=torch.int64)
    if kind == "causal":
        end = causal_ends(s, t)
    elif kind == "packed":
        lengths = torch.tensor(pattern["lengths"], device="cuda", dtype=torch.int64)
        firsts = torch.cumsum(lengths, 0) - lengths
        start = torch.repeat_interleave(firsts, lengths)
        end = rows + 1
    elif kind == "sliding":
        end = causal_ends(s, t)
        start = (end - pattern["window"]).clamp(min=0)
    elif kind == "context_parallel":  # chunks `rank` and `2 ranks - 1 - rank` of a causal pass
        chunk, ranks = max(s // 2, 1), max(t // max(s, 1), 1)
        rank = ranks // 3
        first = rows < chunk
        chunk_index = torch.where(first, rank, 2 * ranks - 1 - rank)
        end = chunk_index * chunk + torch.where(first, rows, rows - chunk) + 1
    else:  # random: empty, inverted, negative starts, ends past T, full and ordinary windows
        def draw(lo, hi):
            return torch.randint(lo, hi, (s,), device="cuda", generator=gen)
        shape, k, a, b = draw(0, 10), draw(0, t + 1), draw(0, t + 1), draw(0, t + 1)
        choices = [(k, k), (k + draw(1, 9), k), (-draw(1, t + 2), k), (k, t + draw(1, t + 2)),
                   (torch.zeros_like(k), torch.full_like(k, t))]
        start, end = torch.minimum(a, b), torch.maximum(a, b)
        for index, (lo, hi) in enumerate(choices):
            start = torch.where(shape == index, lo, start)
            end = torch.where(shape == index, hi, end)
    return start.int().contiguous(), end.int().contiguous()


def patterns(quick: bool) -> list:
    def pattern(name, s, t, kind, **extra):
        return {"name": name, "S": s, "T": t, "kind": kind, **extra}

    def packed(name, lengths):
        return pattern(name, sum(lengths), sum(lengths), "packed", lengths=lengths)

    listed = [pattern("one request", 2048, 8192, "causal")]
    if not quick:
        listed += [pattern("square causal", 2048, 2048, "causal"),
                   pattern("square causal", 4096, 4096, "causal")]
    listed += [pattern("square causal", 8192, 8192, "causal"),
               packed("packed 8 x 2048", [2048] * 8)]
    if not quick:
        listed += [packed("packed 64 x 256", [256] * 64),
                   packed("packed 2 uneven", uneven_lengths(2, 16384, 2)),
                   packed("packed 32 x 1024", [1024] * 32)]
    listed += [packed("packed 12 uneven", uneven_lengths(12, 32768, 1)),
               pattern("sliding 2048", 8192, 65536, "sliding", window=2048)]
    if not quick:
        listed += [pattern("sliding 512", 8192, 65536, "sliding", window=512),
                   pattern("sliding 128", 8192, 65536, "sliding", window=128)]
    listed += [pattern("context parallel", 8192, 65536, "context_parallel"),
               pattern("random", 4096, 16384, "random")]
    return listed


def prefill_inputs(pattern: dict, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    s, t = pattern["S"], pattern["T"]
    values = torch.randn(t, HEAD_DIM, device="cuda", generator=gen)
    scale = values.abs().amax(dim=1).clamp(min=1e-4) / 448.0
    # Given within [0, T] (an empty row as start == end): the reference reads outside the keys
    # when a window is not. The tests and mqa-logits-bench call with the raw windows.
    start, end = windows(pattern, gen)
    start = start.clamp(0, t)
    end = torch.maximum(end.clamp(0, t), start)
    pairs = int((end - start).sum())
    return {"q": torch.randn(s, HEADS, HEAD_DIM, device="cuda", generator=gen).to(
                torch.float8_e4m3fn),
            "k": (values / scale[:, None]).to(torch.float8_e4m3fn), "scale": scale,
            "weights": torch.randn(s, HEADS, device="cuda", generator=gen),
            "start": start, "end": end, "pairs": pairs}


def call_of(module, case: dict, clean: bool):
    return lambda: module.fp8_fp4_mqa_logits(
        (case["q"], None), (case["k"], case["scale"]), case["weights"], case["start"],
        case["end"], clean_logits=clean, max_seqlen_k=0, logits_dtype=torch.float32)


def in_window(case: dict, rows: torch.Tensor, cols: int) -> torch.Tensor:
    keys = torch.arange(cols, device="cuda")
    return ((keys[None, :] >= case["start"][rows, None]) &
            (keys[None, :] < case["end"][rows, None]))


def run_pattern(pattern: dict, seed: int, other, ceiling: dict) -> list:
    case = prefill_inputs(pattern, seed)
    rows_out = []
    for clean in (False, True):
        row = {"pattern": pattern["name"], "S": pattern["S"], "T": pattern["T"],
               "clean": clean, "pairs": case["pairs"]}
        calls = {"mqa_logits": call_of(mqa_logits, case, clean)}
        if other is not None:
            try:
                other_call = call_of(other, case, clean)
                theirs = other_call()
            except Exception as error:  # the other implementation refuses: time ours alone
                row["other_error"] = repr(error)[:200]
            else:
                calls["other"] = other_call
                ours = calls["mqa_logits"]()
                rows = torch.arange(0, pattern["S"], max(1, pattern["S"] // SAMPLED_ROWS),
                                    device="cuda")
                row["diff"] = diff(ours[rows], theirs[rows],
                                   in_window(case, rows, ours.shape[1]))
                del ours, theirs
        row.update(interleaved(calls))
        seconds = row["mqa_logits"]["median_us"] * 1e-6
        row["tflops"] = 2.0 * HEADS * HEAD_DIM * case["pairs"] / seconds / 1e12
        row["percent_of_fp8"] = 100.0 * row["tflops"] / ceiling["fp8_tflops"]
        rows_out.append(row)
    del case
    torch.cuda.empty_cache()
    return rows_out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", help="module of another implementation to time beside")
    parser.add_argument("--quick", action="store_true", help="seven patterns, not fourteen")
    parser.add_argument("--pattern", default="", help="only the patterns whose name has this")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    other = importlib.import_module(args.impl) if args.impl else None
    ceiling = ceilings()
    device = announce(ceiling, args.impl)
    print(f"{'pattern':18} {'S x T':12} {'clean':5} {versus_header(args.impl)} {'TFLOPS':>7} "
          f"{'%fp8':>6} {'diff':>8}")
    rows = []
    for seed, pattern in enumerate(patterns(args.quick)):
        if args.pattern not in pattern["name"]:
            continue
        for row in run_pattern(pattern, seed, other, ceiling):
            rows.append(row)
            shape = f"{row['S']}x{row['T']}"
            print(f"{row['pattern']:18} {shape:12} {'yes' if row['clean'] else 'no':5} "
                  f"{versus(row, other is not None)} {row['tflops']:7.1f} "
                  f"{row['percent_of_fp8']:5.1f}% {agreement(row)}", flush=True)
    return save(args.json, device, ceiling, args.impl, rows)


if __name__ == "__main__":
    raise SystemExit(main())
