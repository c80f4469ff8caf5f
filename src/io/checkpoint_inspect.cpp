// inspect_model: what a checkpoint holds, and what looks wrong in it.
#include <algorithm>
#include <bit>
#include <cmath>
#include <set>

#include "common/fail.hpp"
#include "fp4moe/checkpoint.hpp"
#include "io/checkpoint_internal.hpp"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;
using io::MoeTensors;

class Inspector {
 public:
  Inspector(const ShardedSafetensors& model, ModelInfo& info) : model_(model), info_(info) {}

  template <typename... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) {
    info_.warnings.push_back(fmt::format(format, std::forward<Args>(args)...));
  }

  std::span<const std::uint8_t> bytes(const TensorInfo& t) const { return model_.file_of(t.name).data(t); }

  std::optional<float> scalar(const TensorInfo* t) const {
    if (t == nullptr || t->dtype != Dtype::kF32 || t->numel() != 1) return std::nullopt;
    return io::load_float(Dtype::kF32, bytes(*t).data(), 0);
  }

  MoeLayerInfo layer(const MoeTensors& m) {
    MoeLayerInfo l;
    l.layer = m.layer;
    l.prefix = m.prefix;
    l.layout = io::detect_layout(m).value_or(ExpertLayout::kUnquantized);
    if (const auto* r = m.router_tensor("gate", "weight")) l.router = r->name;
    if (const auto* r = m.router_tensor("router", "weight")) l.router = r->name;
    l.correction_bias = m.router_tensor("gate", "e_score_correction_bias") != nullptr;
    if (l.router.empty()) warn("{}: MoE block without a router weight ({}.gate.weight)", m.prefix, m.prefix);

    if (l.layout == ExpertLayout::kGptOssMxfp4) {
      const auto* b = m.fused_tensor("gate_up_proj_blocks");
      if (b->shape.size() == 4) {
        l.experts = b->shape[0];
        l.intermediate = b->shape[1] / 2;
        l.hidden = b->shape[2] * b->shape[3] * 2;
      }
      for (const char* s : {"gate_up_proj_scales", "gate_up_proj_bias", "down_proj_blocks",
                            "down_proj_scales", "down_proj_bias"}) {
        if (m.fused_tensor(s) == nullptr)
          warn("{}: gpt-oss layout without '{}.experts.{}'", m.prefix, m.prefix, s);
      }
      return l;
    }
    if (!m.fused.empty()) {
      l.experts = m.fused.begin()->second->shape.empty() ? 0 : m.fused.begin()->second->shape[0];
      return l;
    }
    std::set<std::int64_t> ids;
    for (const auto& [key, t] : m.experts) ids.insert(std::get<0>(key));
    l.experts = static_cast<std::int64_t>(ids.size());
    if (!ids.empty() && *ids.rbegin() != l.experts - 1) {
      warn("{}: expert ids are not 0..{}: the largest is {}", m.prefix, l.experts - 1, *ids.rbegin());
    }
    const bool quantized = l.layout != ExpertLayout::kUnquantized;
    const auto dims = [&](const TensorInfo* w, std::int64_t& rows, std::int64_t& cols) {
      if (w == nullptr || w->shape.size() != 2) return;
      rows = w->shape[0];
      cols = quantized ? w->shape[1] * 2 : w->shape[1];
    };
    const std::int64_t first = ids.empty() ? 0 : *ids.begin();
    dims(m.expert(first, "gate_proj", "weight"), l.intermediate, l.hidden);
    std::int64_t shared_h = 0;
    dims(m.shared_tensor("gate_proj", "weight"), l.shared_intermediate, shared_h);

    std::vector<std::string> suffixes{"weight"};
    if (quantized) suffixes.push_back("weight_scale");
    if (l.layout == ExpertLayout::kModelOptNvfp4) suffixes.push_back("weight_scale_2");
    std::int64_t missing = 0;
    std::string first_missing;
    for (const auto e : ids) {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        for (const auto& s : suffixes) {
          if (m.expert(e, proj, s) == nullptr && missing++ == 0) {
            first_missing = fmt::format("{}.experts.{}.{}.{}", m.prefix, e, proj, s);
          }
        }
        if (const auto* w = m.expert(e, proj, "weight")) {
          std::int64_t rows = 0, cols = 0;
          dims(w, rows, cols);
          const bool down = std::string_view(proj) == "down_proj";
          if (rows != (down ? l.hidden : l.intermediate) || cols != (down ? l.intermediate : l.hidden)) {
            warn("{}: '{}' has shape {}, unlike expert {} ([{}, {}] expected)", m.prefix, w->name,
                 w->shape_string(), first, down ? l.hidden : l.intermediate,
                 down ? l.intermediate : l.hidden);
          }
        }
      }
      check_gate_up(m, e);
    }
    if (missing > 0) warn("{}: {} expert tensors missing, the first '{}'", m.prefix, missing, first_missing);
    if (m.shared_tensor("gate_proj", "weight") != nullptr) check_gate_up(m, -1);
    return l;
  }

  // ModelOpt's rule: gate_proj and up_proj of one expert share weight_scale_2 and input_scale.
  void check_gate_up(const MoeTensors& m, std::int64_t e) {
    for (const char* suffix : {"weight_scale_2", "input_scale"}) {
      const auto* g = e >= 0 ? m.expert(e, "gate_proj", suffix) : m.shared_tensor("gate_proj", suffix);
      const auto* u = e >= 0 ? m.expert(e, "up_proj", suffix) : m.shared_tensor("up_proj", suffix);
      const auto gv = scalar(g), uv = scalar(u);
      if (gv && uv && std::bit_cast<std::uint32_t>(*gv) != std::bit_cast<std::uint32_t>(*uv)) {
        warn("{} {}: gate_proj {} = {} but up_proj {} = {} (ModelOpt exports share one)", m.prefix,
             e >= 0 ? fmt::format("expert {}", e) : std::string("shared expert"), suffix, *gv, suffix, *uv);
      }
    }
  }

  // NaN/Inf in floating-point tensors; NaN, zero or negative block scales; bad per-tensor scales.
  void scan(const TensorInfo& t) {
    const auto data = bytes(t);
    const std::string_view name = t.name;
    const bool e4m3_scale = t.dtype == Dtype::kF8E4M3 && name.ends_with("weight_scale");
    const bool ue8m0_scale = (t.dtype == Dtype::kU8 || t.dtype == Dtype::kF8E8M0) &&
                             (name.ends_with("weight_scale") || name.ends_with("_scales"));
    if (e4m3_scale || ue8m0_scale) {
      std::int64_t nan = 0, zero = 0, negative = 0, first_nan = -1, first_zero = -1;
      for (std::size_t i = 0; i < data.size(); ++i) {
        const std::uint8_t c = data[i];
        const bool is_nan = e4m3_scale ? (c & 0x7f) == 0x7f : c == 0xff;
        const bool is_zero = e4m3_scale && (c & 0x7f) == 0;
        if (is_nan && nan++ == 0) first_nan = static_cast<std::int64_t>(i);
        if (is_zero && zero++ == 0) first_zero = static_cast<std::int64_t>(i);
        if (e4m3_scale && !is_nan && !is_zero && (c & 0x80) != 0) ++negative;
      }
      if (nan > 0) warn("'{}': {} NaN block scales (the first at flat index {})", t.name, nan, first_nan);
      if (zero > 0) {
        warn(
            "'{}': {} zero block scales (the first at flat index {}; ModelOpt writes 1.0 for all-zero "
            "blocks)",
            t.name, zero, first_zero);
      }
      if (negative > 0) warn("'{}': {} negative block scales", t.name, negative);
      return;
    }
    if (name.ends_with("weight_scale_2") || name.ends_with("input_scale")) {
      const auto v = scalar(&t);
      if (!v) {
        warn("'{}' is {} {}, expected F32 []", t.name, dtype_name(t.dtype), t.shape_string());
      } else if (!std::isfinite(*v) || *v <= 0.0f) {
        warn("'{}' = {}: not a finite positive scale", t.name, *v);
      }
      return;
    }
    if (!io::is_float_dtype(t.dtype)) return;
    std::int64_t nan = 0, inf = 0, first = -1;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const float v = io::load_float(t.dtype, data.data(), i);
      if (std::isnan(v) && nan++ == 0 && first < 0) first = i;
      if (std::isinf(v) && inf++ == 0 && first < 0) first = i;
    }
    if (nan + inf > 0) {
      warn("'{}': {} NaN and {} Inf values (the first at flat index {})", t.name, nan, inf, first);
    }
  }

 private:
  const ShardedSafetensors& model_;
  ModelInfo& info_;
};

}  // namespace

ModelInfo inspect_model(const fs::path& path, const InspectOptions& options) {
  const auto model = ShardedSafetensors::open(path);
  ModelInfo info;
  info.path = path;
  for (const auto& f : model.files()) {
    info.files.push_back(f.path());
    for (const auto& t : f.tensors()) {
      info.tensors.push_back(t);
      info.tensor_bytes += t.bytes();
    }
  }
  std::sort(info.tensors.begin(), info.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  Inspector inspector(model, info);

  const fs::path dir = fs::is_directory(path) ? path : path.parent_path();
  const bool has_config = fs::is_regular_file(dir / "config.json");
  if (has_config) {
    info.quant = io::read_quant_config(dir);
    const auto config = io::read_config(dir);
    const auto& c = io::text_config(*config);
    info.model_type = c.contains("model_type") && c["model_type"].is_string()
                          ? c["model_type"].get<std::string>()
                          : std::string();
    try {
      info.desc = io::layer_desc_from_config(*config, info.quant, (dir / "config.json").string());
      info.desc->validate();
    } catch (const Error& e) {
      info.desc.reset();
      info.desc_error = e.what();
    }
  }

  for (const auto& [prefix, m] : io::index_moe_tensors(model)) {
    info.moe_layers.push_back(inspector.layer(m));
    const auto& l = info.moe_layers.back();
    if (info.desc && l.experts != info.desc->experts) {
      inspector.warn("{}: {} experts, config.json says {}", prefix, l.experts, info.desc->experts);
    }
    if (info.quant && info.quant->format && l.layout == ExpertLayout::kUnquantized &&
        info.quant->excluded_by(prefix + ".experts").empty()) {
      inspector.warn("{}: experts are unquantized but {} declares {} and does not exclude them", prefix,
                     info.quant->source, info.quant->algo);
    }
  }
  std::sort(info.moe_layers.begin(), info.moe_layers.end(),
            [](const MoeLayerInfo& a, const MoeLayerInfo& b) { return a.layer < b.layer; });

  // Modules the quantization config excludes must not hold quantized weights.
  if (info.quant) {
    for (const auto& t : info.tensors) {
      if (!t.name.ends_with(".weight_scale")) continue;
      const std::string module = t.name.substr(0, t.name.size() - 13);
      const std::string pattern = info.quant->excluded_by(module);
      if (!pattern.empty()) {
        inspector.warn("'{}' is quantized but {} excludes it ('{}')", module, info.quant->source, pattern);
      }
    }
  }
  if (options.scan_values) {
    for (const auto& t : info.tensors) inspector.scan(t);
  }
  return info;
}

}  // namespace fp4moe
