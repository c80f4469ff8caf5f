// fp4moe plan: what fp4moe runs for each expert GEMM of a MoE layer at a token count on an
// architecture (the layer's own decision: planner::pick_layer_gemm), and beside it every
// configuration of every kernel family with shared memory, registers, occupancy, estimated time
// and verdict, the rejected ones with their reasons.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "common/fail.hpp"
#include "fp4moe/arch.hpp"
#include "fp4moe/device.hpp"
#include "fp4moe/layer.hpp"
#include "fp4moe/planner.hpp"
#include "fp4moe/tune.hpp"

namespace fp4moe::cli {
namespace {

struct PlanOptions {
  std::string arch = "local";
  std::string family;  // empty: every family
  std::string preset;
  std::int64_t hidden = 0;
  std::int64_t intermediate = 0;
  std::int64_t experts = 0;
  std::int64_t top_k = 0;
  std::string format;
  std::string activation;
  std::vector<std::int64_t> tokens;
  std::string gemm = "both";
  std::string resources;
  bool no_resources = false;
  std::string tune_cache;
  bool no_tune_cache = false;
  double dram_gbs = 0;
  double l2_gbs = 0;
  int sms = 0;
  int top = 0;
  bool json = false;
};

// The layer: a preset, with any size given on the command line replacing the preset's.
LayerDesc layer_of(const PlanOptions& o) {
  LayerDesc d;
  if (!o.preset.empty()) {
    d = layer_preset(o.preset);
  } else {
    require(
        o.hidden > 0 && o.intermediate > 0 && o.experts > 0 && o.top_k > 0,
        "plan needs --preset or all of --hidden, --intermediate, --experts and --top-k (got {}, {}, {}, {})",
        o.hidden, o.intermediate, o.experts, o.top_k);
  }
  if (o.hidden > 0) d.hidden = o.hidden;
  if (o.intermediate > 0) d.intermediate = o.intermediate;
  if (o.experts > 0) d.experts = o.experts;
  if (o.top_k > 0) d.top_k = o.top_k;
  if (!o.format.empty()) d.format = parse_weight_format(o.format);
  if (!o.activation.empty()) d.activation = parse_activation(o.activation);
  return d;
}

void find_family_or_throw(const std::string& family) {
  const auto names = kernel_family_names();
  if (std::find(names.begin(), names.end(), family) == names.end()) {
    fail(Errc::kInvalidArgument, "unknown kernel family '{}' (known: {})", family, fmt::join(names, ", "));
  }
}

void run_plan(const PlanOptions& o) {
  const LayerDesc layer = layer_of(o);
  const bool local = o.arch.empty() || o.arch == "local";
  // The local GPU as this build runs it (a named architecture: as a build with every image would).
  ArchInfo arch = local ? arch_for_this_build(resolve_arch(o.arch)) : resolve_arch(o.arch);
  if (o.dram_gbs > 0) {
    arch.notes.push_back(fmt::format("DRAM bandwidth {} GB/s given on the command line", o.dram_gbs));
    arch.dram_bandwidth_gbs = o.dram_gbs;
  }
  if (o.l2_gbs > 0) {
    arch.notes.push_back(fmt::format("L2 bandwidth {} GB/s given on the command line", o.l2_gbs));
    arch.l2_bandwidth_gbs = o.l2_gbs;
  }
  if (o.sms > 0) {
    arch.notes.push_back(fmt::format("{} SMs given on the command line", o.sms));
    arch.sm_count = o.sms;
  }
  KernelResources loaded;
  const KernelResources* resources = nullptr;
  if (!o.no_resources) {
    resources = &build_resources();
    if (!o.resources.empty()) {
      loaded = load_resource_report(o.resources);
      resources = &loaded;
    }
  }
  // On the local GPU the layer would also read the tune cache: so does the plan.
  std::optional<TuneCache> tuned;
  std::string tuned_path;
  if (local && !o.no_tune_cache) {
    tuned_path = tune_cache_path(o.tune_cache);
    if (!tuned_path.empty()) {
      TuneCacheLoad load = load_tune_cache(tuned_path, tune_metadata_of(list_gpus().front()));
      if (!load.message.empty()) fmt::print(stderr, "fp4moe: {}\n", load.message);
      tuned = std::move(load.cache);
    }
  }
  std::vector<GemmKind> kinds = {GemmKind::kGateUp, GemmKind::kDown};
  if (o.gemm != "both") kinds = {parse_gemm_kind(o.gemm)};
  auto plans = nlohmann::json::array();
  if (!o.json) {
    fmt::print("layer: {}\n{}", layer.to_string(), arch.to_string());
  }
  if (!o.family.empty()) find_family_or_throw(o.family);
  for (const auto t : o.tokens) {
    for (const auto kind : kinds) {
      const auto preference =
          tuned ? tuned_preference(*tuned, tuned_path, layer, t, kind) : std::optional<GemmPreference>();
      LayerGemmPlan plan = plan_layer_gemm(layer, t, kind, arch, resources, preference);
      if (!o.family.empty()) {
        std::erase_if(plan.plans, [&](const Plan& p) { return p.family != o.family; });
      }
      if (o.json) {
        plans.push_back(nlohmann::json::parse(plan.to_json()));
      } else {
        fmt::print("\n{}", plan.to_string(o.top));
      }
    }
  }
  if (o.json) {
    nlohmann::json j;
    j["arch"] = arch.name;
    j["arch_notes"] = arch.notes;
    j["gemms"] = plans;
    fmt::print("{}\n", j.dump());
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  auto* cmd =
      app.add_subcommand("plan",
                         "Show which kernel configuration fp4moe runs for each expert GEMM of a MoE layer, "
                         "and every candidate: shared memory, registers, occupancy, estimated time, the "
                         "rejected with their reasons");
  cmd->add_option("--arch", o->arch, "Architecture (sm_80 ... sm_121) or 'local' for GPU 0")
      ->capture_default_str();
  cmd->add_option("--family", o->family,
                  "List only this kernel family's candidates (stream-gemm, tile-gemm, wgmma-gemm)");
  std::string presets;
  for (const auto& n : layer_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  cmd->add_option("--preset", o->preset, "Layer shape of a model: " + presets);
  cmd->add_option("--hidden", o->hidden, "Hidden size H (replaces the preset's)");
  cmd->add_option("--intermediate", o->intermediate, "Intermediate size I of one expert");
  cmd->add_option("--experts", o->experts, "Routed experts E");
  cmd->add_option("--top-k", o->top_k, "Experts per token");
  cmd->add_option("--format", o->format, "Weight format: nvfp4 or mxfp4");
  cmd->add_option("--activation", o->activation, "swiglu or swiglu-clamped (gpt-oss)");
  cmd->add_option("--tokens", o->tokens, "Token count(s), e.g. --tokens 1,16,256 or --tokens 1 16 256")
      ->required()
      ->expected(1, -1)
      ->delimiter(',');
  cmd->add_option("--gemm", o->gemm, "gate_up, down or both")->capture_default_str();
  cmd->add_option("--resources", o->resources,
                  "Resource report to read registers from (default: this build's)");
  cmd->add_flag("--no-resources", o->no_resources,
                "Ignore resource reports: occupancy from shared memory and "
                "threads only");
  cmd->add_option("--tune-cache", o->tune_cache,
                  "With --arch local: the tune cache the layer would read (default: $FP4MOE_TUNE_CACHE, "
                  "else the XDG cache directory's fp4moe/tune.json)");
  cmd->add_flag("--no-tune-cache", o->no_tune_cache, "With --arch local: ignore the tune cache");
  cmd->add_option("--dram-gbs", o->dram_gbs, "Override the DRAM bandwidth, GB/s");
  cmd->add_option("--l2-gbs", o->l2_gbs, "Override the L2 bandwidth, GB/s");
  cmd->add_option("--sms", o->sms, "Override the SM count");
  cmd->add_option("--top", o->top,
                  "Print only the N cheapest feasible configs per family (and the pick); 0: all")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON object with every plan");
  cmd->callback([o] { run_plan(*o); });
}

}  // namespace fp4moe::cli
