"""Context parallelism over torch.distributed on the CPU (gloo): 2 and 4 processes, each with a
shard of the keys, must give the one-process top-k over all the keys (context_parallel_checks.py:
prefill with random windows, decode with 1-D and 2-D lengths and next_n 1-4, contiguous and
interleaved shards, ties across the shards)."""

import pytest

from support import requires_torch, torch


@requires_torch
@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_top_k_equals_one_process(tmp_path, world):
    import context_parallel_checks

    torch.multiprocessing.spawn(context_parallel_checks.run,
                                args=(world, str(tmp_path / "rendezvous")), nprocs=world,
                                join=True)
