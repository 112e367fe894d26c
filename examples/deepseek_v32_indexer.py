"""The DeepSeek-V3.2 lightning indexer on mqa_logits: a prefill chunk and a decode step.

DeepSeek-V3.2's indexer scores every earlier token for each query token with 64 FP8 heads of
dimension 128, and sparse attention then reads only the top 2048. This script quantizes random
activations the way the model does (FP8 keys with one float32 scale per token; FP8 queries whose
per-token scale is folded into the head weights) and runs:

  1. prefill: a chunk of new tokens after a cached prefix, causal windows, `fp8_mqa_logits`;
  2. decode: the next tokens of a batch of sequences (two per sequence: multi-token prediction)
     against a paged FP8 KV cache, `fp8_paged_mqa_logits`;

each feeding `torch.topk(..., 2048)`. The code is written against the DeepGEMM API through
`import mqa_logits as deep_gemm`. It runs on the GPU when there is one, else on the CPU backend
(use --small there: the CPU backend is a float64 reference, not a fast path).

    python examples/deepseek_v32_indexer.py [--device cpu|cuda] [--small]
"""

import argparse
import time

import torch

import mqa_logits as deep_gemm

HEADS = 64
HEAD_DIM = 128
TOPK = 2048
BLOCK_KV = 64
FP8_MAX = 448.0


def quantize_keys(keys):
    """[T, D] -> (float8_e4m3fn [T, D], float32 [T]): one scale per token."""
    scale = keys.float().abs().amax(dim=-1).clamp(min=1e-4) / FP8_MAX
    return (keys.float() / scale[:, None]).to(torch.float8_e4m3fn), scale


def quantize_queries(queries, weights):
    """[..., H, D] queries and [..., H] weights -> FP8 queries and weights that carry the
    per-token query scale and the softmax scale (the indexer folds both into the weights)."""
    scale = queries.float().abs().amax(dim=(-2, -1)).clamp(min=1e-4) / FP8_MAX
    q_fp8 = (queries.float() / scale[..., None, None]).to(torch.float8_e4m3fn)
    folded = weights.float() * scale[..., None] * (HEAD_DIM**-0.5) * (HEADS**-0.5)
    return q_fp8, folded


def select_topk(logits, row_ends):
    """Top-k key indices per row; -1 where a row has fewer than k keys in its window."""
    k = min(TOPK, logits.shape[-1])
    values, indices = torch.topk(logits, k, dim=-1)
    indices = torch.where(torch.isneginf(values), -1, indices)
    assert bool(((indices < row_ends[:, None]) | (indices == -1)).all()), "a key past the window"
    return indices


def check_row(logits_row, q_fp8, weights, keys_fp8, key_scales):
    """Compare one row of logits with the formula in float64 over the stored FP8 values, by the
    metric DeepGEMM's tests use: 1 - 2 sum(xy) / sum(x^2 + y^2), below 5e-6 for float32."""
    scores = q_fp8.double() @ (keys_fp8.double() * key_scales.double()[:, None]).T  # [H, T]
    expected = (weights.double()[:, None] * scores.relu()).sum(dim=0)
    actual = logits_row.double()
    diff = 1 - 2 * (actual * expected).sum() / (actual * actual + expected * expected).sum()
    assert float(diff) < 5e-6, f"logits differ from the formula: diff {float(diff):.3g}"


def timed(device, function, *args, **kwargs):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    result = function(*args, **kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, (time.perf_counter() - begin) * 1e3


def prefill_chunk(device, prefix, chunk):
    """Queries prefix .. prefix + chunk - 1 of one sequence; each sees the keys up to itself."""
    num_keys = prefix + chunk
    keys_fp8, key_scales = quantize_keys(torch.randn(num_keys, HEAD_DIM, device=device))
    q_fp8, weights = quantize_queries(torch.randn(chunk, HEADS, HEAD_DIM, device=device),
                                      torch.randn(chunk, HEADS, device=device))
    starts = torch.zeros(chunk, dtype=torch.int32, device=device)
    ends = torch.arange(prefix + 1, num_keys + 1, dtype=torch.int32, device=device)

    logits, ms = timed(device, deep_gemm.fp8_mqa_logits, q_fp8, (keys_fp8, key_scales),
                       weights, starts, ends, clean_logits=True)
    indices = select_topk(logits, ends)
    row = chunk - 1
    check_row(logits[row], q_fp8[row], weights[row], keys_fp8, key_scales)
    print(f"prefill: {chunk} queries x {num_keys} keys -> logits {tuple(logits.shape)} "
          f"in {ms:.2f} ms; top-{indices.shape[1]} of the last query: "
          f"{indices[row, :5].tolist()} ...")


def write_paged_cache(keys_fp8, key_scales, block_table, cache):
    """Store one sequence's tokens in the fused cache: each block holds its tokens' FP8 values,
    then their float32 scales."""
    num_blocks = cache.shape[0]
    blocks = cache.view(num_blocks, -1)
    values = blocks[:, :BLOCK_KV * HEAD_DIM].view(num_blocks, BLOCK_KV, HEAD_DIM)
    scales = blocks[:, BLOCK_KV * HEAD_DIM:].view(torch.float32)
    positions = torch.arange(keys_fp8.shape[0], device=cache.device)
    block_ids = block_table[positions // BLOCK_KV].long()
    offsets = positions % BLOCK_KV
    values[block_ids, offsets] = keys_fp8.view(torch.uint8)
    scales[block_ids, offsets] = key_scales


def decode_step(device, batch, max_len, next_n):
    """next_n new tokens per sequence (the last one and its MTP draft) against the cache."""
    max_blocks = -(-max_len // BLOCK_KV)
    num_blocks = batch * max_blocks
    cache = torch.zeros(num_blocks, BLOCK_KV, 1, HEAD_DIM + 4, dtype=torch.uint8, device=device)
    block_table = torch.randperm(num_blocks, device=device).view(batch, max_blocks).int()
    lengths = torch.randint(next_n, max_len + 1, (batch,), device=device)
    sequences = []
    for b in range(batch):
        keys_fp8, key_scales = quantize_keys(torch.randn(int(lengths[b]), HEAD_DIM,
                                                         device=device))
        write_paged_cache(keys_fp8, key_scales, block_table[b], cache)
        sequences.append((keys_fp8, key_scales))

    q_fp8, weights = quantize_queries(torch.randn(batch, next_n, HEADS, HEAD_DIM, device=device),
                                      torch.randn(batch, next_n, HEADS, device=device))
    weights = weights.view(batch * next_n, HEADS)
    # Token t of the next_n new ones sees the context up to itself.
    offsets = torch.arange(next_n, device=device) - next_n + 1
    context_lens = (lengths[:, None] + offsets).int()

    schedule = deep_gemm.get_paged_mqa_logits_metadata(context_lens, BLOCK_KV,
                                                       deep_gemm.get_num_sms())
    logits, ms = timed(device, deep_gemm.fp8_paged_mqa_logits, q_fp8, cache, weights,
                       context_lens, block_table, schedule, max_len, clean_logits=True)
    indices = select_topk(logits, context_lens.view(-1))
    keys_fp8, key_scales = sequences[0]
    row_len = int(context_lens[0, -1])
    check_row(logits[next_n - 1, :row_len], q_fp8[0, -1], weights[next_n - 1],
              keys_fp8[:row_len], key_scales[:row_len])
    print(f"decode: {batch} sequences x {next_n} tokens, contexts up to {max_len} -> logits "
          f"{tuple(logits.shape)} in {ms:.2f} ms; top-{indices.shape[1]} of row 0: "
          f"{indices[0, :5].tolist()} ...")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="CPU-sized shapes")
    options = parser.parse_args()
    device = torch.device(options.device)
    torch.manual_seed(0)
    if options.small:
        prefill_chunk(device, prefix=448, chunk=64)
        decode_step(device, batch=4, max_len=2500, next_n=2)
    else:
        prefill_chunk(device, prefix=6144, chunk=2048)
        decode_step(device, batch=64, max_len=16384, next_n=2)


if __name__ == "__main__":
    main()
