// The reference forward pass against an independent double-precision evaluation (naive_moe.hpp),
// plus an exact check of its rounding points and operation order.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fp4moe/detail/portable_math.hpp"
#include "fp4moe/reference.hpp"
#include "reference/naive_moe.hpp"

namespace fp4moe {
namespace {

struct Inputs {
  std::vector<Bf16> x;
  std::vector<float> logits;
};

Inputs random_inputs(const LayerDesc& d, std::int64_t tokens, unsigned seed, float x_sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Inputs in;
  for (std::int64_t i = 0; i < tokens * d.hidden; ++i)
    in.x.push_back(Bf16::from_float(x_sigma * normal(rng)));
  for (std::int64_t i = 0; i < tokens * d.experts; ++i) in.logits.push_back(normal(rng));
  return in;
}

double relative_l2(const std::vector<Bf16>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double diff = out[i].to_float() - ref[i];
    num += diff * diff;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// The acceptance test: routing ids identical; weights within 1e-6 (relative above 1: a few float
// ulps of the exp/sigmoid/division chain); the output within 1e-2 relative L2. The output's error
// budget: the BF16 rounding of the expert intermediate and of the output are each ~2^-9 relative
// per element (2^-8 at worst), and fp32 accumulation adds ~1e-6; 1e-2 leaves a wide margin while
// catching any wrong weight, expert or activation (those give errors of order 1).
test::NaiveResult expect_matches_naive(const LayerWeights& w, const Inputs& in, std::int64_t tokens) {
  const ReferenceResult got = reference_forward(w, in.x, in.logits, tokens);
  test::NaiveResult want = test::naive_forward(w, in.x, in.logits, tokens);
  EXPECT_EQ(got.routing.tokens, tokens);
  EXPECT_EQ(got.routing.top_k, w.desc.top_k);
  EXPECT_EQ(got.routing.ids, want.routing.ids);
  EXPECT_EQ(got.routing.weights.size(), want.routing.weights.size());
  for (std::size_t i = 0; i < std::min(got.routing.weights.size(), want.routing.weights.size()); ++i) {
    const double ref = want.routing.weights[i];
    EXPECT_NEAR(got.routing.weights[i], ref, 1e-6 * std::max(1.0, std::fabs(ref)))
        << "token " << i / w.desc.top_k << " pick " << i % w.desc.top_k;
  }
  EXPECT_EQ(got.out.size(), want.out.size());
  if (tokens > 0 && got.out.size() == want.out.size()) {
    EXPECT_LE(relative_l2(got.out, want.out), 1e-2);
  }
  return want;
}

LayerDesc desc(std::int64_t h, std::int64_t i, std::int64_t e, std::int64_t k, RouterKind router) {
  LayerDesc d;
  d.hidden = h;
  d.intermediate = i;
  d.experts = e;
  d.top_k = k;
  d.router = router;
  return d;
}

std::vector<LayerDesc> small_layers() {
  std::vector<LayerDesc> v;
  v.push_back(desc(64, 32, 8, 2, RouterKind::kSoftmaxTopK));
  LayerDesc d = desc(32, 48, 6, 3, RouterKind::kSoftmaxTopK);
  d.renormalize = false;
  d.shared_intermediate = 16;
  v.push_back(d);
  d = desc(64, 32, 16, 4, RouterKind::kSigmoidGroupTopK);
  d.n_group = 4;
  d.topk_group = 2;
  d.routed_scaling_factor = 2.5f;
  d.shared_intermediate = 48;
  v.push_back(d);
  d = desc(48, 16, 8, 8, RouterKind::kSigmoidGroupTopK);  // k = E, no renormalization
  d.renormalize = false;
  d.routed_scaling_factor = 1.5f;
  v.push_back(d);
  d = desc(32, 32, 4, 2, RouterKind::kSigmoidGroupTopK);  // groups of one expert
  d.n_group = 4;
  d.topk_group = 2;
  v.push_back(d);
  v.push_back(desc(64, 32, 8, 3, RouterKind::kTopKSoftmax));
  return v;
}

TEST(Reference, MatchesNaiveOnSmallLayersForEveryRouter) {
  unsigned seed = 10;
  for (const LayerDesc& d : small_layers()) {
    SCOPED_TRACE(d.to_string());
    const LayerWeights w = random_layer_weights(d, seed);
    const std::int64_t tokens = 7;
    expect_matches_naive(w, random_inputs(d, tokens, seed), tokens);
    expect_matches_naive(w, random_inputs(d, 1, seed + 100), 1);
    ++seed;
  }
}

TEST(Reference, GptOssStyleMxfp4ClampedSwigluWithBiases) {
  LayerDesc d = layer_preset("gpt-oss-120b");
  d.hidden = 64;
  d.intermediate = 64;
  d.experts = 4;
  d.top_k = 2;
  for (float limit : {7.0f, 0.25f}) {
    d.swiglu_limit = limit;
    SCOPED_TRACE(d.to_string());
    const LayerWeights w = random_layer_weights(d, 20);
    // x of sigma 30 drives gate and up past the limit 7 at times; 0.25 is passed by many rows.
    const auto result = expect_matches_naive(w, random_inputs(d, 8, 21, 30.0f), 8);
    EXPECT_GT(result.clamp_hits, 0) << "the clamp is never exercised";
    EXPECT_LT(result.clamp_hits, 8 * 2 * 64) << "every value is clamped";
  }
}

TEST(Reference, SmallestLegalK) {
  LayerDesc nv = desc(16, 16, 2, 1, RouterKind::kSoftmaxTopK);
  nv.shared_intermediate = 16;
  expect_matches_naive(random_layer_weights(nv, 30), random_inputs(nv, 5, 31), 5);
  LayerDesc mx = desc(32, 32, 2, 2, RouterKind::kSoftmaxTopK);
  mx.format = WeightFormat::kMxfp4;
  expect_matches_naive(random_layer_weights(mx, 32), random_inputs(mx, 5, 33), 5);
}

TEST(Reference, ZeroTokens) {
  const LayerDesc d = small_layers()[2];
  const LayerWeights w = random_layer_weights(d, 40);
  const ReferenceResult r = reference_forward(w, {}, {}, 0);
  EXPECT_TRUE(r.out.empty());
  EXPECT_EQ(r.routing.tokens, 0);
  EXPECT_EQ(r.routing.top_k, d.top_k);
  EXPECT_TRUE(r.routing.ids.empty());
  EXPECT_TRUE(r.routing.weights.empty());
}

// Expert 3 is every token's first pick, experts 5 and 6 alternate as the second, and the other
// five experts get no token at all.
TEST(Reference, OneExpertTakesEveryTokenAndOthersNone) {
  const LayerDesc d = desc(64, 32, 8, 2, RouterKind::kSoftmaxTopK);
  const LayerWeights w = random_layer_weights(d, 50);
  const std::int64_t tokens = 10;
  Inputs in = random_inputs(d, tokens, 51);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t e = 0; e < d.experts; ++e) in.logits[t * d.experts + e] *= 0.1f;
    in.logits[t * d.experts + 3] = 3.0f;
    in.logits[t * d.experts + (t % 2 == 0 ? 5 : 6)] = 2.0f;
  }
  expect_matches_naive(w, in, tokens);
  const Routing r = route(d, in.logits, tokens);
  for (std::int64_t t = 0; t < tokens; ++t) {
    EXPECT_EQ(r.ids[t * 2], 3);
    EXPECT_EQ(r.ids[t * 2 + 1], t % 2 == 0 ? 5 : 6);
  }
}

// Equal logits: the lower expert id ranks first, for every router.
TEST(Reference, TiesPickTheLowerExpertId) {
  for (LayerDesc d : small_layers()) {
    SCOPED_TRACE(d.to_string());
    LayerWeights w = random_layer_weights(d, 60);
    std::fill(w.correction_bias.begin(), w.correction_bias.end(), 0.0f);
    const std::int64_t tokens = 3;
    Inputs in = random_inputs(d, tokens, 61);
    std::fill(in.logits.begin(), in.logits.begin() + d.experts, 0.5f);  // token 0: all equal
    for (std::int64_t e = 0; e < d.experts; ++e) {                      // token 1: pairs equal, descending
      in.logits[d.experts + e] = static_cast<float>(-(e / 2));
    }
    expect_matches_naive(w, in, tokens);
    const Routing r = route(d, in.logits, tokens, w.correction_bias);
    for (std::int64_t j = 0; j < d.top_k; ++j) {
      EXPECT_EQ(r.ids[j], j) << "token 0 pick " << j;
      EXPECT_EQ(r.weights[j], r.weights[0]) << "token 0 pick " << j;
      EXPECT_EQ(r.ids[d.top_k + j], j) << "token 1 pick " << j;
    }
  }
}

TEST(Reference, BitwiseIdenticalForAnyThreadCount) {
  for (const LayerDesc& d : {small_layers()[2], small_layers()[5]}) {
    const LayerWeights w = random_layer_weights(d, 70);
    const std::int64_t tokens = 37;
    const Inputs in = random_inputs(d, tokens, 71);
    const ReferenceResult one = reference_forward(w, in.x, in.logits, tokens, {.threads = 1});
    const ReferenceResult four = reference_forward(w, in.x, in.logits, tokens, {.threads = 4});
    ASSERT_EQ(one.out.size(), four.out.size());
    for (std::size_t i = 0; i < one.out.size(); ++i) {
      ASSERT_EQ(one.out[i].bits, four.out[i].bits) << "first difference at index " << i;
    }
    EXPECT_EQ(one.routing.ids, four.routing.ids);
    EXPECT_EQ(one.routing.weights, four.routing.weights);
    // Routing elsewhere and passing the decision in gives the same bits.
    const ReferenceResult routed =
        reference_forward_routed(w, in.x, route(d, in.logits, tokens, w.correction_bias), {.threads = 3});
    for (std::size_t i = 0; i < one.out.size(); ++i) {
      ASSERT_EQ(one.out[i].bits, routed.out[i].bits) << "first difference at index " << i;
    }
  }
}

// A matrix with one nonzero per row, at column (r + shift) % cols, of E2M1 code `code`, block
// scales 1.0 and the given global scale: every dot product is one exact product.
QuantizedMatrix permutation(std::int64_t n, int shift, std::uint8_t code, float global_scale) {
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(n * n), 0);
  for (std::int64_t r = 0; r < n; ++r) codes[static_cast<std::size_t>(r * n + (r + shift) % n)] = code;
  QuantizedMatrix q;
  q.rows = n;
  q.cols = n;
  q.packed = pack_e2m1(codes);
  q.scales.assign(static_cast<std::size_t>(n * n / 16), 0x38);
  q.global_scale = global_scale;
  return q;
}

// With exact dot products, every rounding is the definition's: a = bf16(act(g + gate_bias,
// u + up_bias)), y = down . a + down_bias, out = bf16((w0*y0 + w1*y1) + y_shared). The expected
// values are computed here with those float operations, so the reference must match bit for bit.
TEST(Reference, RoundingPointsAndOrderAreTheDefinitions) {
  constexpr std::int64_t n = 16;
  for (Activation act : {Activation::kSwiGLU, Activation::kSwiGLUClamped}) {
    LayerDesc d = desc(n, n, 2, 2, RouterKind::kSoftmaxTopK);
    d.shared_intermediate = n;
    d.activation = act;
    d.swiglu_limit = 1.0f;
    d.expert_bias = act == Activation::kSwiGLUClamped;
    SCOPED_TRACE(d.to_string());
    LayerWeights w;
    w.desc = d;
    // Expert 0: g = x_i, u = 1.5 x_{i+1}, y = 3 a.  Expert 1: g = x_i, u = 2 x_i, y = 0.375 a.
    // Shared: g = x_i, u = x_{i+2}, y = a.
    w.experts.push_back(
        {permutation(n, 0, 2, 1.0f), permutation(n, 1, 3, 1.0f), permutation(n, 0, 5, 1.0f), {}, {}, {}});
    w.experts.push_back(
        {permutation(n, 0, 2, 1.0f), permutation(n, 0, 4, 1.0f), permutation(n, 0, 1, 0.75f), {}, {}, {}});
    w.shared = ExpertWeights{
        permutation(n, 0, 2, 1.0f), permutation(n, 2, 2, 1.0f), permutation(n, 0, 2, 1.0f), {}, {}, {}};
    const float up_mul[3] = {1.5f, 2.0f, 1.0f};
    const int up_shift[3] = {1, 0, 2};
    const float down_mul[3] = {3.0f, 0.375f, 1.0f};
    std::mt19937 rng(80);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<ExpertWeights*> all = {&w.experts[0], &w.experts[1], &*w.shared};
    if (d.expert_bias) {
      for (ExpertWeights* e : all) {
        for (auto* b : {&e->gate_bias, &e->up_bias, &e->down_bias}) {
          for (std::int64_t i = 0; i < n; ++i) b->push_back(round_to_bf16(0.1f * normal(rng)));
        }
      }
    }
    ASSERT_NO_THROW(w.validate());
    const std::int64_t tokens = 4;
    std::vector<Bf16> x;
    for (std::int64_t i = 0; i < tokens * n; ++i) x.push_back(Bf16::from_float(normal(rng)));
    Routing routing;
    routing.tokens = tokens;
    routing.top_k = 2;
    routing.ids = {0, 1, 1, 0, 0, 1, 1, 0};
    routing.weights = {0.7f, 0.3f, 0.55f, 0.45f, 1.0f, 0.0f, 0.123f, 0.877f};

    const auto activate = [&](float g, float u) {
      if (act == Activation::kSwiGLU) return detail::pm_mul(detail::portable_silu(g), u);
      g = g > d.swiglu_limit ? d.swiglu_limit : g;
      u = u > d.swiglu_limit ? d.swiglu_limit : (u < -d.swiglu_limit ? -d.swiglu_limit : u);
      return detail::pm_mul(detail::pm_mul(g, detail::portable_sigmoid(detail::pm_mul(d.swiglu_alpha, g))),
                            detail::pm_add(u, 1.0f));
    };
    // y of expert e (2 = shared) at row h for token t; round_a = false leaves out the BF16 rounding.
    const auto expert_y = [&](int e, std::int64_t t, std::int64_t h, bool round_a) {
      const float xi = x[t * n + h].to_float();
      const float xu = x[t * n + (h + up_shift[e]) % n].to_float();
      float g = xi, u = up_mul[e] * xu;
      if (d.expert_bias) {
        g = detail::pm_add(g, all[e]->gate_bias[h]);
        u = detail::pm_add(u, all[e]->up_bias[h]);
      }
      const float a = round_a ? round_to_bf16(activate(g, u)) : activate(g, u);
      float y = detail::pm_mul(down_mul[e], a);
      if (d.expert_bias) y = detail::pm_add(y, all[e]->down_bias[h]);
      return y;
    };
    const auto expected_out = [&](std::int64_t t, std::int64_t h, bool round_a) {
      float acc = detail::pm_mul(routing.weights[t * 2], expert_y(routing.ids[t * 2], t, h, round_a));
      acc = detail::pm_add(
          acc, detail::pm_mul(routing.weights[t * 2 + 1], expert_y(routing.ids[t * 2 + 1], t, h, round_a)));
      return Bf16::from_float(detail::pm_add(acc, expert_y(2, t, h, round_a)));
    };
    const ReferenceResult r = reference_forward_routed(w, x, routing);
    int differs_without_rounding = 0;
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t h = 0; h < n; ++h) {
        ASSERT_EQ(r.out[t * n + h].bits, expected_out(t, h, true).bits) << "token " << t << " h " << h;
        differs_without_rounding += expected_out(t, h, false).bits != expected_out(t, h, true).bits;
      }
    }
    // The data is such that leaving out the intermediate rounding would change the output.
    EXPECT_GT(differs_without_rounding, 0);
  }
}

TEST(RouterLogits, MatchADoubleProduct) {
  const LayerDesc d = desc(64, 32, 8, 2, RouterKind::kSoftmaxTopK);
  LayerWeights w = random_layer_weights(d, 90);
  std::mt19937 rng(91);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (std::int64_t i = 0; i < d.experts * d.hidden; ++i) w.router_weight.push_back(normal(rng));
  const std::int64_t tokens = 5;
  const Inputs in = random_inputs(d, tokens, 92);
  for (bool with_bias : {false, true}) {
    if (with_bias) {
      for (std::int64_t e = 0; e < d.experts; ++e) w.router_logit_bias.push_back(normal(rng));
    }
    const std::vector<float> logits = router_logits(w, in.x, tokens);
    ASSERT_EQ(logits.size(), static_cast<std::size_t>(tokens * d.experts));
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t e = 0; e < d.experts; ++e) {
        double want = with_bias ? w.router_logit_bias[e] : 0.0;
        double scale = std::fabs(want);
        for (std::int64_t h = 0; h < d.hidden; ++h) {
          const double p =
              static_cast<double>(w.router_weight[e * d.hidden + h]) * in.x[t * d.hidden + h].to_float();
          want += p;
          scale += std::fabs(p);
        }
        EXPECT_NEAR(logits[t * d.experts + e], want, 1e-6 * scale) << "token " << t << " expert " << e;
      }
    }
  }
}

}  // namespace
}  // namespace fp4moe
