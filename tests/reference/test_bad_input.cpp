// Bad input to route and the reference: wrong sizes are rejected with the numbers, and non-finite
// values have the defined results of docs/NUMERICS.md (a NaN token poisons only itself).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "fp4moe/error.hpp"
#include "fp4moe/reference.hpp"

namespace fp4moe {
namespace {

using ::testing::HasSubstr;

template <typename Fn>
std::string error_of(const Fn& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

LayerDesc sigmoid_desc() {
  LayerDesc d;
  d.hidden = 32;
  d.intermediate = 16;
  d.experts = 8;
  d.top_k = 2;
  d.router = RouterKind::kSigmoidGroupTopK;
  d.n_group = 2;
  d.topk_group = 1;
  d.shared_intermediate = 16;
  return d;
}

struct Inputs {
  std::vector<Bf16> x;
  std::vector<float> logits;
};

Inputs random_inputs(const LayerDesc& d, std::int64_t tokens, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Inputs in;
  for (std::int64_t i = 0; i < tokens * d.hidden; ++i) in.x.push_back(Bf16::from_float(normal(rng)));
  for (std::int64_t i = 0; i < tokens * d.experts; ++i) in.logits.push_back(normal(rng));
  return in;
}

TEST(BadInput, RouteRejectsWrongSizes) {
  const LayerDesc d = sigmoid_desc();
  const std::vector<float> bias(8, 0.0f);
  EXPECT_THAT(error_of([&] { route(d, std::vector<float>(15), 2, bias); }),
              HasSubstr("route: 15 router logits, expected tokens * experts = 2 * 8 = 16"));
  EXPECT_THAT(error_of([&] { route(d, std::vector<float>(16), 2, std::vector<float>(7)); }),
              HasSubstr("route: correction_bias holds 7 values, expected experts=8"));
  EXPECT_THAT(error_of([&] { route(d, {}, -1, bias); }), HasSubstr("route: tokens=-1 is negative"));
  LayerDesc bad = d;
  bad.top_k = 9;
  EXPECT_THAT(error_of([&] { route(bad, std::vector<float>(16), 2, bias); }), HasSubstr("top_k=9"));
  // The softmax routers ignore the correction bias.
  LayerDesc softmax = d;
  softmax.router = RouterKind::kSoftmaxTopK;
  EXPECT_NO_THROW(route(softmax, std::vector<float>(16), 2, std::vector<float>(3)));
}

TEST(BadInput, ReferenceRejectsWrongSizes) {
  const LayerDesc d = sigmoid_desc();
  const LayerWeights w = random_layer_weights(d, 1);
  const Inputs in = random_inputs(d, 3, 2);
  EXPECT_THAT(error_of([&] { reference_forward(w, std::span(in.x).first(95), in.logits, 3); }),
              HasSubstr("x holds 95 values, expected tokens * hidden = 3 * 32 = 96"));
  EXPECT_THAT(error_of([&] { reference_forward(w, in.x, std::span(in.logits).first(20), 3); }),
              HasSubstr("route: 20 router logits, expected tokens * experts = 3 * 8 = 24"));
  EXPECT_THAT(error_of([&] { reference_forward(w, in.x, in.logits, 3, {.threads = -2}); }),
              HasSubstr("threads=-2 is negative"));
  LayerWeights broken = w;
  broken.experts[5].down.scales.pop_back();
  EXPECT_THAT(error_of([&] { reference_forward(broken, in.x, in.logits, 3); }),
              HasSubstr("expert 5 down: scales holds"));

  const Routing good = route(d, in.logits, 3, w.correction_bias);
  Routing r = good;
  r.top_k = 3;
  EXPECT_THAT(error_of([&] { reference_forward_routed(w, in.x, r); }),
              HasSubstr("routing: top_k=3, expected the layer's top_k=2"));
  r = good;
  r.weights.pop_back();
  EXPECT_THAT(error_of([&] { reference_forward_routed(w, in.x, r); }),
              HasSubstr("routing: 6 ids and 5 weights, expected tokens * top_k = 3 * 2 = 6 of each"));
  r = good;
  r.ids[3] = 8;
  EXPECT_THAT(error_of([&] { reference_forward_routed(w, in.x, r); }),
              HasSubstr("routing: token 1 pick 1 is expert 8, expected 0..7"));
  r.ids[3] = -1;
  EXPECT_THAT(error_of([&] { reference_forward_routed(w, in.x, r); }), HasSubstr("is expert -1"));
  r = good;
  r.tokens = 2;
  EXPECT_THAT(error_of([&] { reference_forward_routed(w, in.x, r); }),
              HasSubstr("routing: 6 ids and 6 weights"));
  r.tokens = -1;
  EXPECT_THAT(error_of([&] { reference_forward_routed(w, in.x, r); }),
              HasSubstr("routing: tokens=-1 is negative"));
  EXPECT_THAT(error_of([&] { router_logits(w, in.x, 3); }),
              HasSubstr("router_logits: the layer has no router_weight (expected [8, 32])"));
  LayerWeights with_router = w;
  with_router.router_weight.assign(8 * 32, 0.01f);
  EXPECT_THAT(error_of([&] { router_logits(with_router, in.x, 2); }),
              HasSubstr("router_logits: x holds 96 values, expected tokens * hidden = 2 * 32 = 64"));
}

// NaN or Inf in one token's x reaches that token's output only: every other token is bitwise what
// it is without the bad value. A NaN anywhere in x_t makes every dot product of token t NaN, so
// its whole output row is NaN.
TEST(BadInput, NonFiniteXPoisonsOnlyItsToken) {
  const LayerDesc d = sigmoid_desc();
  const LayerWeights w = random_layer_weights(d, 3);
  const std::int64_t tokens = 4;
  const Inputs clean = random_inputs(d, tokens, 4);
  const ReferenceResult base = reference_forward(w, clean.x, clean.logits, tokens);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Inputs in = clean;
    in.x[2 * d.hidden + 5] = Bf16::from_float(bad);
    const ReferenceResult r = reference_forward(w, in.x, in.logits, tokens);
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t h = 0; h < d.hidden; ++h) {
        const float v = r.out[t * d.hidden + h].to_float();
        if (t == 2) {
          if (std::isnan(bad)) {
            ASSERT_TRUE(std::isnan(v)) << "h " << h;
          }
        } else {
          ASSERT_EQ(r.out[t * d.hidden + h].bits, base.out[t * d.hidden + h].bits)
              << "token " << t << " h " << h;
        }
      }
    }
  }
}

// A NaN router logit: the token's picks are defined (NaN ranks last) and, where the weights stay
// finite, its output too; other tokens are untouched.
TEST(BadInput, NanRouterLogitOnlyAffectsItsToken) {
  const LayerDesc d = sigmoid_desc();
  const LayerWeights w = random_layer_weights(d, 5);
  const std::int64_t tokens = 3;
  const Inputs clean = random_inputs(d, tokens, 6);
  const ReferenceResult base = reference_forward(w, clean.x, clean.logits, tokens);
  Inputs in = clean;
  // NaN on token 1's best pick: it moves behind every number, and two other experts are picked.
  const std::int32_t best = base.routing.ids[2];
  in.logits[d.experts + best] = std::numeric_limits<float>::quiet_NaN();
  const ReferenceResult r = reference_forward(w, in.x, in.logits, tokens);
  EXPECT_NE(r.routing.ids[2], best);
  EXPECT_NE(r.routing.ids[3], best);
  EXPECT_TRUE(std::isfinite(r.routing.weights[2]) && std::isfinite(r.routing.weights[3]));
  for (std::int64_t h = 0; h < d.hidden; ++h) {
    EXPECT_TRUE(std::isfinite(r.out[d.hidden + h].to_float())) << "h " << h;
    ASSERT_EQ(r.out[h].bits, base.out[h].bits) << "token 0 h " << h;
    ASSERT_EQ(r.out[2 * d.hidden + h].bits, base.out[2 * d.hidden + h].bits) << "token 2 h " << h;
  }
  // Every logit of token 1 NaN: picks 0 and 1 of the first group, NaN weights, NaN output.
  std::fill(in.logits.begin() + d.experts, in.logits.begin() + 2 * d.experts,
            std::numeric_limits<float>::quiet_NaN());
  const ReferenceResult all = reference_forward(w, in.x, in.logits, tokens);
  EXPECT_EQ(all.routing.ids[2], 0);
  EXPECT_EQ(all.routing.ids[3], 1);
  for (std::int64_t h = 0; h < d.hidden; ++h)
    EXPECT_TRUE(std::isnan(all.out[d.hidden + h].to_float())) << "h " << h;
}

}  // namespace
}  // namespace fp4moe
