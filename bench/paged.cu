// Decode benchmark suite: empty until the CUDA decode kernel lands (paged_mqa_logits on CUDA
// tensors is refused in this release).
#include <cstdio>

#include "common.hpp"

namespace mqa_logits::bench {

std::vector<Record> run_paged_bench(const BenchContext&) {
  std::printf("decode: no CUDA decode kernel in this release; nothing to time\n");
  return {};
}

}  // namespace mqa_logits::bench
