// Tiny model directories made in code for the checkpoint tests: ModelOpt NVFP4 layout
// (DeepSeek-style), gpt-oss MXFP4 layout, and an unquantized BF16 model (Qwen3-MoE-style).
// Tests edit the tensors or configs before writing, to make every kind of malformed model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "fp4moe/layer.hpp"
#include "fp4moe/safetensors.hpp"

namespace fp4moe::test_util {

struct FixtureTensor {
  Dtype dtype = Dtype::kU8;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;
};

FixtureTensor bf16_tensor(std::vector<std::int64_t> shape, std::span<const float> values);
FixtureTensor f32_tensor(std::vector<std::int64_t> shape, std::span<const float> values);
std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale);
// The float values of a BF16 or F32 fixture tensor.
std::vector<float> fixture_floats(const FixtureTensor& t);

struct FixtureModel {
  nlohmann::json config;           // config.json; null: none written
  nlohmann::json hf_quant_config;  // hf_quant_config.json; null: none written
  std::map<std::string, FixtureTensor> tensors;
  int shards = 1;  // > 1: model-0000i-of-0000n.safetensors + model.safetensors.index.json

  void write(const std::filesystem::path& dir) const;
};

// H=64, I=32, 4 routed experts, top-2, sigmoid router with 2 groups (keep 1), scale 2.5, one
// shared expert (I=32). Layer 0 is a dense BF16 MLP (excluded), layer 1 the MoE layer with
// NVFP4 experts quantized by quantize_nvfp4 (gate and up sharing weight_scale_2) and input_scale.
// Written as two shards.
FixtureModel modelopt_fixture(std::uint64_t seed);
inline constexpr std::int64_t kFixtureHidden = 64;
inline constexpr std::int64_t kFixtureInter = 32;
inline constexpr std::int64_t kFixtureExperts = 4;

// gpt-oss: H=64, I=32, 4 experts, top-2; layer 0 holds fused MXFP4 blocks made from `experts`
// (gate/up rows interleaved), BF16 biases, router weight and bias.
struct GptOssFixture {
  FixtureModel model;
  std::vector<ExpertWeights> experts;  // what the fused tensors hold, per expert
};
GptOssFixture gpt_oss_fixture(std::uint64_t seed);

// Qwen3-MoE-style BF16 model: H=64, I=32, 4 experts, top-2, softmax with renormalisation, two MoE
// layers, embeddings, lm_head, norms; two shards.
FixtureModel bf16_fixture(std::uint64_t seed);

}  // namespace fp4moe::test_util
