// load_moe_layer: one MoE layer of a checkpoint as LayerDesc + LayerWeights.
#include <bit>
#include <cmath>
#include <cstring>
#include <set>

#include <fmt/ranges.h>

#include "common/fail.hpp"
#include "fp4moe/checkpoint.hpp"
#include "io/checkpoint_internal.hpp"
#include "io/parallel.hpp"

namespace fp4moe {
namespace io {

const TensorInfo* MoeTensors::expert(std::int64_t e, const std::string& proj,
                                     const std::string& suffix) const {
  const auto it = experts.find({e, proj, suffix});
  return it == experts.end() ? nullptr : it->second;
}
const TensorInfo* MoeTensors::shared_tensor(const std::string& proj, const std::string& suffix) const {
  const auto it = shared.find({proj, suffix});
  return it == shared.end() ? nullptr : it->second;
}
const TensorInfo* MoeTensors::fused_tensor(const std::string& suffix) const {
  const auto it = fused.find(suffix);
  return it == fused.end() ? nullptr : it->second;
}
const TensorInfo* MoeTensors::router_tensor(const std::string& which, const std::string& suffix) const {
  const auto it = router.find({which, suffix});
  return it == router.end() ? nullptr : it->second;
}

std::map<std::string, MoeTensors> index_moe_tensors(const ShardedSafetensors& model,
                                                    std::optional<std::int64_t> layer) {
  std::map<std::string, MoeTensors> out;
  for (const auto& name : model.names()) {
    const auto n = parse_moe_name(name);
    if (!n || (layer && n->layer != *layer)) continue;
    auto& m = out[n->prefix];
    m.layer = n->layer;
    m.prefix = n->prefix;
    const TensorInfo* t = model.find(name);
    switch (n->kind) {
      case MoeName::Kind::kExpert:
        m.experts[{n->expert, n->proj, n->suffix}] = t;
        break;
      case MoeName::Kind::kFused:
        m.fused[n->suffix] = t;
        break;
      case MoeName::Kind::kShared:
        m.shared[{n->proj, n->suffix}] = t;
        break;
      case MoeName::Kind::kRouter:
        m.router[{n->proj, n->suffix}] = t;
        break;
    }
  }
  // A dense MLP next to MoE layers has no experts; it is not a MoE block.
  std::erase_if(out, [](const auto& kv) { return !kv.second.has_experts(); });
  return out;
}

std::optional<ExpertLayout> detect_layout(const MoeTensors& m) {
  if (m.fused_tensor("gate_up_proj_blocks") != nullptr) return ExpertLayout::kGptOssMxfp4;
  if (!m.fused.empty()) return ExpertLayout::kUnquantized;
  const TensorInfo* weight = nullptr;
  const TensorInfo* scale = nullptr;
  for (const auto& [key, t] : m.experts) {
    const auto& suffix = std::get<2>(key);
    if (suffix == "weight" && weight == nullptr) weight = t;
    if (suffix == "weight_scale" && scale == nullptr) scale = t;
  }
  if (weight == nullptr) return std::nullopt;
  if (is_float_dtype(weight->dtype)) return ExpertLayout::kUnquantized;
  if (scale != nullptr && (scale->dtype == Dtype::kU8 || scale->dtype == Dtype::kF8E8M0)) {
    return ExpertLayout::kModelOptMxfp4;
  }
  return ExpertLayout::kModelOptNvfp4;
}

std::string layer_list(const std::map<std::string, MoeTensors>& blocks) {
  std::set<std::int64_t> layers;
  for (const auto& [prefix, m] : blocks) layers.insert(m.layer);
  std::string out;
  for (auto it = layers.begin(); it != layers.end();) {
    const std::int64_t first = *it;
    std::int64_t last = first;
    while (++it != layers.end() && *it == last + 1) ++last;
    if (!out.empty()) out += ", ";
    out += first == last ? fmt::format("{}", first) : fmt::format("{}-{}", first, last);
  }
  return out.empty() ? "none" : out;
}

}  // namespace io

namespace {

using io::MoeTensors;

class LayerLoader {
 public:
  LayerLoader(const ShardedSafetensors& model, const MoeTensors& tensors,
              const std::optional<QuantConfig>& quant)
      : model_(model), m_(tensors), quant_(quant), label_(io::model_label(model)) {}

  std::span<const std::uint8_t> bytes(const TensorInfo& t) const { return model_.file_of(t.name).data(t); }

  const TensorInfo& require_tensor(const TensorInfo* t, const std::string& name) const {
    if (t == nullptr) fail(Errc::kBadFile, "{}: layer {}: tensor '{}' is missing", label_, m_.layer, name);
    return *t;
  }

  // One matrix in the ModelOpt layout; e < 0 is the shared expert.
  QuantizedMatrix matrix(std::int64_t e, const std::string& proj, std::int64_t rows, std::int64_t cols,
                         WeightFormat format) const {
    const std::string base = e >= 0 ? fmt::format("{}.experts.{}.{}", m_.prefix, e, proj)
                                    : fmt::format("{}.shared_experts.{}", m_.prefix, proj);
    const auto get = [&](const std::string& suffix) -> const TensorInfo& {
      return require_tensor(e >= 0 ? m_.expert(e, proj, suffix) : m_.shared_tensor(proj, suffix),
                            base + "." + suffix);
    };
    const TensorInfo& w = get("weight");
    if (io::is_float_dtype(w.dtype)) fail_unquantized(w);
    const std::int64_t block = block_size(format);
    const std::array<std::int64_t, 2> packed_shape{rows, cols / 2};
    io::expect_tensor(model_, w, {Dtype::kU8}, packed_shape);
    const TensorInfo& s = get("weight_scale");
    const std::array<std::int64_t, 2> scale_shape{rows, cols / block};
    if (format == WeightFormat::kNvfp4) {
      io::expect_tensor(model_, s, {Dtype::kF8E4M3}, scale_shape);
    } else {
      io::expect_tensor(model_, s, {Dtype::kU8, Dtype::kF8E8M0}, scale_shape);
    }
    QuantizedMatrix q;
    q.format = format;
    q.rows = rows;
    q.cols = cols;
    const auto wb = bytes(w);
    q.packed.assign(wb.begin(), wb.end());
    const auto sb = bytes(s);
    q.scales.assign(sb.begin(), sb.end());
    for (std::size_t i = 0; i < q.scales.size(); ++i) {
      const std::uint8_t c = q.scales[i];
      const bool nan = format == WeightFormat::kNvfp4 ? (c & 0x7f) == 0x7f : c == 0xff;
      if (nan) {
        const auto sc = static_cast<std::size_t>(cols / block);
        fail(Errc::kBadFile, "{}: '{}' holds a NaN block scale (0x{:02x}) at [{}, {}]", label_, s.name, c,
             i / sc, i % sc);
      }
    }
    if (format == WeightFormat::kNvfp4) q.global_scale = scalar_f32(get("weight_scale_2"));
    return q;
  }

  // weight_scale_2 and input_scale: F32 [] (or [1], as some exporters write them), finite and > 0.
  float scalar_f32(const TensorInfo& t) const {
    if (t.dtype != Dtype::kF32 || !(t.shape.empty() || (t.shape.size() == 1 && t.shape[0] == 1))) {
      fail(Errc::kBadFile, "{}: tensor '{}' is {} {}, expected F32 []", label_, t.name, dtype_name(t.dtype),
           t.shape_string());
    }
    const float v = io::load_float(Dtype::kF32, bytes(t).data(), 0);
    if (!std::isfinite(v) || v <= 0.0f) {
      fail(Errc::kBadFile, "{}: '{}' = {} is not a finite positive scale", label_, t.name, v);
    }
    return v;
  }

  std::vector<float> floats(const TensorInfo& t, std::span<const std::int64_t> shape) const {
    io::expect_tensor(model_, t, {Dtype::kBF16, Dtype::kF16, Dtype::kF32}, shape);
    std::vector<float> out(static_cast<std::size_t>(t.numel()));
    io::to_float(t.dtype, bytes(t), 0, out);
    return out;
  }

  ExpertWeights modelopt_expert(std::int64_t e, const LayerDesc& d, std::int64_t intermediate) const {
    ExpertWeights x;
    x.gate = matrix(e, "gate_proj", intermediate, d.hidden, d.format);
    x.up = matrix(e, "up_proj", intermediate, d.hidden, d.format);
    x.down = matrix(e, "down_proj", d.hidden, intermediate, d.format);
    if (std::bit_cast<std::uint32_t>(x.gate.global_scale) !=
        std::bit_cast<std::uint32_t>(x.up.global_scale)) {
      const std::string who = e >= 0 ? fmt::format("expert {}", e) : std::string("shared expert");
      fail(Errc::kBadFile,
           "{}: layer {} {}: gate_proj weight_scale_2 = {} but up_proj weight_scale_2 = {}: "
           "ModelOpt exports share one (gate and up are one GEMM)",
           label_, m_.layer, who, x.gate.global_scale, x.up.global_scale);
    }
    return x;
  }

  // gpt-oss: expert e of the fused tensors, gate rows = even rows, up rows = odd rows.
  ExpertWeights gpt_oss_expert(std::int64_t e, const LayerDesc& d) const {
    const std::int64_t h = d.hidden, i_size = d.intermediate;
    const auto gu_blocks = bytes(*m_.fused_tensor("gate_up_proj_blocks"));
    const auto gu_scales = bytes(*m_.fused_tensor("gate_up_proj_scales"));
    const auto dn_blocks = bytes(*m_.fused_tensor("down_proj_blocks"));
    const auto dn_scales = bytes(*m_.fused_tensor("down_proj_scales"));
    const auto new_matrix = [](std::int64_t rows, std::int64_t cols) {
      QuantizedMatrix q;
      q.format = WeightFormat::kMxfp4;
      q.rows = rows;
      q.cols = cols;
      q.packed.resize(static_cast<std::size_t>(rows * cols / 2));
      q.scales.resize(static_cast<std::size_t>(rows * cols / kMxfp4BlockSize));
      return q;
    };
    ExpertWeights x;
    x.gate = new_matrix(i_size, h);
    x.up = new_matrix(i_size, h);
    x.down = new_matrix(h, i_size);
    const std::size_t row_bytes = static_cast<std::size_t>(h / 2),
                      row_scales = static_cast<std::size_t>(h / 32);
    for (std::int64_t r = 0; r < 2 * i_size; ++r) {
      QuantizedMatrix& dst = (r % 2 == 0) ? x.gate : x.up;
      const auto src_row = static_cast<std::size_t>(e * 2 * i_size + r);
      const auto dst_row = static_cast<std::size_t>(r / 2);
      std::memcpy(dst.packed.data() + dst_row * row_bytes, gu_blocks.data() + src_row * row_bytes, row_bytes);
      std::memcpy(dst.scales.data() + dst_row * row_scales, gu_scales.data() + src_row * row_scales,
                  row_scales);
    }
    const std::size_t down_bytes = x.down.packed.size(), down_scales = x.down.scales.size();
    std::memcpy(x.down.packed.data(), dn_blocks.data() + static_cast<std::size_t>(e) * down_bytes,
                down_bytes);
    std::memcpy(x.down.scales.data(), dn_scales.data() + static_cast<std::size_t>(e) * down_scales,
                down_scales);
    for (const auto* q : {&x.gate, &x.up, &x.down}) {
      const auto nan = std::find(q->scales.begin(), q->scales.end(), std::uint8_t{0xff});
      if (nan != q->scales.end()) {
        fail(Errc::kBadFile, "{}: layer {} expert {}: a NaN MXFP4 scale (0xff) in the {} scales", label_,
             m_.layer, e, q == &x.down ? "down_proj" : "gate_up_proj");
      }
    }
    const auto gu_bias = *m_.fused_tensor("gate_up_proj_bias");
    const auto dn_bias = *m_.fused_tensor("down_proj_bias");
    const auto gb = bytes(gu_bias);
    const auto db = bytes(dn_bias);
    x.gate_bias.resize(static_cast<std::size_t>(i_size));
    x.up_bias.resize(static_cast<std::size_t>(i_size));
    for (std::int64_t r = 0; r < i_size; ++r) {
      x.gate_bias[static_cast<std::size_t>(r)] =
          io::load_float(gu_bias.dtype, gb.data(), e * 2 * i_size + 2 * r);
      x.up_bias[static_cast<std::size_t>(r)] =
          io::load_float(gu_bias.dtype, gb.data(), e * 2 * i_size + 2 * r + 1);
    }
    x.down_bias.resize(static_cast<std::size_t>(h));
    io::to_float(dn_bias.dtype, db, e * h, x.down_bias);
    return x;
  }

  void check_gpt_oss_shapes(const LayerDesc& d) const {
    const std::int64_t e = d.experts, h = d.hidden, i = d.intermediate;
    const auto get = [&](const std::string& suffix) -> const TensorInfo& {
      return require_tensor(m_.fused_tensor(suffix), m_.prefix + ".experts." + suffix);
    };
    const std::array<std::int64_t, 4> gub{e, 2 * i, h / 32, 16};
    const std::array<std::int64_t, 3> gus{e, 2 * i, h / 32};
    const std::array<std::int64_t, 2> gubias{e, 2 * i};
    const std::array<std::int64_t, 4> db{e, h, i / 32, 16};
    const std::array<std::int64_t, 3> ds{e, h, i / 32};
    const std::array<std::int64_t, 2> dbias{e, h};
    io::expect_tensor(model_, get("gate_up_proj_blocks"), {Dtype::kU8}, gub);
    io::expect_tensor(model_, get("gate_up_proj_scales"), {Dtype::kU8, Dtype::kF8E8M0}, gus);
    io::expect_tensor(model_, get("gate_up_proj_bias"), {Dtype::kBF16, Dtype::kF16, Dtype::kF32}, gubias);
    io::expect_tensor(model_, get("down_proj_blocks"), {Dtype::kU8}, db);
    io::expect_tensor(model_, get("down_proj_scales"), {Dtype::kU8, Dtype::kF8E8M0}, ds);
    io::expect_tensor(model_, get("down_proj_bias"), {Dtype::kBF16, Dtype::kF16, Dtype::kF32}, dbias);
  }

  [[noreturn]] void fail_unquantized(const TensorInfo& t) const {
    const std::string module = t.name.substr(0, t.name.rfind('.'));
    const std::string pattern = quant_ ? quant_->excluded_by(module) : "";
    fail(Errc::kBadFile,
         "{}: layer {}: '{}' is {}, not quantized{}: fp4moe runs NVFP4 or MXFP4 experts "
         "(fp4moe quantize makes them)",
         label_, m_.layer, t.name, dtype_name(t.dtype),
         pattern.empty() ? "" : fmt::format(" (excluded by '{}' in {})", pattern, quant_->source));
  }

 private:
  const ShardedSafetensors& model_;
  const MoeTensors& m_;
  const std::optional<QuantConfig>& quant_;
  std::string label_;
};

}  // namespace

LayerDesc read_layer_desc(const std::filesystem::path& model_dir) {
  const auto config = io::read_config(model_dir);
  if (!config) {
    fail(Errc::kBadFile, "{}: no config.json (the layer's sizes and router come from it)",
         model_dir.string());
  }
  return io::layer_desc_from_config(*config, io::read_quant_config(model_dir),
                                    (model_dir / "config.json").string());
}

LayerWeights load_moe_layer(const std::filesystem::path& model_dir, std::int64_t layer) {
  LayerDesc d = read_layer_desc(model_dir);
  const auto quant = io::read_quant_config(model_dir);
  const auto model = ShardedSafetensors::open(model_dir);
  const std::string label = io::model_label(model);
  const auto blocks = io::index_moe_tensors(model, layer);
  if (blocks.empty()) {
    fail(Errc::kInvalidArgument, "{}: layer {} has no MoE experts (MoE layers: {})", label, layer,
         io::layer_list(io::index_moe_tensors(model)));
  }
  if (blocks.size() > 1) {
    std::vector<std::string> prefixes;
    for (const auto& [p, m] : blocks) prefixes.push_back(p);
    fail(Errc::kBadFile, "{}: layer {} is ambiguous: MoE blocks {}", label, layer, fmt::join(prefixes, ", "));
  }
  const MoeTensors& m = blocks.begin()->second;
  const auto detected = io::detect_layout(m);
  if (!detected) fail(Errc::kBadFile, "{}: layer {} has expert tensors but no expert .weight", label, layer);
  const ExpertLayout layout = *detected;
  LayerLoader loader(model, m, quant);
  if (layout == ExpertLayout::kUnquantized) {
    loader.fail_unquantized(!m.fused.empty() ? *m.fused.begin()->second : *m.experts.begin()->second);
  }

  const WeightFormat format =
      layout == ExpertLayout::kModelOptNvfp4 ? WeightFormat::kNvfp4 : WeightFormat::kMxfp4;
  if (quant && quant->format && *quant->format != format) {
    fail(Errc::kBadFile, "{}: {} declares {} but layer {} holds {} experts", label, quant->source,
         quant->algo, layer, expert_layout_name(layout));
  }
  d.format = format;
  if ((layout == ExpertLayout::kGptOssMxfp4) != d.expert_bias) {
    fail(Errc::kBadFile,
         "{}: layer {} holds {} experts but config.json describes {} (model_type decides the layout)", label,
         layer, expert_layout_name(layout), d.expert_bias ? "gpt-oss" : "a ModelOpt-layout model");
  }

  // The shared expert: present in the tensors iff config.json says so, with its size.
  const TensorInfo* shared_gate = m.shared_tensor("gate_proj", "weight");
  if (shared_gate != nullptr && d.shared_intermediate == 0) {
    fail(Errc::kBadFile, "{}: layer {} has a shared expert ('{}') but config.json has no n_shared_experts",
         label, layer, shared_gate->name);
  }
  if (shared_gate == nullptr && d.shared_intermediate > 0) {
    fail(Errc::kBadFile,
         "{}: config.json has n_shared_experts (shared intermediate {}) but layer {} has no "
         "'{}.shared_experts.gate_proj.weight'",
         label, d.shared_intermediate, layer, m.prefix);
  }
  d.validate();

  LayerWeights w;
  w.desc = d;
  w.experts.resize(static_cast<std::size_t>(d.experts));
  if (layout == ExpertLayout::kGptOssMxfp4) {
    loader.check_gpt_oss_shapes(d);
    io::parallel_for(d.experts, io::thread_count(0), [&](std::int64_t e) {
      w.experts[static_cast<std::size_t>(e)] = loader.gpt_oss_expert(e, d);
    });
  } else {
    for (const auto& [key, t] : m.experts) {
      if (std::get<0>(key) >= d.experts) {
        fail(Errc::kBadFile, "{}: tensor '{}' is expert {} but config.json says {} routed experts", label,
             t->name, std::get<0>(key), d.experts);
      }
    }
    io::parallel_for(d.experts, io::thread_count(0), [&](std::int64_t e) {
      w.experts[static_cast<std::size_t>(e)] = loader.modelopt_expert(e, d, d.intermediate);
    });
  }
  if (d.shared_intermediate > 0) w.shared = loader.modelopt_expert(-1, d, d.shared_intermediate);

  // The router: gate.weight [E, H] (ModelOpt layouts; quantized only if not excluded) or
  // router.weight + router.bias (gpt-oss); the sigmoid router's correction bias.
  const std::array<std::int64_t, 2> router_shape{d.experts, d.hidden};
  const std::array<std::int64_t, 1> expert_vec{d.experts};
  const std::string which = layout == ExpertLayout::kGptOssMxfp4 ? "router" : "gate";
  const TensorInfo& rw =
      loader.require_tensor(m.router_tensor(which, "weight"), m.prefix + "." + which + ".weight");
  if (rw.dtype == Dtype::kU8) {
    QuantizedMatrix q;
    q.format = WeightFormat::kNvfp4;
    q.rows = d.experts;
    q.cols = d.hidden;
    const auto* s = m.router_tensor(which, "weight_scale");
    const auto* s2 = m.router_tensor(which, "weight_scale_2");
    const std::array<std::int64_t, 2> packed{d.experts, d.hidden / 2};
    const std::array<std::int64_t, 2> scales{d.experts, d.hidden / kNvfp4BlockSize};
    io::expect_tensor(model, rw, {Dtype::kU8}, packed);
    io::expect_tensor(model, loader.require_tensor(s, m.prefix + "." + which + ".weight_scale"),
                      {Dtype::kF8E4M3}, scales);
    const auto packed_bytes = loader.bytes(rw), scale_bytes = loader.bytes(*s);
    q.packed.assign(packed_bytes.begin(), packed_bytes.end());
    q.scales.assign(scale_bytes.begin(), scale_bytes.end());
    q.global_scale = loader.scalar_f32(loader.require_tensor(s2, m.prefix + "." + which + ".weight_scale_2"));
    w.router_weight = dequantize(q);
  } else {
    w.router_weight = loader.floats(rw, router_shape);
  }
  if (const auto* rb = m.router_tensor(which, "bias")) w.router_logit_bias = loader.floats(*rb, expert_vec);
  const auto* cb = m.router_tensor("gate", "e_score_correction_bias");
  if (d.router == RouterKind::kSigmoidGroupTopK) {
    w.correction_bias =
        loader.floats(loader.require_tensor(cb, m.prefix + ".gate.e_score_correction_bias"), expert_vec);
  } else if (cb != nullptr) {
    fail(Errc::kBadFile,
         "{}: '{}' is a correction bias, which only the sigmoid router uses, but config.json "
         "describes a {} router",
         label, cb->name, router_name(d.router));
  }
  w.validate();
  return w;
}

}  // namespace fp4moe
