// The run-time (format, head dim, heads) of a call mapped to a compiled kernel instance.
#pragma once

#include <iterator>
#include <string>
#include <type_traits>
#include <utility>

#include "instances.hpp"
#include "mqa_logits/errors.hpp"

namespace mqa_logits::cuda_backend {

// Calls f(std::integral_constant<Format, F>{}, std::integral_constant<int, D>{},
// std::integral_constant<int, H>{}) for the compiled instance (instances.hpp) of (format,
// head_dim, num_heads); validation accepts no other triple, which is refused here too, naming `q`.
template <typename F>
void with_instance(Format format, int head_dim, int num_heads, F&& f) {
  using instances::kCudaFormats;
  using instances::kHeadCounts;
  using instances::kHeadDims;
  // Each list's index sequence, expanded in turn: a fold over one list tries its values.
  const auto any_of = []<std::size_t... kIndex>(std::index_sequence<kIndex...>, auto&& try_index) {
    return (try_index.template operator()<kIndex>() || ...);
  };
  const auto try_format = [&]<std::size_t kF>() {
    if (format != kCudaFormats[kF]) return false;
    return any_of(std::make_index_sequence<std::size(kHeadDims)>{}, [&]<std::size_t kD>() {
      if (head_dim != kHeadDims[kD]) return false;
      return any_of(std::make_index_sequence<std::size(kHeadCounts)>{}, [&]<std::size_t kH>() {
        if (num_heads != kHeadCounts[kH]) return false;
        f(std::integral_constant<Format, kCudaFormats[kF]>{},
          std::integral_constant<int, kHeadDims[kD]>{},
          std::integral_constant<int, kHeadCounts[kH]>{});
        return true;
      });
    });
  };
  if (!any_of(std::make_index_sequence<std::size(kCudaFormats)>{}, try_format)) {
    throw InvalidArgument("q", std::string("no kernel instance for the ") + format_name(format) +
                                   " format, head dim " + std::to_string(head_dim) + " and " +
                                   std::to_string(num_heads) + " heads");
  }
}

}  // namespace mqa_logits::cuda_backend
