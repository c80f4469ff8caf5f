// random_layer_weights with an explicit thread count, so tests can check that the result does not
// depend on it.
#pragma once

#include <cstdint>

#include "fp4moe/layer.hpp"

namespace fp4moe::detail {

LayerWeights random_layer_weights(const LayerDesc& desc, std::uint64_t seed, int threads);

}  // namespace fp4moe::detail
