// The layer-shape options `fp4moe bench` and `fp4moe tune` share: a preset and overrides of its
// dimensions, router, format and activation.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "fp4moe/layer.hpp"

namespace fp4moe::cli {

struct LayerShapeOptions {
  std::string shape = "glm5";
  std::int64_t hidden = 0, intermediate = 0, experts = 0, top_k = 0, shared = -1;
  std::string router, format, activation;

  // --shape, --hidden, --intermediate, --experts, --top-k, --shared, --router, --format,
  // --activation.
  void add_to(CLI::App& cmd);
  // Whether any override was given.
  bool overridden() const;
  // Applies the given overrides to d (not validated: the caller validates the result).
  void apply(LayerDesc& d) const;
};

}  // namespace fp4moe::cli
