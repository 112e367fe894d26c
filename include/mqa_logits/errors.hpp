// Exceptions thrown by the library.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace mqa_logits {

// Invalid input, refused before any launch: what() names the argument, the expectation and what
// was given, e.g. "kv: expected dtype float8_e4m3, got int32".
class InvalidArgument : public std::invalid_argument {
 public:
  InvalidArgument(std::string argument, const std::string& message)
      : std::invalid_argument(argument + ": " + message), argument_(std::move(argument)) {}
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

// A CUDA runtime or driver call failed; what() names the call and the CUDA error string.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace mqa_logits
