// Building blocks of input validation: each check refuses with InvalidArgument naming the
// argument, what was expected and what was given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "mqa_logits/formats.hpp"
#include "mqa_logits/mqa_logits.hpp"

namespace mqa_logits::checks {

// One tensor argument of a call and the name errors give it.
struct Arg {
  const TensorView& view;
  const char* name;
};

[[noreturn]] void refuse(const char* argument, const std::string& message);

std::string device_string(const Device& device);  // "cpu", "cuda:1"
std::string shape_string(const TensorView& view);  // "[4, 8, 128]"

// `value` is one of `allowed`; `what` describes the value, e.g. "heads (dim 1)".
void expect_one_of(const char* argument, std::string_view what, std::int64_t value,
                   std::initializer_list<std::int64_t> allowed);
// `value` is one of a set of the capability table (mqa_logits/capabilities.hpp).
void expect_in_set(const char* argument, std::string_view what, std::int64_t value,
                   std::span<const int> allowed);
// The next_n values decode takes: 1 to capabilities::kMaxNextN.
std::span<const int> next_n_values();
void expect_at_least(const char* argument, std::string_view what, std::int64_t value,
                     std::int64_t minimum);
// minimum <= value <= maximum.
void expect_in_range(const char* argument, std::string_view what, std::int64_t value,
                     std::int64_t minimum, std::int64_t maximum);
// Keys and output columns are indexed with 32-bit integers (windows are int32).
inline constexpr std::int64_t kMaxColumns = 2147483647;

void expect_dtype(Arg arg, std::initializer_list<DType> allowed, std::string_view reason = {});
// Rank and non-negative extents whose elements span fewer than 2^63 bytes (byte_span).
void expect_rank(Arg arg, int rank, std::string_view dims);  // dims: "[S, H, D]"
// Rank and every extent; `dims` names them, e.g. "[S, H]".
void expect_shape(Arg arg, std::span<const std::int64_t> shape, std::string_view dims);
void expect_shape(Arg arg, std::initializer_list<std::int64_t> shape, std::string_view dims);
void expect_contiguous(Arg arg);
// A 2-D tensor whose rows are dense and at least `cols` elements apart.
void expect_row_major_rows(Arg arg);

// Stride of dim 0 of a 2-D tensor; a single row reports the row length (its stride is unused).
std::int64_t row_stride(const TensorView& view);

// The bytes [first, last) that a view's elements span, as offsets from its data pointer (first
// is negative where a stride is); [0, 0) for a view without elements (it addresses no memory);
// nullopt where the element count or an offset does not fit 64 bits.
struct ByteSpan {
  std::int64_t first;
  std::int64_t last;
};
std::optional<ByteSpan> byte_span(const TensorView& view);
// An optional input for expect_disjoint: its view, or, absent, a view of no elements (no memory).
inline TensorView view_or_empty(const std::optional<TensorView>& view) {
  return view ? *view : TensorView::contiguous(nullptr, DType::kInt32, {0});
}
// No byte of `output` lies in the memory of any of `inputs` (a kernel would read what it writes).
void expect_disjoint(Arg output, std::initializer_list<Arg> inputs);

// Where the tensors of one call live: every tensor must be on the device of the first. On a CUDA
// device the build must have the CUDA backend and the GPU must be able to run its kernels.
class Placement {
 public:
  explicit Placement(Arg first);

  void expect_same_device(Arg arg) const;
  // Non-null unless empty, aligned to its element size and to `alignment` bytes, and pointing to
  // memory of the device.
  void expect_memory(Arg arg, std::size_t alignment = 1) const;
  // The alignment of tensors kernels load in 16-byte vectors: 16 on a CUDA device, else 1.
  std::size_t vector_alignment() const { return on_cuda() ? 16 : 1; }
  // On a CUDA device, rows of a 2-D tensor start `bytes`-aligned when the first one does.
  void expect_row_alignment(Arg arg, std::size_t bytes) const;

  const Device& device() const { return device_; }
  bool on_cuda() const { return device_.type == DeviceType::kCUDA; }

 private:
  void expect_usable_gpu(Arg first) const;

  Device device_;
  const char* first_name_;
};

// ---- the format of a call ----

// The format from the query operand: e4m3 without scales is FP8, e4m3 with int32 scales MXFP8,
// bytes (uint8 / int8) with int32 scales MXFP4.
Format infer_format(const QuantizedTensor& q);
bool is_byte_dtype(DType dtype);  // uint8 or int8: packed MXFP4 values
// Head dim D from the stored last dim of q (MXFP4 stores D / 2 bytes); refuses unsupported D.
std::int64_t head_dim(Format format, std::int64_t stored_dim);
void expect_num_heads(const char* argument, std::string_view what, std::int64_t num_heads);
// fp32 or bf16 weights; logits of the same or (fp32 weights only) either logits dtype.
void expect_weights_dtype(Arg weights);
void expect_logits_dtype(Arg logits, DType weights_dtype);
// Schedule metadata describes 1 to kMaxWorkers workers (a CUDA grid of that many CTAs).
inline constexpr int kMaxWorkers = 1 << 16;
// int32 [workers + 1, 2] with 1 <= workers <= kMaxWorkers, contiguous; returns the worker count.
int expect_schedule_meta(Arg meta);

}  // namespace mqa_logits::checks
