"""Malformed calls of every entry point; run as a script by test_errors.py.

Each call starts from valid arguments and applies a few random mutations: dtypes, ranks,
extents, strides (sliced, reversed, broadcast, transposed), misaligned data, garbage contents,
odd scalars. A call may succeed, or raise TypeError or ValueError (or MemoryError for outputs too
large to allocate) whose message starts with one of the function's own arguments and names no
argument the function does not have; anything else, and of course a crash, fails.
"""

import argparse
import sys
import traceback

import numpy as np

import mqa_logits
from reference import make_paged, make_prefill
from support import foreign_names, leading_argument

DTYPES = [np.uint8, np.int8, np.int32, np.int64, np.float32, np.float64, np.float16, np.bool_]
SCALARS = [0, 1, -1, 7, 64, 2**31, -(2**31), 2**62, 3.5, None, "x", True]
ACCEPTED = (TypeError, ValueError, MemoryError)


def misaligned(x):
    raw = np.empty(x.nbytes + 1, dtype=np.uint8)[1:]
    view = raw.view(x.dtype).reshape(x.shape) if x.nbytes else x
    view[...] = x
    return view


def array_mutations(rng, x):
    """Functions of one array; each returns an ill-formed (or oddly laid out) version."""
    axis = int(rng.integers(0, max(x.ndim, 1)))
    return [
        lambda: x.astype(DTYPES[rng.integers(len(DTYPES))]),
        lambda: x[None],
        lambda: x.reshape(-1),
        lambda: x[..., 0] if x.ndim and x.shape[-1] else x,
        lambda: np.take(x, np.arange(x.shape[axis] // 2), axis=axis) if x.ndim else x,
        lambda: np.flip(x, axis=axis) if x.ndim else x,
        lambda: np.swapaxes(x, 0, -1) if x.ndim > 1 else x,
        lambda: np.broadcast_to(x[:1], x.shape) if x.ndim and x.shape[0] else x,
        lambda: misaligned(x),
        lambda: np.empty((0,) + x.shape[1:], dtype=x.dtype),
        lambda: garbage(rng, x),
    ]


def garbage(rng, x):
    """Same layout, hostile contents: extreme integers, NaN and infinities."""
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        return rng.choice(np.array([info.min, info.max, -1, 0, 1, 10**6], dtype=np.int64),
                          size=x.shape).astype(x.dtype)
    if np.issubdtype(x.dtype, np.floating):
        return rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, 1e30], dtype=x.dtype),
                          size=x.shape)
    return x


def mutate(rng, args):
    """Apply one random mutation to one random argument, in place; return a description."""
    name = list(args)[rng.integers(len(args))]
    value = args[name]
    if isinstance(value, tuple):
        part = int(rng.integers(2))
        inner = list(value)
        if inner[part] is None or rng.random() < 0.2:
            inner[part] = (np.zeros(3, np.int32), None)[rng.integers(2)]
        else:
            options = array_mutations(rng, inner[part])
            inner[part] = options[rng.integers(len(options))]()
        args[name] = tuple(inner) if rng.random() < 0.9 else inner + [None]
        return f"{name}[{part}]"
    if isinstance(value, np.ndarray):
        options = array_mutations(rng, value)
        choice = int(rng.integers(len(options)))
        args[name] = options[choice]()
        return f"{name} (mutation {choice})"
    args[name] = SCALARS[rng.integers(len(SCALARS))]
    return f"{name} = {args[name]!r}"


def prefill_call(rng):
    case = make_prefill(rng, ["fp8", "mxfp4"][rng.integers(2)], 8, 16, 64, 40)
    args = case.api_args()
    args.update(clean_logits=True, max_seqlen_k=0, schedule_meta=None)
    if rng.random() < 0.3:
        args["schedule_meta"] = mqa_logits.get_mqa_logits_metadata(
            case.start, case.end, case.seq_len_kv, case.num_heads)
    return mqa_logits.fp8_fp4_mqa_logits, args


def paged_call(rng):
    case = make_paged(rng, ["fp8", "mxfp4"][rng.integers(2)], batch=3, next_n=2, num_heads=16,
                      head_dim=64, block_kv=32, max_context_len=90)
    args = case.api_args()
    args["schedule_meta"] = mqa_logits.get_paged_mqa_logits_metadata(
        args["context_lens"], 32, mqa_logits.get_num_sms())
    args.update(clean_logits=True)
    return mqa_logits.fp8_fp4_paged_mqa_logits, args


def paged_metadata_call(rng):
    lens = rng.integers(0, 500, size=(4, 2)).astype(np.int32)
    return mqa_logits.get_paged_mqa_logits_metadata, dict(
        context_lens=lens, block_kv=64, num_sms=5, indices=None)


def prefill_metadata_call(rng):
    start = np.zeros(6, np.int32)
    return mqa_logits.get_mqa_logits_metadata, dict(
        cu_seq_len_k_start=start, cu_seq_len_k_end=start + 9, num_kv_tokens=20, num_heads=16)


CALLS = [prefill_call, paged_call, paged_metadata_call, prefill_metadata_call]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=20240601)
    options = parser.parse_args()
    rng = np.random.default_rng(options.seed)
    outcomes = {}
    for index in range(options.calls):
        function, args = CALLS[index % len(CALLS)](rng)
        with np.errstate(all="ignore"):  # casts to narrower dtypes overflow on purpose
            mutations = [mutate(rng, args) for _ in range(int(rng.integers(1, 4)))]
        try:
            function(**args)
            outcome = "ok"
        except ACCEPTED as error:
            outcome = type(error).__name__
            message = str(error)
            if not isinstance(error, MemoryError) and (
                    leading_argument(message) not in args or foreign_names(function, message)):
                print(f"call {index}: {function.__name__} with {mutations}: a message not in "
                      f"the caller's words: {message}")
                return 1
        except Exception:
            print(f"call {index}: {function.__name__} with {mutations} raised:")
            traceback.print_exc(file=sys.stdout)
            return 1
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print("calls:", options.calls, outcomes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
