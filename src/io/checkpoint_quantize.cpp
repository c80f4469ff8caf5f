// quantize_checkpoint: BF16/F16/F32 weights -> the ModelOpt NVFP4 (or MXFP4) checkpoint layout.
//
// Each output file is declared tensor by tensor and then written in one pass; a quantized
// weight is produced when the writer reaches it, in row chunks quantized in parallel (blocks
// run along rows, so chunks give the same bytes as the whole matrix at once). Memory: one
// tensor's outputs plus one float chunk per thread.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "common/fail.hpp"
#include "fp4moe/checkpoint.hpp"
#include "fp4moe/version.hpp"
#include "io/checkpoint_internal.hpp"
#include "io/file_util.hpp"
#include "io/parallel.hpp"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::string_view kIndexName = "model.safetensors.index.json";
// About 1M elements per chunk: 4 MB of floats per thread.
constexpr std::int64_t kChunkElements = 1 << 20;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Weights and tensors the tool refuses to copy around as "other files" of a model directory.
bool is_weight_file(const fs::path& p) {
  const auto ext = p.extension().string();
  return ext == ".safetensors" || ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".gguf" ||
         ends_with(p.filename().string(), ".index.json") || p.filename() == "hf_quant_config.json";
}

struct Quantizer {
  const ShardedSafetensors& model;
  WeightFormat format;
  int threads;
  std::map<std::string, std::vector<std::string>> groups;  // weight name -> names sharing its weight_scale_2
  std::map<std::string, float> global_scales;
  // The scales of the last matrix quantized, kept for its weight_scale tensor (written next).
  std::string cached_name;
  std::vector<std::uint8_t> cached_scales;

  std::int64_t chunk_rows(std::int64_t cols) const {
    return std::max<std::int64_t>(1, kChunkElements / cols);
  }

  // max |x| over a tensor; throws naming the first non-finite element.
  float amax(const TensorInfo& t) {
    const auto data = model.file_of(t.name).data(t);
    const std::int64_t rows = t.shape[0], cols = t.shape[1], step = chunk_rows(cols);
    const std::int64_t chunks = (rows + step - 1) / step;
    std::vector<float> chunk_max(static_cast<std::size_t>(chunks), 0.0f);
    std::vector<std::int64_t> bad(static_cast<std::size_t>(chunks), -1);
    io::parallel_for(chunks, threads, [&](std::int64_t c) {
      const std::int64_t begin = c * step * cols, end = std::min(rows, (c + 1) * step) * cols;
      float m = 0.0f;
      for (std::int64_t i = begin; i < end; ++i) {
        const float v = io::load_float(t.dtype, data.data(), i);
        if (!std::isfinite(v)) {
          bad[static_cast<std::size_t>(c)] = i;
          return;
        }
        m = std::max(m, std::fabs(v));
      }
      chunk_max[static_cast<std::size_t>(c)] = m;
    });
    for (const auto i : bad) {
      if (i >= 0) {
        fail(Errc::kInvalidArgument,
             "tensor '{}' element [{}, {}] is {}: only finite weights can be quantized", t.name, i / cols,
             i % cols, io::load_float(t.dtype, data.data(), i));
      }
    }
    return *std::max_element(chunk_max.begin(), chunk_max.end());
  }

  // weight_scale_2 of a weight, shared by its group (gate_proj + up_proj): from the larger amax.
  float global_scale(const std::string& name) {
    if (const auto it = global_scales.find(name); it != global_scales.end()) return it->second;
    float m = 0.0f;
    for (const auto& member : groups.at(name)) m = std::max(m, amax(model.tensor(member)));
    // The single-element span makes nvfp4_global_scale see exactly this amax, so the shared
    // scale follows the one definition of weight_scale_2 (zero rule included).
    const float g = nvfp4_global_scale(std::span<const float>(&m, 1));
    for (const auto& member : groups.at(name)) global_scales[member] = g;
    return g;
  }

  // Quantizes weight `name` into `packed` (its X.weight bytes) and keeps its scales.
  void quantize(const std::string& name, std::span<std::uint8_t> packed) {
    const TensorInfo& t = model.tensor(name);
    const auto data = model.file_of(name).data(t);
    const std::int64_t rows = t.shape[0], cols = t.shape[1], step = chunk_rows(cols);
    const std::int64_t block = block_size(format), chunks = (rows + step - 1) / step;
    const std::optional<float> g =
        format == WeightFormat::kNvfp4 ? std::optional<float>(global_scale(name)) : std::nullopt;
    std::vector<std::uint8_t> scales(static_cast<std::size_t>(rows * (cols / block)));
    io::parallel_for(chunks, threads, [&](std::int64_t c) {
      const std::int64_t r0 = c * step, r1 = std::min(rows, r0 + step);
      std::vector<float> x(static_cast<std::size_t>((r1 - r0) * cols));
      io::to_float(t.dtype, data, r0 * cols, x);
      QuantizedMatrix q;
      try {
        q = format == WeightFormat::kNvfp4 ? quantize_nvfp4(x, r1 - r0, cols, g)
                                           : quantize_mxfp4(x, r1 - r0, cols);
      } catch (const Error& e) {
        fail(e.code(), "tensor '{}' rows {}..{}: {}", name, r0, r1 - 1, e.what());
      }
      std::memcpy(packed.data() + r0 * cols / 2, q.packed.data(), q.packed.size());
      std::memcpy(scales.data() + r0 * (cols / block), q.scales.data(), q.scales.size());
    });
    cached_name = name;
    cached_scales = std::move(scales);
  }

  void scales(const std::string& name, std::span<std::uint8_t> out) {
    if (cached_name != name) {
      const TensorInfo& t = model.tensor(name);
      std::vector<std::uint8_t> scratch(static_cast<std::size_t>(t.shape[0] * t.shape[1] / 2));
      quantize(name, scratch);
    }
    std::memcpy(out.data(), cached_scales.data(), out.size());
  }
};

struct Plan {
  std::set<std::string> quantize;         // weight names to quantize
  std::vector<std::string> kept_modules;  // 2-D float .weight modules left unquantized
  std::int64_t excluded = 0;
  std::int64_t not_block_multiple = 0;
};

Plan make_plan(const ShardedSafetensors& model, const QuantizeOptions& options,
               std::map<std::string, std::vector<std::string>>& groups) {
  std::vector<std::pair<std::string, std::regex>> excludes;
  std::vector<std::string> patterns{std::string(kDefaultQuantizeExclude)};
  patterns.insert(patterns.end(), options.exclude.begin(), options.exclude.end());
  for (const auto& p : patterns) {
    try {
      excludes.emplace_back(p, std::regex(p, std::regex::ECMAScript));
    } catch (const std::regex_error& e) {
      fail(Errc::kInvalidArgument, "exclude '{}' is not a valid regular expression: {}", p, e.what());
    }
  }
  const std::int64_t block = block_size(options.format);
  Plan plan;
  for (const auto& name : model.names()) {
    const TensorInfo& t = model.tensor(name);
    if (t.shape.size() != 2 || !io::is_float_dtype(t.dtype) || !ends_with(name, ".weight")) continue;
    const std::string module = name.substr(0, name.size() - 7);
    if (t.shape[0] == 0 || t.shape[1] == 0 || t.shape[1] % block != 0) {
      ++plan.not_block_multiple;
      plan.kept_modules.push_back(module);
      continue;
    }
    const bool excluded = std::any_of(excludes.begin(), excludes.end(),
                                      [&](const auto& re) { return std::regex_search(name, re.second); });
    if (excluded) {
      ++plan.excluded;
      plan.kept_modules.push_back(module);
      continue;
    }
    for (const char* suffix : {"_scale", "_scale_2"}) {
      if (model.find(name + suffix) != nullptr) {
        fail(Errc::kInvalidArgument, "{}: '{}' is {} but '{}{}' exists already: is this model quantized?",
             io::model_label(model), name, dtype_name(t.dtype), name, suffix);
      }
    }
    plan.quantize.insert(name);
  }
  // gate_proj (Mixtral: w1) and up_proj (w3) of one module share weight_scale_2, as ModelOpt exports.
  for (const auto& name : plan.quantize) groups[name] = {name};
  static const std::regex kGate(R"(^(.*)\.(gate_proj|w1)\.weight$)");
  for (const auto& name : plan.quantize) {
    std::smatch match;
    if (!std::regex_match(name, match, kGate)) continue;
    const std::string up = match[1].str() + (match[2] == "w1" ? ".w3.weight" : ".up_proj.weight");
    if (plan.quantize.count(up) == 0) continue;
    groups[name] = {name, up};
    groups[up] = {name, up};
  }
  return plan;
}

}  // namespace

QuantizeReport quantize_checkpoint(const fs::path& in, const fs::path& out, const QuantizeOptions& options,
                                   const std::function<void(const QuantizeProgress&)>& progress) {
  if (!fs::exists(in)) fail(Errc::kIo, "{}: no such file or directory", in.string());
  const bool in_dir = fs::is_directory(in);
  const bool out_file = out.extension() == ".safetensors";
  if (in_dir && out_file) {
    fail(Errc::kInvalidArgument,
         "{} is a model directory: it quantizes into a directory, not into the file {}", in.string(),
         out.string());
  }
  if (fs::exists(out) && fs::equivalent(in, out)) {
    fail(Errc::kInvalidArgument, "the output {} is the input: write the quantized model elsewhere",
         out.string());
  }
  if (in_dir) {
    if (const auto q = io::read_quant_config(in)) {
      fail(Errc::kInvalidArgument, "{}: already quantized ({} says {}): quantize the unquantized model",
           in.string(), q->source, q->algo);
    }
  }
  const auto model = ShardedSafetensors::open(in);
  Quantizer quantizer{model, options.format, io::thread_count(options.threads), {}, {}, {}, {}};
  const Plan plan = make_plan(model, options, quantizer.groups);

  QuantizeReport report;
  report.quantized = static_cast<std::int64_t>(plan.quantize.size());
  report.excluded = plan.excluded;
  report.not_block_multiple = plan.not_block_multiple;
  report.copied = static_cast<std::int64_t>(model.size()) - report.quantized;
  for (const auto& f : model.files()) {
    for (const auto& t : f.tensors()) report.bytes_in += t.bytes();
  }

  if (!out_file) fs::create_directories(out);
  const bool nvfp4 = options.format == WeightFormat::kNvfp4;
  const std::int64_t block = block_size(options.format);
  json weight_map = json::object();
  std::uint64_t done = 0;
  for (const auto& file : model.files()) {
    const fs::path target =
        out_file ? out : out / (in_dir ? file.path().filename() : fs::path("model.safetensors"));
    SafetensorsWriter writer;
    for (const auto& [k, v] : file.metadata()) writer.set_metadata(k, v);
    // transformers refuses torch-format safetensors whose metadata lacks "format".
    if (file.metadata().count("format") == 0) writer.set_metadata("format", "pt");
    std::map<std::string, std::uint64_t> credit;  // output tensor -> input bytes it completes
    for (const auto& t : file.tensors()) {
      if (plan.quantize.count(t.name) == 0) {
        writer.add_view(t.name, t.dtype, t.shape, file.data(t));
        credit[t.name] = t.bytes();
        continue;
      }
      const std::string& name = t.name;
      const std::int64_t rows = t.shape[0], cols = t.shape[1];
      writer.add_produced(name, Dtype::kU8, {rows, cols / 2},
                          [&quantizer, name](std::span<std::uint8_t> o) { quantizer.quantize(name, o); });
      writer.add_produced(name + "_scale", nvfp4 ? Dtype::kF8E4M3 : Dtype::kU8, {rows, cols / block},
                          [&quantizer, name](std::span<std::uint8_t> o) { quantizer.scales(name, o); });
      credit[name] = t.bytes();
      if (nvfp4) {
        writer.add_produced(name + "_scale_2", Dtype::kF32, {},
                            [&quantizer, name](std::span<std::uint8_t> o) {
                              const float g = quantizer.global_scale(name);
                              std::memcpy(o.data(), &g, 4);
                            });
      }
    }
    const std::string target_name = target.filename().string();
    writer.write(target, [&](std::string_view tensor, std::uint64_t) {
      weight_map[std::string(tensor)] = target_name;
      const auto it = credit.find(std::string(tensor));
      if (it == credit.end()) return;
      done += it->second;
      if (progress) progress({done, report.bytes_in, target_name});
    });
    report.bytes_out += writer.data_bytes();
    report.written.push_back(target);
  }
  if (out_file) return report;

  if (model.index_path()) {
    json index = {{"metadata", {{"total_size", report.bytes_out}}}, {"weight_map", weight_map}};
    write_file_atomically(out / kIndexName, index.dump(2) + "\n");
    report.written.push_back(out / kIndexName);
  }
  std::vector<std::string> kept = plan.kept_modules;
  std::sort(kept.begin(), kept.end());
  const json hf_quant = {
      {"producer", {{"name", "fp4moe"}, {"version", version()}}},
      {"quantization",
       {{"quant_algo", nvfp4 ? "NVFP4" : "MXFP4"},
        {"kv_cache_quant_algo", nullptr},
        {"group_size", block},
        {"exclude_modules", kept}}},
  };
  write_file_atomically(out / "hf_quant_config.json", hf_quant.dump(4) + "\n");
  report.written.push_back(out / "hf_quant_config.json");
  if (in_dir) {
    for (const auto& e : fs::directory_iterator(in)) {
      if (!e.is_regular_file() || is_weight_file(e.path())) continue;
      copy_file_atomically(e.path(), out / e.path().filename());
      report.written.push_back(out / e.path().filename());
    }
  }
  return report;
}

}  // namespace fp4moe
