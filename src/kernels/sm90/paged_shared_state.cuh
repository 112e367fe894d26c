// The decode kernel's shared-memory accessors (paged_kernel.cuh): the carve-up of make_smem_layout
// (paged_plan.cuh) as barriers, q and weight slots, key tiles, scales and per-stage words.
#pragma once

#include <cstdint>

#include "kernels/sm90/paged_plan.cuh"
#include "kernels/sm90/primitives.cuh"

namespace mqa_logits::sm90::paged {

struct SharedState {
  std::uint8_t* base;
  const SmemLayout& layout;

  __device__ SharedState(std::uint8_t* aligned_base, const SmemLayout& smem)
      : base(aligned_base), layout(smem) {}
  // Barriers: full[stages], empty[stages], q_full[kQSlots], q_empty[kQSlots], pipeline_ready.
  __device__ Barrier* barrier(int index) const {
    return reinterpret_cast<Barrier*>(base + layout.barriers_offset) + index;
  }
  __device__ Barrier* full(int stage) const { return barrier(stage); }
  __device__ Barrier* empty(int stage) const { return barrier(layout.stages + stage); }
  __device__ Barrier* q_full(int slot) const { return barrier(2 * layout.stages + slot); }
  __device__ Barrier* q_empty(int slot) const {
    return barrier(2 * layout.stages + kQSlots + slot);
  }
  // Completes once the barriers before it are initialized (paged_kernel.cuh, Pipeline).
  __device__ Barrier* pipeline_ready() const { return barrier(2 * layout.stages + 2 * kQSlots); }
  __device__ std::uint8_t* q_slot(int slot) const {
    return base + layout.q_offset + slot * layout.q_slot_bytes;
  }
  __device__ std::uint8_t* weight_slot(int slot) const {
    return base + layout.weights_offset + slot * layout.weight_slot_bytes;
  }
  __device__ float* fp32_weights(int math_warpgroup) const {
    return reinterpret_cast<float*>(base + layout.fp32_weights_offset +
                                    math_warpgroup * layout.fp32_weights_bytes);
  }
  __device__ std::uint8_t* tile(int stage) const {
    return base + layout.tiles_offset + stage * layout.tile_bytes;
  }
  __device__ float* scales(int stage) const {
    return reinterpret_cast<float*>(base + layout.scales_offset) + stage * kTileKeys;
  }
  __device__ std::uint32_t* info(int stage) const {
    return reinterpret_cast<std::uint32_t*>(base + layout.info_offset) + stage;
  }
};

}  // namespace mqa_logits::sm90::paged
