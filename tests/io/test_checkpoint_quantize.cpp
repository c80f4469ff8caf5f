#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "fp4moe/checkpoint.hpp"
#include "fp4moe/error.hpp"
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

std::vector<std::uint8_t> tensor_bytes(const SafetensorsFile& f, const std::string& name) {
  const auto d = f.data(f.tensor(name));
  return {d.begin(), d.end()};
}

// A hand-worked NVFP4 example. Row 0's amax is 2688 = 6 * 448, so weight_scale_2 = 1 exactly and
// its block scale is 2688 / 6 = 448 (E4M3 0x7e): every value is divided by 448, landing on E2M1
// midpoints (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 -> ties to even) and on 6. Row 1, block 0 is
// all zero (scale 0 -> 1.0 = 0x38, codes 0); row 1, block 1 holds -50 (-50/448 rounds to zero,
// ModelOpt keeps the sign: code 8) and 448 * 0.5 (code 1) in a block whose amax 224 gives the
// block scale 224 / 6 = 37.33 -> E4M3 36 (0x61); 224 / 36 = 6.22 -> 6 (code 7), -50/36 = -1.39 -> -1.5.
TEST(QuantizeCheckpoint, HandWorkedNvfp4Bytes) {
  TempDir dir;
  std::vector<float> x = {112,  336,  560,  784,  1120,  1568,  2240,  2688,
                          -112, -336, -560, -784, -1120, -1568, -2240, -50};
  x.insert(x.end(), {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -0.0f});
  x.resize(64, 0.0f);
  x[48] = 224;
  x[49] = -50;
  SafetensorsWriter w;
  const auto t = test_util::bf16_tensor({2, 32}, x);
  w.add("proj.weight", t.dtype, t.shape, t.bytes);
  w.write(dir / "in.safetensors");
  const auto report = quantize_checkpoint(dir / "in.safetensors", dir / "out.safetensors", {});
  EXPECT_EQ(report.quantized, 1);
  EXPECT_EQ(report.written, std::vector<std::filesystem::path>{dir / "out.safetensors"});
  const auto f = SafetensorsFile::open(dir / "out.safetensors");
  EXPECT_EQ(f.tensor("proj.weight").shape, (std::vector<std::int64_t>{2, 16}));
  EXPECT_EQ(f.tensor("proj.weight_scale").dtype, Dtype::kF8E4M3);
  EXPECT_EQ(tensor_bytes(f, "proj.weight_scale_2"), (std::vector<std::uint8_t>{0x00, 0x00, 0x80, 0x3f}));
  // Row 0 block 0: 0.25->0, 0.75->1 (code 2), 1.25->1 (2), 1.75->2 (4), 2.5->2 (4), 3.5->4 (6), 5->4 (6),
  // 6 (7); then the negatives (codes | 8, -0.25 -> -0 = 8) and -50/448 = -0.11 -> -0 (8).
  const std::vector<std::uint8_t> packed = {
      0x20, 0x42, 0x64, 0x76, 0xa8, 0xca, 0xec, 0x8e,  // row 0, block 0
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // row 0, block 1: zeros (scale 1.0)
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // row 1, block 0 (-0.0 stays code 0)
      0xb7, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // row 1, block 1: 224 -> 7, -50 -> -1.5 (b)
  };
  EXPECT_EQ(tensor_bytes(f, "proj.weight"), packed);
  EXPECT_EQ(tensor_bytes(f, "proj.weight_scale"), (std::vector<std::uint8_t>{0x7e, 0x38, 0x38, 0x61}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

// Quantizes the BF16 fixture directory (two shards, two MoE layers) once for the tests below.
class QuantizedBf16Model : public ::testing::Test {
 protected:
  void SetUp() override {
    model = test_util::bf16_fixture(11);
    model.write(dir / "in");
    test_util::write_text(dir / "in" / "tokenizer.json", "{\"tok\": 1}");
    test_util::write_text(dir / "in" / "pytorch_model.bin", "not copied");
    report = quantize_checkpoint(dir / "in", dir / "out", {}, [&](const QuantizeProgress& p) {
      EXPECT_GE(p.done_bytes, last_done);
      last_done = p.done_bytes;
      total = p.total_bytes;
    });
  }
  TempDir dir;
  FixtureModel model;
  QuantizeReport report;
  std::uint64_t last_done = 0, total = 0;
};

TEST_F(QuantizedBf16Model, WritesShardsIndexAndHfQuantConfig) {
  // 2 layers x 4 experts x 3 + 2 q_proj are quantized; router gates, embeddings, lm_head are not.
  EXPECT_EQ(report.quantized, 26);
  EXPECT_EQ(report.excluded, 4);
  EXPECT_EQ(report.not_block_multiple, 0);
  EXPECT_EQ(last_done, total);
  EXPECT_EQ(total, report.bytes_in);
  const auto out = ShardedSafetensors::open(dir / "out");
  EXPECT_EQ(out.files().size(), 2u);
  EXPECT_EQ(out.size(), model.tensors.size() + 2 * 26);
  const auto& w = out.tensor("model.layers.1.mlp.experts.3.down_proj.weight");
  EXPECT_EQ(w.dtype, Dtype::kU8);
  EXPECT_EQ(w.shape, (std::vector<std::int64_t>{kFixtureHidden, kFixtureInter / 2}));
  EXPECT_EQ(out.tensor("model.layers.1.mlp.experts.3.down_proj.weight_scale").shape,
            (std::vector<std::int64_t>{kFixtureHidden, kFixtureInter / 16}));
  EXPECT_EQ(out.tensor("model.layers.1.mlp.gate.weight").dtype, Dtype::kBF16);
  EXPECT_EQ(out.tensor("model.norm.weight").dtype, Dtype::kBF16);

  const auto hf = nlohmann::json::parse(std::ifstream(dir / "out" / "hf_quant_config.json"));
  EXPECT_EQ(hf["producer"]["name"], "fp4moe");
  EXPECT_EQ(hf["quantization"]["quant_algo"], "NVFP4");
  EXPECT_EQ(hf["quantization"]["group_size"], 16);
  EXPECT_EQ(hf["quantization"]["exclude_modules"],
            nlohmann::json(
                {"lm_head", "model.embed_tokens", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"}));
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "config.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "tokenizer.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "pytorch_model.bin"));
  // No temporary files left next to the outputs.
  for (const auto& e : std::filesystem::directory_iterator(dir / "out")) {
    EXPECT_NE(e.path().filename().string().front(), '.') << e.path();
  }
}

TEST_F(QuantizedBf16Model, LoadsBackAsTheRecipeOfEachExpert) {
  const LayerWeights w = load_moe_layer(dir / "out", 1);
  EXPECT_EQ(w.desc.router, RouterKind::kSoftmaxTopK);
  EXPECT_TRUE(w.desc.renormalize);
  for (int e = 0; e < kFixtureExperts; ++e) {
    const std::string p = fmt::format("model.layers.1.mlp.experts.{}.", e);
    const auto g = test_util::fixture_floats(model.tensors.at(p + "gate_proj.weight"));
    const auto u = test_util::fixture_floats(model.tensors.at(p + "up_proj.weight"));
    std::vector<float> both(g);
    both.insert(both.end(), u.begin(), u.end());
    const float shared = nvfp4_global_scale(both);
    const auto& ew = w.experts[static_cast<std::size_t>(e)];
    EXPECT_EQ(ew.gate.global_scale, shared) << "expert " << e << ": gate and up share the larger amax";
    EXPECT_EQ(ew.up.global_scale, shared);
    const auto d = test_util::fixture_floats(model.tensors.at(p + "down_proj.weight"));
    const std::vector<std::pair<const QuantizedMatrix*, QuantizedMatrix>> pairs = {
        {&ew.gate, quantize_nvfp4(g, kFixtureInter, kFixtureHidden, shared)},
        {&ew.up, quantize_nvfp4(u, kFixtureInter, kFixtureHidden, shared)},
        {&ew.down, quantize_nvfp4(d, kFixtureHidden, kFixtureInter)}};
    for (const auto& [got, want] : pairs) {
      EXPECT_EQ(got->scales, want.scales) << "expert " << e;
      EXPECT_EQ(got->global_scale, want.global_scale) << "expert " << e;
      // Values, not bytes: the checkpoint keeps ModelOpt's -0 codes, which quantize_nvfp4 writes as +0.
      for (std::int64_t r = 0; r < want.rows; ++r) {
        for (std::int64_t c = 0; c < want.cols; ++c) {
          ASSERT_EQ(got->value(r, c), want.value(r, c)) << "expert " << e << " at [" << r << ", " << c << "]";
        }
      }
    }
  }
  EXPECT_EQ(w.router_weight, test_util::fixture_floats(model.tensors.at("model.layers.1.mlp.gate.weight")));
}

TEST_F(QuantizedBf16Model, RefusesToQuantizeAQuantizedModel) {
  EXPECT_THAT(error_of([&] { quantize_checkpoint(dir / "out", dir / "again", {}); }),
              HasSubstr("already quantized (hf_quant_config.json says NVFP4)"));
}

TEST(QuantizeCheckpoint, Mxfp4LayoutLoadsBack) {
  TempDir dir;
  const FixtureModel m = test_util::bf16_fixture(12);
  m.write(dir / "in");
  QuantizeOptions options;
  options.format = WeightFormat::kMxfp4;
  options.threads = 2;
  quantize_checkpoint(dir / "in", dir / "out", options);
  const auto out = ShardedSafetensors::open(dir / "out");
  const auto& s = out.tensor("model.layers.0.mlp.experts.1.gate_proj.weight_scale");
  EXPECT_EQ(s.dtype, Dtype::kU8);
  EXPECT_EQ(s.shape, (std::vector<std::int64_t>{kFixtureInter, kFixtureHidden / 32}));
  EXPECT_EQ(out.find("model.layers.0.mlp.experts.1.gate_proj.weight_scale_2"), nullptr);
  const auto hf = nlohmann::json::parse(std::ifstream(dir / "out" / "hf_quant_config.json"));
  EXPECT_EQ(hf["quantization"]["quant_algo"], "MXFP4");
  EXPECT_EQ(hf["quantization"]["group_size"], 32);

  const LayerWeights w = load_moe_layer(dir / "out", 0);
  EXPECT_EQ(w.desc.format, WeightFormat::kMxfp4);
  const auto g = test_util::fixture_floats(m.tensors.at("model.layers.0.mlp.experts.1.gate_proj.weight"));
  const auto want = quantize_mxfp4(g, kFixtureInter, kFixtureHidden);
  EXPECT_EQ(w.experts[1].gate.packed, want.packed);
  EXPECT_EQ(w.experts[1].gate.scales, want.scales);
}

TEST(QuantizeCheckpoint, ExcludeRegexesAndTensorsThatStayAsTheyAre) {
  TempDir dir;
  SafetensorsWriter w;
  const auto add = [&](const std::string& name, test_util::FixtureTensor t) {
    w.add(name, t.dtype, t.shape, t.bytes);
  };
  add("a.q_proj.weight", test_util::bf16_tensor({4, 32}, test_util::random_floats(128, 1, 1.0f)));
  add("a.k_proj.weight", test_util::bf16_tensor({4, 32}, test_util::random_floats(128, 2, 1.0f)));
  add("a.odd.weight", test_util::bf16_tensor({4, 24}, test_util::random_floats(96, 3, 1.0f)));
  add("a.bias3d.weight", test_util::bf16_tensor({2, 2, 16}, test_util::random_floats(64, 4, 1.0f)));
  add("a.q_proj.bias", test_util::bf16_tensor({4, 16}, test_util::random_floats(64, 5, 1.0f)));
  w.add("a.ids.weight", Dtype::kI32, {2, 16}, std::vector<std::uint8_t>(128, 1));
  w.write(dir / "in.safetensors");
  QuantizeOptions options;
  options.exclude = {"k_proj"};
  const auto r = quantize_checkpoint(dir / "in.safetensors", dir / "out.safetensors", options);
  EXPECT_EQ(r.quantized, 1);
  EXPECT_EQ(r.excluded, 1);
  EXPECT_EQ(r.not_block_multiple, 1);
  EXPECT_EQ(r.copied, 5);
  const auto in = SafetensorsFile::open(dir / "in.safetensors");
  const auto out = SafetensorsFile::open(dir / "out.safetensors");
  for (const char* kept :
       {"a.k_proj.weight", "a.odd.weight", "a.bias3d.weight", "a.q_proj.bias", "a.ids.weight"}) {
    EXPECT_EQ(tensor_bytes(out, kept), tensor_bytes(in, kept)) << kept;
    EXPECT_EQ(out.tensor(kept).dtype, in.tensor(kept).dtype) << kept;
  }
  EXPECT_EQ(out.tensor("a.q_proj.weight").dtype, Dtype::kU8);
}

TEST(QuantizeCheckpoint, RefusesBadInputsWithReasons) {
  TempDir dir;
  std::vector<float> v = test_util::random_floats(64, 1, 1.0f);
  v[37] = std::numeric_limits<float>::quiet_NaN();
  SafetensorsWriter w;
  const auto t = test_util::bf16_tensor({2, 32}, v);
  w.add("m.up_proj.weight", t.dtype, t.shape, t.bytes);
  w.write(dir / "nan.safetensors");
  EXPECT_THAT(
      error_of([&] { quantize_checkpoint(dir / "nan.safetensors", dir / "o.safetensors", {}); }),
      HasSubstr("tensor 'm.up_proj.weight' element [1, 5] is nan: only finite weights can be quantized"));
  EXPECT_FALSE(std::filesystem::exists(dir / "o.safetensors"));

  QuantizeOptions bad_regex;
  bad_regex.exclude = {"(unclosed"};
  EXPECT_THAT(
      error_of([&] { quantize_checkpoint(dir / "nan.safetensors", dir / "o.safetensors", bad_regex); }),
      HasSubstr("exclude '(unclosed' is not a valid regular expression"));

  test_util::bf16_fixture(3).write(dir / "model");
  EXPECT_THAT(error_of([&] { quantize_checkpoint(dir / "model", dir / "o.safetensors", {}); }),
              HasSubstr("is a model directory: it quantizes into a directory, not into the file"));
  EXPECT_THAT(error_of([&] { quantize_checkpoint(dir / "model", dir / "model", {}); }),
              HasSubstr("is the input: write the quantized model elsewhere"));
  EXPECT_THAT(error_of([&] { quantize_checkpoint(dir / "none", dir / "o", {}); }), HasSubstr("no such file"));

  SafetensorsWriter clash;
  clash.add("x.weight", t.dtype, t.shape,
            test_util::bf16_tensor({2, 32}, test_util::random_floats(64, 2, 1.0f)).bytes);
  clash.add("x.weight_scale", Dtype::kF8E4M3, {2, 2}, std::vector<std::uint8_t>(4, 0x38));
  clash.write(dir / "clash.safetensors");
  EXPECT_THAT(error_of([&] { quantize_checkpoint(dir / "clash.safetensors", dir / "o.safetensors", {}); }),
              HasSubstr("'x.weight' is BF16 but 'x.weight_scale' exists already"));
}

}  // namespace
}  // namespace fp4moe
