// Routing: the weights are the definition's float operations bit for bit (the GPU routing kernels
// reproduce them), hand-checked cases, and the defined results for NaN, infinities and zero scores.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "fp4moe/detail/portable_math.hpp"
#include "fp4moe/reference.hpp"
#include "reference/naive_moe.hpp"

namespace fp4moe {
namespace {

using detail::pm_add;
using detail::pm_div;
using detail::pm_mul;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

LayerDesc router_desc(RouterKind router, std::int64_t experts, std::int64_t k) {
  LayerDesc d;
  d.hidden = 16;
  d.intermediate = 16;
  d.experts = experts;
  d.top_k = k;
  d.router = router;
  return d;
}

std::vector<float> normal_logits(std::int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

// The definitions of docs/NUMERICS.md, written out for one token with the ids given (the ids are
// checked against the independent naive selection separately).
std::vector<float> softmax_weights(const std::vector<float>& l, const std::vector<std::int32_t>& ids,
                                   bool renorm) {
  const float m = l[ids[0]];
  std::vector<float> e(l.size());
  float sum = 0.0f;
  for (std::size_t i = 0; i < l.size(); ++i) {
    e[i] = detail::portable_exp(pm_add(l[i], -m));
    sum = i == 0 ? e[i] : pm_add(sum, e[i]);
  }
  std::vector<float> w;
  for (auto id : ids) w.push_back(pm_div(e[id], sum));
  if (renorm) {
    float s = w[0];
    for (std::size_t j = 1; j < w.size(); ++j) s = pm_add(s, w[j]);
    for (float& v : w) v = pm_div(v, s);
  }
  return w;
}

std::vector<float> sigmoid_weights(const std::vector<float>& l, const std::vector<std::int32_t>& ids,
                                   bool renorm, float scale) {
  std::vector<float> w;
  for (auto id : ids) w.push_back(detail::portable_sigmoid(l[id]));
  if (renorm) {
    float s = w[0];
    for (std::size_t j = 1; j < w.size(); ++j) s = pm_add(s, w[j]);
    for (float& v : w) v = pm_div(v, pm_add(s, 1e-20f));
  }
  for (float& v : w) v = pm_mul(v, scale);
  return w;
}

std::vector<float> topk_softmax_weights(const std::vector<float>& l, const std::vector<std::int32_t>& ids) {
  const float m = l[ids[0]];
  std::vector<float> w;
  float sum = 0.0f;
  for (auto id : ids) {
    w.push_back(detail::portable_exp(pm_add(l[id], -m)));
    sum = w.size() == 1 ? w[0] : pm_add(sum, w.back());
  }
  for (float& v : w) v = pm_div(v, sum);
  return w;
}

TEST(Route, WeightsAreTheDefinitionBitForBit) {
  const std::int64_t tokens = 20;
  for (RouterKind router :
       {RouterKind::kSoftmaxTopK, RouterKind::kSigmoidGroupTopK, RouterKind::kTopKSoftmax}) {
    for (bool renorm : {true, false}) {
      LayerDesc d = router_desc(router, 32, 6);
      d.renormalize = renorm;
      if (router == RouterKind::kSigmoidGroupTopK) {
        d.n_group = 8;
        d.topk_group = 3;
        d.routed_scaling_factor = 2.827f;
      }
      SCOPED_TRACE(d.to_string());
      const auto logits = normal_logits(tokens * d.experts, 1);
      const auto bias =
          router == RouterKind::kSigmoidGroupTopK ? normal_logits(d.experts, 2) : std::vector<float>{};
      const Routing r = route(d, logits, tokens, bias);
      const auto naive = test::naive_route(d, logits, tokens, bias);
      ASSERT_EQ(r.ids, naive.ids);
      for (std::int64_t t = 0; t < tokens; ++t) {
        const std::vector<float> l(logits.begin() + t * d.experts, logits.begin() + (t + 1) * d.experts);
        const std::vector<std::int32_t> ids(r.ids.begin() + t * d.top_k, r.ids.begin() + (t + 1) * d.top_k);
        const std::vector<float> want = router == RouterKind::kSoftmaxTopK ? softmax_weights(l, ids, renorm)
                                        : router == RouterKind::kSigmoidGroupTopK
                                            ? sigmoid_weights(l, ids, renorm, d.routed_scaling_factor)
                                            : topk_softmax_weights(l, ids);
        for (std::int64_t j = 0; j < d.top_k; ++j) {
          ASSERT_EQ(r.weights[t * d.top_k + j], want[j]) << "token " << t << " pick " << j;
        }
      }
    }
  }
}

// DeepSeek-style grouping by hand: 4 groups of 2, keep 2. c = sigmoid(l) + bias with bias 0 and
// logits chosen so that group scores are (0.9+0.1), (0.8+0.7), (0.95+0.05), (0.6+0.6): groups 1
// (1.5) and 3 (1.2) are kept although group 2 holds the single best expert (0.95).
TEST(Route, GroupLimitedSelectionByHand) {
  LayerDesc d = router_desc(RouterKind::kSigmoidGroupTopK, 8, 2);
  d.n_group = 4;
  d.topk_group = 2;
  const auto logit_of = [](float s) { return std::log(s / (1.0f - s)); };
  const std::vector<float> scores = {0.9f, 0.1f, 0.8f, 0.7f, 0.95f, 0.05f, 0.6f, 0.6f};
  std::vector<float> logits;
  for (float s : scores) logits.push_back(logit_of(s));
  const Routing r = route(d, logits, 1, std::vector<float>(8, 0.0f));
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{2, 3}));
  // The bias selects but does not weigh: lifting expert 6 by 0.25 picks it first, with weight s_6.
  std::vector<float> bias(8, 0.0f);
  bias[6] = 0.25f;
  d.renormalize = false;
  const Routing biased = route(d, logits, 1, bias);
  EXPECT_EQ(biased.ids, (std::vector<std::int32_t>{6, 2}));
  EXPECT_EQ(biased.weights[0], detail::portable_sigmoid(logits[6]));
}

TEST(Route, ZeroTokens) {
  const Routing r = route(router_desc(RouterKind::kSoftmaxTopK, 4, 2), {}, 0);
  EXPECT_EQ(r.tokens, 0);
  EXPECT_EQ(r.top_k, 2);
  EXPECT_TRUE(r.ids.empty());
  EXPECT_TRUE(r.weights.empty());
}

// A NaN logit ranks below every number: it is picked only when fewer than k experts have a
// number. The weights then follow IEEE arithmetic: softmax sums every expert, so one NaN logit
// makes all of the token's weights NaN; top-k-softmax and sigmoid only see the picks.
TEST(Route, NanLogitsRankLastThenFollowIeee) {
  std::vector<float> l = {0.5f, kNan, 2.0f, 1.0f};
  {
    const LayerDesc d = router_desc(RouterKind::kSoftmaxTopK, 4, 2);
    const Routing r = route(d, l, 1);
    EXPECT_EQ(r.ids, (std::vector<std::int32_t>{2, 3}));
    EXPECT_TRUE(std::isnan(r.weights[0]) && std::isnan(r.weights[1]));
  }
  {
    const LayerDesc d = router_desc(RouterKind::kTopKSoftmax, 4, 2);
    const Routing r = route(d, l, 1);
    EXPECT_EQ(r.ids, (std::vector<std::int32_t>{2, 3}));
    EXPECT_EQ(r.weights, topk_softmax_weights(l, {2, 3}));
    // k = 4 reaches the NaN: it comes last, and the sum it enters is NaN.
    const Routing all = route(router_desc(RouterKind::kTopKSoftmax, 4, 4), l, 1);
    EXPECT_EQ(all.ids, (std::vector<std::int32_t>{2, 3, 0, 1}));
    for (float w : all.weights) EXPECT_TRUE(std::isnan(w));
  }
  {
    const LayerDesc d = router_desc(RouterKind::kSigmoidGroupTopK, 4, 3);
    const Routing r = route(d, l, 1, std::vector<float>(4, 0.0f));
    EXPECT_EQ(r.ids, (std::vector<std::int32_t>{2, 3, 0}));
    for (float w : r.weights) EXPECT_TRUE(std::isfinite(w));
  }
  // Every logit NaN: the picks are the lowest ids, in order.
  const std::vector<float> all_nan(4, kNan);
  for (RouterKind router :
       {RouterKind::kSoftmaxTopK, RouterKind::kSigmoidGroupTopK, RouterKind::kTopKSoftmax}) {
    const Routing r = route(router_desc(router, 4, 2), all_nan, 1, std::vector<float>(4, 0.0f));
    EXPECT_EQ(r.ids, (std::vector<std::int32_t>{0, 1})) << router_name(router);
    for (float w : r.weights) EXPECT_TRUE(std::isnan(w)) << router_name(router);
  }
}

TEST(Route, InfiniteLogitsAndZeroScores) {
  // -inf logits are masked experts: exp(-inf - m) = 0.
  const std::vector<float> masked = {-kInf, 1.0f, -kInf, 0.0f};
  const Routing r = route(router_desc(RouterKind::kSoftmaxTopK, 4, 3), masked, 1);
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{1, 3, 0}));
  EXPECT_EQ(r.weights[2], 0.0f);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0f, 1e-6f);
  // Sigmoid scores that are all exactly 0: the 1e-20 keeps renormalized weights at 0, not NaN.
  const Routing z = route(router_desc(RouterKind::kSigmoidGroupTopK, 4, 2), std::vector<float>(4, -200.0f), 1,
                          std::vector<float>(4, 0.0f));
  EXPECT_EQ(z.weights, (std::vector<float>{0.0f, 0.0f}));
  // +inf minus the maximum +inf is NaN: the softmax weights are NaN (IEEE), the pick is defined.
  const Routing p =
      route(router_desc(RouterKind::kSoftmaxTopK, 4, 1), std::vector<float>{0.0f, kInf, 1.0f, 2.0f}, 1);
  EXPECT_EQ(p.ids, (std::vector<std::int32_t>{1}));
  EXPECT_TRUE(std::isnan(p.weights[0]));
}

}  // namespace
}  // namespace fp4moe
