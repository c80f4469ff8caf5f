// fp4moe inspect: what a safetensors file or model directory holds, and what looks wrong in it.
#include <fmt/format.h>

#include <map>
#include <string>
#include <tuple>

#include "cli/commands.hpp"
#include "fp4moe/checkpoint.hpp"

namespace fp4moe::cli {
namespace {

// Beyond this many tensors the per-name listing is left to --tensors.
constexpr std::size_t kListAllBelow = 64;
constexpr std::size_t kMaxWarningsShown = 50;

std::string human_bytes(std::uint64_t b) {
  if (b < 1024) return fmt::format("{} B", b);
  if (b < (1ull << 20)) return fmt::format("{:.1f} KiB", b / 1024.0);
  if (b < (1ull << 30)) return fmt::format("{:.1f} MiB", b / 1048576.0);
  return fmt::format("{:.2f} GiB", b / 1073741824.0);
}

// "model.layers.3.mlp.experts.12.up_proj.weight" -> "model.layers.*.mlp.experts.*.up_proj.weight".
std::string fold_numbers(const std::string& name) {
  std::string out;
  std::size_t start = 0;
  while (start <= name.size()) {
    const auto dot = name.find('.', start);
    const std::string part = name.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    out += digits ? "*" : part;
    if (dot == std::string::npos) break;
    out += '.';
    start = dot + 1;
  }
  return out;
}

struct Args {
  std::string path;
  bool tensors = false;
  bool no_scan = false;
};

void print_layers(const ModelInfo& info) {
  fmt::print("MoE layers: {}\n", info.moe_layers.size());
  for (const auto& l : info.moe_layers) {
    std::string line = fmt::format("  layer {} ({}): {} experts, {}", l.layer, l.prefix, l.experts,
                                   expert_layout_name(l.layout));
    if (l.hidden > 0) line += fmt::format(", H={} I={}", l.hidden, l.intermediate);
    if (l.shared_intermediate > 0) line += fmt::format(", shared expert I={}", l.shared_intermediate);
    line += l.router.empty() ? ", no router" : ", router " + l.router;
    if (l.correction_bias) line += " + e_score_correction_bias";
    fmt::print("{}\n", line);
  }
}

void run(const Args& a) {
  InspectOptions options;
  options.scan_values = !a.no_scan;
  const ModelInfo info = inspect_model(a.path, options);
  fmt::print("{}: {} file{}, {} tensors, {} of tensor data\n", info.path.string(), info.files.size(),
             info.files.size() == 1 ? "" : "s", info.tensors.size(), human_bytes(info.tensor_bytes));
  if (!info.model_type.empty() || info.desc || !info.desc_error.empty()) {
    fmt::print("config.json: model_type {}\n", info.model_type.empty() ? "(none)" : info.model_type);
    if (info.desc) fmt::print("  MoE layer: {}\n", info.desc->to_string());
    if (!info.desc_error.empty()) fmt::print("  no MoE layer description: {}\n", info.desc_error);
  }
  if (info.quant) {
    const auto& q = *info.quant;
    fmt::print("quantization: {} (from {}{}{}), {} excluded module pattern{}\n", q.algo, q.source,
               q.producer.empty() ? "" : ", producer " + q.producer,
               q.group_size > 0 ? fmt::format(", group size {}", q.group_size) : "", q.exclude_modules.size(),
               q.exclude_modules.size() == 1 ? "" : "s");
  } else {
    fmt::print("quantization: none declared\n");
  }

  std::map<Dtype, std::pair<std::int64_t, std::uint64_t>> by_dtype;
  std::map<std::tuple<std::string, Dtype, std::string>, std::int64_t> groups;
  for (const auto& t : info.tensors) {
    by_dtype[t.dtype].first++;
    by_dtype[t.dtype].second += t.bytes();
    groups[{fold_numbers(t.name), t.dtype, t.shape_string()}]++;
  }
  fmt::print("dtypes:");
  for (const auto& [d, n] : by_dtype)
    fmt::print(" {} x{} ({})", dtype_name(d), n.first, human_bytes(n.second));
  fmt::print("\n");
  print_layers(info);

  if (a.tensors || info.tensors.size() < kListAllBelow) {
    fmt::print("tensors:\n");
    for (const auto& t : info.tensors)
      fmt::print("  {}  {} {}\n", t.name, dtype_name(t.dtype), t.shape_string());
  } else {
    fmt::print("tensors (numbers in names folded to *; --tensors lists every one):\n");
    for (const auto& [key, n] : groups) {
      fmt::print("  {}  {} {}  x{}\n", std::get<0>(key), dtype_name(std::get<1>(key)), std::get<2>(key), n);
    }
  }
  if (info.warnings.empty()) {
    fmt::print("warnings: none{}\n", a.no_scan ? " (values not scanned: --no-scan)" : "");
    return;
  }
  fmt::print("warnings: {}\n", info.warnings.size());
  for (std::size_t i = 0; i < info.warnings.size() && i < kMaxWarningsShown; ++i) {
    fmt::print("  warning: {}\n", info.warnings[i]);
  }
  if (info.warnings.size() > kMaxWarningsShown) {
    fmt::print("  ... and {} more\n", info.warnings.size() - kMaxWarningsShown);
  }
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "inspect",
      "Summarise a safetensors file or model directory: tensors, quantization, MoE layers, anomalies");
  cmd->add_option("PATH", args->path, "a .safetensors file, an index .json, or a model directory")
      ->required();
  cmd->add_flag("--tensors", args->tensors, "list every tensor by name");
  cmd->add_flag("--no-scan", args->no_scan, "read only the headers (no NaN/Inf or zero-scale checks)");
  cmd->callback([args] { run(*args); });
}

}  // namespace fp4moe::cli
