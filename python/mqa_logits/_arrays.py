"""Framework adaptation: torch tensors and numpy arrays in, ``(array, DType)`` pairs out.

Arrays cross into the extension through DLPack. float8 and bfloat16 have no DLPack type code in
every framework (numpy has none at all), so every array crosses as a view of a plain type of the
same size, and its element type (:class:`mqa_logits._C.DType`) travels beside it. Outputs are
allocated with the framework and on the device of a reference input, and CUDA work is queued on
that framework's current stream.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, ContextManager, Dict, Iterable, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import _C
from ._C import DType

try:
    import torch
except ImportError:  # the numpy path works without torch
    torch = None

try:
    import ml_dtypes  # numpy float8_e4m3fn and bfloat16
except ImportError:
    ml_dtypes = None

# Accepted element types per kind of argument.
BYTES = (DType.float8_e4m3, DType.uint8, DType.int8)
Q_SCALES = (DType.int32,)
KV_SCALES = (DType.float32, DType.int32)
WEIGHTS = (DType.float32, DType.bfloat16)
INT32 = (DType.int32,)
LOGITS = (DType.float32, DType.bfloat16)

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

# Framework dtype -> (element type, same-sized carrier dtype to cross as, or None if it crosses
# as itself).
_Entry = Tuple[DType, Any]


def _torch_dtypes() -> Dict[Any, _Entry]:
    table = {
        torch.float8_e4m3fn: (DType.float8_e4m3, torch.uint8),
        torch.uint8: (DType.uint8, None),
        torch.int8: (DType.int8, None),
        torch.int32: (DType.int32, None),
        torch.float32: (DType.float32, None),
        torch.bfloat16: (DType.bfloat16, torch.int16),
    }
    packed_fp4 = getattr(torch, "float4_e2m1fn_x2", None)  # two e2m1 per byte, as MXFP4 stores
    if packed_fp4 is not None:
        table[packed_fp4] = (DType.uint8, torch.uint8)
    return table


def _numpy_dtypes() -> Dict[Any, _Entry]:
    table = {
        np.dtype(np.uint8): (DType.uint8, None),
        np.dtype(np.int8): (DType.int8, None),
        np.dtype(np.int32): (DType.int32, None),
        np.dtype(np.float32): (DType.float32, None),
    }
    if ml_dtypes is not None:
        table[np.dtype(ml_dtypes.float8_e4m3fn)] = (DType.float8_e4m3, np.uint8)
        table[np.dtype(ml_dtypes.bfloat16)] = (DType.bfloat16, np.uint16)
    return table


_TORCH_DTYPES = _torch_dtypes() if torch is not None else {}
_NUMPY_DTYPES = _numpy_dtypes()

# Element type -> framework dtype, for the outputs the library writes.
_TORCH_OUTPUTS = ({DType.float32: torch.float32, DType.bfloat16: torch.bfloat16,
                   DType.int32: torch.int32} if torch is not None else {})
_NUMPY_OUTPUTS = {DType.float32: np.dtype(np.float32), DType.int32: np.dtype(np.int32)}
if ml_dtypes is not None:
    _NUMPY_OUTPUTS[DType.bfloat16] = np.dtype(ml_dtypes.bfloat16)


def _names(dtypes: Iterable[DType]) -> str:
    return " or ".join(_NAMES[d] for d in dtypes)


class Array(NamedTuple):
    """A caller's array, its element type, and the view of it that crosses into the extension."""

    user: Any
    dtype: DType
    carrier: Any

    def pair(self) -> Tuple[Any, DType]:
        return (self.carrier, self.dtype)

    def leading_size(self, dims: int) -> int:
        """Product of the first `dims` extents; 0 when there are fewer (validation reports it)."""
        shape = self.user.shape
        if len(shape) < dims:
            return 0
        size = 1
        for extent in shape[:dims]:
            size *= int(extent)
        return size


def _framework_entry(name: str, x: Any) -> Tuple[Any, Optional[_Entry], str]:
    """(the array ready to cross, its dtype entry or None if unsupported, its dtype's name)."""
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name}: expected a CPU or CUDA tensor, got device {x.device}")
        return x.detach(), _TORCH_DTYPES.get(x.dtype), str(x.dtype).replace("torch.", "")
    if isinstance(x, np.ndarray):
        if not x.dtype.isnative:
            return x, None, f"{x.dtype.name} (non-native byte order)"
        return x, _NUMPY_DTYPES.get(x.dtype), x.dtype.name
    raise TypeError(f"{name}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def _dense_strides(shape: Sequence[int], itemsize: int) -> Tuple[int, ...]:
    """Strides (in units of `itemsize`: bytes for numpy, 1 for torch's element strides) of a
    row-major array, counting an empty dim as one element, as torch does."""
    strides = []
    step = itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(int(extent), 1)
    return tuple(reversed(strides))


def _empty_carrier(x: Any) -> Any:
    """numpy 2 gives every dim of an empty array the stride 0 (and torch.from_numpy keeps it),
    which reads as a non-contiguous last dim or overlapping rows: an empty array with a zero
    stride crosses with row-major strides instead. No element is ever addressed through it."""
    if isinstance(x, np.ndarray):
        if x.size != 0 or 0 not in x.strides:
            return x
        return np.lib.stride_tricks.as_strided(x, x.shape, _dense_strides(x.shape, x.itemsize),
                                               writeable=x.flags.writeable)
    if x.numel() != 0 or 0 not in x.stride():
        return x
    return x.as_strided(x.shape, _dense_strides(x.shape, 1))


def adapt(name: str, x: Any, accepted: Sequence[DType], reason: str = "") -> Array:
    """Check `x`'s element type against `accepted` (TypeError) and make its crossing view."""
    x, entry, dtype_name = _framework_entry(name, x)
    if entry is None or entry[0] not in accepted:
        why = f" ({reason})" if reason else ""
        raise TypeError(f"{name}: expected dtype {_names(accepted)}{why}, got {dtype_name}")
    dtype, carrier_dtype = entry
    carrier = x if carrier_dtype is None else x.view(carrier_dtype)
    return Array(x, dtype, _empty_carrier(carrier))


def adapt_optional(name: str, x: Any, accepted: Sequence[DType]) -> Optional[Array]:
    return None if x is None else adapt(name, x, accepted)


def pair_of(array: Optional[Array]) -> Optional[Tuple[Any, DType]]:
    return None if array is None else array.pair()


class Operand(NamedTuple):
    """A quantized operand: values and, depending on the format, scales."""

    values: Array
    scales: Optional[Array]

    def pair(self) -> Tuple[Tuple[Any, DType], Optional[Tuple[Any, DType]]]:
        return (self.values.pair(), pair_of(self.scales))


def operand(name: str, x: Any, scales_accepted: Sequence[DType]) -> Operand:
    """A tensor, or a ``(values, scales)`` pair whose scales may be None.

    The format follows from the element types: float8_e4m3fn values are FP8 (no scales, or fp32
    key scales) or MXFP8 (int32 scales); byte values (uint8/int8) with int32 scales are packed
    MXFP4. Byte values with no scales or fp32 scales can only be FP8, so they are taken as e4m3
    codes: that is how numpy, which has no float8 type, passes FP8 data.
    """
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise TypeError(f"{name}: expected a tensor or a (values, scales) pair, "
                            f"got a {type(x).__name__} of {len(x)}")
        values, scales = x
    else:
        values, scales = x, None
    values_array = adapt(name, values, BYTES)
    scales_array = adapt_optional(scales_name(name), scales, scales_accepted)
    if scales_array is None or scales_array.dtype == DType.float32:
        values_array = values_array._replace(dtype=DType.float8_e4m3)
    return Operand(values_array, scales_array)


def scales_name(name: str) -> str:
    """How messages name the scales of an operand passed as a ``(values, scales)`` pair."""
    return f"{name}: scales ({name}[1])"


def byte_view(name: str, x: Any) -> Array:
    """Any 1-byte array as raw bytes (the fused KV cache, however the caller typed it)."""
    return adapt(name, x, BYTES)._replace(dtype=DType.uint8)


def as_int(name: str, value: Any, bits: int = 64) -> int:
    try:
        result = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None
    low, high = _INT32_RANGE if bits == 32 else _INT64_RANGE
    if not low <= result <= high:
        raise ValueError(f"{name}: expected an int{bits} value, got {result}")
    return result


def as_bool(name: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")


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
    for dtype in LOGITS:
        if _NAMES[dtype] == name:
            return dtype
    raise TypeError(f"logits_dtype: expected float32 or bfloat16, got {name}")


class Place:
    """Where a call's outputs live and its work runs: a reference input's framework and device."""

    def empty(self, shape: Tuple[int, int], dtype: DType) -> Any:
        raise NotImplementedError

    def empty_strided(self, shape: Tuple[int, int], strides: Tuple[int, int],
                      dtype: DType) -> Any:
        """An array with no element (a zero in `shape`) and these element strides."""
        raise NotImplementedError

    def stream(self) -> int:
        """The CUDA stream handle to queue work on (0: host arrays)."""
        return 0

    def active(self) -> ContextManager[Any]:
        """Makes the place's device current while the library runs."""
        return contextlib.nullcontext()

    def output(self, name: str, shape: Tuple[int, int], dtype: DType) -> Array:
        return adapt(name, self.empty(shape, dtype), (dtype,))

    def logits(self, layout: Tuple[int, int, int], dtype: DType) -> Array:
        """Logits of the library's layout: a [rows, cols] view of a [rows, row_stride] buffer.

        Logits with no element (no row or no column) keep a row stride of one padded row (1024
        bytes): a framework's own strides of an empty array (one element, or numpy's zeros) are
        not what the validation of device outputs accepts (rows 16-byte aligned)."""
        rows, cols, row_stride = layout
        if rows == 0 or cols == 0:
            row_unit = _C.paged_mqa_logits_output_layout(1, 1, dtype)[2]
            buffer = self.empty_strided((rows, cols), (max(row_stride, row_unit), 1), dtype)
            return adapt("logits", buffer, (dtype,))
        buffer = self.empty((rows, row_stride), dtype)
        return adapt("logits", buffer[:, :cols], (dtype,))


class _TorchPlace(Place):
    def __init__(self, device: Any) -> None:
        self.device = device

    def empty(self, shape: Tuple[int, int], dtype: DType) -> Any:
        return torch.empty(shape, dtype=_TORCH_OUTPUTS[dtype], device=self.device)

    def empty_strided(self, shape: Tuple[int, int], strides: Tuple[int, int],
                      dtype: DType) -> Any:
        return torch.empty_strided(shape, strides, dtype=_TORCH_OUTPUTS[dtype],
                                   device=self.device)

    def stream(self) -> int:
        if self.device.type != "cuda":
            return 0
        return torch.cuda.current_stream(self.device).cuda_stream

    def active(self) -> ContextManager[Any]:
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return torch.cuda.device(self.device)


class _NumpyPlace(Place):
    # Rows start at multiples of the row stride (1024 bytes) from a base this aligned.
    _ALIGNMENT = 256

    def empty(self, shape: Tuple[int, int], dtype: DType) -> Any:
        numpy_dtype = self._numpy_dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * numpy_dtype.itemsize
        raw = np.empty(nbytes + self._ALIGNMENT, dtype=np.uint8)
        offset = -raw.ctypes.data % self._ALIGNMENT
        return raw[offset:offset + nbytes].view(numpy_dtype).reshape(shape)

    def empty_strided(self, shape: Tuple[int, int], strides: Tuple[int, int],
                      dtype: DType) -> Any:
        numpy_dtype = self._numpy_dtype(dtype)
        byte_strides = tuple(stride * numpy_dtype.itemsize for stride in strides)
        return np.lib.stride_tricks.as_strided(np.empty(0, numpy_dtype), shape, byte_strides)

    @staticmethod
    def _numpy_dtype(dtype: DType) -> Any:
        numpy_dtype = _NUMPY_OUTPUTS.get(dtype)
        if numpy_dtype is None:
            raise TypeError(f"logits_dtype: {_NAMES[dtype]} numpy arrays need the ml_dtypes "
                            "package (pip install ml_dtypes)")
        return numpy_dtype


def place_of(array: Array) -> Place:
    if torch is not None and isinstance(array.user, torch.Tensor):
        return _TorchPlace(array.user.device)
    return _NumpyPlace()
