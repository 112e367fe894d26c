"""What the Python benchmarks share: CUDA-graph timing, the machine's ceilings, and the
contract's diff to check two implementations against each other before timing them.

Timing: a graph of CALLS calls, replayed back to back for WARM_MS (past the step by which the
power cap lowers the SM clock 20-60 ms into a heavy load, as mqa-logits-bench does), then
SAMPLES replays, each giving one per-call time; each sample's events and replay are queued
behind a kernel that holds the GPU, so that the sample does not include the host's launch.
"""

from __future__ import annotations

import json
import statistics

import torch

CALLS, SAMPLES, WARM_MS = 5, 40, 200.0
HOLD_CYCLES = 100_000  # ~50-70 us of GPU time: well past a graph launch from Python

# Each implementation within 5e-6 of the float64 oracle (docs/contract.md, fp32 logits) puts the
# two within 4 x 5e-6 of each other (the diff's square root obeys the triangle inequality).
AGREEMENT = 4 * 5e-6


def summary(times: list[float]) -> dict:
    """Median, p10 and p90 of per-call times (us)."""
    times = sorted(times)
    return {"median_us": statistics.median(times), "p10_us": times[len(times) // 10],
            "p90_us": times[(9 * len(times)) // 10]}


def replay_times(fn) -> list[float]:
    """SAMPLES per-call times (us), each from a replay of a graph of CALLS calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def replay_ms() -> float:
        # The GPU held busy while the host records the events and launches the graph: with an
        # idle GPU the begin event fires at once and the time would include the launch.
        torch.cuda._sleep(HOLD_CYCLES)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end)

    # The SM clock falls while the host builds a case, and under a heavy case the power cap
    # lowers it 20-60 ms into the load: warm up past both, as mqa-logits-bench does (time_graph).
    for _ in range(min(10000, int(WARM_MS / max(replay_ms(), 1e-3)))):
        graph.replay()
    torch.cuda.synchronize()
    return [replay_ms() * 1000.0 / CALLS for _ in range(SAMPLES)]


def interleaved(calls: dict) -> dict:
    """Each callable timed in two rounds, alternating A, B, A, B, so that clock drift hits all
    alike: per name, the median and p10-p90 over both rounds' samples and each round's median."""
    rounds = {name: [] for name in calls}
    for _ in range(2):
        for name, fn in calls.items():
            rounds[name].append(replay_times(fn))
    stats = {}
    for name, samples in rounds.items():
        stats[name] = summary([t for round_times in samples for t in round_times])
        stats[name]["round_medians_us"] = [statistics.median(times) for times in samples]
    return stats


def ceilings() -> dict:
    """Copy bandwidth (bytes read + written per second) and the FP8 GEMM rate, measured here."""
    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    y = torch.empty_like(x)
    copy_us = summary(replay_times(lambda: y.copy_(x)))["median_us"]
    m = 8192
    a = torch.randn(m, m, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(m, m, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    mm_us = summary(replay_times(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                                          out_dtype=torch.bfloat16)))["median_us"]
    return {"copy_tbps": 2 * n / (copy_us * 1e-6) / 1e12,
            "fp8_tflops": 2 * m ** 3 / (mm_us * 1e-6) / 1e12}


def diff(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    """The contract's metric over in-window elements, in float64."""
    x, y = x[mask].double(), y[mask].double()
    squares = float((x * x + y * y).sum())
    return 0.0 if squares == 0.0 else 1.0 - 2.0 * float((x * y).sum()) / squares


def disagrees(row: dict) -> bool:
    """Both ran and their logits differ by AGREEMENT or more (or by NaN)."""
    return "diff" in row and not row["diff"] < AGREEMENT


def stats_text(stats: dict) -> str:
    """"median (p10-p90; each round's median)" in us."""
    rounds = ", ".join(f"{m:.1f}" for m in stats["round_medians_us"])
    return f"{stats['median_us']:.1f} ({stats['p10_us']:.1f}-{stats['p90_us']:.1f}; {rounds})"


def announce(ceiling: dict, other: str | None) -> str:
    """Print the machine's line (device, ceilings, what is compared); return the device name."""
    name = torch.cuda.get_device_properties(0).name
    against = f"; mqa_logits against {other}" if other else ""
    print(f"{name}: copy {ceiling['copy_tbps']:.2f} TB/s, FP8 GEMM "
          f"{ceiling['fp8_tflops']:.0f} TFLOPS{against}", flush=True)
    return name


def versus_header(other: str | None) -> str:
    """The headers of versus's columns."""
    return (f"{'mqa_logits us (p10-p90; rounds)':>34} "
            f"{(other or 'other') + ' us (p10-p90; rounds)':>34} {'ratio':>6}")


def versus(row: dict, compared: bool) -> str:
    """This library's time, the other implementation's ("-" when none was compared, "refuses"
    when it refused) and the ratio of the medians, as table columns."""
    ours, theirs = row["mqa_logits"], row.get("other")
    other_text = ("refuses" if compared else "-") if theirs is None else stats_text(theirs)
    ratio = "" if theirs is None else f"{ours['median_us'] / theirs['median_us']:.2f}"
    return f"{stats_text(ours):>34} {other_text:>34} {ratio:>6}"


def agreement(row: dict) -> str:
    """The diff between the two implementations' logits as a table column, marked when over."""
    return f"{row.get('diff', float('nan')):8.1e}{' DISAGREE' if disagrees(row) else ''}"


def save(path: str | None, device: str, ceiling: dict, other: str | None, rows: list) -> int:
    """Write the rows as JSON when asked; the exit status: 1 when any row disagrees."""
    if path:
        with open(path, "w") as out:
            json.dump({"device": device, "ceilings": ceiling, "other": other, "rows": rows}, out,
                      indent=1)
    return 1 if any(disagrees(row) for row in rows) else 0
