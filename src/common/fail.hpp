// Throwing helpers for host code (not for .cu files: nvcc 13 cannot compile fmt's consteval
// format strings with g++ 13 on the GPU machine).
#pragma once

#include <fmt/format.h>

#include <utility>

#include "fp4moe/error.hpp"

namespace fp4moe {

template <typename... Args>
[[noreturn]] void fail(Errc code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// fail(Errc::kInvalidArgument, ...) unless the condition holds.
template <typename... Args>
void require(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) throw Error(Errc::kInvalidArgument, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace fp4moe
