// The run-time (head dim, heads) of a call mapped to a compiled kernel instance.
#pragma once

#include <iterator>
#include <string>
#include <type_traits>
#include <utility>

#include "instances.hpp"
#include "mqa_logits/errors.hpp"

namespace mqa_logits::cuda_backend {

// Calls f(std::integral_constant<int, D>{}, std::integral_constant<int, H>{}) for the compiled
// instance (instances.hpp) of (head_dim, num_heads); validation accepts no other pair, which is
// refused here too, naming `q`.
template <typename F>
void with_instance(int head_dim, int num_heads, F&& f) {
  using instances::kHeadCounts;
  using instances::kHeadDims;
  const auto visit = [&]<std::size_t... kDims, std::size_t... kHeads>(
                         std::index_sequence<kDims...>, std::index_sequence<kHeads...>) {
    const auto try_dim = [&]<std::size_t kD>() {
      const auto try_heads = [&]<std::size_t kH>() {
        if (num_heads != kHeadCounts[kH]) return false;
        f(std::integral_constant<int, kHeadDims[kD]>{},
          std::integral_constant<int, kHeadCounts[kH]>{});
        return true;
      };
      return head_dim == kHeadDims[kD] && (try_heads.template operator()<kHeads>() || ...);
    };
    return (try_dim.template operator()<kDims>() || ...);
  };
  if (!visit(std::make_index_sequence<std::size(kHeadDims)>{},
             std::make_index_sequence<std::size(kHeadCounts)>{})) {
    throw InvalidArgument("q", "no kernel instance for head dim " + std::to_string(head_dim) +
                                   " and " + std::to_string(num_heads) + " heads");
  }
}

}  // namespace mqa_logits::cuda_backend
