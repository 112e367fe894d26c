"""What each process of tests/python/test_distributed.py runs: the same global inputs on every
rank (one seed), the rank's shard of the keys, the context-parallel top-k, and the one-process
top-k over all the keys, which it must equal bitwise (indices and values)."""

import numpy as np
import torch
import torch.distributed as dist

import mqa_logits
from mqa_logits import distributed as cp
from reference import make_prefill

TOPKS = (1, 64, 2048)


def shard(rank, world, keys, interleaved):
    """(positions of the rank's keys, key_offset, key_stride)."""
    if interleaved:
        return np.arange(rank, keys, world), rank, world
    chunk = -(-keys // world)
    first = min(rank * chunk, keys)
    return np.arange(first, min(first + chunk, keys)), first, 1


def with_ties(rng, values, scales, count):
    """Copies `count` random keys over others: equal logits at keys of different shards."""
    src = rng.integers(0, len(values), size=count)
    dst = rng.integers(0, len(values), size=count)
    values[dst] = values[src]
    scales[dst] = scales[src]


def assert_same(got, want, what):
    assert torch.equal(got[0], want[0]), what
    assert torch.equal(got[1].view(torch.int32), want[1].view(torch.int32)), what


def check_prefill(rank, world):
    rng = np.random.default_rng(1234)
    case = make_prefill(rng, "fp8", seq_len=24, num_heads=8, head_dim=64, seq_len_kv=3100)
    with_ties(rng, case.kv, case.kv_scales, 400)
    args = case.api_args("torch")
    values, scales = args["kv"]
    for interleaved in (False, True):
        positions, offset, stride = shard(rank, world, case.seq_len_kv, interleaved)
        local_kv = (values[positions].contiguous(), scales[positions].contiguous())
        for topk in TOPKS:
            for absolute in (False, True):
                want = mqa_logits.mqa_topk(**args, topk=topk, absolute_indices=absolute,
                                           return_values=True)
                got = cp.context_parallel_mqa_topk(
                    args["q"], local_kv, args["weights"], args["cu_seq_len_k_start"],
                    args["cu_seq_len_k_end"], topk, key_offset=offset, key_stride=stride,
                    absolute_indices=absolute, return_values=True)
                assert_same(got, want, f"prefill interleaved={interleaved} topk={topk}")


def paged_cache(keys_per_sequence, block_kv, head_dim, rng):
    """A fused FP8 cache of the sequences' keys in shuffled blocks, and its block table."""
    max_blocks = max(1, max(-(-len(v) // block_kv) for v, _ in keys_per_sequence))
    blocks = len(keys_per_sequence) * max_blocks
    cache = np.zeros((blocks, block_kv, 1, head_dim + 4), np.uint8)
    table = rng.permutation(blocks).astype(np.int32).reshape(len(keys_per_sequence), max_blocks)
    for b, (values, scales) in enumerate(keys_per_sequence):
        if len(values):
            mqa_logits.write_paged_kv_cache(cache, (values, scales), table[b])
    return torch.from_numpy(cache), torch.from_numpy(table)


def check_decode(rank, world):
    rng = np.random.default_rng(4321)
    batch, heads, dim, block_kv = 3, 8, 64, 32
    for next_n, lens_2d in ((1, False), (2, True), (4, False), (3, True)):
        lengths = rng.integers(0, 2600, size=batch)
        lengths[0] = 2600
        keys = []
        for length in lengths:
            values, scales = mqa_logits.quantize_fp8(rng.standard_normal((int(length), dim)))
            if length:
                with_ties(rng, values, scales, 200)
            keys.append((values, scales))
        if lens_2d:
            lens = np.sort(np.maximum(lengths[:, None] - rng.integers(0, 5, (batch, next_n)), 0),
                           axis=1).astype(np.int32)
        else:
            lens = lengths.astype(np.int32)
        max_len = int(lengths.max())
        q, q_scales = mqa_logits.quantize_fp8(rng.standard_normal((batch * next_n, heads * dim)))
        weights = (rng.standard_normal((batch * next_n, heads)) * q_scales[:, None])
        q = torch.from_numpy(q.reshape(batch, next_n, heads, dim)).view(torch.float8_e4m3fn)
        weights = torch.from_numpy(weights.astype(np.float32))
        lens_t = torch.from_numpy(lens)

        cache, table = paged_cache(keys, block_kv, dim, rng)
        meta = mqa_logits.get_paged_mqa_logits_metadata(lens_t, block_kv, mqa_logits.get_num_sms())
        for interleaved in (True, False):
            # A contiguous shard holds the same chunk of every sequence: chunks of the longest.
            held, offset, stride = shard(rank, world, max_len, interleaved)
            shard_keys = None if interleaved else len(held)
            local = [(v[held[held < len(v)]], s[held[held < len(v)]]) for v, s in keys]
            local_cache, local_table = paged_cache(local, block_kv, dim, rng)
            for topk in TOPKS:
                want = mqa_logits.paged_mqa_topk(q, cache, weights, lens_t, table, meta, max_len,
                                                 topk, return_values=True)
                got = cp.context_parallel_paged_mqa_topk(
                    q, local_cache, weights, lens_t, local_table, max_len, topk,
                    key_offset=offset, key_stride=stride, shard_keys=shard_keys,
                    return_values=True)
                assert_same(got, want, f"decode next_n={next_n} interleaved={interleaved} "
                                       f"topk={topk}")


def run(rank, world, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        check_prefill(rank, world)
        check_decode(rank, world)
    finally:
        dist.destroy_process_group()
