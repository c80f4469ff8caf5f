// config.json, hf_quant_config.json and the tensor-name grammar of MoE checkpoints.
#include <algorithm>
#include <bit>
#include <cctype>
#include <cstring>

#include <fmt/ranges.h>

#include "common/fail.hpp"
#include "io/checkpoint_internal.hpp"
#include "io/file_util.hpp"

namespace fp4moe {

std::string_view expert_layout_name(ExpertLayout layout) noexcept {
  switch (layout) {
    case ExpertLayout::kModelOptNvfp4:
      return "modelopt-nvfp4";
    case ExpertLayout::kModelOptMxfp4:
      return "modelopt-mxfp4";
    case ExpertLayout::kGptOssMxfp4:
      return "gpt-oss-mxfp4";
    case ExpertLayout::kUnquantized:
      return "unquantized";
  }
  return "?";
}

std::string QuantConfig::excluded_by(std::string_view module) const {
  for (const auto& p : exclude_modules) {
    if (io::wildcard_match(p, module)) return p;
  }
  return "";
}

namespace io {
namespace {

using json = nlohmann::json;

bool all_digits(std::string_view s) {
  return !s.empty() && s.size() <= 9 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::int64_t to_int(std::string_view s) {
  std::int64_t v = 0;
  for (const char c : s) v = v * 10 + (c - '0');
  return v;
}

std::optional<std::string> normalise_proj(std::string_view p) {
  if (p == "gate_proj" || p == "w1") return "gate_proj";
  if (p == "up_proj" || p == "w3") return "up_proj";
  if (p == "down_proj" || p == "w2") return "down_proj";
  return std::nullopt;
}

json parse_json_file(const std::filesystem::path& path) {
  const std::string text = read_small_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(Errc::kBadFile, "{}: not valid JSON: {}", path.string(), e.what());
  }
}

// The integer field `key` of `j` when present; throws naming it when it is not a positive integer.
std::optional<std::int64_t> int_field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& v = j[key];
  if (!v.is_number_integer() || v.get<std::int64_t>() < 0) {
    fail(Errc::kBadFile, "{}: \"{}\" is {}, expected a non-negative integer", where, key, v.dump());
  }
  return v.get<std::int64_t>();
}

std::optional<double> number_field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number())
    fail(Errc::kBadFile, "{}: \"{}\" is {}, expected a number", where, key, j[key].dump());
  return j[key].get<double>();
}

std::optional<bool> bool_field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_boolean())
    fail(Errc::kBadFile, "{}: \"{}\" is {}, expected true or false", where, key, j[key].dump());
  return j[key].get<bool>();
}

std::string string_field(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

std::int64_t first_int(const json& j, std::initializer_list<const char*> keys, const std::string& where) {
  for (const char* k : keys) {
    if (const auto v = int_field(j, k, where)) return *v;
  }
  std::string names;
  for (const char* k : keys) names += fmt::format("{}\"{}\"", names.empty() ? "" : " or ", k);
  fail(Errc::kBadFile, "{}: no {} (needed for the MoE layer)", where, names);
}

std::optional<WeightFormat> format_of_algo(std::string algo) {
  std::transform(algo.begin(), algo.end(), algo.begin(), [](unsigned char c) { return std::toupper(c); });
  if (algo == "NVFP4") return WeightFormat::kNvfp4;
  if (algo == "MXFP4") return WeightFormat::kMxfp4;
  return std::nullopt;
}

std::vector<std::string> string_list(const json& j, const char* key, const std::string& where) {
  std::vector<std::string> out;
  if (!j.contains(key) || j[key].is_null()) return out;
  if (!j[key].is_array())
    fail(Errc::kBadFile, "{}: \"{}\" is {}, expected a list of names", where, key, j[key].dump());
  for (const auto& v : j[key]) {
    if (!v.is_string()) fail(Errc::kBadFile, "{}: \"{}\" holds {}, expected strings", where, key, v.dump());
    out.push_back(v.get<std::string>());
  }
  return out;
}

constexpr std::string_view kSigmoidModels[] = {"deepseek_v3", "deepseek_v32", "glm4_moe", "kimi_k2"};
constexpr std::string_view kSoftmaxModels[] = {"qwen3_moe", "mixtral", "olmoe"};

}  // namespace

std::optional<MoeName> parse_moe_name(std::string_view name) {
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const auto dot = name.find('.', start);
    parts.push_back(name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  for (std::size_t i = 0; i + 3 < parts.size(); ++i) {
    if (parts[i] != "layers" || !all_digits(parts[i + 1])) continue;
    if (parts[i + 2] != "mlp" && parts[i + 2] != "block_sparse_moe") continue;
    MoeName n;
    n.layer = to_int(parts[i + 1]);
    n.prefix = std::string(
        name.substr(0, static_cast<std::size_t>(parts[i + 2].data() - name.data()) + parts[i + 2].size()));
    const auto rest = std::span(parts).subspan(i + 3);
    if (rest.size() == 4 && rest[0] == "experts" && all_digits(rest[1])) {
      const auto proj = normalise_proj(rest[2]);
      if (!proj) return std::nullopt;
      n.kind = MoeName::Kind::kExpert;
      n.expert = to_int(rest[1]);
      n.proj = *proj;
      n.suffix = rest[3];
      return n;
    }
    if (rest.size() == 2 && rest[0] == "experts") {
      n.kind = MoeName::Kind::kFused;
      n.suffix = rest[1];
      return n;
    }
    if (rest.size() == 3 && rest[0] == "shared_experts") {
      const auto proj = normalise_proj(rest[1]);
      if (!proj) return std::nullopt;
      n.kind = MoeName::Kind::kShared;
      n.proj = *proj;
      n.suffix = rest[2];
      return n;
    }
    if (rest.size() == 2 && (rest[0] == "gate" || rest[0] == "router")) {
      n.kind = MoeName::Kind::kRouter;
      n.proj = rest[0];
      n.suffix = rest[1];
      return n;
    }
    return std::nullopt;
  }
  return std::nullopt;
}

bool wildcard_match(std::string_view pattern, std::string_view text) {
  // Greedy with one backtrack point (the last '*'): linear in practice, never exponential.
  std::size_t p = 0, t = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::optional<nlohmann::json> read_config(const std::filesystem::path& dir) {
  const auto path = dir / "config.json";
  if (!std::filesystem::is_regular_file(path)) return std::nullopt;
  json j = parse_json_file(path);
  if (!j.is_object()) fail(Errc::kBadFile, "{}: expected a JSON object", path.string());
  return j;
}

const nlohmann::json& text_config(const nlohmann::json& config) {
  if (!config.contains("hidden_size") && config.contains("text_config") &&
      config["text_config"].is_object()) {
    return config["text_config"];
  }
  return config;
}

std::optional<QuantConfig> read_quant_config(const std::filesystem::path& dir) {
  QuantConfig q;
  const auto hf = dir / "hf_quant_config.json";
  if (std::filesystem::is_regular_file(hf)) {
    const json j = parse_json_file(hf);
    const std::string where = hf.string();
    if (!j.is_object() || !j.contains("quantization") || !j["quantization"].is_object()) {
      fail(Errc::kBadFile, "{}: expected an object with a \"quantization\" object", where);
    }
    const json& qj = j["quantization"];
    q.source = "hf_quant_config.json";
    q.algo = string_field(qj, "quant_algo");
    q.group_size = static_cast<int>(int_field(qj, "group_size", where).value_or(0));
    q.exclude_modules = string_list(qj, "exclude_modules", where);
    if (j.contains("producer") && j["producer"].is_object()) {
      q.producer = string_field(j["producer"], "name");
      const auto version = string_field(j["producer"], "version");
      if (!version.empty()) q.producer += " " + version;
    }
  } else {
    const auto config = read_config(dir);
    if (!config || !config->contains("quantization_config")) return std::nullopt;
    const json& qj = (*config)["quantization_config"];
    const std::string where = (dir / "config.json").string() + " quantization_config";
    if (!qj.is_object()) fail(Errc::kBadFile, "{}: expected an object, got {}", where, qj.dump());
    q.source = "config.json quantization_config";
    q.algo = string_field(qj, "quant_algo");
    if (q.algo.empty()) q.algo = string_field(qj, "quant_method");
    q.producer = string_field(qj, "quant_method");
    q.group_size = static_cast<int>(int_field(qj, "group_size", where).value_or(0));
    for (const char* key : {"exclude_modules", "ignore", "modules_to_not_convert"}) {
      const auto more = string_list(qj, key, where);
      q.exclude_modules.insert(q.exclude_modules.end(), more.begin(), more.end());
    }
  }
  q.format = format_of_algo(q.algo);
  return q;
}

LayerDesc layer_desc_from_config(const nlohmann::json& config, const std::optional<QuantConfig>& quant,
                                 const std::string& where) {
  const json& c = text_config(config);
  const std::string model_type = string_field(c, "model_type").empty() ? string_field(config, "model_type")
                                                                       : string_field(c, "model_type");
  LayerDesc d;
  d.hidden = first_int(c, {"hidden_size"}, where);
  d.intermediate = first_int(c, {"moe_intermediate_size", "intermediate_size"}, where);
  d.experts = first_int(c, {"n_routed_experts", "num_experts", "num_local_experts"}, where);
  d.top_k = first_int(c, {"num_experts_per_tok", "experts_per_token"}, where);
  d.n_group = int_field(c, "n_group", where).value_or(1);
  d.topk_group = int_field(c, "topk_group", where).value_or(1);
  d.routed_scaling_factor = static_cast<float>(number_field(c, "routed_scaling_factor", where).value_or(1.0));
  d.shared_intermediate = int_field(c, "n_shared_experts", where).value_or(0) * d.intermediate;
  d.format = quant && quant->format ? *quant->format : WeightFormat::kNvfp4;

  const std::string scoring = string_field(c, "scoring_func");
  const std::string topk_method = string_field(c, "topk_method");
  const auto in = [&](std::span<const std::string_view> list) {
    return std::find(list.begin(), list.end(), model_type) != list.end();
  };
  if (topk_method == "group_limited_greedy") {
    fail(Errc::kUnsupported,
         "{}: topk_method \"group_limited_greedy\" (DeepSeek-V2 routing) is not supported", where);
  }
  if (model_type == "gpt_oss") {
    d.router = RouterKind::kTopKSoftmax;
    d.activation = Activation::kSwiGLUClamped;
    d.swiglu_alpha = 1.702f;
    d.swiglu_limit = static_cast<float>(number_field(c, "swiglu_limit", where).value_or(7.0));
    d.expert_bias = true;
    d.renormalize = true;
  } else if (scoring == "sigmoid" || topk_method == "noaux_tc" || in(kSigmoidModels)) {
    d.router = RouterKind::kSigmoidGroupTopK;
    d.renormalize = bool_field(c, "norm_topk_prob", where).value_or(true);
  } else if (scoring == "softmax" || in(kSoftmaxModels)) {
    d.router = RouterKind::kSoftmaxTopK;
    // Mixtral always renormalises its top-2; Qwen3's config class defaults to false.
    d.renormalize = bool_field(c, "norm_topk_prob", where).value_or(model_type == "mixtral");
  } else {
    fail(
        Errc::kUnsupported,
        "{}: model_type \"{}\" with scoring_func \"{}\": unknown router (known model types: gpt_oss, {}, {})",
        where, model_type, scoring, fmt::join(kSigmoidModels, ", "), fmt::join(kSoftmaxModels, ", "));
  }
  return d;
}

bool is_float_dtype(Dtype dtype) noexcept {
  return dtype == Dtype::kBF16 || dtype == Dtype::kF16 || dtype == Dtype::kF32;
}

namespace {

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

}  // namespace

float load_float(Dtype dtype, const std::uint8_t* data, std::int64_t i) noexcept {
  switch (dtype) {
    case Dtype::kBF16: {
      std::uint16_t b;
      std::memcpy(&b, data + 2 * i, 2);
      return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
    }
    case Dtype::kF16: {
      std::uint16_t b;
      std::memcpy(&b, data + 2 * i, 2);
      return half_to_float(b);
    }
    case Dtype::kF32: {
      float f;
      std::memcpy(&f, data + 4 * i, 4);
      return f;
    }
    default:
      return 0.0f;
  }
}

void to_float(Dtype dtype, std::span<const std::uint8_t> data, std::int64_t begin, std::span<float> out) {
  for (std::size_t j = 0; j < out.size(); ++j)
    out[j] = load_float(dtype, data.data(), begin + static_cast<std::int64_t>(j));
}

void expect_tensor(const ShardedSafetensors& model, const TensorInfo& t, std::initializer_list<Dtype> dtypes,
                   std::span<const std::int64_t> shape) {
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
    std::vector<std::string_view> names;
    for (const auto d : dtypes) names.push_back(dtype_name(d));
    fail(Errc::kBadFile, "{}: tensor '{}' is {}, expected {}", model_label(model), t.name,
         dtype_name(t.dtype), fmt::join(names, " or "));
  }
  if (!std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end())) {
    fail(Errc::kBadFile, "{}: tensor '{}' has shape {}, expected [{}]", model_label(model), t.name,
         t.shape_string(), fmt::join(shape, ", "));
  }
}

std::string model_label(const ShardedSafetensors& model) {
  if (model.index_path()) return model.index_path()->parent_path().string();
  return model.files().front().path().string();
}

}  // namespace io
}  // namespace fp4moe
