#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <limits>

#include "fp4moe/checkpoint.hpp"
#include "fp4moe/error.hpp"
#include "fp4moe/reference.hpp"
#include "io/io_test_util.hpp"
#include "io/model_fixtures.hpp"
#include "test_util/shared.hpp"

namespace fp4moe {
namespace {

using test_util::error_of;
using test_util::FixtureModel;
using test_util::kFixtureExperts;
using test_util::kFixtureHidden;
using test_util::kFixtureInter;
using test_util::TempDir;
using ::testing::HasSubstr;

// Index of the first differing byte, or -1.
std::int64_t first_difference(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  if (a.size() != b.size()) return static_cast<std::int64_t>(std::min(a.size(), b.size()));
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<std::int64_t>(i);
  }
  return -1;
}

float fixture_scalar(const FixtureModel& m, const std::string& name) {
  float v;
  std::memcpy(&v, m.tensors.at(name).bytes.data(), 4);
  return v;
}

void expect_matrix(const QuantizedMatrix& q, const FixtureModel& m, const std::string& base) {
  EXPECT_EQ(first_difference(q.packed, m.tensors.at(base + ".weight").bytes), -1) << base << ".weight";
  EXPECT_EQ(first_difference(q.scales, m.tensors.at(base + ".weight_scale").bytes), -1)
      << base << ".weight_scale";
  EXPECT_EQ(std::bit_cast<std::uint32_t>(q.global_scale),
            std::bit_cast<std::uint32_t>(fixture_scalar(m, base + ".weight_scale_2")))
      << base;
}

TEST(LoadMoeLayer, ModelOptNvfp4EveryTensorExactly) {
  TempDir dir;
  const FixtureModel m = test_util::modelopt_fixture(1);
  m.write(dir.path());
  const LayerWeights w = load_moe_layer(dir.path(), 1);
  const LayerDesc& d = w.desc;
  EXPECT_EQ(d.hidden, kFixtureHidden);
  EXPECT_EQ(d.intermediate, kFixtureInter);
  EXPECT_EQ(d.experts, kFixtureExperts);
  EXPECT_EQ(d.top_k, 2);
  EXPECT_EQ(d.router, RouterKind::kSigmoidGroupTopK);
  EXPECT_EQ(d.n_group, 2);
  EXPECT_EQ(d.topk_group, 1);
  EXPECT_EQ(d.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(d.renormalize);
  EXPECT_EQ(d.shared_intermediate, kFixtureInter);
  EXPECT_EQ(d.format, WeightFormat::kNvfp4);
  EXPECT_EQ(d.activation, Activation::kSwiGLU);
  EXPECT_FALSE(d.expert_bias);
  ASSERT_EQ(w.experts.size(), static_cast<std::size_t>(kFixtureExperts));
  for (int e = 0; e < kFixtureExperts; ++e) {
    for (const auto& [proj, q] :
         {std::pair{"gate_proj", &w.experts[e].gate}, std::pair{"up_proj", &w.experts[e].up},
          std::pair{"down_proj", &w.experts[e].down}}) {
      expect_matrix(*q, m, fmt::format("model.layers.1.mlp.experts.{}.{}", e, proj));
    }
    EXPECT_EQ(w.experts[e].gate.global_scale, w.experts[e].up.global_scale);
  }
  ASSERT_TRUE(w.shared.has_value());
  expect_matrix(w.shared->gate, m, "model.layers.1.mlp.shared_experts.gate_proj");
  expect_matrix(w.shared->down, m, "model.layers.1.mlp.shared_experts.down_proj");
  EXPECT_EQ(w.router_weight, test_util::fixture_floats(m.tensors.at("model.layers.1.mlp.gate.weight")));
  EXPECT_EQ(w.correction_bias,
            test_util::fixture_floats(m.tensors.at("model.layers.1.mlp.gate.e_score_correction_bias")));
  EXPECT_TRUE(w.router_logit_bias.empty());
  EXPECT_EQ(read_layer_desc(dir.path()).experts, kFixtureExperts);

  // The loaded layer runs through the reference: 3 tokens, every output finite.
  std::vector<Bf16> x(3 * kFixtureHidden);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = Bf16::from_float(static_cast<float>(i % 7) * 0.25f - 0.75f);
  const auto logits = router_logits(w, x, 3);
  const auto r = reference_forward(w, x, logits, 3);
  ASSERT_EQ(r.out.size(), x.size());
  for (const auto v : r.out) ASSERT_TRUE(std::isfinite(v.to_float()));
}

TEST(LoadMoeLayer, QuantizedRouterIsDequantized) {
  TempDir dir;
  FixtureModel m = test_util::modelopt_fixture(6);
  const auto router = test_util::random_floats(kFixtureExperts * kFixtureHidden, 9, 0.3f);
  const QuantizedMatrix q = quantize_nvfp4(router, kFixtureExperts, kFixtureHidden);
  const std::string g = "model.layers.1.mlp.gate.";
  m.tensors[g + "weight"] = {Dtype::kU8, {kFixtureExperts, kFixtureHidden / 2}, q.packed};
  m.tensors[g + "weight_scale"] = {Dtype::kF8E4M3, {kFixtureExperts, kFixtureHidden / 16}, q.scales};
  m.tensors[g + "weight_scale_2"] = test_util::f32_tensor({}, std::span(&q.global_scale, 1));
  m.write(dir.path());
  EXPECT_EQ(load_moe_layer(dir.path(), 1).router_weight, dequantize(q));
}

// Writes the fixture after `edit` and returns the error load_moe_layer(layer) throws.
template <typename Edit>
std::string load_error(FixtureModel m, Edit&& edit, std::int64_t layer = 1) {
  TempDir dir;
  edit(m);
  m.write(dir.path());
  return error_of([&] { load_moe_layer(dir.path(), layer); });
}

TEST(LoadMoeLayer, RejectsMissingTensorsWrongDtypesAndShapes) {
  const FixtureModel m = test_util::modelopt_fixture(2);
  const std::string x2 = "model.layers.1.mlp.experts.2.";
  EXPECT_THAT(load_error(m, [&](FixtureModel& f) { f.tensors.erase(x2 + "down_proj.weight_scale"); }),
              HasSubstr("layer 1: tensor '" + x2 + "down_proj.weight_scale' is missing"));
  EXPECT_THAT(
      load_error(m, [&](FixtureModel& f) { f.tensors[x2 + "up_proj.weight_scale"].dtype = Dtype::kU8; }),
      HasSubstr("tensor '" + x2 + "up_proj.weight_scale' is U8, expected F8_E4M3"));
  EXPECT_THAT(load_error(m,
                         [&](FixtureModel& f) {
                           f.tensors[x2 + "gate_proj.weight"].shape = {16, 64};
                         }),
              HasSubstr("tensor '" + x2 + "gate_proj.weight' has shape [16, 64], expected [32, 32]"));
  EXPECT_THAT(
      load_error(
          m,
          [&](FixtureModel& f) {
            f.tensors[x2 + "gate_proj.weight_scale_2"] = test_util::f32_tensor({2}, std::vector{1.f, 1.f});
          }),
      HasSubstr("tensor '" + x2 + "gate_proj.weight_scale_2' is F32 [2], expected F32 []"));
  EXPECT_THAT(
      load_error(m,
                 [&](FixtureModel& f) {
                   f.tensors["model.layers.1.mlp.experts.4.up_proj.weight"] =
                       f.tensors[x2 + "up_proj.weight"];
                 }),
      HasSubstr("'model.layers.1.mlp.experts.4.up_proj.weight' is expert 4 but config.json says 4 routed"));
  EXPECT_THAT(
      load_error(
          m, [&](FixtureModel& f) { f.tensors.erase("model.layers.1.mlp.gate.e_score_correction_bias"); }),
      HasSubstr("'model.layers.1.mlp.gate.e_score_correction_bias' is missing"));
  EXPECT_THAT(
      load_error(m,
                 [&](FixtureModel& f) {
                   f.tensors["model.layers.1.mlp.gate.weight"].shape = {kFixtureHidden, kFixtureExperts};
                 }),
      HasSubstr("'model.layers.1.mlp.gate.weight' has shape [64, 4], expected [4, 64]"));
}

TEST(LoadMoeLayer, RejectsBrokenScaleRules) {
  const FixtureModel m = test_util::modelopt_fixture(3);
  const std::string x1 = "model.layers.1.mlp.experts.1.";
  EXPECT_THAT(load_error(m,
                         [&](FixtureModel& f) {
                           const float other = 1e-3f;
                           f.tensors[x1 + "up_proj.weight_scale_2"] =
                               test_util::f32_tensor({}, std::span(&other, 1));
                         }),
              HasSubstr("layer 1 expert 1: gate_proj weight_scale_2 = "));
  for (const float bad : {0.0f, -1e-3f, std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
    EXPECT_THAT(load_error(m,
                           [&](FixtureModel& f) {
                             f.tensors[x1 + "down_proj.weight_scale_2"] =
                                 test_util::f32_tensor({}, std::span(&bad, 1));
                           }),
                HasSubstr("'" + x1 + "down_proj.weight_scale_2' = " + fmt::format("{}", bad) +
                          " is not a finite positive scale"));
  }
  EXPECT_THAT(
      load_error(m, [&](FixtureModel& f) { f.tensors[x1 + "down_proj.weight_scale"].bytes[9] = 0xff; }),
      HasSubstr("'" + x1 + "down_proj.weight_scale' holds a NaN block scale (0xff) at [4, 1]"));
}

TEST(LoadMoeLayer, RejectsConfigsThatDisagree) {
  const FixtureModel m = test_util::modelopt_fixture(4);
  EXPECT_THAT(load_error(
                  m, [](FixtureModel&) {}, 0),
              HasSubstr("layer 0 has no MoE experts (MoE layers: 1)"));
  EXPECT_THAT(load_error(m, [](FixtureModel& f) { f.config = nullptr; }), HasSubstr("no config.json"));
  EXPECT_THAT(load_error(m,
                         [](FixtureModel& f) {
                           f.config["model_type"] = "llama4";
                           f.config.erase("scoring_func");
                           f.config.erase("topk_method");
                         }),
              HasSubstr("model_type \"llama4\" with scoring_func \"\": unknown router"));
  EXPECT_THAT(load_error(m, [](FixtureModel& f) { f.config["hidden_size"] = "64"; }),
              HasSubstr("\"hidden_size\" is \"64\", expected a non-negative integer"));
  EXPECT_THAT(load_error(m, [](FixtureModel& f) { f.config.erase("num_experts_per_tok"); }),
              HasSubstr("no \"num_experts_per_tok\" or \"experts_per_token\""));
  EXPECT_THAT(
      load_error(m, [](FixtureModel& f) { f.config["n_shared_experts"] = 0; }),
      HasSubstr("layer 1 has a shared expert ('model.layers.1.mlp.shared_experts.gate_proj.weight') but "
                "config.json has no n_shared_experts"));
  EXPECT_THAT(
      load_error(m, [](FixtureModel& f) { f.hf_quant_config["quantization"]["quant_algo"] = "MXFP4"; }),
      HasSubstr("hf_quant_config.json declares MXFP4 but layer 1 holds modelopt-nvfp4 experts"));
  EXPECT_THAT(load_error(m, [](FixtureModel& f) { f.config["moe_intermediate_size"] = 48; }),
              HasSubstr("expected [48, 32]"));
}

TEST(LoadMoeLayer, RejectsUnquantizedExpertsNamingTheExcludePattern) {
  FixtureModel m = test_util::modelopt_fixture(5);
  for (auto it = m.tensors.begin(); it != m.tensors.end();) {
    it = it->first.find(".experts.") != std::string::npos ? m.tensors.erase(it) : std::next(it);
  }
  for (int e = 0; e < kFixtureExperts; ++e) {
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      const bool down = std::string_view(proj) == "down_proj";
      m.tensors[fmt::format("model.layers.1.mlp.experts.{}.{}.weight", e, proj)] = test_util::bf16_tensor(
          {down ? kFixtureHidden : kFixtureInter, down ? kFixtureInter : kFixtureHidden},
          std::vector<float>(kFixtureHidden * kFixtureInter, 0.5f));
    }
  }
  m.hf_quant_config["quantization"]["exclude_modules"].push_back("model.layers.1.mlp.experts*");
  EXPECT_THAT(load_error(m, [](FixtureModel&) {}),
              HasSubstr("'model.layers.1.mlp.experts.0.down_proj.weight' is BF16, not quantized (excluded by "
                        "'model.layers.1.mlp.experts*' in hf_quant_config.json)"));
}

TEST(LoadMoeLayer, GptOssDeinterleavesGateAndUp) {
  TempDir dir;
  const auto f = test_util::gpt_oss_fixture(7);
  f.model.write(dir.path());
  const LayerWeights w = load_moe_layer(dir.path(), 0);
  const LayerDesc& d = w.desc;
  EXPECT_EQ(d.router, RouterKind::kTopKSoftmax);
  EXPECT_EQ(d.activation, Activation::kSwiGLUClamped);
  EXPECT_EQ(d.swiglu_alpha, 1.702f);
  EXPECT_EQ(d.swiglu_limit, 7.0f);
  EXPECT_TRUE(d.expert_bias);
  EXPECT_EQ(d.format, WeightFormat::kMxfp4);
  EXPECT_EQ(d.intermediate, kFixtureInter);
  ASSERT_EQ(w.experts.size(), f.experts.size());
  for (std::size_t e = 0; e < f.experts.size(); ++e) {
    const auto& got = w.experts[e];
    const auto& want = f.experts[e];
    EXPECT_EQ(first_difference(got.gate.packed, want.gate.packed), -1) << "expert " << e;
    EXPECT_EQ(first_difference(got.gate.scales, want.gate.scales), -1) << "expert " << e;
    EXPECT_EQ(first_difference(got.up.packed, want.up.packed), -1) << "expert " << e;
    EXPECT_EQ(first_difference(got.up.scales, want.up.scales), -1) << "expert " << e;
    EXPECT_EQ(first_difference(got.down.packed, want.down.packed), -1) << "expert " << e;
    EXPECT_EQ(first_difference(got.down.scales, want.down.scales), -1) << "expert " << e;
    EXPECT_EQ(got.gate_bias, want.gate_bias);
    EXPECT_EQ(got.up_bias, want.up_bias);
    EXPECT_EQ(got.down_bias, want.down_bias);
    EXPECT_EQ(got.gate.format, WeightFormat::kMxfp4);
  }
  EXPECT_EQ(w.router_logit_bias,
            test_util::fixture_floats(f.model.tensors.at("model.layers.0.mlp.router.bias")));
  EXPECT_TRUE(w.correction_bias.empty());
}

TEST(LoadMoeLayer, GptOssRejectsBadBlocks) {
  const auto f = test_util::gpt_oss_fixture(8);
  const std::string p = "model.layers.0.mlp.experts.";
  EXPECT_THAT(load_error(
                  f.model,
                  [&](FixtureModel& m) {
                    m.tensors[p + "down_proj_blocks"].shape = {4, 64, 16, 1};
                  },
                  0),
              HasSubstr("'" + p + "down_proj_blocks' has shape [4, 64, 16, 1], expected [4, 64, 1, 16]"));
  EXPECT_THAT(
      load_error(
          f.model, [&](FixtureModel& m) { m.tensors[p + "gate_up_proj_scales"].bytes[200] = 0xff; }, 0),
      HasSubstr("layer 0 expert 1: a NaN MXFP4 scale (0xff) in the gate_up_proj scales"));
  EXPECT_THAT(load_error(
                  f.model, [&](FixtureModel& m) { m.tensors.erase(p + "gate_up_proj_bias"); }, 0),
              HasSubstr("'" + p + "gate_up_proj_bias' is missing"));
  EXPECT_THAT(
      load_error(
          f.model, [&](FixtureModel& m) { m.config["model_type"] = "qwen3_moe"; }, 0),
      HasSubstr("layer 0 holds gpt-oss-mxfp4 experts but config.json describes a ModelOpt-layout model"));
}

}  // namespace
}  // namespace fp4moe
