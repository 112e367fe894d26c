// mqa_logits._C: the C++ API over array descriptors.
//
// This layer is deliberately thin. The Python package (python/mqa_logits/) adapts framework
// arrays to it: it describes every array as a tuple
//
//     (data_ptr, DType, shape, strides, device)
//
// with strides in elements and device -1 for host memory or the CUDA ordinal, allocates outputs
// with the caller's framework and passes the framework's current CUDA stream. A descriptor costs
// a few attribute reads of a torch tensor, where a DLPack capsule costs microseconds per array;
// the caller keeps the arrays alive for the call. Element types travel in the descriptor because
// float8 and bfloat16 have no DLPack type code in every framework (numpy has none at all).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "api_table.hpp"
#include "mqa_logits/capabilities.hpp"
#include "mqa_logits/errors.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "mqa_logits/tensor.hpp"

namespace nb = nanobind;
namespace ml = mqa_logits;

namespace {

using Layout = std::tuple<std::int64_t, std::int64_t, std::int64_t>;

// Fields of a descriptor tuple.
constexpr std::size_t kData = 0, kDType = 1, kShape = 2, kStrides = 3, kDevice = 4, kFields = 5;

// A descriptor's shape or strides: a tuple (torch.Size is one) of at most kMaxRank ints.
nb::tuple extents_of(nb::handle extents, const char* name) {
  if (!nb::isinstance<nb::tuple>(extents) || nb::len(extents) > ml::kMaxRank) {
    throw ml::InvalidArgument(name, "expected at most " + std::to_string(ml::kMaxRank) +
                                        " dimensions, got " + nb::str(extents).c_str());
  }
  return nb::borrow<nb::tuple>(extents);
}

ml::TensorView view_of(nb::handle descriptor, const char* name) {
  if (!nb::isinstance<nb::tuple>(descriptor) || nb::len(descriptor) != kFields) {
    throw ml::InvalidArgument(name, "expected an array descriptor of 5 fields");
  }
  const auto fields = nb::borrow<nb::tuple>(descriptor);
  const nb::tuple shape = extents_of(fields[kShape], name);
  const nb::tuple strides = extents_of(fields[kStrides], name);
  const std::size_t rank = shape.size();
  if (strides.size() != rank) {
    throw ml::InvalidArgument(name, "expected as many strides as dimensions");
  }
  ml::TensorView view;
  view.data = reinterpret_cast<void*>(nb::cast<std::uintptr_t>(fields[kData]));
  view.dtype = nb::cast<ml::DType>(fields[kDType]);
  view.rank = static_cast<int>(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    view.shape[d] = nb::cast<std::int64_t>(shape[d]);
    view.strides[d] = nb::cast<std::int64_t>(strides[d]);
  }
  const int device = nb::cast<int>(fields[kDevice]);
  view.device = device < 0 ? ml::Device{ml::DeviceType::kCPU, 0}
                           : ml::Device{ml::DeviceType::kCUDA, device};
  return view;
}

std::optional<ml::TensorView> optional_view(nb::handle descriptor, const char* name) {
  if (descriptor.is_none()) return std::nullopt;
  return view_of(descriptor, name);
}

ml::QuantizedTensor quantized(nb::handle values, nb::handle scales, const char* name,
                              const char* scales_name) {
  return {view_of(values, name), optional_view(scales, scales_name)};
}

cudaStream_t to_stream(std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

Layout to_tuple(const ml::OutputLayout& layout) {
  return {layout.rows, layout.cols, layout.row_stride};
}

// The inputs a prefill call and its top-k share, as the C++ API takes them.
struct PrefillOperands {
  ml::QuantizedTensor q, kv;
  ml::TensorView weights, k_start, k_end;
};

PrefillOperands prefill_operands(nb::handle q, nb::handle q_scales, nb::handle kv,
                                 nb::handle kv_scales, nb::handle weights, nb::handle k_start,
                                 nb::handle k_end) {
  return {quantized(q, q_scales, "q", "q_scales"), quantized(kv, kv_scales, "kv", "kv_scales"),
          view_of(weights, "weights"), view_of(k_start, "cu_seq_len_k_start"),
          view_of(k_end, "cu_seq_len_k_end")};
}

// The inputs a decode call and its top-k share.
struct PagedOperands {
  ml::QuantizedTensor q;
  ml::TensorView kv_cache, weights, context_lens, block_table, schedule_meta;
};

PagedOperands paged_operands(nb::handle q, nb::handle q_scales, nb::handle kv_cache,
                             nb::handle weights, nb::handle context_lens, nb::handle block_table,
                             nb::handle schedule_meta) {
  return {quantized(q, q_scales, "q", "q_scales"), view_of(kv_cache, "kv_cache"),
          view_of(weights, "weights"), view_of(context_lens, "context_lens"),
          view_of(block_table, "block_table"), view_of(schedule_meta, "schedule_meta")};
}

void prefill_logits(nb::handle q, nb::handle q_scales, nb::handle kv, nb::handle kv_scales,
                    nb::handle weights, nb::handle k_start, nb::handle k_end, nb::handle logits,
                    bool clean_logits, std::int64_t max_seqlen_k, nb::handle schedule_meta,
                    std::uintptr_t stream) {
  const PrefillOperands in = prefill_operands(q, q_scales, kv, kv_scales, weights, k_start, k_end);
  const ml::TensorView logits_view = view_of(logits, "logits");
  ml::MqaLogitsOptions options;
  options.clean_logits = clean_logits;
  options.max_seqlen_k = max_seqlen_k;
  options.schedule_meta = optional_view(schedule_meta, "schedule_meta");
  options.stream = to_stream(stream);

  nb::gil_scoped_release release;
  ml::mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, logits_view, options);
}

void paged_logits(nb::handle q, nb::handle q_scales, nb::handle kv_cache, nb::handle weights,
                  nb::handle context_lens, nb::handle block_table, nb::handle schedule_meta,
                  std::int64_t max_context_len, nb::handle logits, bool clean_logits,
                  nb::handle indices, std::uintptr_t stream) {
  const PagedOperands in =
      paged_operands(q, q_scales, kv_cache, weights, context_lens, block_table, schedule_meta);
  const ml::TensorView logits_view = view_of(logits, "logits");
  ml::PagedMqaLogitsOptions options;
  options.clean_logits = clean_logits;
  options.indices = optional_view(indices, "indices");
  options.stream = to_stream(stream);

  nb::gil_scoped_release release;
  ml::paged_mqa_logits(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table,
                       in.schedule_meta, max_context_len, logits_view, options);
}

void paged_metadata(nb::handle context_lens, int block_kv, int num_sms, nb::handle out,
                    nb::handle indices, std::uintptr_t stream) {
  const ml::TensorView lens_view = view_of(context_lens, "context_lens");
  const ml::TensorView out_view = view_of(out, "schedule_meta");
  const std::optional<ml::TensorView> indices_view = optional_view(indices, "indices");

  nb::gil_scoped_release release;
  ml::get_paged_mqa_logits_metadata(lens_view, block_kv, num_sms, out_view, indices_view,
                                    to_stream(stream));
}

void prefill_metadata(nb::handle k_start, nb::handle k_end, std::int64_t seq_len_kv,
                      int num_heads, nb::handle out, std::uintptr_t stream) {
  const ml::TensorView start_view = view_of(k_start, "cu_seq_len_k_start");
  const ml::TensorView end_view = view_of(k_end, "cu_seq_len_k_end");
  const ml::TensorView out_view = view_of(out, "schedule_meta");

  nb::gil_scoped_release release;
  ml::get_mqa_logits_metadata(start_view, end_view, seq_len_kv, num_heads, out_view,
                              to_stream(stream));
}

void per_row_topk(nb::handle logits, nb::handle starts, nb::handle ends, std::int64_t topk,
                  nb::handle topk_indices, nb::handle values, bool compressed,
                  bool absolute_indices, std::uintptr_t stream) {
  const ml::TensorView logits_view = view_of(logits, "logits");
  const std::optional<ml::TensorView> starts_view = optional_view(starts, "starts");
  const ml::TensorView ends_view = view_of(ends, "ends");
  const ml::TensorView indices_view = view_of(topk_indices, "topk_indices");
  ml::TopkPerRowOptions options;
  options.compressed = compressed;
  options.absolute_indices = absolute_indices;
  options.values = optional_view(values, "values");
  options.stream = to_stream(stream);

  nb::gil_scoped_release release;
  ml::topk_per_row(logits_view, starts_view, ends_view, topk, indices_view, options);
}

void prefill_topk(nb::handle q, nb::handle q_scales, nb::handle kv, nb::handle kv_scales,
                  nb::handle weights, nb::handle k_start, nb::handle k_end, std::int64_t topk,
                  nb::handle topk_indices, nb::handle workspace, nb::handle values,
                  bool absolute_indices, nb::handle schedule_meta,
                  std::optional<ml::DType> logits_dtype, std::uintptr_t stream) {
  const PrefillOperands in = prefill_operands(q, q_scales, kv, kv_scales, weights, k_start, k_end);
  const ml::TensorView indices_view = view_of(topk_indices, "topk_indices");
  const ml::TensorView workspace_view = view_of(workspace, "workspace");
  ml::MqaTopkOptions options;
  options.absolute_indices = absolute_indices;
  options.values = optional_view(values, "values");
  options.schedule_meta = optional_view(schedule_meta, "schedule_meta");
  options.logits_dtype = logits_dtype;
  options.stream = to_stream(stream);

  nb::gil_scoped_release release;
  ml::mqa_topk(in.q, in.kv, in.weights, in.k_start, in.k_end, topk, indices_view,
               workspace_view, options);
}

void paged_topk(nb::handle q, nb::handle q_scales, nb::handle kv_cache, nb::handle weights,
                nb::handle context_lens, nb::handle block_table, nb::handle schedule_meta,
                std::int64_t max_context_len, std::int64_t topk, nb::handle topk_indices,
                nb::handle workspace, nb::handle values, bool cache_slots, nb::handle indices,
                std::optional<ml::DType> logits_dtype, std::uintptr_t stream) {
  const PagedOperands in =
      paged_operands(q, q_scales, kv_cache, weights, context_lens, block_table, schedule_meta);
  const ml::TensorView indices_view = view_of(topk_indices, "topk_indices");
  const ml::TensorView workspace_view = view_of(workspace, "workspace");
  ml::PagedMqaTopkOptions options;
  options.cache_slots = cache_slots;
  options.values = optional_view(values, "values");
  options.indices = optional_view(indices, "indices");
  options.logits_dtype = logits_dtype;
  options.stream = to_stream(stream);

  nb::gil_scoped_release release;
  ml::paged_mqa_topk(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table,
                     in.schedule_meta, max_context_len, topk, indices_view, workspace_view,
                     options);
}

void merge(nb::handle candidate_values, nb::handle candidate_indices, std::int64_t topk,
           nb::handle topk_indices, nb::handle values, std::uintptr_t stream) {
  const ml::TensorView values_view = view_of(candidate_values, "candidate_values");
  const ml::TensorView indices_view = view_of(candidate_indices, "candidate_indices");
  const ml::TensorView out_view = view_of(topk_indices, "topk_indices");
  ml::MergeTopkOptions options;
  options.values = optional_view(values, "values");
  options.stream = to_stream(stream);

  nb::gil_scoped_release release;
  ml::merge_topk(values_view, indices_view, topk, out_view, options);
}

// ---- the API table (api_table.hpp) ----

thread_local std::string table_message;

// Runs f(), turning what it throws into a Status and a message.
template <typename F>
ml::python::Status guarded(F&& f) noexcept {
  try {
    f();
    return ml::python::Status::kOk;
  } catch (const ml::InvalidArgument& error) {
    table_message = error.what();
    return ml::python::Status::kInvalidArgument;
  } catch (const std::exception& error) {
    table_message = error.what();
    return ml::python::Status::kCudaError;
  }
}

const ml::python::ApiTable api_table{
    ml::python::kApiTableVersion,
    [](std::int64_t seq_len, std::int64_t seq_len_kv, std::int64_t max_seqlen_k,
       ml::DType logits_dtype, ml::OutputLayout* layout) {
      return guarded([&] {
        *layout = ml::mqa_logits_output_layout(seq_len, seq_len_kv, max_seqlen_k, logits_dtype);
      });
    },
    [](std::int64_t num_rows, std::int64_t max_context_len, ml::DType logits_dtype,
       ml::OutputLayout* layout) {
      return guarded([&] {
        *layout = ml::paged_mqa_logits_output_layout(num_rows, max_context_len, logits_dtype);
      });
    },
    [](const ml::QuantizedTensor& q, const ml::QuantizedTensor& kv, const ml::TensorView& weights,
       const ml::TensorView& k_start, const ml::TensorView& k_end, const ml::TensorView& logits,
       const ml::MqaLogitsOptions& options) {
      return guarded([&] { ml::mqa_logits(q, kv, weights, k_start, k_end, logits, options); });
    },
    [](const ml::QuantizedTensor& q, const ml::TensorView& kv_cache, const ml::TensorView& weights,
       const ml::TensorView& context_lens, const ml::TensorView& block_table,
       const ml::TensorView& schedule_meta, std::int64_t max_context_len,
       const ml::TensorView& logits, const ml::PagedMqaLogitsOptions& options) {
      return guarded([&] {
        ml::paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                             max_context_len, logits, options);
      });
    },
    [](const ml::TensorView& context_lens, int block_kv, int num_sms, const ml::TensorView& out,
       const std::optional<ml::TensorView>& indices, cudaStream_t stream) {
      return guarded([&] {
        ml::get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, out, indices, stream);
      });
    },
    [](const ml::TensorView& k_start, const ml::TensorView& k_end, std::int64_t seq_len_kv,
       int num_heads, const ml::TensorView& out, cudaStream_t stream) {
      return guarded([&] {
        ml::get_mqa_logits_metadata(k_start, k_end, seq_len_kv, num_heads, out, stream);
      });
    },
    [](int* num_sms) { return guarded([&] { *num_sms = ml::get_num_sms(); }); },
    [] { return table_message.c_str(); },
};

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
      "Low-level bindings of the mqa_logits C++ library over array descriptors. Use the functions "
      "of the `mqa_logits` package instead: they allocate outputs and pick the CUDA stream.";
  m.attr("__version__") = MQA_LOGITS_VERSION;
  m.attr("LOGITS_ROW_ALIGNMENT_BYTES") = ml::kLogitsRowAlignmentBytes;
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

  m.def("mqa_logits", &prefill_logits, nb::arg("q"), nb::arg("q_scales").none(), nb::arg("kv"),
        nb::arg("kv_scales").none(), nb::arg("weights"), nb::arg("cu_seq_len_k_start"),
        nb::arg("cu_seq_len_k_end"), nb::arg("logits"),
        nb::arg("clean_logits"), nb::arg("max_seqlen_k"), nb::arg("schedule_meta").none(),
        nb::arg("stream"),
        "Prefill logits into the preallocated `logits`. Each array is a descriptor (data_ptr, "
        "DType, shape, strides in elements, device: -1 host or the CUDA ordinal), scales and "
        "metadata may be None; `stream` is a cudaStream_t as an integer (0 for host arrays or "
        "the default stream).");
  m.def("paged_mqa_logits", &paged_logits, nb::arg("q"), nb::arg("q_scales").none(),
        nb::arg("kv_cache"), nb::arg("weights"), nb::arg("context_lens"), nb::arg("block_table"),
        nb::arg("schedule_meta"), nb::arg("max_context_len"), nb::arg("logits"),
        nb::arg("clean_logits"), nb::arg("indices").none(), nb::arg("stream"),
        "Decode logits over a paged KV cache into the preallocated `logits`.");
  m.def("get_paged_mqa_logits_metadata", &paged_metadata, nb::arg("context_lens"),
        nb::arg("block_kv"), nb::arg("num_sms"), nb::arg("out"), nb::arg("indices").none(),
        nb::arg("stream"), "Decode schedule metadata into `out` (int32 [num_sms + 1, 2]).");
  m.def("get_mqa_logits_metadata", &prefill_metadata, nb::arg("cu_seq_len_k_start"),
        nb::arg("cu_seq_len_k_end"), nb::arg("seq_len_kv"), nb::arg("num_heads"), nb::arg("out"),
        nb::arg("stream"), "Prefill schedule metadata into `out` (int32 [get_num_sms() + 1, 2]).");

  m.attr("MAX_TOPK") = ml::kMaxTopk;
  // The capability table (mqa_logits/capabilities.hpp), for the package's docstrings and checks.
  const auto ints = [](const auto& values) {
    nb::list list;
    for (const int value : values) list.append(value);
    return nb::tuple(list);
  };
  m.attr("HEAD_COUNTS") = ints(ml::capabilities::kHeadCounts);
  m.attr("HEAD_DIMS") = ints(ml::capabilities::kHeadDims);
  m.attr("MXFP4_HEAD_DIMS") = ints(ml::capabilities::kMxfp4HeadDims);
  m.attr("MAX_NEXT_N") = ml::capabilities::kMaxNextN;
  m.attr("BLOCK_KVS") = ints(ml::capabilities::kBlockKvs);
  m.def("mqa_topk_workspace_bytes", &ml::mqa_topk_workspace_bytes, nb::arg("seq_len"),
        nb::arg("seq_len_kv"), nb::arg("topk"), "Bytes of the workspace mqa_topk needs.");
  m.def("paged_mqa_topk_workspace_bytes", &ml::paged_mqa_topk_workspace_bytes,
        nb::arg("num_rows"), nb::arg("max_context_len"), nb::arg("topk"),
        "Bytes of the workspace paged_mqa_topk needs.");
  m.def("topk_per_row", &per_row_topk, nb::arg("logits"), nb::arg("starts").none(),
        nb::arg("ends"), nb::arg("topk"), nb::arg("topk_indices"), nb::arg("values").none(),
        nb::arg("compressed"), nb::arg("absolute_indices"), nb::arg("stream"),
        "Top-k indices of logits rows into the preallocated int32 `topk_indices` [R, topk].");
  m.def("mqa_topk", &prefill_topk, nb::arg("q"), nb::arg("q_scales").none(), nb::arg("kv"),
        nb::arg("kv_scales").none(), nb::arg("weights"), nb::arg("cu_seq_len_k_start"),
        nb::arg("cu_seq_len_k_end"), nb::arg("topk"), nb::arg("topk_indices"),
        nb::arg("workspace"), nb::arg("values").none(), nb::arg("absolute_indices"),
        nb::arg("schedule_meta").none(), nb::arg("logits_dtype").none(), nb::arg("stream"),
        "Prefill top-k key indices into the preallocated `topk_indices` [S, topk].");
  m.def("paged_mqa_topk", &paged_topk, nb::arg("q"), nb::arg("q_scales").none(),
        nb::arg("kv_cache"), nb::arg("weights"), nb::arg("context_lens"), nb::arg("block_table"),
        nb::arg("schedule_meta"), nb::arg("max_context_len"), nb::arg("topk"),
        nb::arg("topk_indices"), nb::arg("workspace"), nb::arg("values").none(),
        nb::arg("cache_slots"), nb::arg("indices").none(), nb::arg("logits_dtype").none(),
        nb::arg("stream"),
        "Decode top-k key positions (or cache slots) into `topk_indices` [B * N, topk].");

  m.def("merge_topk", &merge, nb::arg("candidate_values"), nb::arg("candidate_indices"),
        nb::arg("topk"), nb::arg("topk_indices"), nb::arg("values").none(), nb::arg("stream"),
        "The top-k of R candidate lists per row ([R, S, K]) into `topk_indices` [S, topk].");

  m.def(
      "api_table",
      [] {
        return nb::capsule(static_cast<const void*>(&api_table), ml::python::kApiTableName);
      },
      "The C++ API as a capsule of a table of functions (api_table.hpp), for the package's "
      "torch extension.");
  m.def("get_num_sms", &ml::get_num_sms,
        "SMs (CPU: worker threads) the kernels may use; the device's count unless set.");
  m.def("set_num_sms", &ml::set_num_sms, nb::arg("new_num_sms"),
        "Limit the SMs (CPU: worker threads) the kernels may use; 0 goes back to the default.");
  m.def("cuda_backend_available", &ml::cuda_backend_available,
        "True when this build has the CUDA backend and a compute capability 9.0 GPU is visible.");
}
