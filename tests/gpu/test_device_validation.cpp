// Validation of device tensors on a real GPU: host memory passed as a CUDA tensor (and the
// reverse), device alignment, mixed devices, SM counts. Every refusal names the argument, leaves
// the device output untouched and leaves no CUDA error behind.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "gpu/gpu_test_support.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "validation_inputs.hpp"

namespace mqa_logits {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::kGpu;
using gpu_test::upload_values;
using test::expect_refused;
using test::PrefillInputs;

// Points `view` at `buffer` on the GPU.
void place(TensorView& view, const DeviceBuffer& buffer) {
  view.data = buffer.data();
  view.device = kGpu;
}

// Whether `logits` (uploaded from the inputs' poisoned host output) holds only test::kPoison.
bool still_poisoned(const DeviceBuffer& logits) {
  const auto bytes = logits.download();
  return std::all_of(bytes.begin(), bytes.end(),
                     [](std::byte b) { return b == std::byte{test::kPoison}; });
}

// The call was refused naming `argument`; nothing reached `logits` or the CUDA error state.
template <typename Call>
void expect_refused_untouched(Call&& call, const std::string& argument, const DeviceBuffer& logits) {
  expect_refused(std::forward<Call>(call), argument);
  EXPECT_TRUE(still_poisoned(logits));
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// A prefill call whose tensors all live on the GPU, built from host inputs.
class DevicePrefill : public gpu_test::GpuTest {
 protected:
  void SetUp() override {
    gpu_test::GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    q_ = upload_values(in_.q_data);
    kv_ = upload_values(in_.kv_data);
    kv_scales_ = upload_values(in_.kv_scale_data);
    weights_ = upload_values(in_.weights_data);
    start_ = upload_values(in_.start_data);
    end_ = upload_values(in_.end_data);
    logits_ = upload_values(in_.out.bytes);  // poisoned
    place(in_.q.values, q_);
    place(in_.kv.values, kv_);
    place(*in_.kv.scales, kv_scales_);
    place(in_.weights, weights_);
    place(in_.k_start, start_);
    place(in_.k_end, end_);
    place(in_.logits, logits_);
  }

  // The call is refused naming `argument`; nothing reached the output or the error state.
  void expect_refused_call(const std::string& argument) {
    expect_refused_untouched([&] { in_.call(); }, argument, logits_);
  }

  PrefillInputs in_;
  DeviceBuffer q_, kv_, kv_scales_, weights_, start_, end_, logits_;
};

TEST_F(DevicePrefill, RefusesHostMemoryMarkedAsDevice) {
  in_.weights.data = in_.weights_data.data();
  expect_refused_call("weights");
}

TEST_F(DevicePrefill, RefusesMixedDevices) {
  in_.k_end.data = in_.end_data.data();
  in_.k_end.device = Device{};
  expect_refused_call("k_end");
}

TEST_F(DevicePrefill, RefusesAnInvisibleDeviceIndex) {
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  for (TensorView* view : {&in_.q.values, &in_.kv.values, &*in_.kv.scales, &in_.weights,
                           &in_.k_start, &in_.k_end, &in_.logits}) {
    view->device.index = count;
  }
  expect_refused_call("q");
}

TEST_F(DevicePrefill, RefusesMisalignedDeviceData) {
  // The keys 8 bytes into a larger allocation: element-aligned, but not 16-byte aligned.
  const DeviceBuffer larger(in_.kv_data.size() + 16);
  in_.kv.values.data = static_cast<std::uint8_t*>(larger.data()) + 8;
  expect_refused_call("kv");
}

TEST_F(DevicePrefill, RefusesKeyScalesNotSixteenByteAligned) {
  // The key scales 4 bytes into a larger allocation: element-aligned, but not 16-byte aligned.
  const DeviceBuffer larger(in_.kv_scale_data.size() * sizeof(float) + 16);
  in_.kv.scales->data = static_cast<std::uint8_t*>(larger.data()) + 4;
  expect_refused_call("kv_scales");
}

TEST_F(DevicePrefill, RefusesLogitsRowsNotSixteenByteAligned) {
  in_.logits.strides[0] = in_.logits.shape[1] + 1;  // 51 fp32 = 204 bytes apart
  expect_refused_call("logits");
}

TEST_F(DevicePrefill, RefusesDeviceMemoryMarkedAsHost) {
  // Every tensor on the host but one whose pointer is device memory.
  PrefillInputs host;
  host.k_start.data = start_.data();
  expect_refused([&] { host.call(); }, "k_start");
  EXPECT_TRUE(host.out.untouched());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// On a CUDA device q's rows (S x H, B x N x H) are TMA coordinates, 32-bit: a q claiming more is
// refused before anything reads it (only its shape is large; its memory is the small upload).
TEST_F(DevicePrefill, RefusesQueryRowsPastThirtyTwoBits) {
  in_.q.values.shape[0] = (std::int64_t{1} << 31) / in_.q.values.shape[1] + 1;
  expect_refused_call("q");
}

// The checking mode synchronizes, which a capturing stream cannot: asked for during a capture it
// is refused before anything is captured, and the capture stays valid; a call without it is
// captured, and the graph's replay writes the logits.
TEST_F(DevicePrefill, CheckingModeIsRefusedWhileCapturing) {
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  in_.options.stream = stream;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "BeginCapture");
  in_.options.check_inputs = true;
  expect_refused([&] { in_.call(); }, "check_inputs");
  in_.options.check_inputs = std::nullopt;
  in_.call();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_TRUE(still_poisoned(logits_)) << "written while capturing";
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  EXPECT_FALSE(still_poisoned(logits_)) << "the replay wrote nothing";
  check_cuda(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
  check_cuda(cudaGraphDestroy(graph), "cudaGraphDestroy");
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(DevicePrefill, BackendPointerChecks) {
  EXPECT_NO_THROW(cuda_backend::require_device_pointer(q_.data(), 0, "q"));
  EXPECT_NO_THROW(cuda_backend::require_host_pointer(in_.q_data.data(), "q"));
  expect_refused([&] { cuda_backend::require_device_pointer(in_.q_data.data(), 0, "x"); }, "x");
  expect_refused([&] { cuda_backend::require_host_pointer(q_.data(), "y"); }, "y");
  void* managed = nullptr;
  check_cuda(cudaMallocManaged(&managed, 256), "cudaMallocManaged");
  EXPECT_NO_THROW(cuda_backend::require_device_pointer(managed, 0, "m"));
  EXPECT_NO_THROW(cuda_backend::require_host_pointer(managed, "m"));
  check_cuda(cudaFree(managed), "cudaFree");
  void* pinned = nullptr;
  check_cuda(cudaMallocHost(&pinned, 256), "cudaMallocHost");
  expect_refused([&] { cuda_backend::require_device_pointer(pinned, 0, "p"); }, "p");
  EXPECT_NO_THROW(cuda_backend::require_host_pointer(pinned, "p"));
  check_cuda(cudaFreeHost(pinned), "cudaFreeHost");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Device copies of a paged call's inputs (all but the block table), its views moved onto them.
struct DevicePaged {
  DeviceBuffer q, cache, weights, lens, meta, logits;
  explicit DevicePaged(test::PagedInputs& paged)
      : q(upload_values(paged.q_data)), cache(upload_values(paged.cache_data)),
        weights(upload_values(paged.weights_data)), lens(upload_values(paged.lens_data)),
        meta(upload_values(paged.meta_data)), logits(upload_values(paged.out.bytes)) {
    place(paged.q.values, q);
    place(paged.kv_cache, cache);
    place(paged.weights, weights);
    place(paged.context_lens, lens);
    place(paged.schedule_meta, meta);
    place(paged.logits, logits);
  }
};

TEST_F(DevicePrefill, PagedRefusesHostBlockTable) {
  test::PagedInputs paged;
  const DevicePaged device(paged);
  paged.block_table.device = kGpu;  // but still host memory
  expect_refused_untouched([&] { paged.call(); }, "block_table", device.logits);
}

TEST_F(DevicePrefill, PagedRefusesQueryRowsPastThirtyTwoBits) {
  test::PagedInputs paged;
  const DevicePaged device(paged);
  paged.block_table.device = kGpu;  // one device for all (its host memory is never read here)
  const auto& shape = paged.q.values.shape;
  paged.q.values.shape[0] = (std::int64_t{1} << 31) / (shape[1] * shape[2]) + 1;
  expect_refused_untouched([&] { paged.call(); }, "q", device.logits);
}

TEST_F(DevicePrefill, SmCountSettings) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "sms");
  const int before = get_num_sms();
  expect_refused([&] { set_num_sms(sms + 1); }, "num_sms");
  EXPECT_NO_THROW(set_num_sms(sms));
  EXPECT_EQ(get_num_sms(), sms);
  EXPECT_NO_THROW(set_num_sms(1));
  EXPECT_EQ(get_num_sms(), 1);
  set_num_sms(before);
  EXPECT_TRUE(cuda_backend_available());
}

}  // namespace
}  // namespace mqa_logits
