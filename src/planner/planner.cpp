#include "fp4moe/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/fail.hpp"
#include "planner/kernel_family.hpp"

namespace fp4moe {
namespace {

constexpr double kCostTie = 0.01;

// The family list: add a family here (and its adapter) and `fp4moe plan` knows it.
std::vector<const planner::KernelFamily*> families() {
  return {&planner::stream_gemm_family(), &planner::tile_gemm_family(), &planner::wgmma_gemm_family()};
}

std::string params_text(const std::vector<std::pair<std::string, int>>& params) {
  std::string s;
  for (const auto& [k, v] : params) s += fmt::format("{}{}={}", s.empty() ? "" : " ", k, v);
  return s;
}

std::string occupancy_text(const Occupancy& o) {
  if (o.blocks_per_sm == 0) return fmt::format("0 ({})", o.limiter);
  return fmt::format("{} ({})", o.blocks_per_sm, o.limiter);
}

}  // namespace

std::string_view gemm_kind_name(GemmKind kind) noexcept {
  return kind == GemmKind::kGateUp ? "gate_up" : "down";
}

GemmKind parse_gemm_kind(std::string_view name) {
  if (name == "gate_up") return GemmKind::kGateUp;
  if (name == "down") return GemmKind::kDown;
  fail(Errc::kInvalidArgument, "unknown GEMM '{}' (expected gate_up or down)", name);
}

std::string GemmProblem::to_string() const {
  const std::string shared =
      shared_pieces > 0 ? fmt::format(" + {} shared x {} tokens", shared_pieces, tokens) : std::string();
  return fmt::format("{} N={} K={} {}, {} experts top-{}, {} tokens: {:.1f} active experts x {:.2f} tokens{}",
                     gemm_kind_name(kind), n, k, format_name(format), experts, top_k, tokens, active_experts,
                     tokens_per_expert, shared);
}

GemmProblem make_gemm_problem(const LayerDesc& layer, std::int64_t tokens, GemmKind kind) {
  layer.validate();
  require(tokens >= 1, "tokens={}: a plan needs at least 1 token", tokens);
  GemmProblem p;
  p.kind = kind;
  p.n = kind == GemmKind::kGateUp ? 2 * layer.intermediate : layer.hidden;
  p.k = kind == GemmKind::kGateUp ? layer.hidden : layer.intermediate;
  p.experts = layer.experts;
  p.top_k = layer.top_k;
  p.tokens = tokens;
  p.format = layer.format;
  p.activation = layer.activation;
  p.active_experts = layer.expected_active_experts(tokens);
  p.tokens_per_expert = static_cast<double>(tokens * layer.top_k) / p.active_experts;
  p.shared_pieces = layer.shared_pieces();
  return p;
}

Occupancy occupancy(const ArchInfo& arch, std::int64_t smem_per_block, int threads,
                    int registers_per_thread) {
  Occupancy o;
  o.by_block_limit = arch.max_blocks_per_sm;
  const std::int64_t smem = smem_per_block + arch.smem_reserved_per_block;
  o.by_smem = smem > 0 ? static_cast<int>(arch.smem_per_sm / smem) : std::numeric_limits<int>::max();
  const int warps = (threads + 31) / 32;
  o.by_threads = warps > 0 ? (arch.max_threads_per_sm / 32) / warps : 0;
  if (registers_per_thread > 0) {
    const int per_warp =
        (registers_per_thread * 32 + arch.reg_alloc_unit - 1) / arch.reg_alloc_unit * arch.reg_alloc_unit;
    o.by_registers = registers_per_thread > arch.regs_per_thread ? 0 : arch.regs_per_sm / (per_warp * warps);
  }
  o.blocks_per_sm = std::min({o.by_smem, o.by_threads, o.by_block_limit});
  o.limiter = o.blocks_per_sm == o.by_smem      ? "shared memory"
              : o.blocks_per_sm == o.by_threads ? "threads"
                                                : "blocks per SM";
  if (o.by_registers >= 0 && o.by_registers < o.blocks_per_sm) {
    o.blocks_per_sm = o.by_registers;
    o.limiter = "registers";
  }
  return o;
}

namespace planner {

std::vector<int> parse_config_fields(std::string_view config, std::string_view letters,
                                     std::string_view family, std::string_view form,
                                     std::string_view example) {
  std::vector<int> v(letters.size(), 0);
  std::size_t pos = 0;
  for (std::size_t i = 0; i < letters.size(); ++i) {
    while (pos < config.size() && (config[pos] == ' ' || config[pos] == ',')) ++pos;
    const bool letter_ok = pos < config.size() && config[pos] == letters[i];
    const char* begin = config.data() + pos + 1;
    const auto r = letter_ok ? std::from_chars(begin, config.data() + config.size(), v[i])
                             : std::from_chars_result{begin, std::errc::invalid_argument};
    require(letter_ok && r.ec == std::errc() && v[i] > 0, "{} config '{}' is not '{}' (e.g. {})", family,
            config, form, example);
    pos = static_cast<std::size_t>(r.ptr - config.data());
  }
  require(pos == config.size(), "{} config '{}' has text after its last field (expected '{}')", family,
          config, form);
  return v;
}

CandidateVerdict judge(const KernelFamily& family, const CandidateSpec& spec, const ArchInfo& arch,
                       const KernelResources* resources) {
  CandidateVerdict c;
  c.family = std::string(family.name());
  c.label = spec.label;
  c.params = spec.params;
  c.dynamic_smem_bytes = spec.dynamic_smem_bytes;
  c.smem_how = spec.smem_how;
  c.threads = spec.threads;
  if (resources != nullptr && resources->source != ResourceSource::kNone) {
    // The entry with all of the instance's numbers, else one that differs only in the last (for
    // the stream GEMM: another epilogue of the same tile, a close stand-in).
    const std::size_t n = spec.resource_key.size();
    for (std::size_t len = n; len >= 1 && len + 1 >= n; --len) {
      const std::vector<int> key(spec.resource_key.begin(),
                                 spec.resource_key.begin() + static_cast<long>(len));
      if (const auto* r = resources->find(family.kernel_prefix(), key, arch.sm)) {
        c.registers = r->registers;
        c.static_smem_bytes = r->static_smem_bytes;
        c.spill_bytes = r->spill_bytes;
        c.registers_source = resources->source;
        break;
      }
    }
  }
  const std::int64_t smem = c.dynamic_smem_bytes + c.static_smem_bytes;
  c.occupancy = occupancy(arch, smem, c.threads, c.registers);
  if (!spec.invalid.empty()) {
    c.reason = spec.invalid;
  } else if (const std::string why = family.unsupported(arch); !why.empty()) {
    c.reason = why;
  } else if (smem > arch.smem_per_block_optin) {
    c.reason = fmt::format("needs {} B of shared memory per block ({}{}), {} allows {} B: over by {} B", smem,
                           c.smem_how,
                           c.static_smem_bytes > 0 ? fmt::format(" + {} B static", c.static_smem_bytes) : "",
                           arch.name, arch.smem_per_block_optin, smem - arch.smem_per_block_optin);
  } else if (c.threads > arch.max_threads_per_block) {
    c.reason =
        fmt::format("{} threads per block, {} allows {}", c.threads, arch.name, arch.max_threads_per_block);
  } else if (c.registers > 0 && static_cast<std::int64_t>(c.registers) * c.threads > arch.regs_per_block) {
    c.reason =
        fmt::format("{} registers x {} threads = {} per block, {} allows {}", c.registers, c.threads,
                    static_cast<std::int64_t>(c.registers) * c.threads, arch.name, arch.regs_per_block);
  } else if (c.occupancy.blocks_per_sm < 1) {
    c.reason = fmt::format(
        "no block fits on an SM (limited by {}: {} B smem + {} B reserved of {} B per SM, "
        "{} threads of {})",
        c.occupancy.limiter, smem, arch.smem_reserved_per_block, arch.smem_per_sm, c.threads,
        arch.max_threads_per_sm);
  } else {
    c.feasible = true;
  }
  return c;
}

CandidateVerdict evaluate(const KernelFamily& family, const CandidateSpec& spec, const GemmProblem& problem,
                          const ArchInfo& arch, const KernelResources* resources) {
  CandidateVerdict c = judge(family, spec, arch, resources);
  if (c.feasible) {
    const auto cost = family.cost(spec, problem, arch, c.occupancy);
    c.cost_us = cost.us;
    c.cost_how = cost.how;
    c.in_flight_bytes = cost.in_flight_total;
  }
  return c;
}

Plan plan_family(const KernelFamily& family, const GemmProblem& problem, const ArchInfo& arch,
                 const KernelResources* resources) {
  Plan plan;
  plan.family = std::string(family.name());
  plan.problem = problem;
  plan.arch = arch.name;
  plan.arch_source = arch.source;
  if (resources != nullptr && resources->source != ResourceSource::kNone) {
    plan.resources_note = fmt::format("registers and static shared memory: {} ({})",
                                      resource_source_name(resources->source), resources->origin);
  } else {
    plan.resources_note = fmt::format(
        "registers unknown ({}): occupancy from shared memory and threads only",
        resources != nullptr && !resources->origin.empty() ? resources->origin : "no resource source given");
  }
  for (const auto& spec : family.candidates(problem)) {
    plan.candidates.push_back(evaluate(family, spec, problem, arch, resources));
  }
  // The cheapest; candidates within kCostTie of it count as equal (the model is not that
  // precise), and among those the one with the most loads in flight wins (it hides
  // latency jitter the model ignores), then the one with less shared memory, then list order.
  double min_cost = 0;
  for (const auto& c : plan.candidates) {
    if (c.feasible && (min_cost == 0 || c.cost_us < min_cost)) min_cost = c.cost_us;
  }
  for (int i = 0; i < static_cast<int>(plan.candidates.size()); ++i) {
    const auto& c = plan.candidates[static_cast<std::size_t>(i)];
    if (!c.feasible || c.cost_us > min_cost * (1.0 + kCostTie)) continue;
    if (plan.chosen >= 0) {
      const auto& best = plan.candidates[static_cast<std::size_t>(plan.chosen)];
      if (c.in_flight_bytes < best.in_flight_bytes) continue;
      if (c.in_flight_bytes == best.in_flight_bytes && c.dynamic_smem_bytes >= best.dynamic_smem_bytes) {
        continue;
      }
    }
    plan.chosen = i;
  }
  return plan;
}

}  // namespace planner

const planner::KernelFamily& find_family(std::string_view family) {
  for (const auto* f : families()) {
    if (f->name() == family) return *f;
  }
  std::string known;
  for (const auto* f : families()) known += std::string(known.empty() ? "" : ", ") + std::string(f->name());
  fail(Errc::kInvalidArgument, "unknown kernel family '{}' (known: {})", family, known);
}

std::vector<std::string> kernel_family_names() {
  std::vector<std::string> names;
  for (const auto* f : families()) names.emplace_back(f->name());
  return names;
}

Plan plan_kernels(std::string_view family, const GemmProblem& problem, const ArchInfo& arch,
                  const KernelResources* resources) {
  return planner::plan_family(find_family(family), problem, arch, resources);
}

KernelExplanation explain_kernel(std::string_view family, std::string_view config, const ArchInfo& arch,
                                 const KernelResources* resources) {
  const auto& f = find_family(family);
  const auto spec = f.parse(config);
  KernelExplanation e;
  e.verdict = planner::judge(f, spec, arch, resources);
  e.smem_terms = f.smem_terms(spec);
  e.limit_bytes = arch.smem_per_block_optin;
  if (e.verdict.feasible) return e;
  // One alternative per launch parameter: the configuration of the same compiled instance that
  // differs from this one in that parameter only, fits, and keeps the most shared memory.
  const auto configs = f.configs();
  for (std::size_t i = 0; i < spec.params.size(); ++i) {
    const planner::CandidateSpec* pick = nullptr;
    for (const auto& other : configs) {
      if (other.resource_key != spec.resource_key || other.params.size() != spec.params.size()) continue;
      bool only_i = other.params[i] != spec.params[i];
      for (std::size_t j = 0; j < spec.params.size() && only_i; ++j)
        only_i = j == i || other.params[j] == spec.params[j];
      if (!only_i || (pick != nullptr && other.dynamic_smem_bytes <= pick->dynamic_smem_bytes)) continue;
      if (planner::judge(f, other, arch, resources).feasible) pick = &other;
    }
    if (pick != nullptr) e.alternatives.push_back(planner::judge(f, *pick, arch, resources));
  }
  return e;
}

std::string KernelExplanation::to_string() const {
  const auto& v = verdict;
  std::string s = fmt::format("{} {}\n", v.family, v.label);
  s += fmt::format("  {:<34}{:<46}{:>10}\n", "shared memory (kernel layout)", "", "bytes");
  for (const auto& t : smem_terms) s += fmt::format("    {:<32}{:<46}{:>10}\n", t.name, t.how, t.bytes);
  s += fmt::format("    {:<78}{:>10}\n", "dynamic shared memory per block", v.dynamic_smem_bytes);
  s += fmt::format("    {:<78}{:>10}\n",
                   fmt::format("static shared memory ({})", resource_source_name(v.registers_source)),
                   v.static_smem_bytes);
  s += fmt::format("  total {} B; limit {} B per block\n", v.dynamic_smem_bytes + v.static_smem_bytes,
                   limit_bytes);
  s += fmt::format(
      "  threads {}, registers {} ({}), blocks per SM {}: by shared memory {}, threads {}, registers {}, "
      "block limit {}\n",
      v.threads, v.registers > 0 ? std::to_string(v.registers) : std::string("unknown"),
      resource_source_name(v.registers_source), v.occupancy.blocks_per_sm, v.occupancy.by_smem,
      v.occupancy.by_threads,
      v.occupancy.by_registers >= 0 ? std::to_string(v.occupancy.by_registers) : std::string("-"),
      v.occupancy.by_block_limit);
  s += v.feasible ? fmt::format("  verdict: FITS ({} B to spare)\n",
                                limit_bytes - v.dynamic_smem_bytes - v.static_smem_bytes)
                  : "  verdict: DOES NOT FIT: " + v.reason + "\n";
  if (!v.feasible && !alternatives.empty()) {
    s += "  fixes that fit (the same compiled instance, one launch parameter changed):\n";
    for (const auto& a : alternatives) {
      s += fmt::format("    {:<16}{:>8} B  {}, {} block(s) per SM\n", a.label,
                       a.dynamic_smem_bytes + a.static_smem_bytes, a.smem_how, a.occupancy.blocks_per_sm);
    }
  }
  return s;
}

std::string KernelExplanation::to_json() const {
  const auto& v = verdict;
  const std::int64_t total = v.dynamic_smem_bytes + v.static_smem_bytes;
  nlohmann::json j;
  j["family"] = v.family;
  j["config"] = v.label;
  j["fits"] = v.feasible;
  j["total_bytes"] = total;
  j["limit_bytes"] = limit_bytes;
  int stages = 0;
  for (const auto& [k, val] : v.params) {
    if (k == "stages") stages = val;
  }
  j["stages"] = stages;
  j["over_by_bytes"] = std::max<std::int64_t>(0, total - limit_bytes);
  j["reason"] = v.feasible ? fmt::format("fits: {} B <= {} B", total, limit_bytes) : v.reason;
  j["threads"] = v.threads;
  j["registers"] = v.registers;
  j["blocks_per_sm"] = v.occupancy.blocks_per_sm;
  auto terms = nlohmann::json::array();
  for (const auto& t : smem_terms) terms.push_back({{"name", t.name}, {"bytes", t.bytes}, {"how", t.how}});
  j["breakdown"] = terms;
  auto alts = nlohmann::json::array();
  for (const auto& a : alternatives) {
    alts.push_back({{"change", a.label},
                    {"total_bytes", a.dynamic_smem_bytes + a.static_smem_bytes},
                    {"fits", a.feasible},
                    {"blocks_per_sm", a.occupancy.blocks_per_sm}});
  }
  j["alternatives"] = alts;
  return j.dump();
}

const CandidateVerdict& Plan::best() const {
  if (ok()) return candidates[static_cast<std::size_t>(chosen)];
  // The refusal names the candidate that came closest: the least shared memory among those that
  // were valid for the problem.
  const CandidateVerdict* closest = nullptr;
  for (const auto& c : candidates) {
    if (closest == nullptr || c.dynamic_smem_bytes < closest->dynamic_smem_bytes) closest = &c;
  }
  if (closest == nullptr) {
    fail(Errc::kDoesNotFit, "plan: {} has no candidate configurations for {} on {}", family,
         problem.to_string(), arch);
  }
  fail(Errc::kDoesNotFit, "plan: no {} config fits {} on {} ({} candidates): the smallest, {}, {}", family,
       problem.to_string(), arch, candidates.size(), closest->label, closest->reason);
}

namespace planner {

nlohmann::json problem_to_json(const GemmProblem& p) {
  return {{"gemm", std::string(gemm_kind_name(p.kind))},
          {"n", p.n},
          {"k", p.k},
          {"experts", p.experts},
          {"top_k", p.top_k},
          {"tokens", p.tokens},
          {"format", std::string(format_name(p.format))},
          {"active_experts", p.active_experts},
          {"tokens_per_expert", p.tokens_per_expert},
          {"shared_pieces", p.shared_pieces}};
}

std::string render_plan(const Plan& plan, int top, int pick, std::string_view chosen_word) {
  const auto& candidates = plan.candidates;
  std::string s = fmt::format("plan: {} for {}\n  on {} ({})\n  {}\n", plan.family, plan.problem.to_string(),
                              plan.arch, plan.arch_source, plan.resources_note);
  s += fmt::format("  {:<16}{:>9}  {:<44}{:>8}{:>6}  {:<22}{:>11}  {}\n", "config", "smem B", "(layout)",
                   "threads", "regs", "blocks/SM (limit)", "est. us", "verdict");
  const auto row = [&](const CandidateVerdict& c, std::string_view verdict) {
    return fmt::format("  {:<16}{:>9}  {:<44}{:>8}{:>6}  {:<22}{:>11}  {}\n", c.label,
                       c.dynamic_smem_bytes + c.static_smem_bytes, c.smem_how, c.threads,
                       c.registers > 0 ? std::to_string(c.registers) : std::string("?"),
                       occupancy_text(c.occupancy),
                       c.feasible ? fmt::format("{:.2f}", c.cost_us) : std::string("-"), verdict);
  };
  std::string rejected;
  std::vector<std::size_t> feasible;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].feasible) {
      feasible.push_back(i);
    } else {
      rejected += fmt::format("    {}: {}\n", candidates[i].label, candidates[i].reason);
    }
  }
  if (top > 0 && static_cast<std::size_t>(top) < feasible.size()) {
    std::stable_sort(feasible.begin(), feasible.end(), [&](std::size_t x, std::size_t y) {
      return candidates[x].cost_us < candidates[y].cost_us;
    });
    feasible.resize(static_cast<std::size_t>(top));
    for (const int keep : {plan.chosen, pick}) {
      if (keep >= 0 &&
          std::find(feasible.begin(), feasible.end(), static_cast<std::size_t>(keep)) == feasible.end()) {
        feasible.push_back(static_cast<std::size_t>(keep));
      }
    }
    std::sort(feasible.begin(), feasible.end());
  }
  for (const auto i : feasible) {
    std::string mark;
    if (static_cast<int>(i) == pick) mark = "PICK";
    if (static_cast<int>(i) == plan.chosen)
      mark += std::string(mark.empty() ? "" : ", ") + std::string(chosen_word);
    s += row(candidates[i], mark.empty() ? "ok" : "ok  <- " + mark);
  }
  if (plan.ok()) {
    const auto& b = plan.best();
    s += fmt::format("  {}: {} ({}): {:.2f} us estimated; {}\n", chosen_word, b.label, params_text(b.params),
                     b.cost_us, b.cost_how);
  } else {
    s += fmt::format("  {}: none: no candidate is feasible on {}\n", chosen_word, plan.arch);
  }
  if (!rejected.empty()) s += "  rejected:\n" + rejected;
  return s;
}

}  // namespace planner

std::string Plan::to_string(int top) const {
  return planner::render_plan(*this, top, -1, "chosen");
}

std::string Plan::to_json() const {
  nlohmann::json j;
  j["family"] = family;
  j["arch"] = arch;
  j["arch_source"] = arch_source;
  j["resources"] = resources_note;
  j["problem"] = planner::problem_to_json(problem);
  auto arr = nlohmann::json::array();
  for (const auto& c : candidates) {
    nlohmann::json p = nlohmann::json::object();
    for (const auto& [k, v] : c.params) p[k] = v;
    arr.push_back({{"label", c.label},
                   {"params", p},
                   {"dynamic_smem_bytes", c.dynamic_smem_bytes},
                   {"static_smem_bytes", c.static_smem_bytes},
                   {"threads", c.threads},
                   {"registers", c.registers},
                   {"registers_source", std::string(resource_source_name(c.registers_source))},
                   {"spill_bytes", c.spill_bytes},
                   {"blocks_per_sm", c.occupancy.blocks_per_sm},
                   {"occupancy_limiter", c.occupancy.limiter},
                   {"feasible", c.feasible},
                   {"reason", c.reason},
                   {"cost_us", c.cost_us},
                   {"cost_how", c.cost_how}});
  }
  j["candidates"] = arr;
  j["chosen"] = ok() ? nlohmann::json(best().label) : nlohmann::json(nullptr);
  return j.dump();
}

}  // namespace fp4moe
