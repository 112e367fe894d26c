// mqa_logits._torch_C: the torch fast path, built when torch is importable at build time.
//
// A call whose arrays are all plain torch tensors (CPU or CUDA) of accepted dtypes runs here: the
// tensors are read in C++ (a few nanoseconds each, where Python attribute reads cost ~1 us a
// tensor), the logits are allocated with ATen and the work is queued on torch's current stream,
// through the library that mqa_logits._C holds (api_table.hpp). Any other call (numpy arrays, a
// tensor subclass, a dtype that is refused, a non-bool flag) returns None, and the package takes
// its general path, which words every refusal of a type. Validation errors are the library's own,
// raised as ValueError, and reworded by the package as on the general path.
#include <nanobind/nanobind.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/python_variable.h>
#if defined(MQA_LOGITS_TORCH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "api_table.hpp"

namespace nb = nanobind;
namespace ml = mqa_logits;
using ml::python::Status;

namespace {

const ml::python::ApiTable* api = nullptr;

void check(Status status) {
  if (status == Status::kOk) return;
  if (status == Status::kInvalidArgument) throw nb::value_error(api->message());
  throw std::runtime_error(api->message());
}

// Runs the library call `f` (which touches no Python object) with the GIL released, then raises
// its failure with the GIL held.
template <typename F>
void call_without_gil(F&& f) {
  Status status;
  {
    nb::gil_scoped_release release;
    status = f();
  }
  check(status);
}

std::optional<ml::DType> dtype_of(at::ScalarType type) {
  switch (type) {
    case at::kFloat8_e4m3fn: return ml::DType::kFloat8E4M3;
    case at::kByte: return ml::DType::kUInt8;
    case at::kChar: return ml::DType::kInt8;
    case at::kInt: return ml::DType::kInt32;
    case at::kFloat: return ml::DType::kFloat32;
    case at::kBFloat16: return ml::DType::kBFloat16;
    case at::ScalarType::Float4_e2m1fn_x2: return ml::DType::kUInt8;  // two e2m1 per byte
    default: return std::nullopt;
  }
}

at::ScalarType torch_dtype(ml::DType dtype) {
  switch (dtype) {
    case ml::DType::kBFloat16: return at::kBFloat16;
    case ml::DType::kInt32: return at::kInt;
    default: return at::kFloat;
  }
}

using Accepted = std::initializer_list<ml::DType>;
constexpr Accepted kBytes{ml::DType::kFloat8E4M3, ml::DType::kUInt8, ml::DType::kInt8};
constexpr Accepted kInt32{ml::DType::kInt32};
constexpr Accepted kKvScales{ml::DType::kFloat32, ml::DType::kInt32};
constexpr Accepted kWeights{ml::DType::kFloat32, ml::DType::kBFloat16};
constexpr Accepted kFp32{ml::DType::kFloat32};

// The tensor of a plain torch.Tensor (a subclass takes the general path), or null.
const at::Tensor* tensor_of(nb::handle object) {
  if (!THPVariable_CheckExact(object.ptr())) return nullptr;
  return &THPVariable_Unpack(object.ptr());
}

// The view of a CPU or CUDA tensor of at most kMaxRank dims, read as `dtype`.
ml::TensorView tensor_view(const at::Tensor& tensor, ml::DType dtype) {
  ml::TensorView view;
  view.data = tensor.data_ptr();
  view.dtype = dtype;
  view.rank = static_cast<int>(tensor.dim());
  for (int d = 0; d < view.rank; ++d) {
    view.shape[d] = tensor.size(d);
    view.strides[d] = tensor.stride(d);
  }
  view.device = tensor.is_cuda() ? ml::Device{ml::DeviceType::kCUDA, tensor.device().index()}
                                 : ml::Device{ml::DeviceType::kCPU, 0};
  return view;
}

// Whether the fast path takes tensors on `tensor`'s device: CPU ones always, CUDA ones where this
// module was built with torch's CUDA library, which gives torch's current stream (without it
// their work would go on the legacy default stream: the general path takes them).
bool fast_path_device(const at::Tensor& tensor) {
#if defined(MQA_LOGITS_TORCH_CUDA)
  return tensor.is_cpu() || tensor.is_cuda();
#else
  return tensor.is_cpu();
#endif
}

// `object`'s view when it is a plain tensor of an accepted dtype on a fast_path_device.
std::optional<ml::TensorView> view_of(nb::handle object, Accepted accepted) {
  const at::Tensor* tensor = tensor_of(object);
  if (tensor == nullptr || tensor->dim() > ml::kMaxRank) return std::nullopt;
  const std::optional<ml::DType> dtype = dtype_of(tensor->scalar_type());
  bool ok = false;
  for (ml::DType a : accepted) ok = ok || dtype == a;
  if (!ok || !fast_path_device(*tensor)) return std::nullopt;
  return tensor_view(*tensor, *dtype);
}

// An optional argument: nullopt (None), or its view; `eligible` turns false when it is neither.
std::optional<ml::TensorView> optional_view(nb::handle object, Accepted accepted,
                                            bool& eligible) {
  if (object.is_none()) return std::nullopt;
  std::optional<ml::TensorView> view = view_of(object, accepted);
  eligible = eligible && view.has_value();
  return view;
}

// A quantized operand and the tensor of its values (where the outputs go).
struct Operand {
  ml::QuantizedTensor view;
  const at::Tensor* values;
};

// A tensor or a (values, scales) pair, typed as _arrays.operand does: byte values with no scales
// or float32 scales are FP8 e4m3 codes.
std::optional<Operand> operand_of(nb::handle object, Accepted scales_accepted) {
  nb::handle values = object, scales = nb::none();
  if (PyTuple_Check(object.ptr()) || PyList_Check(object.ptr())) {
    if (nb::len(object) != 2) return std::nullopt;
    values = object[0];
    scales = object[1];
  }
  bool eligible = true;
  const std::optional<ml::TensorView> values_view = view_of(values, kBytes);
  const std::optional<ml::TensorView> scales_view =
      optional_view(scales, scales_accepted, eligible);
  if (!values_view || !eligible) return std::nullopt;
  Operand operand{{*values_view, scales_view}, tensor_of(values)};
  if (!scales_view || scales_view->dtype == ml::DType::kFloat32) {
    operand.view.values.dtype = ml::DType::kFloat8E4M3;
  }
  return operand;
}

cudaStream_t current_stream(const at::Tensor& like) {
#if defined(MQA_LOGITS_TORCH_CUDA)
  if (like.is_cuda()) return c10::cuda::getCurrentCUDAStream(like.device().index()).stream();
#endif
  static_cast<void>(like);
  return nullptr;
}

// Logits of the library's layout on `like`'s device, and their view. Logits with no element keep
// a row stride of one padded row (_arrays.new_logits).
std::pair<at::Tensor, ml::TensorView> new_logits(const at::Tensor& like,
                                                 const ml::OutputLayout& layout,
                                                 ml::DType dtype) {
  std::int64_t row_stride = layout.row_stride;
  if (layout.rows == 0 || layout.cols == 0) {
    ml::OutputLayout one_row;
    check(api->paged_mqa_logits_output_layout(1, 1, dtype, &one_row));
    row_stride = std::max(row_stride, one_row.row_stride);
  }
  at::Tensor logits = at::empty_strided({layout.rows, layout.cols}, {row_stride, 1},
                                        like.options().dtype(torch_dtype(dtype)));
  const ml::TensorView view = tensor_view(logits, dtype);
  return {std::move(logits), view};
}

nb::object wrap(at::Tensor tensor) { return nb::steal(THPVariable_Wrap(std::move(tensor))); }

bool is_bool(nb::handle object) { return PyBool_Check(object.ptr()); }

// A Python int (not a bool) that fits int64; nullopt otherwise (the general path words it).
std::optional<std::int64_t> int64_of(nb::handle object) {
  if (!PyLong_Check(object.ptr()) || is_bool(object)) return std::nullopt;
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(object.ptr(), &overflow);
  if (overflow != 0) return std::nullopt;
  return value;
}

nb::object prefill(nb::handle q, nb::handle kv, nb::handle weights, nb::handle k_start,
                   nb::handle k_end, nb::handle clean_logits, nb::handle max_seqlen_k,
                   ml::DType logits_dtype, nb::handle schedule_meta, bool fp32_weights_only) {
  const auto width = int64_of(max_seqlen_k);
  if (!is_bool(clean_logits) || !width) return nb::none();
  const auto q_operand = operand_of(q, kInt32);
  const auto kv_operand = operand_of(kv, kKvScales);
  const auto weights_view = view_of(weights, fp32_weights_only ? kFp32 : kWeights);
  const auto start_view = view_of(k_start, kInt32);
  const auto end_view = view_of(k_end, kInt32);
  bool eligible = q_operand && kv_operand && weights_view && start_view && end_view;
  ml::MqaLogitsOptions options;
  options.schedule_meta = optional_view(schedule_meta, kInt32, eligible);
  if (!eligible) return nb::none();
  options.clean_logits = clean_logits.ptr() == Py_True;
  options.max_seqlen_k = *width;

  const at::Tensor& like = *q_operand->values;
  const ml::TensorView& q_values = q_operand->view.values;
  const ml::TensorView& kv_values = kv_operand->view.values;
  ml::OutputLayout layout;
  check(api->mqa_logits_output_layout(q_values.rank > 0 ? q_values.shape[0] : 0,
                                      kv_values.rank > 0 ? kv_values.shape[0] : 0,
                                      options.max_seqlen_k, logits_dtype, &layout));
  auto [logits, logits_view] = new_logits(like, layout, logits_dtype);
  options.stream = current_stream(like);
  call_without_gil([&] {
    return api->mqa_logits(q_operand->view, kv_operand->view, *weights_view, *start_view,
                           *end_view, logits_view, options);
  });
  return wrap(std::move(logits));
}

nb::object paged(nb::handle q, nb::handle kv_cache, nb::handle weights, nb::handle context_lens,
                 nb::handle block_table, nb::handle schedule_meta, nb::handle max_context_len,
                 nb::handle clean_logits, ml::DType logits_dtype, nb::handle indices,
                 bool fp32_weights_only) {
  const auto width = int64_of(max_context_len);
  if (!is_bool(clean_logits) || !width) return nb::none();
  const auto q_operand = operand_of(q, kInt32);
  auto cache_view = view_of(kv_cache, kBytes);
  const auto weights_view = view_of(weights, fp32_weights_only ? kFp32 : kWeights);
  const auto lens_view = view_of(context_lens, kInt32);
  const auto table_view = view_of(block_table, kInt32);
  const auto meta_view = view_of(schedule_meta, kInt32);
  bool eligible =
      q_operand && cache_view && weights_view && lens_view && table_view && meta_view;
  ml::PagedMqaLogitsOptions options;
  options.indices = optional_view(indices, kInt32, eligible);
  if (!eligible) return nb::none();
  cache_view->dtype = ml::DType::kUInt8;  // the fused cache is raw bytes, however it is typed
  options.clean_logits = clean_logits.ptr() == Py_True;

  const at::Tensor& like = *q_operand->values;
  const ml::TensorView& values = q_operand->view.values;
  ml::OutputLayout layout;
  check(api->paged_mqa_logits_output_layout(
      values.rank >= 2 ? values.shape[0] * values.shape[1] : 0, *width, logits_dtype, &layout));
  auto [logits, logits_view] = new_logits(like, layout, logits_dtype);
  options.stream = current_stream(like);
  call_without_gil([&] {
    return api->paged_mqa_logits(q_operand->view, *cache_view, *weights_view, *lens_view,
                                 *table_view, *meta_view, *width, logits_view, options);
  });
  return wrap(std::move(logits));
}

// Metadata int32 [rows, 2] on `like`'s device, and its view.
std::pair<at::Tensor, ml::TensorView> new_metadata(const at::Tensor& like, std::int64_t rows) {
  at::Tensor out = at::empty({rows, 2}, like.options().dtype(at::kInt));
  const ml::TensorView view = tensor_view(out, ml::DType::kInt32);
  return {std::move(out), view};
}

// An int64 that fits int32 (the metadata functions' int arguments), nullopt otherwise.
std::optional<int> int32_of(nb::handle object) {
  const auto value = int64_of(object);
  if (!value || *value < INT32_MIN || *value > INT32_MAX) return std::nullopt;
  return static_cast<int>(*value);
}

nb::object paged_metadata(nb::handle context_lens, nb::handle block_kv, nb::handle num_sms,
                          nb::handle indices) {
  const auto block = int32_of(block_kv);
  const auto workers = int32_of(num_sms);
  const auto lens_view = view_of(context_lens, kInt32);
  bool eligible = block && workers && *workers >= 1 && lens_view;
  const auto indices_view = optional_view(indices, kInt32, eligible);
  if (!eligible) return nb::none();  // the general path words the refusal
  const at::Tensor& like = *tensor_of(context_lens);
  auto [out, out_view] = new_metadata(like, std::int64_t{*workers} + 1);
  call_without_gil([&] {
    return api->get_paged_mqa_logits_metadata(*lens_view, *block, *workers, out_view,
                                              indices_view, current_stream(like));
  });
  return wrap(std::move(out));
}

nb::object prefill_metadata(nb::handle k_start, nb::handle k_end, nb::handle num_kv_tokens,
                            nb::handle num_heads) {
  const auto seq_len_kv = int64_of(num_kv_tokens);
  const auto heads = int32_of(num_heads);
  const auto start_view = view_of(k_start, kInt32);
  const auto end_view = view_of(k_end, kInt32);
  if (!seq_len_kv || !heads || !start_view || !end_view) return nb::none();
  int workers = 0;
  check(api->get_num_sms(&workers));
  const at::Tensor& like = *tensor_of(k_start);
  auto [out, out_view] = new_metadata(like, std::int64_t{workers} + 1);
  call_without_gil([&] {
    return api->get_mqa_logits_metadata(*start_view, *end_view, *seq_len_kv, *heads, out_view,
                                        current_stream(like));
  });
  return wrap(std::move(out));
}

}  // namespace

NB_MODULE(_torch_C, m) {
  m.doc() =
      "The torch fast path of the mqa_logits functions (see mqa_logits._api): each returns the "
      "output, or None when the call is not all plain torch tensors of accepted dtypes.";
  nb::module_ c = nb::module_::import_("mqa_logits._C");
  const auto capsule = nb::borrow<nb::capsule>(c.attr("api_table")());
  api = static_cast<const ml::python::ApiTable*>(capsule.data());
  if (api == nullptr || api->version != ml::python::kApiTableVersion) {
    throw nb::import_error("mqa_logits._torch_C: mqa_logits._C is of another build");
  }

  // Every argument may be None or of any type: such calls return None (the general path).
  const auto any = [](const char* name) { return nb::arg(name).none(); };
  m.def("mqa_logits", &prefill, any("q"), any("kv"), any("weights"), any("cu_seq_len_k_start"),
        any("cu_seq_len_k_end"), any("clean_logits"), any("max_seqlen_k"),
        nb::arg("logits_dtype"), any("schedule_meta"), nb::arg("fp32_weights_only"));
  m.def("paged_mqa_logits", &paged, any("q"), any("kv_cache"), any("weights"),
        any("context_lens"), any("block_table"), any("schedule_meta"), any("max_context_len"),
        any("clean_logits"), nb::arg("logits_dtype"), any("indices"),
        nb::arg("fp32_weights_only"));
  m.def("get_paged_mqa_logits_metadata", &paged_metadata, any("context_lens"), any("block_kv"),
        any("num_sms"), any("indices"));
  m.def("get_mqa_logits_metadata", &prefill_metadata, any("cu_seq_len_k_start"),
        any("cu_seq_len_k_end"), any("num_kv_tokens"), any("num_heads"));
}
