// Routing: the reference definition that the GPU routing kernels reproduce bit for bit. Every
// float operation goes through detail::pm_* / portable_* in the order written in docs/NUMERICS.md,
// and every selection through detail::ranks_before.
#include <algorithm>
#include <limits>
#include <numeric>

#include "common/fail.hpp"
#include "fp4moe/detail/portable_math.hpp"
#include "fp4moe/reference.hpp"

namespace fp4moe {
namespace {

using detail::pm_add;
using detail::pm_div;
using detail::pm_mul;

// Sorts the first k of `candidates` into rank order by (score[id], id): larger first, NaN last,
// ties to the lower id.
void select_top(std::vector<int>& candidates, std::size_t k, const float* score) {
  std::partial_sort(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(k), candidates.end(),
                    [score](int a, int b) { return detail::ranks_before(score[a], a, score[b], b); });
}

struct TokenRouter {
  const LayerDesc& desc;
  std::span<const float> correction_bias;
  int experts;
  int k;
  std::vector<int> candidates;
  std::vector<float> scratch;  // per-expert values: exps, or corrected sigmoid scores
  std::vector<float> sigmoid;  // per-expert sigmoid scores (sigmoid router)
  std::vector<float> group_score;
  std::vector<int> groups;

  void all_experts() {
    candidates.resize(static_cast<std::size_t>(experts));
    std::iota(candidates.begin(), candidates.end(), 0);
  }

  void softmax_topk(const float* l, std::int32_t* ids, float* w) {
    all_experts();
    select_top(candidates, static_cast<std::size_t>(k), l);
    const float m = l[candidates[0]];  // the largest logit (NaN only if every logit is NaN)
    scratch.resize(static_cast<std::size_t>(experts));
    float sum = 0.0f;
    for (int i = 0; i < experts; ++i) {
      scratch[i] = detail::portable_exp(pm_add(l[i], -m));
      sum = i == 0 ? scratch[i] : pm_add(sum, scratch[i]);
    }
    for (int j = 0; j < k; ++j) {
      ids[j] = candidates[j];
      w[j] = pm_div(scratch[candidates[j]], sum);
    }
    if (desc.renormalize) {
      float s = w[0];
      for (int j = 1; j < k; ++j) s = pm_add(s, w[j]);
      for (int j = 0; j < k; ++j) w[j] = pm_div(w[j], s);
    }
  }

  void sigmoid_group_topk(const float* l, std::int32_t* ids, float* w) {
    sigmoid.resize(static_cast<std::size_t>(experts));
    scratch.resize(static_cast<std::size_t>(experts));
    for (int i = 0; i < experts; ++i) {
      sigmoid[i] = detail::portable_sigmoid(l[i]);
      scratch[i] = pm_add(sigmoid[i], correction_bias[i]);
    }
    const float* c = scratch.data();
    const int n_group = static_cast<int>(desc.n_group);
    const int group_size = experts / n_group;
    if (desc.topk_group < desc.n_group) {
      group_score.resize(static_cast<std::size_t>(n_group));
      for (int g = 0; g < n_group; ++g) {
        // The best and second best c of the group (a group of one scores its c alone).
        int best = g * group_size;
        int second = -1;
        for (int i = best + 1; i < (g + 1) * group_size; ++i) {
          if (detail::ranks_before(c[i], i, c[best], best)) {
            second = best;
            best = i;
          } else if (second < 0 || detail::ranks_before(c[i], i, c[second], second)) {
            second = i;
          }
        }
        group_score[g] = second < 0 ? c[best] : pm_add(c[best], c[second]);
      }
      groups.resize(static_cast<std::size_t>(n_group));
      std::iota(groups.begin(), groups.end(), 0);
      select_top(groups, static_cast<std::size_t>(desc.topk_group), group_score.data());
      candidates.clear();
      for (int gi = 0; gi < desc.topk_group; ++gi) {
        for (int i = groups[gi] * group_size; i < (groups[gi] + 1) * group_size; ++i) candidates.push_back(i);
      }
    } else {
      all_experts();
    }
    select_top(candidates, static_cast<std::size_t>(k), c);
    for (int j = 0; j < k; ++j) {
      ids[j] = candidates[j];
      w[j] = sigmoid[candidates[j]];
    }
    if (desc.renormalize) {
      float s = w[0];
      for (int j = 1; j < k; ++j) s = pm_add(s, w[j]);
      const float denom = pm_add(s, 1e-20f);
      for (int j = 0; j < k; ++j) w[j] = pm_div(w[j], denom);
    }
    for (int j = 0; j < k; ++j) w[j] = pm_mul(w[j], desc.routed_scaling_factor);
  }

  void topk_softmax(const float* l, std::int32_t* ids, float* w) {
    all_experts();
    select_top(candidates, static_cast<std::size_t>(k), l);
    const float m = l[candidates[0]];
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      ids[j] = candidates[j];
      w[j] = detail::portable_exp(pm_add(l[candidates[j]], -m));
      sum = j == 0 ? w[j] : pm_add(sum, w[j]);
    }
    for (int j = 0; j < k; ++j) w[j] = pm_div(w[j], sum);
  }
};

}  // namespace

Routing route(const LayerDesc& desc, std::span<const float> logits, std::int64_t tokens,
              std::span<const float> correction_bias) {
  desc.validate();
  require(tokens >= 0, "route: tokens={} is negative", tokens);
  require(tokens <= std::numeric_limits<std::int64_t>::max() / desc.experts / desc.top_k,
          "route: tokens={} is too large", tokens);
  require(static_cast<std::int64_t>(logits.size()) == tokens * desc.experts,
          "route: {} router logits, expected tokens * experts = {} * {} = {}", logits.size(), tokens,
          desc.experts, tokens * desc.experts);
  if (desc.router == RouterKind::kSigmoidGroupTopK) {
    require(static_cast<std::int64_t>(correction_bias.size()) == desc.experts,
            "route: correction_bias holds {} values, expected experts={} (sigmoid-group router)",
            correction_bias.size(), desc.experts);
  }
  Routing r;
  r.tokens = tokens;
  r.top_k = desc.top_k;
  r.ids.resize(static_cast<std::size_t>(tokens * desc.top_k));
  r.weights.resize(r.ids.size());
  TokenRouter router{
      desc, correction_bias, static_cast<int>(desc.experts), static_cast<int>(desc.top_k), {}, {}, {}, {},
      {}};
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float* l = logits.data() + t * desc.experts;
    std::int32_t* ids = r.ids.data() + t * desc.top_k;
    float* w = r.weights.data() + t * desc.top_k;
    switch (desc.router) {
      case RouterKind::kSoftmaxTopK:
        router.softmax_topk(l, ids, w);
        break;
      case RouterKind::kSigmoidGroupTopK:
        router.sigmoid_group_topk(l, ids, w);
        break;
      case RouterKind::kTopKSoftmax:
        router.topk_softmax(l, ids, w);
        break;
    }
  }
  return r;
}

}  // namespace fp4moe
