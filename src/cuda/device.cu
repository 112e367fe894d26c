// Device queries and pointer checks of the CUDA backend (the host side of validation).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <string>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_check.hpp"
#include "mqa_logits/errors.hpp"

namespace mqa_logits::cuda_backend {
namespace {

constexpr int kHopperComputeCapability = 90;

std::string device_label(int device) { return "cuda:" + std::to_string(device); }

int device_attribute(cudaDeviceAttr attribute, int device, const char* what) {
  int value = 0;
  check_cuda(cudaDeviceGetAttribute(&value, attribute, device), what);
  return value;
}

cudaPointerAttributes pointer_attributes(const void* ptr) {
  cudaPointerAttributes attributes{};
  check_cuda(cudaPointerGetAttributes(&attributes, ptr), "cudaPointerGetAttributes");
  return attributes;
}

std::string describe_memory(const cudaPointerAttributes& attributes) {
  switch (attributes.type) {
    case cudaMemoryTypeDevice: return "device memory of " + device_label(attributes.device);
    case cudaMemoryTypeManaged: return "managed memory";
    case cudaMemoryTypeHost: return "page-locked host memory";
    case cudaMemoryTypeUnregistered: break;
  }
  return "pageable host memory";
}

}  // namespace

int device_count() {
  // Counted once: the visible devices do not change while a process runs. A missing or broken
  // driver means no usable device, not an error: the CPU backend must keep working on such
  // machines. The failure is cleared so it does not surface elsewhere.
  static const int count = [] {
    int visible = 0;
    if (cudaGetDeviceCount(&visible) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return 0;
    }
    return std::min(visible, kMaxDevices);
  }();
  return count;
}

bool any_device() { return device_count() > 0; }

bool available() {
  const int count = device_count();
  for (int device = 0; device < count; ++device) {
    if (device_limits(device).compute_capability == kHopperComputeCapability) return true;
  }
  return false;
}

int current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

const DeviceLimits& device_limits(int device) {
  // Queried on first use of each device, then read: a call's host time must not pay a driver
  // query per attribute.
  static std::array<DeviceLimits, kMaxDevices> limits;
  static std::array<std::once_flag, kMaxDevices> queried;
  if (device < 0 || device >= device_count()) {
    throw CudaError("device_limits: no visible CUDA device " + std::to_string(device));
  }
  std::call_once(queried[device], [device] {
    const int major = device_attribute(cudaDevAttrComputeCapabilityMajor, device,
                                       "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMajor)");
    const int minor = device_attribute(cudaDevAttrComputeCapabilityMinor, device,
                                       "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMinor)");
    limits[device] = {
        device_attribute(cudaDevAttrMultiProcessorCount, device,
                         "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)"),
        major * 10 + minor,
        device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device,
                         "cudaDeviceGetAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)")};
  });
  return limits[device];
}

void require_device_pointer(const void* ptr, int device, const char* argument) {
  const cudaPointerAttributes attributes = pointer_attributes(ptr);
  // Managed memory is reachable from every device, whichever one it was allocated on.
  if (attributes.type == cudaMemoryTypeManaged) return;
  if (attributes.type == cudaMemoryTypeDevice && attributes.device == device) return;
  throw InvalidArgument(argument, "expected device memory of " + device_label(device) +
                                      ", got " + describe_memory(attributes));
}

void require_host_pointer(const void* ptr, const char* argument) {
  if (!any_device()) return;  // without a device there is no device memory
  const cudaPointerAttributes attributes = pointer_attributes(ptr);
  if (attributes.type != cudaMemoryTypeDevice) return;
  throw InvalidArgument(argument, "expected host memory (a cpu tensor), got " +
                                      describe_memory(attributes));
}

}  // namespace mqa_logits::cuda_backend
