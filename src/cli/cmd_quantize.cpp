// fp4moe quantize: BF16/F16/F32 safetensors (a file or a model directory) -> ModelOpt NVFP4 or MXFP4.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "fp4moe/checkpoint.hpp"

namespace fp4moe::cli {
namespace {

// Inputs smaller than this finish in a blink: no progress line.
constexpr std::uint64_t kProgressMinBytes = 256ull << 20;

std::string human_bytes(std::uint64_t b) {
  if (b < 1024) return fmt::format("{} B", b);
  if (b < (1ull << 20)) return fmt::format("{:.1f} KiB", b / 1024.0);
  if (b < (1ull << 30)) return fmt::format("{:.1f} MiB", b / 1048576.0);
  return fmt::format("{:.2f} GiB", b / 1073741824.0);
}

struct Args {
  std::string in, out, format = "nvfp4";
  std::vector<std::string> exclude;
  int threads = 0;
};

void run(const Args& a) {
  QuantizeOptions options;
  options.format = parse_weight_format(a.format);
  options.exclude = a.exclude;
  options.threads = a.threads;
  const bool tty = isatty(fileno(stderr)) != 0;
  int last_step = -1;
  const auto progress = [&](const QuantizeProgress& p) {
    if (p.total_bytes < kProgressMinBytes) return;
    const double pct = 100.0 * static_cast<double>(p.done_bytes) / static_cast<double>(p.total_bytes);
    if (tty) {
      fmt::print(stderr, "\rquantize: {:5.1f}% ({} of {}) {}   ", pct, human_bytes(p.done_bytes),
                 human_bytes(p.total_bytes), p.file);
      if (p.done_bytes == p.total_bytes) fmt::print(stderr, "\n");
    } else if (static_cast<int>(pct / 10) != last_step) {
      last_step = static_cast<int>(pct / 10);
      fmt::print(stderr, "quantize: {:.0f}% ({} of {})\n", pct, human_bytes(p.done_bytes),
                 human_bytes(p.total_bytes));
    }
  };
  const QuantizeReport r = quantize_checkpoint(a.in, a.out, options, progress);
  const int block = block_size(options.format);
  fmt::print("quantize: {} -> {} ({}{})\n", a.in, a.out,
             options.format == WeightFormat::kNvfp4 ? "NVFP4" : "MXFP4",
             options.format == WeightFormat::kNvfp4 ? ", ModelOpt recipe" : ", OCP MX recipe");
  fmt::print(
      "  {} matrices quantized; {} kept unquantized by the exclude regexes; {} with K not a multiple of {}; "
      "{} tensors copied unchanged\n",
      r.quantized, r.excluded, r.not_block_multiple, block, r.copied);
  fmt::print("  tensor data {} -> {}\n", human_bytes(r.bytes_in), human_bytes(r.bytes_out));
  for (const auto& f : r.written) fmt::print("  wrote {}\n", f.string());
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("quantize",
                                 "Quantize every 2-D BF16/F16/F32 '.weight' tensor into the ModelOpt layout "
                                 "(X.weight U8, X.weight_scale, "
                                 "X.weight_scale_2); other tensors are copied");
  cmd->add_option("IN", args->in, "a .safetensors file or a model directory")->required();
  cmd->add_option("OUT", args->out, "a .safetensors file, or a directory (gets hf_quant_config.json)")
      ->required();
  cmd->add_option("--format", args->format, "nvfp4 (ModelOpt recipe) or mxfp4")->capture_default_str();
  cmd->add_option("--exclude", args->exclude,
                  "keep tensors whose name matches this regex unquantized (repeatable; always kept: " +
                      std::string(kDefaultQuantizeExclude) + ")");
  cmd->add_option("--threads", args->threads, "threads (0: all cores)")->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace fp4moe::cli
