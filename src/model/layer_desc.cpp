// LayerDesc: validation, printing, names and the presets of real models.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/fail.hpp"
#include "fp4moe/layer.hpp"

namespace fp4moe {
namespace {

// Sizes are bounded so that products of two of them fit in 64 bits and expert ids fit the int32
// of Routing::ids.
constexpr std::int64_t kMaxDimension = std::numeric_limits<std::int32_t>::max();

std::string_view upper_format_name(WeightFormat format) {
  return format == WeightFormat::kMxfp4 ? "MXFP4" : "NVFP4";
}

void require_block_multiple(std::string_view field, std::int64_t value, WeightFormat format,
                            bool allow_zero) {
  const int block = block_size(format);
  require(allow_zero ? value >= 0 : value > 0, "{}={} must be {}", field, value,
          allow_zero ? "at least 0" : "positive");
  require(value <= kMaxDimension, "{}={} is too large (at most {})", field, value, kMaxDimension);
  require(value % block == 0, "{}={} is not a multiple of {} (the {} block size)", field, value, block,
          upper_format_name(format));
}

}  // namespace

std::string_view router_name(RouterKind kind) noexcept {
  switch (kind) {
    case RouterKind::kSoftmaxTopK:
      return "softmax";
    case RouterKind::kSigmoidGroupTopK:
      return "sigmoid-group";
    case RouterKind::kTopKSoftmax:
      return "topk-softmax";
  }
  return "unknown";
}

RouterKind parse_router_kind(std::string_view name) {
  for (auto kind : {RouterKind::kSoftmaxTopK, RouterKind::kSigmoidGroupTopK, RouterKind::kTopKSoftmax}) {
    if (name == router_name(kind)) return kind;
  }
  fail(Errc::kInvalidArgument, "unknown router '{}': expected softmax, sigmoid-group or topk-softmax", name);
}

std::string_view activation_name(Activation activation) noexcept {
  switch (activation) {
    case Activation::kSwiGLU:
      return "swiglu";
    case Activation::kSwiGLUClamped:
      return "swiglu-clamped";
  }
  return "unknown";
}

Activation parse_activation(std::string_view name) {
  for (auto activation : {Activation::kSwiGLU, Activation::kSwiGLUClamped}) {
    if (name == activation_name(activation)) return activation;
  }
  fail(Errc::kInvalidArgument, "unknown activation '{}': expected swiglu or swiglu-clamped", name);
}

void LayerDesc::validate() const {
  require(format == WeightFormat::kNvfp4 || format == WeightFormat::kMxfp4,
          "format={} is not a known weight format (expected nvfp4 or mxfp4)", static_cast<int>(format));
  require_block_multiple("hidden", hidden, format, false);
  require_block_multiple("intermediate", intermediate, format, false);
  require(experts >= 1 && experts <= kMaxDimension, "experts={} must be between 1 and {}", experts,
          kMaxDimension);
  require(top_k >= 1 && top_k <= experts, "top_k={} must be between 1 and experts={}", top_k, experts);
  switch (router) {
    case RouterKind::kSoftmaxTopK:
    case RouterKind::kTopKSoftmax:
      break;
    case RouterKind::kSigmoidGroupTopK:
      require(n_group >= 1, "n_group={} must be at least 1 (sigmoid-group router)", n_group);
      require(experts % n_group == 0, "n_group={} does not divide experts={} (sigmoid-group router)", n_group,
              experts);
      require(topk_group >= 1 && topk_group <= n_group, "topk_group={} must be between 1 and n_group={}",
              topk_group, n_group);
      require(
          topk_group * (experts / n_group) >= top_k,
          "topk_group={} groups of {} experts hold {} experts, fewer than top_k={} (sigmoid-group router)",
          topk_group, experts / n_group, topk_group * (experts / n_group), top_k);
      break;
    default:
      fail(Errc::kInvalidArgument,
           "router={} is not a known router kind (expected softmax, sigmoid-group or "
           "topk-softmax)",
           static_cast<int>(router));
  }
  require(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0.0f,
          "routed_scaling_factor={} must be finite and positive", routed_scaling_factor);
  switch (activation) {
    case Activation::kSwiGLU:
      break;
    case Activation::kSwiGLUClamped:
      require(std::isfinite(swiglu_alpha), "swiglu_alpha={} must be finite (clamped SwiGLU)", swiglu_alpha);
      require(std::isfinite(swiglu_limit) && swiglu_limit > 0.0f,
              "swiglu_limit={} must be finite and positive (clamped SwiGLU)", swiglu_limit);
      break;
    default:
      fail(Errc::kInvalidArgument,
           "activation={} is not a known activation (expected swiglu or swiglu-clamped)",
           static_cast<int>(activation));
  }
  require_block_multiple("shared_intermediate", shared_intermediate, format, true);
}

double LayerDesc::expected_active_experts(std::int64_t tokens) const {
  const double e = static_cast<double>(experts);
  const double miss = std::pow(1.0 - static_cast<double>(top_k) / e, static_cast<double>(tokens));
  // At least one expert is active; the expectation can round below 1 only through floating point.
  return std::max(1.0, e * (1.0 - miss));
}

std::string LayerDesc::to_string() const {
  std::string s =
      fmt::format("H={} I={} E={} top-{} {}", hidden, intermediate, experts, top_k, router_name(router));
  switch (router) {
    case RouterKind::kSoftmaxTopK:
      if (!renormalize) s += "(no renorm)";
      break;
    case RouterKind::kSigmoidGroupTopK:
      s += fmt::format("(groups {}/{}, scale {}{})", topk_group, n_group, routed_scaling_factor,
                       renormalize ? "" : ", no renorm");
      break;
    case RouterKind::kTopKSoftmax:
      break;
  }
  s += fmt::format(" {}", activation_name(activation));
  if (activation == Activation::kSwiGLUClamped) {
    s += fmt::format("(alpha {}, limit {})", swiglu_alpha, swiglu_limit);
  }
  s += fmt::format(" {}", format_name(format));
  if (expert_bias) s += " bias";
  if (shared_intermediate > 0) s += fmt::format(" shared I={}", shared_intermediate);
  return s;
}

namespace {

struct Preset {
  std::string_view name;
  LayerDesc desc;
};

LayerDesc sigmoid_layer(std::int64_t hidden, std::int64_t intermediate, std::int64_t experts,
                        std::int64_t n_group, std::int64_t topk_group, float scale) {
  LayerDesc d;
  d.hidden = hidden;
  d.intermediate = intermediate;
  d.experts = experts;
  d.top_k = 8;
  d.router = RouterKind::kSigmoidGroupTopK;
  d.renormalize = true;
  d.n_group = n_group;
  d.topk_group = topk_group;
  d.routed_scaling_factor = scale;
  d.shared_intermediate = intermediate;  // one shared expert the size of a routed one
  return d;
}

LayerDesc softmax_layer(std::int64_t hidden, std::int64_t intermediate, std::int64_t experts,
                        std::int64_t top_k) {
  LayerDesc d;
  d.hidden = hidden;
  d.intermediate = intermediate;
  d.experts = experts;
  d.top_k = top_k;
  d.router = RouterKind::kSoftmaxTopK;
  d.renormalize = true;
  return d;
}

LayerDesc gpt_oss_layer() {
  LayerDesc d;
  d.hidden = 2880;
  d.intermediate = 2880;
  d.experts = 128;
  d.top_k = 4;
  d.router = RouterKind::kTopKSoftmax;
  d.activation = Activation::kSwiGLUClamped;
  d.swiglu_alpha = 1.702f;
  d.swiglu_limit = 7.0f;
  d.format = WeightFormat::kMxfp4;
  d.expert_bias = true;
  return d;
}

// Where the numbers come from: hidden, moe intermediate, experts, top-k, shared experts and the
// router of every model are /work/shared/FORMATS.md "Model shapes" (taken from each model's
// config.json); the sigmoid router recipe and Qwen3's renormalization are FORMATS.md "Routers";
// gpt-oss's clamped SwiGLU (alpha 1.702, limit 7), biases and MXFP4 experts are FORMATS.md
// "MXFP4 (OCP MX; gpt-oss)". Not in FORMATS.md: norm_topk_prob is true in the GLM-4.5/5,
// DeepSeek-V3 and Kimi K2 configs, and Mixtral always renormalizes its top-2; a shared expert has
// the routed experts' intermediate size in every model listed.
const std::vector<Preset>& presets() {
  static const std::vector<Preset> kPresets = {
      {"glm5", sigmoid_layer(6144, 2048, 256, 1, 1, 2.5f)},
      {"glm45", sigmoid_layer(5120, 1536, 160, 1, 1, 2.5f)},
      {"deepseek-v3", sigmoid_layer(7168, 2048, 256, 8, 4, 2.5f)},
      {"kimi-k2", sigmoid_layer(7168, 2048, 384, 1, 1, 2.827f)},
      {"qwen3-235b", softmax_layer(4096, 1536, 128, 8)},
      {"qwen3-30b", softmax_layer(2048, 768, 128, 8)},
      {"gpt-oss-120b", gpt_oss_layer()},
      {"mixtral-8x7b", softmax_layer(4096, 14336, 8, 2)},
  };
  return kPresets;
}

}  // namespace

LayerDesc layer_preset(std::string_view name) {
  for (const auto& p : presets()) {
    if (p.name == name) return p.desc;
  }
  fail(Errc::kInvalidArgument, "unknown layer preset '{}': expected one of {}", name,
       fmt::join(layer_preset_names(), ", "));
}

std::vector<std::string> layer_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets()) names.emplace_back(p.name);
  return names;
}

}  // namespace fp4moe
