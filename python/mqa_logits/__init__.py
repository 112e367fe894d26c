"""mqa_logits: lightning-indexer logits of DeepSeek-style sparse attention.

A drop-in replacement for DeepGEMM's indexer functions: ``import mqa_logits as deep_gemm`` keeps
code that calls ``fp8_mqa_logits``, ``fp8_fp4_mqa_logits``, ``fp8_paged_mqa_logits``,
``fp8_fp4_paged_mqa_logits``, their metadata functions and ``get_num_sms`` / ``set_num_sms``
working, with the same argument names, order and defaults.

Arrays:
    torch tensors (CPU or CUDA) or numpy arrays (CPU). Outputs are allocated with the framework
    and on the device of the first tensor argument; CUDA work is queued on torch's current
    stream, and nothing synchronizes, so the calls can be captured in CUDA graphs. CPU arrays run
    the CPU reference backend.

Formats follow from the dtypes:
    FP8:   float8_e4m3fn values; no query scales; float32 key scales.
    MXFP8: float8_e4m3fn values; int32 scales (4 packed UE8M0 bytes, one per 32 elements).
    MXFP4: int8 or uint8 values (two e2m1 per byte, low nibble first); int32 scales.
    Byte values with no scales or float32 scales can only be FP8 and are read as e4m3 codes.

numpy, which has no float8 or bfloat16 type, passes FP8 as uint8 e4m3 codes. MXFP8 values,
bfloat16 weights and bfloat16 logits need ml_dtypes arrays (``ml_dtypes.float8_e4m3fn``,
``ml_dtypes.bfloat16``), or torch.

numpy helpers prepare the inputs: ``quantize_fp8``, ``quantize_mxfp8`` and ``quantize_mxfp4``
return ``(values, scales)`` pairs in the formats above, and ``write_paged_kv_cache`` stores a
sequence's keys in the fused paged KV cache that the decode functions read.

Empty calls (no query, no key, no sequence, rows with no context) return empty logits, or rows
of -inf with clean_logits, on every device.

Errors: a wrong type or dtype raises InvalidTypeError (a TypeError); any other invalid input
raises InvalidArgumentError (a ValueError). Both are RuntimeErrors too, as every refusal of
DeepGEMM is, so that ``except RuntimeError`` written for it still catches them. The message
names the argument as the Python function spells it (the scales of a ``(values, scales)`` pair
as, e.g., ``kv: scales (kv[1])``), then what was expected and what was given.
"""

from ._topk import merge_topk, mqa_topk, paged_mqa_topk, topk_per_row
from ._api import (
    cuda_backend_available,
    fp8_fp4_mqa_logits,
    fp8_fp4_paged_mqa_logits,
    fp8_mqa_logits,
    fp8_paged_mqa_logits,
    get_mqa_logits_metadata,
    get_num_sms,
    get_paged_mqa_logits_metadata,
    set_num_sms,
)
from ._errors import InvalidArgumentError, InvalidTypeError
from ._quantize import quantize_fp8, quantize_mxfp4, quantize_mxfp8, write_paged_kv_cache
from . import _C

__version__: str = _C.__version__

__all__ = [
    "fp8_fp4_mqa_logits",
    "fp8_fp4_paged_mqa_logits",
    "fp8_mqa_logits",
    "fp8_paged_mqa_logits",
    "get_mqa_logits_metadata",
    "get_num_sms",
    "get_paged_mqa_logits_metadata",
    "merge_topk",
    "mqa_topk",
    "paged_mqa_topk",
    "set_num_sms",
    "topk_per_row",
    "InvalidArgumentError",
    "InvalidTypeError",
    "cuda_backend_available",
    "quantize_fp8",
    "quantize_mxfp8",
    "quantize_mxfp4",
    "write_paged_kv_cache",
    "__version__",
]
