"""The DeepSeek-V3.2 lightning indexer with numpy only: quantize, prefill, paged decode, top-k.

The same steps as deepseek_v32_indexer.py, without torch or a GPU: numpy arrays run the CPU
backend (a float64 reference, so this is how indexer code is tested on any machine). It quantizes
random activations with the package's numpy helpers, in the format picked on the command line:

  FP8    keys: e4m3 with one float32 scale per token; queries: e4m3 with one scale per token,
         folded into the head weights (FP8 queries take no scales), as DeepSeek does;
  MXFP8  e4m3 with a power-of-two (UE8M0) scale per 32 elements (needs the ml_dtypes package);
  MXFP4  e2m1, two per byte, with the same block scales;

then runs

  1. prefill: a chunk of new tokens after a cached prefix, causal windows, `fp8_fp4_mqa_logits`;
  2. decode: the next tokens of a batch of sequences (two per sequence: multi-token prediction)
     against a paged KV cache written with `write_paged_kv_cache`, `fp8_fp4_paged_mqa_logits`;

each feeding a top-2048 selection, and checks the logits against the float64 formula on the
unquantized inputs with the bound of docs/contract.md, "Numerics" (1e-3; MXFP4 2e-2).

    python examples/numpy_indexer.py [--format fp8|mxfp8|mxfp4]
"""

import argparse
import time

import numpy as np

import mqa_logits as deep_gemm

HEADS = 64
HEAD_DIM = 128
TOPK = 2048
BLOCK_KV = 64
CONTRACT_BOUND = {"fp8": 1e-3, "mxfp8": 1e-3, "mxfp4": 2e-2}


def bf16(x):
    """Activations as a model holds them: float32 rounded to bfloat16 (to nearest even)."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def quantize_keys(fmt, keys):
    """[T, D] -> (values, scales), what `kv` and the paged cache take."""
    return getattr(deep_gemm, f"quantize_{fmt}")(keys)


def quantize_queries(fmt, queries, weights):
    """[..., H, D] queries and [..., H] weights -> (q, weights) for the logits call. The softmax
    scale goes into the weights; FP8 queries also carry their per-token scale there."""
    weights = weights * (HEAD_DIM**-0.5) * (HEADS**-0.5)
    if fmt != "fp8":
        return getattr(deep_gemm, f"quantize_{fmt}")(queries), weights.astype(np.float32)
    lead = queries.shape[:-2]
    values, scales = deep_gemm.quantize_fp8(queries.reshape(*lead, HEADS * HEAD_DIM))
    return values.reshape(queries.shape), (weights * scales[..., None]).astype(np.float32)


def formula(queries, keys, weights):
    """The indexer formula in float64 on the unquantized inputs: [R, H, D], [T, D] -> [R, T]."""
    scores = np.einsum("rhd,td->rht", queries.astype(np.float64), keys.astype(np.float64))
    weights = weights.astype(np.float64) * (HEAD_DIM**-0.5) * (HEADS**-0.5)
    return np.einsum("rh,rht->rt", weights, np.maximum(scores, 0.0))


def spec_diff(x, y):
    """1 - 2 sum(xy) / sum(x^2 + y^2), the metric of DeepGEMM's tests, in float64."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(1.0 - 2.0 * np.sum(x * y) / np.sum(x * x + y * y))


def select_topk(logits, row_ends):
    """Top-k key indices per row, best first; -1 where a row has fewer than k keys."""
    k = min(TOPK, logits.shape[-1])
    order = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    best = np.take_along_axis(logits, order, axis=-1)
    indices = np.where(np.isneginf(best), -1, order)
    assert ((indices < row_ends[:, None]) | (indices == -1)).all(), "a key past the window"
    return indices


def timed(function, *args, **kwargs):
    begin = time.perf_counter()
    result = function(*args, **kwargs)
    return result, (time.perf_counter() - begin) * 1e3


def prefill_chunk(rng, fmt, prefix, chunk):
    """Queries prefix .. prefix + chunk - 1 of one sequence; each sees the keys up to itself."""
    num_keys = prefix + chunk
    keys = bf16(rng.standard_normal((num_keys, HEAD_DIM)))
    queries = bf16(rng.standard_normal((chunk, HEADS, HEAD_DIM)))
    weights = rng.standard_normal((chunk, HEADS)).astype(np.float32)
    q, q_weights = quantize_queries(fmt, queries, weights)
    starts = np.zeros(chunk, np.int32)
    ends = np.arange(prefix + 1, num_keys + 1, dtype=np.int32)

    logits, ms = timed(deep_gemm.fp8_fp4_mqa_logits, q, quantize_keys(fmt, keys), q_weights,
                       starts, ends, clean_logits=True)
    indices = select_topk(logits, ends)
    inside = np.arange(num_keys)[None, :] < ends[:, None]
    assert np.array_equal(np.isneginf(logits), ~inside), "-inf must be exactly the outside"
    diff = spec_diff(logits[inside], formula(queries, keys, weights)[inside])
    assert diff < CONTRACT_BOUND[fmt], f"prefill logits differ from the formula: diff {diff:.3g}"
    print(f"prefill: {fmt}, {chunk} queries x {num_keys} keys -> logits {logits.shape} in "
          f"{ms:.1f} ms, diff {diff:.2e} from the unquantized formula; top-"
          f"{indices.shape[1]} of the last query: {indices[-1, :5].tolist()} ...")


def decode_step(rng, fmt, batch, max_len, next_n):
    """next_n new tokens per sequence (the last one and its MTP draft) against the cache."""
    token_bytes = HEAD_DIM // 2 if fmt == "mxfp4" else HEAD_DIM
    max_blocks = -(-max_len // BLOCK_KV)
    num_blocks = batch * max_blocks
    cache = np.zeros((num_blocks, BLOCK_KV, 1, token_bytes + 4), np.uint8)
    block_table = rng.permutation(num_blocks).reshape(batch, max_blocks).astype(np.int32)
    lengths = rng.integers(next_n, max_len + 1, size=batch)
    sequences = []
    for b in range(batch):
        keys = bf16(rng.standard_normal((lengths[b], HEAD_DIM)))
        cached = lengths[b] - next_n
        # The context the cache held, then the keys of this step's new tokens, appended.
        deep_gemm.write_paged_kv_cache(cache, quantize_keys(fmt, keys[:cached]), block_table[b])
        deep_gemm.write_paged_kv_cache(cache, quantize_keys(fmt, keys[cached:]), block_table[b],
                                       start=cached)
        sequences.append(keys)

    queries = bf16(rng.standard_normal((batch, next_n, HEADS, HEAD_DIM)))
    weights = rng.standard_normal((batch * next_n, HEADS)).astype(np.float32)
    q, q_weights = quantize_queries(fmt, queries, weights.reshape(batch, next_n, HEADS))
    # Token t of the next_n new ones sees the context up to itself.
    context_lens = (lengths[:, None] - next_n + 1 + np.arange(next_n)).astype(np.int32)

    schedule = deep_gemm.get_paged_mqa_logits_metadata(context_lens, BLOCK_KV,
                                                       deep_gemm.get_num_sms())
    logits, ms = timed(deep_gemm.fp8_fp4_paged_mqa_logits, q, cache,
                       q_weights.reshape(batch * next_n, HEADS), context_lens, block_table,
                       schedule, max_len, clean_logits=True)
    indices = select_topk(logits, context_lens.reshape(-1))
    actual, expected = [], []
    for r in range(batch * next_n):
        b, t = divmod(r, next_n)
        length = context_lens[b, t]
        assert np.isneginf(logits[r, length:]).all(), "-inf must be exactly past the context"
        actual.append(logits[r, :length])
        expected.append(formula(queries[b, t][None], sequences[b][:length], weights[r:r + 1])[0])
    diff = spec_diff(np.concatenate(actual), np.concatenate(expected))
    assert diff < CONTRACT_BOUND[fmt], f"decode logits differ from the formula: diff {diff:.3g}"
    print(f"decode: {fmt}, {batch} sequences x {next_n} tokens, contexts up to {max_len} -> "
          f"logits {logits.shape} in {ms:.1f} ms, diff {diff:.2e} from the unquantized "
          f"formula; top-{indices.shape[1]} of row 0: {indices[0, :5].tolist()} ...")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=sorted(CONTRACT_BOUND), default="fp8")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    rng = np.random.default_rng(options.seed)
    prefill_chunk(rng, options.format, prefix=448, chunk=64)
    decode_step(rng, options.format, batch=4, max_len=2500, next_n=2)


if __name__ == "__main__":
    main()
