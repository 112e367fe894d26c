"""Framework adaptation: torch tensors and numpy arrays in, array descriptors out.

Every array crosses into the extension as a descriptor, the tuple

    (data_ptr, DType, shape, strides in elements, device: -1 host or the CUDA ordinal)

A descriptor of a torch tensor costs five attribute reads; a DLPack capsule per array cost several
times more, which made a call's host time a multiple of the reference's. float8 and bfloat16 have no
type code in every framework (numpy has none at all), so the element type
(:class:`mqa_logits._C.DType`) is part of the descriptor. The caller's arrays stay referenced for
the whole call, so the pointers stay valid. Outputs are allocated with the framework and on the
device of a reference input, and CUDA work is queued on that framework's current stream.
"""

from __future__ import annotations

import numbers
import operator
from typing import Any, Dict, Iterable, Optional, Tuple

import numpy as np

from . import _C
from ._C import DType
from ._errors import InvalidArgumentError, InvalidTypeError

try:
    import torch
except ImportError:  # the numpy path works without torch
    torch = None

try:
    import ml_dtypes  # numpy float8_e4m3fn and bfloat16
except ImportError:
    ml_dtypes = None

# A descriptor (see the module's docstring) and its fields.
Descriptor = Tuple[int, DType, Tuple[int, ...], Tuple[int, ...], int]
DATA, DTYPE, SHAPE, STRIDES, DEVICE = range(5)
HOST = -1

# Element type names as the frameworks spell them, for messages and for `logits_dtype`.
_NAMES = {
    DType.float8_e4m3: "float8_e4m3fn",
    DType.uint8: "uint8",
    DType.int8: "int8",
    DType.int32: "int32",
    DType.float32: "float32",
    DType.bfloat16: "bfloat16",
}

DEFAULT_LOGITS_DTYPE: Any = torch.float32 if torch is not None else np.float32

_INT32_RANGE = (-(2**31), 2**31 - 1)
_INT64_RANGE = (-(2**63), 2**63 - 1)


def _torch_dtypes() -> Dict[Any, DType]:
    table = {
        torch.float8_e4m3fn: DType.float8_e4m3,
        torch.uint8: DType.uint8,
        torch.int8: DType.int8,
        torch.int32: DType.int32,
        torch.float32: DType.float32,
        torch.bfloat16: DType.bfloat16,
    }
    packed_fp4 = getattr(torch, "float4_e2m1fn_x2", None)  # two e2m1 per byte, as MXFP4 stores
    if packed_fp4 is not None:
        table[packed_fp4] = DType.uint8
    return table


def _numpy_dtypes() -> Dict[Any, DType]:
    table = {
        np.dtype(np.uint8): DType.uint8,
        np.dtype(np.int8): DType.int8,
        np.dtype(np.int32): DType.int32,
        np.dtype(np.float32): DType.float32,
    }
    if ml_dtypes is not None:
        table[np.dtype(ml_dtypes.float8_e4m3fn)] = DType.float8_e4m3
        table[np.dtype(ml_dtypes.bfloat16)] = DType.bfloat16
    return table


_Tensor: Any = torch.Tensor if torch is not None else ()
_TORCH_DTYPES = _torch_dtypes() if torch is not None else {}
_NUMPY_DTYPES = _numpy_dtypes()

# Element type -> framework dtype, for the outputs the library writes.
TORCH_OUTPUTS = ({DType.float32: torch.float32, DType.bfloat16: torch.bfloat16,
                  DType.int32: torch.int32, DType.uint8: torch.uint8}
                 if torch is not None else {})
_NUMPY_OUTPUTS = {DType.float32: np.dtype(np.float32), DType.int32: np.dtype(np.int32),
                  DType.uint8: np.dtype(np.uint8)}
if ml_dtypes is not None:
    _NUMPY_OUTPUTS[DType.bfloat16] = np.dtype(ml_dtypes.bfloat16)


def _names(dtypes: Iterable[DType]) -> str:
    return " or ".join(_NAMES[d] for d in dtypes)


class Accepted:
    """The element types an argument accepts, looked up per framework dtype in one step."""

    __slots__ = ("dtypes", "torch", "numpy", "reason")

    def __init__(self, *dtypes: DType, reason: str = ""):
        self.dtypes = dtypes
        self.torch = {key: d for key, d in _TORCH_DTYPES.items() if d in dtypes}
        self.numpy = {key: d for key, d in _NUMPY_DTYPES.items() if d in dtypes}
        self.reason = reason  # why the others are refused, for the message

    def refuse(self, name: str, dtype_name: str) -> InvalidTypeError:
        why = f" ({self.reason})" if self.reason else ""
        return InvalidTypeError(
            f"{name}: expected dtype {_names(self.dtypes)}{why}, got {dtype_name}")


BYTES = Accepted(DType.float8_e4m3, DType.uint8, DType.int8)
Q_SCALES = Accepted(DType.int32)
KV_SCALES = Accepted(DType.float32, DType.int32)
WEIGHTS = Accepted(DType.float32, DType.bfloat16)
INT32 = Accepted(DType.int32)


def describe(name: str, x: Any, accepted: Accepted) -> Descriptor:
    """`x`'s descriptor; TypeError when its element type is not accepted."""
    if isinstance(x, _Tensor):
        dtype = accepted.torch.get(x.dtype)
        if dtype is None:
            raise accepted.refuse(name, str(x.dtype).replace("torch.", ""))
        if x.is_cuda:
            device = x.get_device()
        elif x.is_cpu:
            device = HOST
        else:
            raise InvalidArgumentError(
                f"{name}: expected a CPU or CUDA tensor, got device {x.device}")
        return (x.data_ptr(), dtype, x.shape, x.stride(), device)
    if isinstance(x, np.ndarray):
        if not x.dtype.isnative:
            raise accepted.refuse(name, f"{x.dtype.name} (non-native byte order)")
        dtype = accepted.numpy.get(x.dtype)
        if dtype is None:
            raise accepted.refuse(name, x.dtype.name)
        return _numpy_descriptor(name, x, dtype)
    raise InvalidTypeError(
        f"{name}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def _numpy_descriptor(name: str, x: np.ndarray, dtype: DType) -> Descriptor:
    itemsize = x.itemsize
    if any(stride % itemsize for stride in x.strides):
        raise InvalidArgumentError(
            f"{name}: expected strides that are multiples of the element size "
            f"({itemsize} bytes), got {x.strides} bytes")
    strides = tuple(stride // itemsize for stride in x.strides)
    return (x.__array_interface__["data"][0], dtype, x.shape, strides, HOST)


def describe_optional(name: str, x: Any, accepted: Accepted) -> Optional[Descriptor]:
    return None if x is None else describe(name, x, accepted)


def retyped(descriptor: Descriptor, dtype: DType) -> Descriptor:
    """The same array read as another element type of the same size."""
    return (descriptor[DATA], dtype, descriptor[SHAPE], descriptor[STRIDES], descriptor[DEVICE])


def leading_size(descriptor: Descriptor, dims: int) -> int:
    """Product of the first `dims` extents; 0 when there are fewer (validation reports it)."""
    shape = descriptor[SHAPE]
    if len(shape) < dims:
        return 0
    size = 1
    for extent in shape[:dims]:
        size *= int(extent)
    return size


def operand(name: str, x: Any,
            scales_accepted: Accepted) -> Tuple[Any, Descriptor, Optional[Descriptor]]:
    """A tensor, or a ``(values, scales)`` pair whose scales may be None: (the values array,
    its descriptor, the scales' descriptor or None).

    The format follows from the element types: float8_e4m3fn values are FP8 (no scales, or fp32
    key scales) or MXFP8 (int32 scales); byte values (uint8/int8) with int32 scales are packed
    MXFP4. Byte values with no scales or fp32 scales can only be FP8, so they are taken as e4m3
    codes: that is how numpy, which has no float8 type, passes FP8 data.
    """
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise InvalidTypeError(
                f"{name}: expected a tensor or a (values, scales) pair, "
                f"got a {type(x).__name__} of {len(x)}")
        values, scales = x
    else:
        values, scales = x, None
    values_descriptor = describe(name, values, BYTES)
    scales_descriptor = describe_optional(scales_name(name), scales, scales_accepted)
    if (values_descriptor[DTYPE] is not DType.float8_e4m3 and
            (scales_descriptor is None or scales_descriptor[DTYPE] is DType.float32)):
        values_descriptor = retyped(values_descriptor, DType.float8_e4m3)
    return values, values_descriptor, scales_descriptor


def prefill_operands(q: Any, kv: Any, weights: Any, start: Any, end: Any,
                     weights_accepted: Accepted) -> tuple:
    """A prefill call's inputs described, in argument order: (q's values array, q, q's scales,
    kv, kv's scales, weights, start, end)."""
    q_values, q_array, q_scales = operand("q", q, Q_SCALES)
    _, kv_array, kv_scales = operand("kv", kv, KV_SCALES)
    return (q_values, q_array, q_scales, kv_array, kv_scales,
            describe("weights", weights, weights_accepted),
            describe("cu_seq_len_k_start", start, INT32),
            describe("cu_seq_len_k_end", end, INT32))


def paged_operands(q: Any, kv_cache: Any, weights: Any, context_lens: Any, block_table: Any,
                   schedule_meta: Any, weights_accepted: Accepted) -> tuple:
    """A decode call's inputs described, in argument order: (q's values array, q, q's scales,
    cache, weights, context_lens, block_table, schedule_meta)."""
    q_values, q_array, q_scales = operand("q", q, Q_SCALES)
    return (q_values, q_array, q_scales, byte_view("kv_cache", kv_cache),
            describe("weights", weights, weights_accepted),
            describe("context_lens", context_lens, INT32),
            describe("block_table", block_table, INT32),
            describe("schedule_meta", schedule_meta, INT32))


def scales_name(name: str) -> str:
    """How messages name the scales of an operand passed as a ``(values, scales)`` pair."""
    return f"{name}: scales ({name}[1])"


def byte_view(name: str, x: Any) -> Descriptor:
    """Any 1-byte array as raw bytes (the fused KV cache, however the caller typed it)."""
    return retyped(describe(name, x, BYTES), DType.uint8)


def as_int(name: str, value: Any, bits: int = 64) -> int:
    try:
        result = operator.index(value)
    except TypeError:
        raise InvalidTypeError(f"{name}: expected an int, got {type(value).__name__}") from None
    low, high = _INT32_RANGE if bits == 32 else _INT64_RANGE
    if not low <= result <= high:
        raise InvalidArgumentError(f"{name}: expected an int{bits} value, got {result}")
    return result


def as_bool(name: str, value: Any) -> bool:
    """A flag as the reference's pybind11 binding converts one: None is False; a bool, a number
    (Python or numpy: nonzero is True) or a one-element tensor is its truth value; anything else
    (a string, a list, a tensor of several elements) is refused."""
    if value is True or value is False:
        return value
    if value is None:
        return False
    if isinstance(value, (numbers.Number, np.bool_, np.number)):
        return bool(value)
    if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1:
        return bool(value)
    raise InvalidTypeError(
        f"{name}: expected a bool (or a number, or a one-element tensor), "
        f"got {type(value).__name__}")


def logits_dtype_of(value: Any) -> DType:
    """`logits_dtype` as a torch dtype, a numpy dtype or a name: float32 or bfloat16."""
    if torch is not None and isinstance(value, torch.dtype):
        name = str(value).replace("torch.", "")
    elif isinstance(value, str):
        name = value
    else:
        try:
            name = np.dtype(value).name
        except TypeError:
            name = repr(value)
    for dtype in (DType.float32, DType.bfloat16):
        if _NAMES[dtype] == name:
            return dtype
    raise InvalidTypeError(f"logits_dtype: expected float32 or bfloat16, got {name}")


def stream_of(descriptor: Descriptor) -> int:
    """The CUDA stream to queue work on: torch's current stream of the array's device (0 for
    host arrays)."""
    device = descriptor[DEVICE]
    if device == HOST:
        return 0
    return torch._C._cuda_getCurrentRawStream(device)


def new_array(like: Any, shape: Tuple[int, ...], strides: Tuple[int, ...],
              dtype: DType) -> Tuple[Any, Descriptor]:
    """An uninitialized output of `like`'s framework and device, with these element strides,
    and its descriptor."""
    if isinstance(like, _Tensor):
        array = torch.empty_strided(shape, strides, dtype=TORCH_OUTPUTS[dtype],
                                    device=like.device)
        device = array.get_device() if array.is_cuda else HOST
        return array, (array.data_ptr(), dtype, shape, strides, device)
    array = _numpy_empty_strided(shape, strides, dtype)
    return array, (array.__array_interface__["data"][0], dtype, shape, strides, HOST)


def new_logits(like: Any, layout: Tuple[int, int, int], dtype: DType) -> Tuple[Any, Descriptor]:
    """Logits of the library's layout: [rows, cols] with rows `row_stride` elements apart.

    Logits with no element (no row or no column) keep a row stride of one padded row (1024
    bytes): a framework's own strides of an empty array (one element, or numpy's zeros) are
    not what the validation of device outputs accepts (rows 16-byte aligned)."""
    rows, cols, row_stride = layout
    if rows == 0 or cols == 0:
        row_stride = max(row_stride, _C.paged_mqa_logits_output_layout(1, 1, dtype)[2])
    return new_array(like, (rows, cols), (row_stride, 1), dtype)


# numpy outputs start at a multiple of this many bytes (rows then start at multiples of the
# row stride, 1024 bytes, from it).
_NUMPY_ALIGNMENT = 256


def _numpy_empty_strided(shape: Tuple[int, ...], strides: Tuple[int, ...],
                         dtype: DType) -> np.ndarray:
    numpy_dtype = _NUMPY_OUTPUTS.get(dtype)
    if numpy_dtype is None:
        raise InvalidTypeError(
            f"logits_dtype: {_NAMES[dtype]} numpy arrays need the ml_dtypes "
            "package (pip install ml_dtypes)")
    byte_strides = tuple(stride * numpy_dtype.itemsize for stride in strides)
    if 0 in shape:
        return np.lib.stride_tricks.as_strided(np.empty(0, numpy_dtype), shape, byte_strides)
    count = 1 + sum((extent - 1) * stride for extent, stride in zip(shape, strides))
    nbytes = count * numpy_dtype.itemsize
    raw = np.empty(nbytes + _NUMPY_ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % _NUMPY_ALIGNMENT
    buffer = raw[offset:offset + nbytes].view(numpy_dtype)
    return np.lib.stride_tricks.as_strided(buffer, shape, byte_strides)
