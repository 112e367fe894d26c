// The prefill kernel's producer, warp 0 of warpgroup 0 (docs/design.md, "The prefill kernel",
// Roles): the key tiles and their scales into the stage ring.
#pragma once

#include "kernels/sm90/prefill_plan.cuh"
#include "kernels/sm90/primitives.cuh"

namespace mqa_logits::sm90 {

// Warp 0: the key tiles and their scales of every block span of this CTA (lane 0 issues).
template <typename T>
__device__ __forceinline__ void produce_key_tiles(const PrefillParams& p,
                                                  const PrefillShared<T>& sh, int lane) {
  RingPosition<T::kStages> kv;
  for_each_block_span<T::kHeads>(p, [&](const BlockSpan& s) {
    for (int t = s.first_tile; t < s.end_tile; ++t) {
      if (lane == 0) {
        const int key0 = s.lo + t * T::kTileKV;
        sh.kv_empty[kv.stage].wait(kv.phase ^ 1);
        sh.kv_full[kv.stage].arrive_expect_bytes(T::kKVBytes + T::kScaleBytes);
        tma_load_2d(sh.kv_tiles + kv.stage * T::kKVBytes, &p.kv_map, 0, key0,
                    &sh.kv_full[kv.stage]);
        tma_load_2d(sh.scale_tiles + kv.stage * T::kScaleBytes, &p.kscale_map, key0, 0,
                    &sh.kv_full[kv.stage]);
      }
      kv.advance();
    }
  });
}

}  // namespace mqa_logits::sm90
