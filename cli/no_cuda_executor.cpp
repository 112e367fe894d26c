// Builds without the CUDA toolkit have no GPU executor.
#include <stdexcept>

#include "executor.hpp"

namespace mqa_logits::cli {

std::unique_ptr<Executor> make_cuda_executor() {
  throw std::runtime_error(
      "this build of mqa-logits has no CUDA support (configured with MQA_LOGITS_CUDA=OFF or "
      "without a CUDA compiler)");
}

}  // namespace mqa_logits::cli
