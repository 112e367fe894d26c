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
  // Stage 0's parts as shared-memory addresses, computed once: the tile loop then finds a
  // stage's by one multiply-add each (from the base and the layout, ptxas rebuilt each part every
  // tile, the alignment of the base included).
  std::uint32_t full0;
  std::uint32_t empty0;
  std::uint32_t tile0;
  std::uint32_t scales0;
  std::uint32_t info0;

  __device__ SharedState(std::uint8_t* aligned_base, const SmemLayout& smem)
      : base(aligned_base),
        layout(smem),
        full0(smem_address(aligned_base + smem.barriers_offset)),
        empty0(full0 + smem.stages * sizeof(Barrier)),
        tile0(smem_address(aligned_base + smem.tiles_offset)),
        scales0(smem_address(aligned_base + smem.scales_offset)),
        info0(smem_address(aligned_base + smem.info_offset)) {}
  // The generic pointer to shared-memory address `address` (the conversions back to it fold).
  template <typename T>
  __device__ static T* generic(std::uint32_t address) {
    return static_cast<T*>(__cvta_shared_to_generic(address));
  }
  // Barriers: full[stages], empty[stages], q_full[kQSlots], q_empty[kQSlots], pipeline_ready.
  __device__ Barrier* barrier(int index) const {
    return generic<Barrier>(full0 + index * sizeof(Barrier));
  }
  __device__ Barrier* full(int stage) const { return barrier(stage); }
  __device__ Barrier* empty(int stage) const {
    return generic<Barrier>(empty0 + stage * sizeof(Barrier));
  }
  __device__ Barrier* q_full(int slot) const { return barrier(2 * layout.stages + slot); }
  __device__ Barrier* q_empty(int slot) const {
    return barrier(2 * layout.stages + kQSlots + slot);
  }
  // Completes once the barriers before it are initialized (docs/design.md, "The decode kernel",
  // Ring).
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
    return generic<std::uint8_t>(tile0 + stage * layout.tile_bytes);
  }
  // The wgmma descriptor of a stage's key tile: stage 0's, its address field advanced (shared
  // memory addresses stay below the field's 2^18 bytes, so no carry leaves it).
  template <int RowBytes>
  __device__ std::uint64_t tile_descriptor(int stage) const {
    return kmajor_descriptor<RowBytes>(generic<std::uint8_t>(tile0)) +
           static_cast<std::uint64_t>(stage) * (layout.tile_bytes >> 4);
  }
  __device__ float* scales(int stage) const {
    return generic<float>(scales0 + stage * kTileKeys * sizeof(float));
  }
  __device__ std::uint32_t* info(int stage) const {
    return generic<std::uint32_t>(info0 + stage * sizeof(std::uint32_t));
  }
};

}  // namespace mqa_logits::sm90::paged
