// mqa_logits._C: the C++ API over DLPack arrays.
//
// This layer is deliberately thin. The Python package (python/mqa_logits/) adapts framework
// tensors to it: it names the element type of every array, allocates outputs with the caller's
// framework and passes the framework's current CUDA stream. Element types travel beside the array
// because float8 and bfloat16 have no DLPack type code in every framework (numpy has none at all):
// such arrays cross as same-sized integer views, and only the byte size is checked here.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "mqa_logits/errors.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "mqa_logits/tensor.hpp"

namespace nb = nanobind;
namespace ml = mqa_logits;

namespace {

// An array and the element type it holds. Inputs may be read-only; outputs must be writable.
using Input = std::pair<nb::ndarray<nb::ro>, ml::DType>;
using Output = std::pair<nb::ndarray<>, ml::DType>;
// A quantized operand: values and, depending on the format, scales.
using Operand = std::pair<Input, std::optional<Input>>;
using Layout = std::tuple<std::int64_t, std::int64_t, std::int64_t>;

ml::Device device_of(int dlpack_device_type, int device_id, const std::string& name) {
  switch (dlpack_device_type) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:  // pinned host memory: host code reads it directly
      return {ml::DeviceType::kCPU, 0};
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value:
      return {ml::DeviceType::kCUDA, device_id};
    default:
      throw ml::InvalidArgument(name, "expected a CPU or CUDA array, got DLPack device type " +
                                          std::to_string(dlpack_device_type));
  }
}

template <typename... Flags>
ml::TensorView to_view(const nb::ndarray<Flags...>& array, ml::DType dtype,
                       const std::string& name) {
  if (array.ndim() > static_cast<std::size_t>(ml::kMaxRank)) {
    throw ml::InvalidArgument(name, "expected at most " + std::to_string(ml::kMaxRank) +
                                        " dimensions, got " + std::to_string(array.ndim()));
  }
  if (array.itemsize() != ml::dtype_size(dtype)) {
    throw nb::type_error((name + ": " + ml::dtype_name(dtype) + " elements take " +
                          std::to_string(ml::dtype_size(dtype)) + " bytes, the array's take " +
                          std::to_string(array.itemsize()))
                             .c_str());
  }
  ml::TensorView view;
  view.data = const_cast<void*>(static_cast<const void*>(array.data()));
  view.dtype = dtype;
  view.rank = static_cast<int>(array.ndim());
  for (std::size_t d = 0; d < array.ndim(); ++d) {
    view.shape[d] = static_cast<std::int64_t>(array.shape(d));
    view.strides[d] = array.stride(d);
  }
  view.device = device_of(array.device_type(), array.device_id(), name);
  return view;
}

ml::TensorView input_view(const Input& input, const std::string& name) {
  return to_view(input.first, input.second, name);
}

ml::TensorView output_view(const Output& output, const std::string& name) {
  return to_view(output.first, output.second, name);
}

std::optional<ml::TensorView> optional_view(const std::optional<Input>& input,
                                            const std::string& name) {
  if (!input) return std::nullopt;
  return input_view(*input, name);
}

ml::QuantizedTensor quantized(const Operand& operand, const std::string& name) {
  return {input_view(operand.first, name), optional_view(operand.second, name + "_scales")};
}

cudaStream_t to_stream(std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

Layout to_tuple(const ml::OutputLayout& layout) {
  return {layout.rows, layout.cols, layout.row_stride};
}

void prefill_logits(const Operand& q, const Operand& kv, const Input& weights,
                    const Input& k_start, const Input& k_end, const Output& logits,
                    bool clean_logits, std::int64_t max_seqlen_k,
                    const std::optional<Input>& schedule_meta, std::uintptr_t stream) {
  const ml::QuantizedTensor q_view = quantized(q, "q");
  const ml::QuantizedTensor kv_view = quantized(kv, "kv");
  const ml::TensorView weights_view = input_view(weights, "weights");
  const ml::TensorView start_view = input_view(k_start, "cu_seq_len_k_start");
  const ml::TensorView end_view = input_view(k_end, "cu_seq_len_k_end");
  const ml::TensorView logits_view = output_view(logits, "logits");
  ml::MqaLogitsOptions options;
  options.clean_logits = clean_logits;
  options.max_seqlen_k = max_seqlen_k;
  options.schedule_meta = optional_view(schedule_meta, "schedule_meta");
  options.stream = to_stream(stream);

  nb::gil_scoped_release release;
  ml::mqa_logits(q_view, kv_view, weights_view, start_view, end_view, logits_view, options);
}

void paged_logits(const Operand& q, const Input& kv_cache, const Input& weights,
                  const Input& context_lens, const Input& block_table, const Input& schedule_meta,
                  std::int64_t max_context_len, const Output& logits, bool clean_logits,
                  const std::optional<Input>& indices, std::uintptr_t stream) {
  const ml::QuantizedTensor q_view = quantized(q, "q");
  const ml::TensorView cache_view = input_view(kv_cache, "kv_cache");
  const ml::TensorView weights_view = input_view(weights, "weights");
  const ml::TensorView lens_view = input_view(context_lens, "context_lens");
  const ml::TensorView table_view = input_view(block_table, "block_table");
  const ml::TensorView meta_view = input_view(schedule_meta, "schedule_meta");
  const ml::TensorView logits_view = output_view(logits, "logits");
  ml::PagedMqaLogitsOptions options;
  options.clean_logits = clean_logits;
  options.indices = optional_view(indices, "indices");
  options.stream = to_stream(stream);

  nb::gil_scoped_release release;
  ml::paged_mqa_logits(q_view, cache_view, weights_view, lens_view, table_view, meta_view,
                       max_context_len, logits_view, options);
}

void paged_metadata(const Input& context_lens, int block_kv, int num_sms, const Output& out,
                    const std::optional<Input>& indices, std::uintptr_t stream) {
  const ml::TensorView lens_view = input_view(context_lens, "context_lens");
  const ml::TensorView out_view = output_view(out, "schedule_meta");
  const std::optional<ml::TensorView> indices_view = optional_view(indices, "indices");

  nb::gil_scoped_release release;
  ml::get_paged_mqa_logits_metadata(lens_view, block_kv, num_sms, out_view, indices_view,
                                    to_stream(stream));
}

void prefill_metadata(const Input& k_start, const Input& k_end, std::int64_t seq_len_kv,
                      int num_heads, const Output& out, std::uintptr_t stream) {
  const ml::TensorView start_view = input_view(k_start, "cu_seq_len_k_start");
  const ml::TensorView end_view = input_view(k_end, "cu_seq_len_k_end");
  const ml::TensorView out_view = output_view(out, "schedule_meta");

  nb::gil_scoped_release release;
  ml::get_mqa_logits_metadata(start_view, end_view, seq_len_kv, num_heads, out_view,
                              to_stream(stream));
}

void translate_exceptions(const std::exception_ptr& exception, void*) {
  try {
    std::rethrow_exception(exception);
  } catch (const ml::InvalidArgument& error) {
    PyErr_SetString(PyExc_ValueError, error.what());
  } catch (const ml::CudaError& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() =
      "Low-level bindings of the mqa_logits C++ library over DLPack arrays. Use the functions of "
      "the `mqa_logits` package instead: they allocate outputs and pick the CUDA stream.";
  m.attr("__version__") = MQA_LOGITS_VERSION;
  nb::register_exception_translator(translate_exceptions);

  nb::enum_<ml::DType>(m, "DType", "Element type of an array crossing into the library.")
      .value("float8_e4m3", ml::DType::kFloat8E4M3)
      .value("uint8", ml::DType::kUInt8)
      .value("int8", ml::DType::kInt8)
      .value("int32", ml::DType::kInt32)
      .value("float32", ml::DType::kFloat32)
      .value("bfloat16", ml::DType::kBFloat16);

  m.def(
      "mqa_logits_output_layout",
      [](std::int64_t seq_len, std::int64_t seq_len_kv, std::int64_t max_seqlen_k,
         ml::DType logits_dtype) {
        return to_tuple(ml::mqa_logits_output_layout(seq_len, seq_len_kv, max_seqlen_k,
                                                     logits_dtype));
      },
      nb::arg("seq_len"), nb::arg("seq_len_kv"), nb::arg("max_seqlen_k"), nb::arg("logits_dtype"),
      "(rows, cols, row_stride) of the prefill logits to allocate; row_stride in elements.");
  m.def(
      "paged_mqa_logits_output_layout",
      [](std::int64_t num_rows, std::int64_t max_context_len, ml::DType logits_dtype) {
        return to_tuple(ml::paged_mqa_logits_output_layout(num_rows, max_context_len,
                                                           logits_dtype));
      },
      nb::arg("num_rows"), nb::arg("max_context_len"), nb::arg("logits_dtype"),
      "(rows, cols, row_stride) of the decode logits to allocate; row_stride in elements.");
  m.def("schedule_meta_rows", &ml::schedule_meta_rows, nb::arg("num_sms"),
        "Rows of schedule metadata for num_sms workers (num_sms + 1).");

  m.def("mqa_logits", &prefill_logits, nb::arg("q"), nb::arg("kv"), nb::arg("weights"),
        nb::arg("cu_seq_len_k_start"), nb::arg("cu_seq_len_k_end"), nb::arg("logits"),
        nb::arg("clean_logits"), nb::arg("max_seqlen_k"), nb::arg("schedule_meta").none(),
        nb::arg("stream"),
        "Prefill logits into the preallocated `logits`. Each array is an (array, DType) pair; "
        "q and kv are (values, scales-or-None) pairs of those; `stream` is a cudaStream_t as an "
        "integer (0 for host arrays or the default stream).");
  m.def("paged_mqa_logits", &paged_logits, nb::arg("q"), nb::arg("kv_cache"),
        nb::arg("weights"), nb::arg("context_lens"), nb::arg("block_table"),
        nb::arg("schedule_meta"), nb::arg("max_context_len"), nb::arg("logits"),
        nb::arg("clean_logits"), nb::arg("indices").none(), nb::arg("stream"),
        "Decode logits over a paged KV cache into the preallocated `logits`.");
  m.def("get_paged_mqa_logits_metadata", &paged_metadata, nb::arg("context_lens"),
        nb::arg("block_kv"), nb::arg("num_sms"), nb::arg("out"), nb::arg("indices").none(),
        nb::arg("stream"), "Decode schedule metadata into `out` (int32 [num_sms + 1, 2]).");
  m.def("get_mqa_logits_metadata", &prefill_metadata, nb::arg("cu_seq_len_k_start"),
        nb::arg("cu_seq_len_k_end"), nb::arg("seq_len_kv"), nb::arg("num_heads"), nb::arg("out"),
        nb::arg("stream"), "Prefill schedule metadata into `out` (int32 [get_num_sms() + 1, 2]).");

  m.def("get_num_sms", &ml::get_num_sms,
        "SMs (CPU: worker threads) the kernels may use; the device's count unless set.");
  m.def("set_num_sms", &ml::set_num_sms, nb::arg("new_num_sms"),
        "Limit the SMs (CPU: worker threads) the kernels may use.");
  m.def("cuda_backend_available", &ml::cuda_backend_available,
        "True when this build has the CUDA backend and a compute capability 9.0 GPU is visible.");
}
