// LayerWeights::validate and random_layer_weights.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>

#include "fp4moe/bf16.hpp"
#include "fp4moe/error.hpp"
#include "fp4moe/layer.hpp"
#include "model/random_weights.hpp"

namespace fp4moe {
namespace {

using ::testing::HasSubstr;

LayerDesc small_desc() {
  LayerDesc d;
  d.hidden = 64;
  d.intermediate = 32;
  d.experts = 4;
  d.top_k = 2;
  d.router = RouterKind::kSigmoidGroupTopK;
  d.routed_scaling_factor = 2.5f;
  d.shared_intermediate = 48;
  return d;
}

LayerDesc small_gpt_oss() {
  LayerDesc d = layer_preset("gpt-oss-120b");
  d.hidden = 64;
  d.intermediate = 96;
  d.experts = 4;
  d.top_k = 2;
  return d;
}

std::string validate_error(const LayerWeights& w) {
  try {
    w.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct Case {
  const char* name;
  std::function<void(LayerWeights&)> change;
  const char* message;
};

TEST(LayerWeights, ValidateNamesTheExpertMatrixAndSize) {
  const LayerWeights base = random_layer_weights(small_desc(), 1);
  ASSERT_NO_THROW(base.validate());
  const std::vector<Case> cases = {
      {"desc", [](LayerWeights& w) { w.desc.top_k = 0; }, "top_k=0 must be between 1 and experts=4"},
      {"expert count", [](LayerWeights& w) { w.experts.pop_back(); },
       "layer weights hold 3 experts, expected 4"},
      {"gate shape", [](LayerWeights& w) { w.experts[2].gate.rows = 16; },
       "expert 2 gate: shape [16, 64], expected [32, 64]"},
      {"down shape", [](LayerWeights& w) { w.experts[0].down.cols = 64; },
       "expert 0 down: shape [64, 64], expected [64, 32]"},
      {"packed size", [](LayerWeights& w) { w.experts[1].up.packed.pop_back(); },
       "expert 1 up: packed holds 1023 bytes"},
      {"scales size", [](LayerWeights& w) { w.experts[3].down.scales.clear(); },
       "expert 3 down: scales holds 0 bytes, expected 128"},
      {"format", [](LayerWeights& w) { w.experts[1].gate.format = WeightFormat::kMxfp4; },
       "expert 1 gate: format mxfp4, expected nvfp4"},
      {"unexpected bias", [](LayerWeights& w) { w.experts[0].gate_bias.assign(32, 0.0f); },
       "expert 0 gate_bias: 32 values, expected none (expert_bias is not set)"},
      {"shared missing", [](LayerWeights& w) { w.shared.reset(); },
       "shared expert missing: shared_intermediate=48"},
      {"shared shape", [](LayerWeights& w) { w.shared->up.rows = 32; },
       "shared expert up: shape [32, 64], expected [48, 64]"},
      {"shared unexpected", [](LayerWeights& w) { w.desc.shared_intermediate = 0; },
       "shared expert present, but shared_intermediate=0 expects none"},
      {"correction bias", [](LayerWeights& w) { w.correction_bias.pop_back(); },
       "correction_bias holds 3 values, expected experts=4"},
      {"correction bias other router", [](LayerWeights& w) { w.desc.router = RouterKind::kSoftmaxTopK; },
       "correction_bias holds 4 values, expected none for the softmax router"},
      {"router weight", [](LayerWeights& w) { w.router_weight.assign(10, 0.0f); },
       "router_weight holds 10 values, expected experts * hidden = 4 * 64 = 256"},
      {"router bias without weight", [](LayerWeights& w) { w.router_logit_bias.assign(4, 0.0f); },
       "router_logit_bias holds 4 values, expected none or experts=4"},
      {"router bias size",
       [](LayerWeights& w) {
         w.router_weight.assign(256, 0.0f);
         w.router_logit_bias.assign(3, 0.0f);
       },
       "router_logit_bias holds 3 values"},
  };
  for (const auto& c : cases) {
    LayerWeights w = base;
    c.change(w);
    EXPECT_THAT(validate_error(w), HasSubstr(c.message)) << c.name;
  }
  LayerWeights with_router = base;
  with_router.router_weight.assign(256, 0.0f);
  with_router.router_logit_bias.assign(4, 0.0f);
  EXPECT_NO_THROW(with_router.validate());
}

TEST(LayerWeights, ValidateChecksBiasesWhenTheLayerHasThem) {
  const LayerWeights base = random_layer_weights(small_gpt_oss(), 2);
  ASSERT_NO_THROW(base.validate());
  LayerWeights w = base;
  w.experts[3].down_bias.pop_back();
  EXPECT_THAT(validate_error(w),
              HasSubstr("expert 3 down_bias: 63 values, expected 64 (expert_bias is set)"));
  w = base;
  w.experts[0].up_bias.clear();
  EXPECT_THAT(validate_error(w), HasSubstr("expert 0 up_bias: 0 values, expected 96"));
}

bool same_matrix(const QuantizedMatrix& a, const QuantizedMatrix& b) {
  return a.format == b.format && a.rows == b.rows && a.cols == b.cols && a.packed == b.packed &&
         a.scales == b.scales && a.global_scale == b.global_scale;
}

bool same_expert(const ExpertWeights& a, const ExpertWeights& b) {
  return same_matrix(a.gate, b.gate) && same_matrix(a.up, b.up) && same_matrix(a.down, b.down) &&
         a.gate_bias == b.gate_bias && a.up_bias == b.up_bias && a.down_bias == b.down_bias;
}

bool same_layer(const LayerWeights& a, const LayerWeights& b) {
  if (a.experts.size() != b.experts.size() || a.shared.has_value() != b.shared.has_value()) return false;
  for (std::size_t e = 0; e < a.experts.size(); ++e) {
    if (!same_expert(a.experts[e], b.experts[e])) return false;
  }
  return (!a.shared || same_expert(*a.shared, *b.shared)) && a.correction_bias == b.correction_bias;
}

TEST(RandomLayerWeights, DeterministicInSeedAndIndependentOfThreads) {
  for (const LayerDesc& d : {small_desc(), small_gpt_oss()}) {
    const LayerWeights one = detail::random_layer_weights(d, 7, 1);
    const LayerWeights three = detail::random_layer_weights(d, 7, 3);
    const LayerWeights public_api = random_layer_weights(d, 7);
    EXPECT_TRUE(same_layer(one, three)) << d.to_string();
    EXPECT_TRUE(same_layer(one, public_api)) << d.to_string();
    const LayerWeights other = random_layer_weights(d, 8);
    EXPECT_FALSE(same_layer(one, other)) << d.to_string();
    // Experts differ from each other.
    EXPECT_NE(one.experts[0].gate.packed, one.experts[1].gate.packed);
    EXPECT_NE(one.experts[0].gate.packed, one.experts[0].up.packed);
  }
}

TEST(RandomLayerWeights, Nvfp4CodesAndScalesLookLikeModelOptOutput) {
  LayerDesc d = small_desc();
  d.hidden = 512;
  d.intermediate = 256;
  const LayerWeights w = random_layer_weights(d, 3);
  ASSERT_NO_THROW(w.validate());
  EXPECT_TRUE(w.router_weight.empty());
  EXPECT_TRUE(w.router_logit_bias.empty());
  std::array<std::int64_t, 16> counts{};
  double sum_abs = 0;
  std::int64_t n = 0;
  for (const auto& e : w.experts) {
    EXPECT_EQ(e.gate.global_scale, e.up.global_scale);  // shared, as ModelOpt does
    for (const QuantizedMatrix* m : {&e.gate, &e.up, &e.down}) {
      EXPECT_GE(m->global_scale, 2e-5f);
      EXPECT_LT(m->global_scale, 1e-4f);
      for (std::uint8_t s : m->scales) {
        ASSERT_GE(s, 0x68);  // 64
        ASSERT_LE(s, 0x7e);  // 448
      }
      for (std::uint8_t b : m->packed) {
        ++counts[b & 15];
        ++counts[b >> 4];
      }
      for (float v : dequantize(*m)) {
        sum_abs += std::fabs(v);
        ++n;
      }
    }
    EXPECT_TRUE(e.gate_bias.empty());
  }
  const double mean_abs = sum_abs / static_cast<double>(n);
  EXPECT_GT(mean_abs, 0.01);
  EXPECT_LT(mean_abs, 0.05);
  EXPECT_EQ(counts[8], 0);  // zero is always +0
  // Magnitude shares from the Gaussian model: counts out of 128, split evenly between the signs.
  const double codes = static_cast<double>(n);
  const std::array<int, 8> per_128 = {8, 17, 16, 15, 20, 21, 19, 12};
  EXPECT_NEAR(counts[0] / codes, per_128[0] / 128.0, 0.005);
  for (int m = 1; m < 8; ++m) {
    EXPECT_NEAR(counts[m] / codes, per_128[m] / 256.0, 0.005) << "code " << m;
    EXPECT_NEAR(counts[m | 8] / codes, per_128[m] / 256.0, 0.005) << "code " << (m | 8);
  }
  ASSERT_EQ(w.correction_bias.size(), 4u);
  for (float b : w.correction_bias) {
    EXPECT_GE(b, -0.05f);
    EXPECT_LT(b, 0.05f);
  }
  EXPECT_NE(w.correction_bias[0], w.correction_bias[1]);
  ASSERT_TRUE(w.shared.has_value());
  EXPECT_EQ(w.shared->gate.rows, 48);
}

TEST(RandomLayerWeights, Mxfp4ScalesAndBiases) {
  const LayerWeights w = random_layer_weights(small_gpt_oss(), 4);
  ASSERT_NO_THROW(w.validate());
  EXPECT_TRUE(w.correction_bias.empty());
  EXPECT_FALSE(w.shared.has_value());
  double sum_abs = 0;
  std::int64_t n = 0;
  for (const auto& e : w.experts) {
    for (const QuantizedMatrix* m : {&e.gate, &e.up, &e.down}) {
      EXPECT_EQ(m->global_scale, 1.0f);
      for (std::uint8_t s : m->scales) {
        ASSERT_GE(s, 119);  // 2^-8
        ASSERT_LE(s, 122);  // 2^-5
      }
      for (float v : dequantize(*m)) {
        sum_abs += std::fabs(v);
        ++n;
      }
    }
    for (const auto* bias : {&e.gate_bias, &e.up_bias, &e.down_bias}) {
      for (float b : *bias) {
        ASSERT_EQ(b, round_to_bf16(b));  // stored as BF16, as gpt-oss does
        ASSERT_GE(b, -0.05f);
        ASSERT_LE(b, 0.05f);
      }
    }
    EXPECT_NE(e.gate_bias, e.up_bias);
  }
  const double mean_abs = sum_abs / static_cast<double>(n);
  EXPECT_GT(mean_abs, 0.01);
  EXPECT_LT(mean_abs, 0.05);
}

TEST(RandomLayerWeights, RejectsAnInvalidDesc) {
  LayerDesc d = small_desc();
  d.hidden = 24;
  try {
    random_layer_weights(d, 1);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("hidden=24 is not a multiple of 16"));
  }
}

}  // namespace
}  // namespace fp4moe
