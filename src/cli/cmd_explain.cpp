// fp4moe explain: why a kernel configuration fits an architecture's shared memory or not, term by
// term, with the fixes that would fit. CUTLASS's grouped GEMMs (the model in cutlass_model.hpp)
// and fp4moe's own kernels (their constexpr layouts).
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.hpp"
#include "common/fail.hpp"
#include "fp4moe/arch.hpp"
#include "fp4moe/cutlass_model.hpp"
#include "fp4moe/planner.hpp"

namespace fp4moe::cli {
namespace {

struct ExplainOptions {
  std::string arch = "local";
  std::string kernel = "cutlass-grouped-blockscaled";
  std::string a = "nvfp4";
  std::string b = "nvfp4";
  std::string tile;
  std::string epilogue;
  bool swap_ab = false;
  std::string schedule = "auto";
  int stages = 0;
  bool all = false;
  std::string config;
  std::string resources;
  bool json = false;
};

void explain_cutlass_all(const ExplainOptions& o, const ArchInfo& arch, const CutlassConfig& base) {
  require(arch.sm >= 120,
          "--all lists TensorRT-LLM's SM120 candidate tiles; {} is not an SM120-class architecture "
          "(give --tile instead)",
          arch.name);
  std::vector<Epilogue> epilogues = {Epilogue::kNone, Epilogue::kFinalize};
  if (!o.epilogue.empty()) epilogues = {parse_epilogue(o.epilogue)};
  auto arr = nlohmann::json::array();
  if (!o.json) {
    fmt::print("{} {} x {} on {}: TensorRT-LLM's SM120 candidate tiles (cutlass_heuristic.cpp)\n",
               cutlass_kernel_name(base.kernel), operand_name(base.a), operand_name(base.b), arch.name);
  }
  for (const auto& tile : trtllm_sm120_tiles(base.a, base.b)) {
    for (const auto e : epilogues) {
      CutlassConfig c = base;
      c.tile = tile;
      c.epilogue = e;
      const auto v = explain_cutlass(c, arch);
      if (o.json) {
        arr.push_back(nlohmann::json::parse(v.to_json()));
      } else {
        fmt::print("  {}\n", v.one_line());
      }
    }
  }
  if (o.json) fmt::print("{}\n", arr.dump());
}

void run_explain(const ExplainOptions& o) {
  const ArchInfo arch = resolve_arch(o.arch);
  if (o.kernel.starts_with("cutlass")) {
    CutlassConfig c;
    c.kernel = parse_cutlass_kernel(o.kernel);
    c.a = parse_operand(o.a);
    c.b = parse_operand(o.b);
    c.swap_ab = o.swap_ab;
    c.schedule = parse_cutlass_schedule(o.schedule);
    c.stages = o.stages;
    if (o.all) {
      explain_cutlass_all(o, arch, c);
      return;
    }
    require(!o.tile.empty(), "explain --kernel {} needs --tile MxNxK (or --all)", o.kernel);
    c.tile = parse_tile(o.tile);
    c.epilogue = o.epilogue.empty() ? Epilogue::kNone : parse_epilogue(o.epilogue);
    const auto v = explain_cutlass(c, arch);
    fmt::print("{}\n", o.json ? v.to_json() : v.to_string());
    return;
  }
  require(!o.config.empty(), "explain --kernel {} needs --config (e.g. --config \"m1 n1 s8 w8\")", o.kernel);
  KernelResources resources;
  const KernelResources* r = &build_resources();
  if (!o.resources.empty()) {
    resources = load_resource_report(o.resources);
    r = &resources;
  }
  const auto e = explain_kernel(o.kernel, o.config, arch, r);
  fmt::print("{}\n", o.json ? e.to_json() : e.to_string());
}

}  // namespace

void register_explain(CLI::App& app) {
  auto o = std::make_shared<ExplainOptions>();
  auto* cmd = app.add_subcommand(
      "explain",
      "Explain whether a kernel configuration fits an architecture's shared memory, and why (or why not)");
  cmd->add_option("--arch", o->arch, "Architecture (sm_80 ... sm_121) or 'local' for GPU 0")
      ->capture_default_str();
  cmd->add_option(
         "--kernel", o->kernel,
         "cutlass-grouped (SM90), cutlass-grouped-blockscaled (SM100/SM120) or one of fp4moe's families "
         "(stream-gemm)")
      ->capture_default_str();
  cmd->add_option("--a", o->a, "CUTLASS: operand A, the activations (bf16, fp8, nvfp4, mxfp4, mxfp8)")
      ->capture_default_str();
  cmd->add_option("--b", o->b, "CUTLASS: operand B, the expert weights")->capture_default_str();
  cmd->add_option("--tile", o->tile, "CUTLASS: CTA tile MxNxK in elements, e.g. 128x256x128");
  cmd->add_option("--epilogue", o->epilogue, "CUTLASS: none or finalize (default none; --all: both)");
  cmd->add_flag("--swap-ab", o->swap_ab,
                "CUTLASS: the swap_ab variant (the kernel's M runs along the weights)");
  cmd->add_option("--schedule", o->schedule, "CUTLASS: auto, cooperative, pingpong, 1sm or 2sm")
      ->capture_default_str();
  cmd->add_option("--stages", o->stages,
                  "CUTLASS: StageCount<N> instead of StageCountAutoCarveout (0 = auto)")
      ->capture_default_str();
  cmd->add_flag("--all", o->all, "CUTLASS: one line per TensorRT-LLM SM120 candidate tile");
  cmd->add_option("--config", o->config, "fp4moe kernels: the configuration, e.g. \"m1 n1 s8 w8\"");
  cmd->add_option("--resources", o->resources, "fp4moe kernels: a resource report (default: this build's)");
  cmd->add_flag("--json", o->json,
                "Print one JSON object (fits, total_bytes, limit_bytes, stages, over_by_bytes, "
                "reason, alternatives)");
  cmd->callback([o] { run_explain(*o); });
}

}  // namespace fp4moe::cli
