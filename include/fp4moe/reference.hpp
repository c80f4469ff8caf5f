// fp4moe: the CPU reference forward pass, the oracle every GPU path is tested against.
//
// Written for clarity: weights are dequantized exactly (e2m1 * scale * global scale), products
// are accumulated in fp32, activations are BF16. Numerics that the GPU path shares by design:
//   - the expert intermediate act(gate, up) is rounded to BF16 before the down projection
//     (the GPU stores it as BF16);
//   - the output is accumulated in fp32 over the k picks (in rank order) plus the shared
//     expert, and rounded to BF16 once.
// Non-finite inputs: a NaN router logit ranks below every number (never picked before a finite
// logit); NaN or Inf in x propagates (IEEE) into that token's output only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "fp4moe/bf16.hpp"
#include "fp4moe/layer.hpp"

namespace fp4moe {

// The routing decision for T tokens: ids[t*k + j] is the j-th pick of token t (picks ranked by
// the router's selection score, descending; equal scores: the lower expert id first), and
// weights[t*k + j] its weight.
struct Routing {
  std::int64_t tokens = 0;
  std::int64_t top_k = 0;
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
};

// Routes T tokens from router logits [T, E] (fp32). correction_bias is [E] for the sigmoid
// router and ignored (may be empty) otherwise. Throws Error on shape mismatches.
Routing route(const LayerDesc& desc, std::span<const float> logits, std::int64_t tokens,
              std::span<const float> correction_bias = {});

struct ReferenceOptions {
  int threads = 0;  // 0: std::thread::hardware_concurrency()
};

struct ReferenceResult {
  std::vector<Bf16> out;  // [T, H]
  Routing routing;
};

// The whole layer: route from logits [T, E], then experts and reduction. T = 0 is allowed and
// returns empty results. Deterministic for any thread count.
ReferenceResult reference_forward(const LayerWeights& weights, std::span<const Bf16> x,
                                  std::span<const float> router_logits, std::int64_t tokens,
                                  const ReferenceOptions& options = {});

// The same with a routing decision made elsewhere (engines that route themselves).
ReferenceResult reference_forward_routed(const LayerWeights& weights, std::span<const Bf16> x,
                                         const Routing& routing, const ReferenceOptions& options = {});

// Router logits from hidden states, for layers that carry router_weight: x @ W^T (+ bias), fp32.
std::vector<float> router_logits(const LayerWeights& weights, std::span<const Bf16> x, std::int64_t tokens);

}  // namespace fp4moe
