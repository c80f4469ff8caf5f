// The layer's decision for one GEMM: a preference (forced or tuned), else the dispatcher's
// heuristics, else the planner's cheapest feasible candidate, each only if the planner accepts
// it. The layer runs exactly this pick; `fp4moe plan` prints it beside every candidate.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/fail.hpp"
#include "fp4moe/planner.hpp"
#include "fp4moe/version.hpp"
#include "gpu/dispatch.hpp"
#include "planner/kernel_family.hpp"
#include "planner/stream_gemm_plan.hpp"
#include "planner/tile_gemm_plan.hpp"
#include "planner/wgmma_gemm_plan.hpp"

namespace fp4moe {
namespace {

struct Judged {
  const planner::KernelFamily* family = nullptr;
  CandidateVerdict verdict;
  bool invalid = false;      // the kernel does not take the shape (or it is not compiled)
  bool unsupported = false;  // the architecture (or this build) cannot run the kernel at all
};

Judged judge_choice(const GemmChoice& c, const GemmProblem& problem, const ArchInfo& arch,
                    const KernelResources* resources) {
  Judged j;
  planner::CandidateSpec spec;
  switch (c.kernel) {
    case GemmKernel::kStream:
      j.family = &planner::stream_gemm_family();
      spec = planner::stream_gemm_spec({c.m_tiles, c.n_tiles, c.stages, c.warps, c.k_split}, problem);
      break;
    case GemmKernel::kTile:
      j.family = &planner::tile_gemm_family();
      spec = planner::tile_gemm_spec({c.m_tiles, c.n_tiles, c.warps, c.stages}, problem);
      if (spec.invalid.empty() && c.k_split != 1) {
        spec.invalid =
            fmt::format("k_split={}: the tile kernel does not split K (k_split must be 1)", c.k_split);
      }
      break;
    case GemmKernel::kWgmma:
      j.family = &planner::wgmma_gemm_family();
      spec = planner::wgmma_gemm_spec({c.n_tiles, c.stages, c.warps}, problem);
      if (spec.invalid.empty() && (c.m_tiles != 2 || c.k_split != 1)) {
        spec.invalid = fmt::format(
            "m_tiles={} k_split={}: the wgmma kernel runs 256 rows (m_tiles 2) without a K split (k_split 1)",
            c.m_tiles, c.k_split);
      }
      break;
  }
  j.invalid = !spec.invalid.empty();
  j.unsupported = !j.invalid && !j.family->unsupported(arch).empty();
  j.verdict = planner::evaluate(*j.family, spec, problem, arch, resources);
  return j;
}

int param(const CandidateVerdict& c, std::string_view name) {
  for (const auto& [k, v] : c.params) {
    if (k == name) return v;
  }
  fail(Errc::kInternal, "{} candidate {} has no parameter {}", c.family, c.label, name);
}

}  // namespace

std::string_view pick_source_name(PickSource source) noexcept {
  switch (source) {
    case PickSource::kForced:
      return "forced by the caller";
    case PickSource::kTuned:
      return "tuned on this GPU";
    case PickSource::kDispatcher:
      return "picked by the dispatcher";
    case PickSource::kCheapest:
      return "the planner's cheapest feasible candidate";
  }
  return "?";
}

std::string_view gemm_family_name(GemmKernel kernel) noexcept {
  switch (kernel) {
    case GemmKernel::kTile:
      return "tile-gemm";
    case GemmKernel::kWgmma:
      return "wgmma-gemm";
    case GemmKernel::kStream:
      break;
  }
  return "stream-gemm";
}

std::string_view gemm_kernel_name(GemmKernel kernel) noexcept {
  switch (kernel) {
    case GemmKernel::kTile:
      return "tile";
    case GemmKernel::kWgmma:
      return "wgmma";
    case GemmKernel::kStream:
      break;
  }
  return "stream";
}

std::string gemm_choice_label(const GemmChoice& c) {
  switch (c.kernel) {
    case GemmKernel::kTile:
      return planner::tile_gemm_label({c.m_tiles, c.n_tiles, c.warps, c.stages});
    case GemmKernel::kWgmma:
      return planner::wgmma_gemm_label({c.n_tiles, c.stages, c.warps});
    case GemmKernel::kStream:
      break;
  }
  return planner::stream_gemm_label({c.m_tiles, c.n_tiles, c.stages, c.warps, c.k_split});
}

GemmChoice choice_of_candidate(const CandidateVerdict& c) {
  // The wgmma kernel's rows (256: m_tiles 2) and K split (none) are fixed; warps are its consumer warps.
  if (c.family == "wgmma-gemm") {
    return {GemmKernel::kWgmma, 2, param(c, "n_tiles"), param(c, "stages"), param(c, "consumer_warps"), 1};
  }
  GemmChoice g;
  if (c.family == "stream-gemm") {
    g.kernel = GemmKernel::kStream;
    g.k_split = param(c, "k_split");
  } else if (c.family == "tile-gemm") {
    g.kernel = GemmKernel::kTile;
    g.k_split = 1;
  } else {
    fail(Errc::kInvalidArgument,
         "kernel family '{}' is not one the layer runs (stream-gemm, tile-gemm, wgmma-gemm)", c.family);
  }
  g.m_tiles = param(c, "m_tiles");
  g.n_tiles = param(c, "n_tiles");
  g.stages = param(c, "stages");
  g.warps = param(c, "warps");
  return g;
}

ArchInfo arch_for_this_build(ArchInfo arch) {
  if (arch.wgmma && cuda_architectures().find("90a") == std::string::npos) {
    arch.wgmma = false;
    arch.notes.push_back(
        fmt::format("wgmma: this build has no sm_90a image of the wgmma GEMM (CUDA architectures: '{}')",
                    cuda_architectures()));
  }
  return arch;
}

std::string LayerGemmPick::to_string() const {
  return fmt::format("{} {} ({})", verdict.family, verdict.label, why);
}

LayerGemmPick pick_layer_gemm(const LayerDesc& layer, std::int64_t tokens, GemmKind which,
                              const ArchInfo& arch, const KernelResources* resources,
                              const std::optional<GemmPreference>& preference) {
  LayerGemmPick pick;
  pick.problem = make_gemm_problem(layer, tokens, which);
  std::string passed;  // what was passed over, and why
  const auto take = [&](const GemmChoice& c, const CandidateVerdict& v, PickSource source,
                        const std::string& origin) {
    pick.choice = c;
    pick.verdict = v;
    pick.source = source;
    pick.why = std::string(pick_source_name(source)) + (origin.empty() ? "" : " (" + origin + ")") + passed;
    return pick;
  };
  if (preference) {
    const Judged j = judge_choice(preference->choice, pick.problem, arch, resources);
    if (j.verdict.feasible)
      return take(preference->choice, j.verdict, preference->source, preference->origin);
    if (preference->source == PickSource::kForced) {
      fail(j.invalid       ? Errc::kInvalidArgument
           : j.unsupported ? Errc::kUnsupported
                           : Errc::kDoesNotFit,
           "GEMM config {} {} ({}, {}) is rejected by the planner for {} on {}: {}", j.verdict.family,
           j.verdict.label, preference->origin, pick_source_name(preference->source),
           pick.problem.to_string(), arch.name, j.verdict.reason);
    }
    passed += fmt::format("; {} {} ({}) passed over: {}", j.verdict.family, j.verdict.label,
                          preference->origin, j.verdict.reason);
  }
  const gpu::DeviceLimits limits{arch.sm_count, arch.smem_per_block_optin, arch.smem_per_sm, arch.wgmma};
  const GemmChoice dispatched = gpu::choose_gemm(
      layer, tokens, which == GemmKind::kGateUp ? gpu::Gemm::kGateUp : gpu::Gemm::kDown, limits);
  const Judged d = judge_choice(dispatched, pick.problem, arch, resources);
  if (d.verdict.feasible) return take(dispatched, d.verdict, PickSource::kDispatcher, "");
  passed += fmt::format("; the dispatcher's {} {} is rejected on {}: {}", d.verdict.family, d.verdict.label,
                        arch.name, d.verdict.reason);
  // The cheapest feasible candidate of any family (the first family wins a tie).
  std::optional<CandidateVerdict> best;
  for (const auto& name : kernel_family_names()) {
    const Plan p = plan_kernels(name, pick.problem, arch, resources);
    if (p.ok() && (!best || p.best().cost_us < best->cost_us)) best = p.best();
  }
  if (!best) {
    fail(Errc::kDoesNotFit, "plan: no configuration of any kernel family fits {} on {}{}",
         pick.problem.to_string(), arch.name, passed);
  }
  return take(choice_of_candidate(*best), *best, PickSource::kCheapest, "");
}

LayerGemmPlan plan_layer_gemm(const LayerDesc& layer, std::int64_t tokens, GemmKind which,
                              const ArchInfo& arch, const KernelResources* resources,
                              const std::optional<GemmPreference>& preference) {
  LayerGemmPlan lp;
  const GemmProblem problem = make_gemm_problem(layer, tokens, which);
  for (const auto& name : kernel_family_names())
    lp.plans.push_back(plan_kernels(name, problem, arch, resources));
  try {
    lp.pick = pick_layer_gemm(layer, tokens, which, arch, resources, preference);
    lp.ok = true;
  } catch (const Error& e) {
    const bool forced = preference && preference->source == PickSource::kForced;
    if (forced || e.code() != Errc::kDoesNotFit) throw;
    lp.refusal = e.what();
    lp.pick.problem = problem;
    return lp;
  }
  for (auto& p : lp.plans) {
    if (p.family != lp.pick.verdict.family) continue;
    bool listed = false;
    for (const auto& c : p.candidates) listed = listed || c.label == lp.pick.verdict.label;
    if (!listed) p.candidates.push_back(lp.pick.verdict);
  }
  if (lp.pick.choice.kernel == GemmKernel::kWgmma) {
    for (const gpu::TailLaunch& t : gpu::tail_launches(lp.pick.choice, arch.smem_per_block_optin)) {
      lp.then.push_back(fmt::format("each expert's last {}-{} tokens: wgmma-gemm {}", t.lo + 1, t.hi,
                                    gemm_choice_label(t.choice)));
    }
    // The small-expert launch follows a wgmma GEMM when the first GEMM runs on wgmma (the layer's
    // rule, gpu::small_expert_max; MoeLayerOptions::small_expert_launch, on by default).
    lp.then.push_back(fmt::format(
        "the experts of 1-{} tokens, when at least {}{}: stream-gemm {} (K split chosen on the GPU)",
        gpu::kSmallExpertTokens, gpu::small_expert_min(layer),
        which == GemmKind::kDown ? " and the gate/up GEMM runs on wgmma too" : "",
        gemm_choice_label(gpu::small_expert_choice())));
  }
  return lp;
}

std::string LayerGemmPlan::to_string(int top) const {
  const GemmProblem& p = pick.problem;
  std::string s = fmt::format("{}\n", p.to_string());
  if (ok) {
    s += fmt::format("  PICK: {} {}: {}; {:.2f} us estimated\n", pick.verdict.family, pick.verdict.label,
                     pick.why, pick.verdict.cost_us);
    for (const std::string& t : then) s += fmt::format("  then {}\n", t);
  } else {
    s += fmt::format("  PICK: none: {}\n", refusal);
  }
  for (const auto& plan : plans) {
    int index = -1;
    for (std::size_t i = 0; ok && i < plan.candidates.size(); ++i) {
      if (plan.family == pick.verdict.family && plan.candidates[i].label == pick.verdict.label) {
        index = static_cast<int>(i);
      }
    }
    s += planner::render_plan(plan, top, index, "cheapest estimate");
  }
  return s;
}

std::string LayerGemmPlan::to_json() const {
  nlohmann::json j;
  j["problem"] = planner::problem_to_json(pick.problem);
  if (ok) {
    nlohmann::json params = nlohmann::json::object();
    for (const auto& [k, v] : pick.verdict.params) params[k] = v;
    j["pick"] = {{"family", pick.verdict.family},
                 {"label", pick.verdict.label},
                 {"kernel", std::string(gemm_kernel_name(pick.choice.kernel))},
                 {"params", params},
                 {"source", std::string(pick_source_name(pick.source))},
                 {"why", pick.why},
                 {"cost_us", pick.verdict.cost_us},
                 {"dynamic_smem_bytes", pick.verdict.dynamic_smem_bytes},
                 {"blocks_per_sm", pick.verdict.occupancy.blocks_per_sm}};
  } else {
    j["pick"] = nullptr;
  }
  j["then"] = then;
  j["refusal"] = refusal;
  auto arr = nlohmann::json::array();
  for (const auto& plan : plans) arr.push_back(nlohmann::json::parse(plan.to_json()));
  j["plans"] = arr;
  return j.dump();
}

}  // namespace fp4moe
