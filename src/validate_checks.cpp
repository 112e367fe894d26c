#include "validate_checks.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <utility>

#include "cuda/cuda_backend.hpp"
#include "instances.hpp"
#include "mqa_logits/capabilities.hpp"
#include "mqa_logits/errors.hpp"

namespace mqa_logits::checks {
namespace {

#if defined(MQA_LOGITS_WITH_CUDA)
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

constexpr int kKernelsComputeCapability = 90;  // sm_90a code runs on compute capability 9.0 only

// "[1, 2, 3]" style lists of integers, between `open` and `close`.
template <typename Range>
std::string int_list(const Range& values, char open = '[', char close = ']') {
  std::string text(1, open);
  for (const std::int64_t value : values) {
    if (text.size() > 1) text += ", ";
    text += std::to_string(value);
  }
  text += close;
  return text;
}

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string text;
  std::size_t index = 0;
  for (const DType dtype : dtypes) {
    if (index > 0) text += index + 1 == dtypes.size() ? " or " : ", ";
    text += dtype_name(dtype);
    ++index;
  }
  return text;
}

// Devices are equal when their types are; the index only distinguishes CUDA devices.
bool same_device(const Device& a, const Device& b) {
  return a.type == b.type && (a.type == DeviceType::kCPU || a.index == b.index);
}

std::string hex_address(const void* ptr) {
  char digits[2 * sizeof(std::uintptr_t)];
  const auto result = std::to_chars(std::begin(digits), std::end(digits),
                                    reinterpret_cast<std::uintptr_t>(ptr), 16);
  return "0x" + std::string(digits, result.ptr);
}

// Refuses a value not in `allowed`, naming `argument`.
template <typename Range>
void expect_in(const char* argument, std::string_view what, std::int64_t value,
               const Range& allowed) {
  for (const std::int64_t candidate : allowed) {
    if (value == candidate) return;
  }
  refuse(argument, "expected " + std::string(what) + " in " + int_list(allowed, '{', '}') +
                       ", got " + std::to_string(value));
}

}  // namespace

void expect_in_set(const char* argument, std::string_view what, std::int64_t value,
                   std::span<const int> allowed) {
  expect_in(argument, what, value, allowed);
}

std::span<const int> next_n_values() {
  static const auto values = [] {
    std::array<int, capabilities::kMaxNextN> all{};
    for (int n = 0; n < capabilities::kMaxNextN; ++n) all[static_cast<std::size_t>(n)] = n + 1;
    return all;
  }();
  return values;
}

void refuse(const char* argument, const std::string& message) {
  throw InvalidArgument(argument, message);
}

std::string device_string(const Device& device) {
  if (device.type == DeviceType::kCPU) return device_name(device.type);
  return std::string(device_name(device.type)) + ":" + std::to_string(device.index);
}

std::string shape_string(const TensorView& view) {
  const int rank = std::clamp(view.rank, 0, kMaxRank);  // views may arrive with any rank
  return int_list(std::span(view.shape).first(static_cast<std::size_t>(rank)));
}

void expect_one_of(const char* argument, std::string_view what, std::int64_t value,
                   std::initializer_list<std::int64_t> allowed) {
  expect_in(argument, what, value, allowed);
}

void expect_at_least(const char* argument, std::string_view what, std::int64_t value,
                     std::int64_t minimum) {
  if (value >= minimum) return;
  refuse(argument, "expected " + std::string(what) + " >= " + std::to_string(minimum) + ", got " +
                       std::to_string(value));
}

void expect_in_range(const char* argument, std::string_view what, std::int64_t value,
                     std::int64_t minimum, std::int64_t maximum) {
  if (value >= minimum && value <= maximum) return;
  refuse(argument, "expected " + std::to_string(minimum) + " <= " + std::string(what) + " <= " +
                       std::to_string(maximum) + ", got " + std::to_string(value));
}

void expect_dtype(Arg arg, std::initializer_list<DType> allowed, std::string_view reason) {
  for (const DType dtype : allowed) {
    if (arg.view.dtype == dtype) return;
  }
  const std::string why = reason.empty() ? "" : " (" + std::string(reason) + ")";
  refuse(arg.name, "expected dtype " + dtype_list(allowed) + why + ", got " +
                       dtype_name(arg.view.dtype));
}

void expect_rank(Arg arg, int rank, std::string_view dims) {
  if (arg.view.rank != rank) {
    refuse(arg.name, "expected rank " + std::to_string(rank) + " " + std::string(dims) +
                         ", got rank " + std::to_string(arg.view.rank) + " " +
                         shape_string(arg.view));
  }
  for (int d = 0; d < rank; ++d) {
    if (arg.view.shape[d] < 0) {
      refuse(arg.name, "expected non-negative extents, got shape " + shape_string(arg.view));
    }
  }
  if (!byte_span(arg.view)) {
    const auto strides = std::span(arg.view.strides).first(static_cast<std::size_t>(rank));
    refuse(arg.name, "expected elements spanning fewer than 2^63 bytes, got shape " +
                         shape_string(arg.view) + " with strides " + int_list(strides));
  }
}

void expect_shape(Arg arg, std::span<const std::int64_t> shape, std::string_view dims) {
  expect_rank(arg, static_cast<int>(shape.size()), dims);
  if (!std::equal(shape.begin(), shape.end(), arg.view.shape.begin())) {
    refuse(arg.name, "expected shape " + std::string(dims) + " = " + int_list(shape) +
                         ", got " + shape_string(arg.view));
  }
}

void expect_shape(Arg arg, std::initializer_list<std::int64_t> shape, std::string_view dims) {
  expect_shape(arg, std::span(shape.begin(), shape.size()), dims);
}

void expect_contiguous(Arg arg) {
  if (arg.view.is_contiguous()) return;
  const auto strides = std::span(arg.view.strides).first(static_cast<std::size_t>(arg.view.rank));
  refuse(arg.name, "expected a contiguous tensor, got strides " + int_list(strides) +
                       " for shape " + shape_string(arg.view));
}

void expect_row_major_rows(Arg arg) {
  const TensorView& view = arg.view;
  if (view.numel() == 0) return;  // no element is addressed: any strides (numpy gives 0) will do
  if (view.shape[1] > 1 && view.strides[1] != 1) {
    refuse(arg.name, "expected a contiguous last dim (stride 1), got stride " +
                         std::to_string(view.strides[1]));
  }
  if (view.shape[0] > 1 && view.strides[0] < view.shape[1]) {
    refuse(arg.name, "expected a row stride (stride 0) of at least " +
                         std::to_string(view.shape[1]) + " elements, got " +
                         std::to_string(view.strides[0]));
  }
}

std::int64_t row_stride(const TensorView& view) {
  return view.shape[0] > 1 ? view.strides[0] : view.shape[1];
}

std::optional<ByteSpan> byte_span(const TensorView& view) {
  const auto element = static_cast<std::int64_t>(dtype_size(view.dtype));
  const auto extents = std::span(view.shape).first(static_cast<std::size_t>(view.rank));
  if (std::find(extents.begin(), extents.end(), 0) != extents.end()) return ByteSpan{0, 0};
  std::int64_t count = 1;
  for (const std::int64_t extent : extents) {
    if (__builtin_mul_overflow(count, extent, &count)) return std::nullopt;
  }
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(count, element, &bytes)) return std::nullopt;
  ByteSpan span{0, element};
  for (int d = 0; d < view.rank; ++d) {
    std::int64_t reach = 0;  // bytes from the first element to the last along dim d
    if (__builtin_mul_overflow(view.shape[d] - 1, view.strides[d], &reach) ||
        __builtin_mul_overflow(reach, element, &reach)) {
      return std::nullopt;
    }
    std::int64_t& edge = reach < 0 ? span.first : span.last;
    if (__builtin_add_overflow(edge, reach, &edge)) return std::nullopt;
  }
  return span;
}

void expect_disjoint(Arg output, std::initializer_list<Arg> inputs) {
  const auto bounds = [](Arg arg) {  // [begin, end) as addresses, after expect_rank
    const ByteSpan span = *byte_span(arg.view);
    const auto base = reinterpret_cast<std::uintptr_t>(arg.view.data);
    return std::pair{base + static_cast<std::uintptr_t>(span.first),
                     base + static_cast<std::uintptr_t>(span.last)};
  };
  const auto [out_begin, out_end] = bounds(output);
  if (out_begin == out_end) return;
  for (const Arg input : inputs) {
    const auto [begin, end] = bounds(input);
    if (begin == end || end <= out_begin || out_end <= begin) continue;
    refuse(output.name, "expected memory apart from " + std::string(input.name) + "'s (the kernels "
                        "read it while they write " + output.name + "), got bytes [" +
                        hex_address(reinterpret_cast<const void*>(out_begin)) + ", " +
                        hex_address(reinterpret_cast<const void*>(out_end)) + ") overlapping " +
                        input.name + "'s [" + hex_address(reinterpret_cast<const void*>(begin)) +
                        ", " + hex_address(reinterpret_cast<const void*>(end)) + ")");
  }
}

// ---- Placement ----

Placement::Placement(Arg first) : device_(first.view.device), first_name_(first.name) {
  if (on_cuda()) {
    expect_usable_gpu(first);
  } else {
    device_.index = 0;  // meaningless for the CPU; normalized so descriptors compare equal
  }
}

void Placement::expect_usable_gpu(Arg first) const {
  const int count = cuda_backend::device_count();
  if (count == 0) {
    refuse(first.name, kBuiltWithCuda
                           ? "expected a tensor on a visible CUDA device, got " +
                                 device_string(device_) + " but no CUDA device is visible"
                           : std::string("the tensor is on a CUDA device but this build of "
                                         "mqa_logits has no CUDA backend"));
  }
  if (device_.index < 0 || device_.index >= count) {
    refuse(first.name, "expected a CUDA device index in [0, " + std::to_string(count) +
                           ") (the visible devices), got " + device_string(device_));
  }
  const int capability = cuda_backend::device_limits(device_.index).compute_capability;
  if (capability != kKernelsComputeCapability) {
    refuse(first.name, "expected a GPU of compute capability 9.0 (the kernels are sm_90a code: "
                       "H100, H200, H800, H20), got " + device_string(device_) +
                           " of compute capability " + std::to_string(capability / 10) + "." +
                           std::to_string(capability % 10));
  }
}

void Placement::expect_same_device(Arg arg) const {
  if (same_device(arg.view.device, device_)) return;
  refuse(arg.name, "expected a tensor on " + device_string(device_) + " (the device of " +
                       first_name_ + "), got " + device_string(arg.view.device));
}

void Placement::expect_memory(Arg arg, std::size_t alignment) const {
  if (arg.view.numel() == 0) return;  // nothing is ever read or written through it
  const void* data = arg.view.data;
  if (data == nullptr) refuse(arg.name, "expected a data pointer, got null");
  alignment = std::max(alignment, dtype_size(arg.view.dtype));
  if (reinterpret_cast<std::uintptr_t>(data) % alignment != 0) {
    refuse(arg.name, "expected a data pointer aligned to " + std::to_string(alignment) +
                         " bytes, got " + hex_address(data));
  }
  if (on_cuda()) {
    cuda_backend::require_device_pointer(data, device_.index, arg.name);
  } else {
    cuda_backend::require_host_pointer(data, arg.name);
  }
}

void Placement::expect_row_alignment(Arg arg, std::size_t bytes) const {
  if (!on_cuda() || arg.view.shape[0] <= 1) return;
  const std::int64_t stride_bytes =
      arg.view.strides[0] * static_cast<std::int64_t>(dtype_size(arg.view.dtype));
  if (stride_bytes % static_cast<std::int64_t>(bytes) == 0) return;
  refuse(arg.name, "expected a row stride that is a multiple of " + std::to_string(bytes) +
                       " bytes on a CUDA device, got " + std::to_string(arg.view.strides[0]) +
                       " elements (" + std::to_string(stride_bytes) + " bytes)");
}

// ---- the format of a call ----

bool is_byte_dtype(DType dtype) { return dtype == DType::kUInt8 || dtype == DType::kInt8; }

Format infer_format(const QuantizedTensor& q) {
  expect_dtype({q.values, "q"}, {DType::kFloat8E4M3, DType::kUInt8, DType::kInt8});
  if (!q.scales) {
    if (is_byte_dtype(q.values.dtype)) {
      refuse("q_scales", "expected int32 packed UE8M0 scales for MXFP4 queries (q is " +
                             std::string(dtype_name(q.values.dtype)) + "), got none");
    }
    return Format::kFP8;
  }
  expect_dtype({*q.scales, "q_scales"}, {DType::kInt32},
               "packed UE8M0 scales: MXFP8 or MXFP4; FP8 queries take no scales");
  return is_byte_dtype(q.values.dtype) ? Format::kMXFP4 : Format::kMXFP8;
}

std::int64_t head_dim(Format format, std::int64_t stored_dim) {
  if (format == Format::kMXFP4) {
    const std::int64_t dim = 2 * stored_dim;
    expect_in("q", "MXFP4 head dim (2 x the last dim of q)", dim,
              capabilities::kMxfp4HeadDims);
    return dim;
  }
  expect_in("q", std::string(format_name(format)) + " head dim (last dim)", stored_dim,
            instances::kHeadDims);
  return stored_dim;
}

void expect_num_heads(const char* argument, std::string_view what, std::int64_t num_heads) {
  expect_in(argument, what, num_heads, instances::kHeadCounts);
}

void expect_weights_dtype(Arg weights) {
  expect_dtype(weights, {DType::kFloat32, DType::kBFloat16});
}

void expect_logits_dtype(Arg logits, DType weights_dtype) {
  if (weights_dtype == DType::kBFloat16) {
    expect_dtype(logits, {DType::kBFloat16}, "weights are bfloat16");
  } else {
    expect_dtype(logits, {DType::kFloat32, DType::kBFloat16});
  }
}

int expect_schedule_meta(Arg meta) {
  expect_dtype(meta, {DType::kInt32});
  expect_rank(meta, 2, "[workers + 1, 2]");
  const std::int64_t rows = meta.view.shape[0];
  if (rows < 2 || rows - 1 > kMaxWorkers || meta.view.shape[1] != 2) {
    refuse(meta.name, "expected shape [workers + 1, 2] with 1 <= workers <= " +
                          std::to_string(kMaxWorkers) + ", got " + shape_string(meta.view));
  }
  expect_contiguous(meta);
  return static_cast<int>(rows - 1);
}

}  // namespace mqa_logits::checks
