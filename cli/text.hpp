// printf-style formatting into a std::string, for the report and progress lines.
#pragma once

#include <cstdio>
#include <string>

namespace mqa_logits::cli {

template <typename... Args>
std::string format_string(const char* format, Args... args) {
  const int size = std::snprintf(nullptr, 0, format, args...);
  std::string text(static_cast<std::size_t>(size > 0 ? size : 0), '\0');
  std::snprintf(text.data(), text.size() + 1, format, args...);
  return text;
}

}  // namespace mqa_logits::cli
