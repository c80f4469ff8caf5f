#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include "fp4moe/checkpoint.hpp"
#include "io/io_test_util.hpp"
#include "io/model_fixtures.hpp"

namespace fp4moe {
namespace {

using test_util::FixtureModel;
using test_util::kFixtureExperts;
using test_util::kFixtureHidden;
using test_util::kFixtureInter;
using test_util::TempDir;
using ::testing::Contains;
using ::testing::HasSubstr;

TEST(InspectModel, ModelOptFixture) {
  TempDir dir;
  const FixtureModel m = test_util::modelopt_fixture(21);
  m.write(dir.path());
  const ModelInfo info = inspect_model(dir.path());
  EXPECT_EQ(info.files.size(), 2u);
  EXPECT_EQ(info.tensors.size(), m.tensors.size());
  EXPECT_EQ(info.model_type, "deepseek_v3");
  ASSERT_TRUE(info.desc.has_value()) << info.desc_error;
  EXPECT_EQ(info.desc->router, RouterKind::kSigmoidGroupTopK);
  ASSERT_TRUE(info.quant.has_value());
  EXPECT_EQ(info.quant->source, "hf_quant_config.json");
  EXPECT_EQ(info.quant->algo, "NVFP4");
  EXPECT_EQ(info.quant->format, WeightFormat::kNvfp4);
  EXPECT_EQ(info.quant->producer, "modelopt 0.29.0");
  EXPECT_EQ(info.quant->group_size, 16);
  EXPECT_EQ(info.quant->excluded_by("model.layers.0.mlp.down_proj"), "model.layers.0.mlp*");
  EXPECT_EQ(info.quant->excluded_by("model.layers.1.mlp.experts.0.up_proj"), "");
  ASSERT_EQ(info.moe_layers.size(), 1u);
  const MoeLayerInfo& l = info.moe_layers[0];
  EXPECT_EQ(l.layer, 1);
  EXPECT_EQ(l.prefix, "model.layers.1.mlp");
  EXPECT_EQ(l.layout, ExpertLayout::kModelOptNvfp4);
  EXPECT_EQ(l.experts, kFixtureExperts);
  EXPECT_EQ(l.hidden, kFixtureHidden);
  EXPECT_EQ(l.intermediate, kFixtureInter);
  EXPECT_EQ(l.shared_intermediate, kFixtureInter);
  EXPECT_EQ(l.router, "model.layers.1.mlp.gate.weight");
  EXPECT_TRUE(l.correction_bias);
  EXPECT_TRUE(info.warnings.empty()) << ::testing::PrintToString(info.warnings);
}

TEST(InspectModel, WarnsAboutAnomalies) {
  TempDir dir;
  FixtureModel m = test_util::modelopt_fixture(22);
  const std::string x = "model.layers.1.mlp.experts.";
  const float other = 1e-3f, zero = 0.0f;
  m.tensors[x + "1.up_proj.weight_scale_2"] = test_util::f32_tensor({}, std::span(&other, 1));
  m.tensors[x + "2.down_proj.weight_scale_2"] = test_util::f32_tensor({}, std::span(&zero, 1));
  m.tensors[x + "0.gate_proj.weight_scale"].bytes[3] = 0x00;  // zero block scale
  m.tensors[x + "0.gate_proj.weight_scale"].bytes[5] = 0x7f;  // NaN
  m.tensors[x + "0.gate_proj.weight_scale"].bytes[6] = 0xb8;  // -1.0
  m.tensors.erase(x + "3.down_proj.weight_scale");
  auto& emb = m.tensors["model.embed_tokens.weight"].bytes;
  emb[4] = 0xc0;  // BF16 element 2 = 0x7fc0: NaN
  emb[5] = 0x7f;
  emb[6] = 0x80;  // element 3 = 0xff80: -Inf
  emb[7] = 0xff;
  m.hf_quant_config["quantization"]["exclude_modules"].push_back("model.layers.1.mlp.shared_experts.up_proj");
  m.write(dir.path());

  const ModelInfo info = inspect_model(dir.path());
  const auto& w = info.warnings;
  EXPECT_THAT(w, Contains(HasSubstr("model.layers.1.mlp expert 1: gate_proj weight_scale_2 = ")));
  EXPECT_THAT(w,
              Contains(HasSubstr("'" + x + "2.down_proj.weight_scale_2' = 0: not a finite positive scale")));
  EXPECT_THAT(w, Contains(HasSubstr("'" + x +
                                    "0.gate_proj.weight_scale': 1 NaN block scales (the first at flat "
                                    "index 5)")));
  EXPECT_THAT(w, Contains(HasSubstr("'" + x +
                                    "0.gate_proj.weight_scale': 1 zero block scales (the first at flat "
                                    "index 3")));
  EXPECT_THAT(w, Contains(HasSubstr("'" + x + "0.gate_proj.weight_scale': 1 negative block scales")));
  EXPECT_THAT(w, Contains(HasSubstr("model.layers.1.mlp: 1 expert tensors missing, the first '" + x +
                                    "3.down_proj.weight_scale'")));
  EXPECT_THAT(
      w,
      Contains(HasSubstr("'model.embed_tokens.weight': 1 NaN and 1 Inf values (the first at flat index 2)")));
  EXPECT_THAT(w, Contains(HasSubstr("'model.layers.1.mlp.shared_experts.up_proj' is quantized but "
                                    "hf_quant_config.json excludes it")));
  EXPECT_EQ(w.size(), 8u) << ::testing::PrintToString(w);

  InspectOptions headers_only;
  headers_only.scan_values = false;
  const ModelInfo quick = inspect_model(dir.path(), headers_only);
  // Only what the headers and the per-expert scalars show: the gate/up mismatch, the missing
  // tensor and the excluded-but-quantized module.
  EXPECT_EQ(quick.warnings.size(), 3u) << ::testing::PrintToString(quick.warnings);
}

TEST(InspectModel, GptOssFixtureAndASingleFile) {
  TempDir dir;
  const auto f = test_util::gpt_oss_fixture(23);
  f.model.write(dir.path());
  const ModelInfo info = inspect_model(dir.path());
  ASSERT_EQ(info.moe_layers.size(), 1u);
  EXPECT_EQ(info.moe_layers[0].layout, ExpertLayout::kGptOssMxfp4);
  EXPECT_EQ(info.moe_layers[0].experts, kFixtureExperts);
  EXPECT_EQ(info.moe_layers[0].hidden, kFixtureHidden);
  EXPECT_EQ(info.moe_layers[0].intermediate, kFixtureInter);
  EXPECT_EQ(info.moe_layers[0].router, "model.layers.0.mlp.router.weight");
  ASSERT_TRUE(info.quant.has_value());
  EXPECT_EQ(info.quant->source, "config.json quantization_config");
  EXPECT_EQ(info.quant->format, WeightFormat::kMxfp4);
  EXPECT_EQ(info.quant->excluded_by("model.layers.0.mlp.router"), "model.layers.*.mlp.router");
  EXPECT_TRUE(info.warnings.empty()) << ::testing::PrintToString(info.warnings);

  const ModelInfo file = inspect_model(dir / "model.safetensors");
  EXPECT_EQ(file.files.size(), 1u);
  EXPECT_EQ(file.moe_layers.size(), 1u);
}

}  // namespace
}  // namespace fp4moe
