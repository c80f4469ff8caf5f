// Helpers the CPU tests share: the message of the fp4moe::Error a call throws, and layer shapes
// by their four numbers.
#pragma once

#include <cstdint>
#include <string>

#include "fp4moe/error.hpp"
#include "fp4moe/layer.hpp"

namespace fp4moe::test_util {

// What f throws as fp4moe::Error (its code into *code when given), or "no error".
template <typename F>
std::string error_of(F&& f, Errc* code = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (code != nullptr) *code = e.code();
    return e.what();
  }
  return "no error";
}

inline LayerDesc layer(std::int64_t hidden, std::int64_t intermediate, std::int64_t experts,
                       std::int64_t top_k) {
  LayerDesc d;
  d.hidden = hidden;
  d.intermediate = intermediate;
  d.experts = experts;
  d.top_k = top_k;
  return d;
}

// GLM-5's routed experts: hidden 6144, 256 experts of 2048, top-8 (the rest default).
inline LayerDesc glm5() {
  return layer(6144, 2048, 256, 8);
}

}  // namespace fp4moe::test_util
