#include "io/model_fixtures.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>

#include "fp4moe/bf16.hpp"
#include "fp4moe/formats.hpp"

namespace fp4moe::test_util {

FixtureTensor bf16_tensor(std::vector<std::int64_t> shape, std::span<const float> values) {
  FixtureTensor t{Dtype::kBF16, std::move(shape), std::vector<std::uint8_t>(values.size() * 2)};
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint16_t b = Bf16::from_float(values[i]).bits;
    std::memcpy(t.bytes.data() + 2 * i, &b, 2);
  }
  return t;
}

FixtureTensor f32_tensor(std::vector<std::int64_t> shape, std::span<const float> values) {
  FixtureTensor t{Dtype::kF32, std::move(shape), std::vector<std::uint8_t>(values.size() * 4)};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 gen(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * (static_cast<float>(gen() >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  return v;
}

std::vector<float> fixture_floats(const FixtureTensor& t) {
  const std::size_t n = t.bytes.size() / (t.dtype == Dtype::kF32 ? 4 : 2);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (t.dtype == Dtype::kF32) {
      std::memcpy(&v[i], t.bytes.data() + 4 * i, 4);
    } else {
      std::uint16_t b;
      std::memcpy(&b, t.bytes.data() + 2 * i, 2);
      v[i] = Bf16::from_bits(b).to_float();
    }
  }
  return v;
}

void FixtureModel::write(const std::filesystem::path& dir) const {
  std::filesystem::create_directories(dir);
  const auto write_json = [&](const char* name, const nlohmann::json& j) {
    if (j.is_null()) return;
    std::ofstream(dir / name) << j.dump(2);
  };
  write_json("config.json", config);
  write_json("hf_quant_config.json", hf_quant_config);
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  const std::size_t per_shard =
      (names.size() + static_cast<std::size_t>(shards) - 1) / static_cast<std::size_t>(shards);
  nlohmann::json weight_map = nlohmann::json::object();
  for (int s = 0; s < shards; ++s) {
    const std::string file =
        shards == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
    SafetensorsWriter w;
    w.set_metadata("format", "pt");
    for (std::size_t i = s * per_shard; i < std::min(names.size(), (s + 1) * per_shard); ++i) {
      const auto& t = tensors.at(names[i]);
      w.add(names[i], t.dtype, t.shape, t.bytes);
      weight_map[names[i]] = file;
    }
    w.write(dir / file);
  }
  if (shards > 1)
    write_json("model.safetensors.index.json",
               {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}});
}

namespace {

void add_nvfp4(FixtureModel& m, const std::string& base, const QuantizedMatrix& q, float input_scale) {
  m.tensors[base + ".weight"] = {Dtype::kU8, {q.rows, q.cols / 2}, q.packed};
  m.tensors[base + ".weight_scale"] = {Dtype::kF8E4M3, {q.rows, q.cols / kNvfp4BlockSize}, q.scales};
  m.tensors[base + ".weight_scale_2"] = f32_tensor({}, std::span(&q.global_scale, 1));
  m.tensors[base + ".input_scale"] = f32_tensor({}, std::span(&input_scale, 1));
}

// gate/up/down of one expert in ModelOpt NVFP4, gate and up sharing weight_scale_2.
void add_nvfp4_expert(FixtureModel& m, const std::string& base, std::int64_t inter, std::uint64_t seed) {
  const auto g = random_floats(static_cast<std::size_t>(inter * kFixtureHidden), seed, 0.05f);
  const auto u = random_floats(static_cast<std::size_t>(inter * kFixtureHidden), seed + 1, 0.08f);
  const auto d = random_floats(static_cast<std::size_t>(inter * kFixtureHidden), seed + 2, 0.04f);
  std::vector<float> gu(g);
  gu.insert(gu.end(), u.begin(), u.end());
  const float shared = nvfp4_global_scale(gu);
  add_nvfp4(m, base + ".gate_proj", quantize_nvfp4(g, inter, kFixtureHidden, shared), 0.5f);
  add_nvfp4(m, base + ".up_proj", quantize_nvfp4(u, inter, kFixtureHidden, shared), 0.5f);
  add_nvfp4(m, base + ".down_proj", quantize_nvfp4(d, kFixtureHidden, inter), 0.25f);
}

void add_bf16_matrix(FixtureModel& m, const std::string& name, std::int64_t rows, std::int64_t cols,
                     std::uint64_t seed, float scale) {
  m.tensors[name] =
      bf16_tensor({rows, cols}, random_floats(static_cast<std::size_t>(rows * cols), seed, scale));
}

}  // namespace

FixtureModel modelopt_fixture(std::uint64_t seed) {
  FixtureModel m;
  m.shards = 2;
  m.config = {{"model_type", "deepseek_v3"},
              {"architectures", {"DeepseekV3ForCausalLM"}},
              {"hidden_size", kFixtureHidden},
              {"intermediate_size", 128},
              {"moe_intermediate_size", kFixtureInter},
              {"n_routed_experts", kFixtureExperts},
              {"num_experts_per_tok", 2},
              {"n_group", 2},
              {"topk_group", 1},
              {"routed_scaling_factor", 2.5},
              {"norm_topk_prob", true},
              {"n_shared_experts", 1},
              {"scoring_func", "sigmoid"},
              {"topk_method", "noaux_tc"},
              {"num_hidden_layers", 2}};
  m.hf_quant_config = {
      {"producer", {{"name", "modelopt"}, {"version", "0.29.0"}}},
      {"quantization",
       {{"quant_algo", "NVFP4"},
        {"kv_cache_quant_algo", nullptr},
        {"group_size", 16},
        {"exclude_modules", {"lm_head", "model.layers.0.mlp*", "model.layers.*.mlp.gate"}}}}};
  add_bf16_matrix(m, "model.embed_tokens.weight", 16, kFixtureHidden, seed, 1.0f);
  add_bf16_matrix(m, "lm_head.weight", 16, kFixtureHidden, seed + 1, 0.1f);
  const std::vector<float> ones(kFixtureHidden, 1.0f);
  m.tensors["model.norm.weight"] = bf16_tensor({kFixtureHidden}, ones);
  add_bf16_matrix(m, "model.layers.0.mlp.gate_proj.weight", 128, kFixtureHidden, seed + 2, 0.05f);
  add_bf16_matrix(m, "model.layers.0.mlp.up_proj.weight", 128, kFixtureHidden, seed + 3, 0.05f);
  add_bf16_matrix(m, "model.layers.0.mlp.down_proj.weight", kFixtureHidden, 128, seed + 4, 0.05f);
  for (std::int64_t e = 0; e < kFixtureExperts; ++e) {
    add_nvfp4_expert(m, fmt::format("model.layers.1.mlp.experts.{}", e), kFixtureInter, seed + 10 + 3 * e);
  }
  add_nvfp4_expert(m, "model.layers.1.mlp.shared_experts", kFixtureInter, seed + 50);
  add_bf16_matrix(m, "model.layers.1.mlp.gate.weight", kFixtureExperts, kFixtureHidden, seed + 60, 0.2f);
  m.tensors["model.layers.1.mlp.gate.e_score_correction_bias"] =
      f32_tensor({kFixtureExperts}, random_floats(kFixtureExperts, seed + 61, 0.1f));
  return m;
}

GptOssFixture gpt_oss_fixture(std::uint64_t seed) {
  constexpr std::int64_t h = kFixtureHidden, inter = kFixtureInter, e_count = kFixtureExperts;
  GptOssFixture f;
  FixtureModel& m = f.model;
  m.config = {
      {"model_type", "gpt_oss"},
      {"hidden_size", h},
      {"intermediate_size", inter},
      {"num_local_experts", e_count},
      {"num_experts_per_tok", 2},
      {"experts_per_token", 2},
      {"swiglu_limit", 7.0},
      {"quantization_config",
       {{"quant_method", "mxfp4"},
        {"modules_to_not_convert",
         {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}}}};
  std::vector<std::uint8_t> gu_blocks, gu_scales, dn_blocks, dn_scales;
  std::vector<float> gu_bias, dn_bias;
  for (std::int64_t e = 0; e < e_count; ++e) {
    ExpertWeights x;
    const auto s = seed + 10 * static_cast<std::uint64_t>(e);
    x.gate = quantize_mxfp4(random_floats(inter * h, s, 1.0f), inter, h);
    x.up = quantize_mxfp4(random_floats(inter * h, s + 1, 1.0f), inter, h);
    x.down = quantize_mxfp4(random_floats(inter * h, s + 2, 1.0f), h, inter);
    x.gate_bias = random_floats(inter, s + 3, 0.1f);
    x.up_bias = random_floats(inter, s + 4, 0.1f);
    x.down_bias = random_floats(h, s + 5, 0.1f);
    for (auto* b : {&x.gate_bias, &x.up_bias, &x.down_bias}) {
      for (auto& v : *b) v = round_to_bf16(v);  // stored as BF16
    }
    for (std::int64_t r = 0; r < inter; ++r) {
      for (const QuantizedMatrix* q : {&x.gate, &x.up}) {
        gu_blocks.insert(gu_blocks.end(), q->packed.begin() + r * h / 2, q->packed.begin() + (r + 1) * h / 2);
        gu_scales.insert(gu_scales.end(), q->scales.begin() + r * h / 32,
                         q->scales.begin() + (r + 1) * h / 32);
      }
      gu_bias.push_back(x.gate_bias[static_cast<std::size_t>(r)]);
      gu_bias.push_back(x.up_bias[static_cast<std::size_t>(r)]);
    }
    dn_blocks.insert(dn_blocks.end(), x.down.packed.begin(), x.down.packed.end());
    dn_scales.insert(dn_scales.end(), x.down.scales.begin(), x.down.scales.end());
    dn_bias.insert(dn_bias.end(), x.down_bias.begin(), x.down_bias.end());
    f.experts.push_back(std::move(x));
  }
  const std::string p = "model.layers.0.mlp.";
  m.tensors[p + "experts.gate_up_proj_blocks"] = {Dtype::kU8, {e_count, 2 * inter, h / 32, 16}, gu_blocks};
  m.tensors[p + "experts.gate_up_proj_scales"] = {Dtype::kU8, {e_count, 2 * inter, h / 32}, gu_scales};
  m.tensors[p + "experts.gate_up_proj_bias"] = bf16_tensor({e_count, 2 * inter}, gu_bias);
  m.tensors[p + "experts.down_proj_blocks"] = {Dtype::kU8, {e_count, h, inter / 32, 16}, dn_blocks};
  m.tensors[p + "experts.down_proj_scales"] = {Dtype::kU8, {e_count, h, inter / 32}, dn_scales};
  m.tensors[p + "experts.down_proj_bias"] = bf16_tensor({e_count, h}, dn_bias);
  add_bf16_matrix(m, p + "router.weight", e_count, h, seed + 100, 0.2f);
  m.tensors[p + "router.bias"] = bf16_tensor({e_count}, random_floats(e_count, seed + 101, 0.1f));
  return f;
}

FixtureModel bf16_fixture(std::uint64_t seed) {
  FixtureModel m;
  m.shards = 2;
  m.config = {{"model_type", "qwen3_moe"},      {"hidden_size", kFixtureHidden},
              {"intermediate_size", 128},       {"moe_intermediate_size", kFixtureInter},
              {"num_experts", kFixtureExperts}, {"num_experts_per_tok", 2},
              {"norm_topk_prob", true},         {"num_hidden_layers", 2}};
  add_bf16_matrix(m, "model.embed_tokens.weight", 16, kFixtureHidden, seed, 1.0f);
  add_bf16_matrix(m, "lm_head.weight", 16, kFixtureHidden, seed + 1, 0.1f);
  const std::vector<float> ones(kFixtureHidden, 1.0f);
  m.tensors["model.norm.weight"] = bf16_tensor({kFixtureHidden}, ones);
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    m.tensors[p + "input_layernorm.weight"] = bf16_tensor({kFixtureHidden}, ones);
    add_bf16_matrix(m, p + "self_attn.q_proj.weight", kFixtureHidden, kFixtureHidden, seed + 2 + layer,
                    0.05f);
    add_bf16_matrix(m, p + "mlp.gate.weight", kFixtureExperts, kFixtureHidden, seed + 4 + layer, 0.2f);
    for (std::int64_t e = 0; e < kFixtureExperts; ++e) {
      const std::uint64_t s =
          seed + 100 * static_cast<std::uint64_t>(layer + 1) + 10 * static_cast<std::uint64_t>(e);
      const std::string x = fmt::format("{}mlp.experts.{}.", p, e);
      add_bf16_matrix(m, x + "gate_proj.weight", kFixtureInter, kFixtureHidden, s, 0.05f);
      add_bf16_matrix(m, x + "up_proj.weight", kFixtureInter, kFixtureHidden, s + 1, 0.08f);
      add_bf16_matrix(m, x + "down_proj.weight", kFixtureHidden, kFixtureInter, s + 2, 0.04f);
    }
  }
  return m;
}

}  // namespace fp4moe::test_util
