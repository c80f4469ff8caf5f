// fp4moe: the description of a Mixture-of-Experts layer and its weights.
//
// A layer maps hidden states x [T, H] to out [T, H]:
//   1. route: each token picks top_k of E routed experts and a weight for each (RouterKind);
//   2. each picked expert e computes  down_e( act( gate_e(x), up_e(x) ) )  where gate_e and up_e
//      are [I, H] and down_e is [H, I] quantized matrices (NVFP4 or MXFP4);
//   3. out = sum over the k picks of weight * expert output, plus the shared expert's output
//      (unweighted) when the layer has one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp4moe/formats.hpp"

namespace fp4moe {

enum class RouterKind : std::uint8_t {
  // Qwen3, Mixtral: softmax (fp32) over all experts, top-k, then (renormalize) w /= sum(w).
  kSoftmaxTopK,
  // DeepSeek-V3, GLM-4.5/5, Kimi K2 ("noaux_tc"): s = sigmoid(logits); c = s + correction_bias;
  // group score = sum of the top 2 of c in each of n_group groups; keep topk_group groups;
  // ids = top-k of c over the kept groups; w = s[ids]; (renormalize) w /= sum(w) + 1e-20;
  // w *= routed_scaling_factor.
  kSigmoidGroupTopK,
  // gpt-oss: top-k of the logits, then softmax over those k.
  kTopKSoftmax,
};

enum class Activation : std::uint8_t {
  kSwiGLU,         // silu(g) * u
  kSwiGLUClamped,  // gpt-oss: g = min(g, limit); u = clamp(u, -limit, limit); g*sigmoid(alpha*g)*(u+1)
};

std::string_view router_name(RouterKind kind) noexcept;  // "softmax", "sigmoid-group", "topk-softmax"
RouterKind parse_router_kind(std::string_view name);     // throws Error naming the value
std::string_view activation_name(Activation activation) noexcept;  // "swiglu", "swiglu-clamped"
Activation parse_activation(std::string_view name);

struct LayerDesc {
  std::int64_t hidden = 0;        // H: model hidden size (K of the first GEMM, N of the second)
  std::int64_t intermediate = 0;  // I: intermediate size of one routed expert
  std::int64_t experts = 0;       // E: routed experts
  std::int64_t top_k = 0;         // k: experts per token
  RouterKind router = RouterKind::kSoftmaxTopK;
  bool renormalize = true;             // norm_topk_prob
  std::int64_t n_group = 1;            // sigmoid router: expert groups
  std::int64_t topk_group = 1;         // sigmoid router: groups kept
  float routed_scaling_factor = 1.0f;  // sigmoid router: multiplies the final weights
  Activation activation = Activation::kSwiGLU;
  float swiglu_alpha = 1.702f;           // kSwiGLUClamped only
  float swiglu_limit = 7.0f;             // kSwiGLUClamped only
  std::int64_t shared_intermediate = 0;  // intermediate size of the shared expert; 0 = none
  WeightFormat format = WeightFormat::kNvfp4;
  bool expert_bias = false;  // experts carry biases (gpt-oss)

  // Throws Error naming the first bad field and what was expected (hidden and intermediate a
  // multiple of the format's block, 1 <= top_k <= experts, n_group divides experts, ...).
  void validate() const;
  // One line, e.g. "H=6144 I=2048 E=256 top-8 sigmoid-group(groups 1/1, scale 2.5) swiglu nvfp4 shared
  // I=2048".
  std::string to_string() const;
  // The shared expert as pseudo-experts of the routed experts' size: ceil(shared_intermediate /
  // intermediate) pieces, each taking every token (0 without a shared expert).
  std::int64_t shared_pieces() const noexcept {
    return shared_intermediate > 0 && intermediate > 0
               ? (shared_intermediate + intermediate - 1) / intermediate
               : 0;
  }
  // Experts that receive at least one of T tokens' picks when the router picks top_k of experts
  // uniformly: E (1 - (1 - k/E)^T), at least 1. The planner's cost model and the dispatcher size
  // the GEMMs' work by it.
  double expected_active_experts(std::int64_t tokens) const;
};

// Real model shapes: glm5, glm45, deepseek-v3, kimi-k2, qwen3-235b, qwen3-30b, gpt-oss-120b,
// mixtral-8x7b. Throws Error listing the known names for an unknown one.
LayerDesc layer_preset(std::string_view name);
std::vector<std::string> layer_preset_names();

struct ExpertWeights {
  QuantizedMatrix gate;                              // [I, H]
  QuantizedMatrix up;                                // [I, H]
  QuantizedMatrix down;                              // [H, I]
  std::vector<float> gate_bias, up_bias, down_bias;  // empty, or [I], [I], [H] (expert_bias)
};

struct LayerWeights {
  LayerDesc desc;
  std::vector<ExpertWeights> experts;   // E routed experts
  std::optional<ExpertWeights> shared;  // present iff desc.shared_intermediate > 0
  std::vector<float> correction_bias;   // [E] for kSigmoidGroupTopK (e_score_correction_bias), else empty
  // Optional router projection for callers that start from hidden states rather than logits
  // (`fp4moe run`): logits = x @ router_weight^T + router_logit_bias.
  std::vector<float> router_weight;      // [E, H] or empty
  std::vector<float> router_logit_bias;  // [E] or empty

  // Throws Error naming the expert, matrix and the mismatched size.
  void validate() const;
};

// Random weights of realistic scale for tests and benchmarks, drawn directly as quantized codes
// and scales (cheap even for the 5 GB GLM-5 layer): E2M1 codes distributed like ModelOpt's output
// for Gaussian weights (both signs), NVFP4 block scales E4M3 64..448, global scales 2e-5..1e-4
// (gate and up share one), MXFP4 scales 2^-8..2^-5, so that weights are ~0.01-0.05; small random
// correction_bias (sigmoid router) and BF16 biases (expert_bias); router_weight left empty.
// Deterministic in seed, whatever the thread count (docs/NUMERICS.md).
LayerWeights random_layer_weights(const LayerDesc& desc, std::uint64_t seed);

}  // namespace fp4moe
