// fp4moe plan: fp4moe's own kernel configurations for one MoE layer at a token count on an
// architecture: each with shared memory, registers, occupancy, estimated time and verdict, the
// pick, and the rejected ones with their reasons.
#include <fmt/format.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "common/fail.hpp"
#include "fp4moe/arch.hpp"
#include "fp4moe/layer.hpp"
#include "fp4moe/planner.hpp"

namespace fp4moe::cli {
namespace {

struct PlanOptions {
  std::string arch = "local";
  std::string family = "stream-gemm";
  LayerDesc layer;
  std::vector<std::int64_t> tokens;
  std::string gemm = "both";
  std::string resources;
  bool no_resources = false;
  double dram_gbs = 0;
  double l2_gbs = 0;
  int sms = 0;
  bool json = false;
};

void run_plan(const PlanOptions& o) {
  ArchInfo arch = resolve_arch(o.arch);
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
  std::vector<GemmKind> kinds = {GemmKind::kGateUp, GemmKind::kDown};
  if (o.gemm != "both") kinds = {parse_gemm_kind(o.gemm)};
  auto plans = nlohmann::json::array();
  if (!o.json) {
    fmt::print("{}", arch.to_string());
  }
  for (const auto t : o.tokens) {
    for (const auto kind : kinds) {
      const Plan plan = plan_kernels(o.family, make_gemm_problem(o.layer, t, kind), arch, resources);
      if (o.json) {
        plans.push_back(nlohmann::json::parse(plan.to_json()));
      } else {
        fmt::print("\n{}", plan.to_string());
      }
    }
  }
  if (o.json) {
    nlohmann::json j;
    j["arch"] = arch.name;
    j["arch_notes"] = arch.notes;
    j["plans"] = plans;
    fmt::print("{}\n", j.dump());
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  auto* cmd =
      app.add_subcommand("plan",
                         "List fp4moe's kernel configurations for a MoE layer: shared memory, registers, "
                         "occupancy, estimated time, the pick and the rejected with their reasons");
  cmd->add_option("--arch", o->arch, "Architecture (sm_80 ... sm_121) or 'local' for GPU 0")
      ->capture_default_str();
  cmd->add_option("--family", o->family, "Kernel family (stream-gemm)")->capture_default_str();
  cmd->add_option("--hidden", o->layer.hidden, "Hidden size H")->required();
  cmd->add_option("--intermediate", o->layer.intermediate, "Intermediate size I of one expert")->required();
  cmd->add_option("--experts", o->layer.experts, "Routed experts E")->required();
  cmd->add_option("--top-k", o->layer.top_k, "Experts per token")->required();
  const std::map<std::string, WeightFormat> formats = {{"nvfp4", WeightFormat::kNvfp4},
                                                       {"mxfp4", WeightFormat::kMxfp4}};
  cmd->add_option("--format", o->layer.format, "Weight format: nvfp4 or mxfp4")
      ->transform(CLI::CheckedTransformer(formats, CLI::ignore_case));
  const std::map<std::string, Activation> activations = {{"swiglu", Activation::kSwiGLU},
                                                         {"swiglu-clamped", Activation::kSwiGLUClamped}};
  cmd->add_option("--activation", o->layer.activation, "swiglu or swiglu-clamped (gpt-oss)")
      ->transform(CLI::CheckedTransformer(activations, CLI::ignore_case));
  cmd->add_option("--tokens", o->tokens, "Token count(s), e.g. --tokens 1 16 256")
      ->required()
      ->expected(1, -1);
  cmd->add_option("--gemm", o->gemm, "gate_up, down or both")->capture_default_str();
  cmd->add_option("--resources", o->resources,
                  "Resource report to read registers from (default: this build's)");
  cmd->add_flag("--no-resources", o->no_resources,
                "Ignore resource reports: occupancy from shared memory and "
                "threads only");
  cmd->add_option("--dram-gbs", o->dram_gbs, "Override the DRAM bandwidth, GB/s");
  cmd->add_option("--l2-gbs", o->l2_gbs, "Override the L2 bandwidth, GB/s");
  cmd->add_option("--sms", o->sms, "Override the SM count");
  cmd->add_flag("--json", o->json, "Print one JSON object with every plan");
  cmd->callback([o] { run_plan(*o); });
}

}  // namespace fp4moe::cli
