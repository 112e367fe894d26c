"""Context-parallel prefill top-k against one GPU: one request of S queries over T keys (causal,
queries at the end), the keys split into R contiguous chunks, one a rank. Run under torchrun on R
GPUs of one host (NCCL):

    torchrun --nproc-per-node 2 bench/python/context_parallel.py [--seq-len 8192 --keys 131072]

Every rank times its context-parallel call (CUDA events around a loop of calls, after a
warm-up; the collectives synchronize the ranks); rank 0 also times mqa_topk over all the keys on
its own GPU, checks that the two give the same indices, and prints both times, their ratio and
the bytes each rank sent (S x k x 8: float32 values and int32 keys).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist

import mqa_logits
from mqa_logits import distributed as cp


def timed_us(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--keys", type=int, default=131072)
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    S, T, H, D, k = args.seq_len, args.keys, 64, 128, args.topk

    rng = np.random.default_rng(7)  # the same inputs on every rank
    q, q_scales = mqa_logits.quantize_fp8(rng.standard_normal((S, H * D), np.float32))
    keys, key_scales = mqa_logits.quantize_fp8(rng.standard_normal((T, D), np.float32))
    weights = (rng.standard_normal((S, H)) * q_scales[:, None]).astype(np.float32)
    dev = torch.device("cuda")
    q = torch.from_numpy(q.reshape(S, H, D)).view(torch.float8_e4m3fn).to(dev)
    keys = torch.from_numpy(keys).view(torch.float8_e4m3fn).to(dev)
    key_scales = torch.from_numpy(key_scales).to(dev)
    weights = torch.from_numpy(weights).to(dev)
    starts = torch.zeros(S, dtype=torch.int32, device=dev)
    ends = torch.arange(T - S + 1, T + 1, dtype=torch.int32, device=dev)

    chunk = -(-T // world)
    first = min(rank * chunk, T)
    local_kv = (keys[first:first + chunk].contiguous(),
                key_scales[first:first + chunk].contiguous())
    call = lambda: cp.context_parallel_mqa_topk(q, local_kv, weights, starts, ends, k,
                                                key_offset=first)
    parallel_us = timed_us(call, args.iters)
    if rank == 0:
        whole = lambda: mqa_logits.mqa_topk(q, (keys, key_scales), weights, starts, ends, k)
        same = torch.equal(call(), whole())
        one_us = timed_us(whole, args.iters)
        print(f"S={S} T={T} k={k}: {world} GPUs {parallel_us:.1f} us, 1 GPU {one_us:.1f} us, "
              f"ratio {parallel_us / one_us:.3f}; sent per rank {S * k * 8} bytes; "
              f"same indices: {same}")
    else:
        call()  # rank 0's check call
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
