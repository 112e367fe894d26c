"""scripts/bars: the issues' bars read from a gpu-check run's JSON (synthetic rows here)."""

import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bars"


def pattern(name, s, windows, pct, rate, *, heads=64, dim=128, pairs=None, sliding=0,
            clean=False, within=True):
    row = {"op": "prefill_pattern", "pattern": name, "S": s, "T": s, "H": heads, "D": dim,
           "windows": windows, "sliding_window": sliding, "pairs": pairs or s * 1024,
           "logits": "float32", "clean": clean, "scheduled": True, "verified": True,
           "pct_fp8_ceiling": pct, "rate_vs_one_request": rate}
    if clean:
        row["clean_within_allowance"] = within
    return row


def decode(b, n, avg, us, floor, pct, *, block_kv=64, p10=None, p90=None, meta=2.4):
    return {"op": "decode", "B": b, "N": n, "avg_context": avg, "block_kv": block_kv, "H": 64,
            "D": 128, "median_us": us, "p10_us": p10 or us, "p90_us": p90 or us,
            "floor_us": floor, "pct_floor": pct, "metadata_us": meta, "verified": True}


def run_bars_lines(tmp_path, bench, grid=None, side_by_side=None, ceilings=None,
                   side_by_side_cold=None):
    """Each bar's (what was measured, verdict), by the bar's text."""
    (tmp_path / "bench.json").write_text(json.dumps({"results": bench, **(ceilings or {})}))
    if grid is not None:
        (tmp_path / "grid.json").write_text(json.dumps({"results": grid}))
    if side_by_side is not None:
        (tmp_path / "side_by_side.json").write_text(json.dumps({"rows": side_by_side}))
    if side_by_side_cold is not None:
        (tmp_path / "side_by_side_cold.json").write_text(json.dumps({"rows": side_by_side_cold}))
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True,
                            text=True, check=True)
    lines = {}
    for line in result.stdout.splitlines():
        columns = [column.strip() for column in line.split("  ") if column.strip()]
        if len(columns) == 4:
            lines[columns[1]] = (columns[2], columns[3])
    return lines


def run_bars(tmp_path, bench, grid=None):
    return {bar: verdict for bar, (_, verdict) in run_bars_lines(tmp_path, bench, grid).items()}


def test_verdicts_follow_the_rows(tmp_path):
    bench = [
        pattern("one request", 2048, "causal", 90.0, 1.0),
        pattern("square causal", 8192, "causal", 85.0, 0.95),
        pattern("packed 8 x 2048", 16384, "packed", 77.0, 0.86, pairs=16384 * 1024),
        pattern("packed 32 x 1024", 32768, "packed", 71.0, 0.79, pairs=32768 * 512),
        pattern("sliding 2048", 8192, "sliding", 80.0, 0.89, sliding=2048),
        pattern("random", 4096, "random", 85.0, 0.94),
        pattern("square causal", 8192, "causal", 60.0, 0.95, clean=True, within=False),
        decode(64, 1, 32768, 72.0, 68.4, 95.0),
        decode(256, 2, 65536, 700.0, 600.0, 85.7, p10=690.0, p90=740.0),
        decode(128, 4, 65536, 600.0, 450.0, 75.0, p10=598.0, p90=604.0),
    ]
    grid = [dict(decode(1, 1, 4096, 3.4, 0.2, 5.0), op="decode-grid"),
            dict(decode(8, 8, 32768, 80.0, 40.0, 50.0, meta=3.2), op="decode-grid")]
    verdicts = run_bars(tmp_path, bench, grid)
    assert verdicts["square causal 8192^2 >= 82% of FP8"] == "met"
    assert verdicts["packed, mean window >= 1024: >= 78%"] == "MISSED"
    assert verdicts["packed, mean window ~512: >= 70%"] == "met"
    assert verdicts["sliding window 2048 >= 78%"] == "met"
    assert verdicts["other patterns >= 0.9 x the one request's rate"] == "met"
    assert verdicts["H = 32, D = 128: each pattern >= 0.9 x its one request"] == "not measured"
    assert verdicts["clean adds <= 1.1 x masked bytes / copy rate + 5 us"] == "MISSED"
    assert verdicts["floor >= 30 us, next_n <= 2: >= 93% of floor"] == "MISSED"  # 256/2: 85.7%
    assert verdicts["next_n = 8 (floor >= 30 us): >= 80%"] == "MISSED"
    assert verdicts["B = 1, L = 4096: <= 3.5 us"] == "met"
    assert verdicts["256/2/65536, 128/4/65536: p90 / p10 <= 1.05"] == "MISSED"  # 740 / 690
    assert verdicts["metadata kernel <= 3 us"] == "MISSED"
    assert (verdicts["issue cells, next_n <= 2: <= 0.95 x reference or >= 97% of floor"]
            == "not measured")


def test_a_short_pattern_bound_by_its_bytes_says_what_its_bytes_allow(tmp_path):
    sliding_128 = pattern("sliding 128", 8192, "sliding", 28.0, 0.32, sliding=128)
    sliding_128.update(floor_bound="memory", pct_floor=42.0)  # at its floor: 0.32 / 0.42
    sliding_512 = pattern("sliding 512", 8192, "sliding", 52.0, 0.58, sliding=512)
    sliding_512.update(floor_bound="fp8", pct_floor=52.0)
    bench = [pattern("one request", 2048, "causal", 90.0, 1.0), sliding_128, sliding_512]
    measured, verdict = run_bars_lines(tmp_path, bench)[
        "other patterns >= 0.9 x the one request's rate"]
    assert measured == ("0 of 2 (short: sliding 128 8192 0.32, its bytes allow 0.76, "
                        "sliding 512 8192 0.58)")
    assert verdict == "MISSED"


def test_a_cell_in_both_the_benchmark_and_the_grid_counts_once_at_its_slower_time(tmp_path):
    bench = [decode(64, 1, 32768, 72.0, 68.4, 95.0), decode(64, 2, 32768, 74.0, 70.0, 94.6)]
    grid = [dict(decode(64, 1, 32768, 74.0, 68.4, 92.4), op="decode-grid"),
            dict(decode(64, 2, 32768, 73.0, 70.0, 95.9), op="decode-grid")]
    measured, verdict = run_bars_lines(tmp_path, bench, grid)[
        "floor >= 30 us, next_n <= 2: >= 93% of floor"]
    assert measured == "2 cells, 92.4-94.6%, 1 below"
    assert verdict == "MISSED"


def beside(b, n, ours, theirs, python_floor, **terms):
    return {"B": b, "N": n, "L": 32768, "block_kv": 64, "floor_us": python_floor,
            "mqa_logits": {"median_us": ours}, "other": {"median_us": theirs}, **terms}


def test_the_side_by_side_floor_is_taken_against_the_benchmarks_ceilings(tmp_path):
    bar = "issue cells, next_n <= 2: <= 0.95 x reference or >= 97% of floor"
    ceilings = {"copy_tbps": 4.0, "fp8_tflops": 1200.0}
    # 38.5 MB: a 9.63 us floor at 4 TB/s (97.2% of 9.9 us); 13.3 us at Python's slower copy.
    at_floor = beside(8, 1, 9.9, 9.0, 13.3, traffic_bytes=38.5e6, flops=1e9)
    measured, verdict = run_bars_lines(tmp_path, [decode(64, 1, 32768, 72.0, 68.4, 95.0)],
                                       side_by_side=[at_floor], ceilings=ceilings)[bar]
    assert (measured, verdict) == ("1 of 1", "met")
    # Without its bytes a row counts by the ratio alone: the Python floor never meets the bar.
    slow = beside(8, 2, 12.0, 11.0, 13.3)
    fast = beside(32, 2, 45.0, 48.0, 40.0)
    measured, verdict = run_bars_lines(tmp_path, [decode(64, 1, 32768, 72.0, 68.4, 95.0)],
                                       side_by_side=[slow, fast], ceilings=ceilings)[bar]
    assert measured == "1 of 2 (8/2/32768 1.09 short); 2 by the ratio alone (no traffic in the row)"
    assert verdict == "MISSED"


def test_the_cold_side_by_side_is_a_bar_line_of_its_own(tmp_path):
    warm_bar = "issue cells, next_n <= 2: <= 0.95 x reference or >= 97% of floor"
    cold_bar = "the same, each call its own copy of the cache (cold L2)"
    bench = [decode(64, 1, 32768, 72.0, 68.4, 95.0)]
    terms = {"traffic_bytes": 33.8e6, "flops": 1e9}  # an 8.45 us floor at 4 TB/s
    warm = [beside(8, 1, 9.7, 8.6, 12.2, **terms)]
    cold = [beside(8, 1, 12.0, 13.2, 12.2, **terms)]
    ceilings = {"copy_tbps": 4.0, "fp8_tflops": 1200.0}
    lines = run_bars_lines(tmp_path, bench, side_by_side=warm, side_by_side_cold=cold,
                           ceilings=ceilings)
    assert lines[warm_bar] == ("0 of 1 (8/1/32768 1.13 short)", "MISSED")
    assert lines[cold_bar] == ("1 of 1", "met")
    # A run without the cold rows prints no line for them.
    (tmp_path / "side_by_side_cold.json").unlink()
    assert cold_bar not in run_bars_lines(tmp_path, bench, side_by_side=warm, ceilings=ceilings)


def test_a_run_without_results_is_an_error(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True,
                            text=True)
    assert result.returncode == 2
    assert "no results" in result.stderr
