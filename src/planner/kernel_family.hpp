// What a kernel family tells the planner: its candidate configurations, each with the shared
// memory its own constexpr layout gives and its threads, and an estimated time. The planner does
// the rest (resources, occupancy, verdicts, the pick). Adding a family = one class like
// StreamGemmFamily (stream_gemm_plan.cpp) and one line in planner.cpp's family list (and, for the
// layer's decision, GemmChoice's conversion in layer_plan.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fp4moe/arch.hpp"
#include "fp4moe/cutlass_model.hpp"
#include "fp4moe/planner.hpp"
#include "kernels/stream_gemm_layout.hpp"
#include "kernels/tile_gemm_layout.hpp"
#include "kernels/wgmma_gemm_layout.hpp"

namespace fp4moe::planner {

struct CandidateSpec {
  std::string label;  // "m1 n1 s8 w4"
  std::vector<std::pair<std::string, int>> params;
  std::int64_t dynamic_smem_bytes = 0;  // the layout header's number: what the launch asks for
  std::string smem_how;
  int threads = 0;
  // The numbers in the compiled instance's name (its template arguments), to find its registers
  // in KernelResources.
  std::vector<int> resource_key;
  std::string invalid;  // non-empty: the family cannot run this config on this problem (why, with numbers)
};

struct CostEstimate {
  double us = 0;
  std::string how;  // the bound and its numbers
  // Bytes of loads in flight over the whole GPU (busy warps only): among candidates of about
  // the same cost, more hides latency jitter better (the tie-break).
  double in_flight_total = 0;
};

class KernelFamily {
 public:
  virtual ~KernelFamily() = default;
  virtual std::string_view name() const = 0;
  // The kernels' name prefix in the build's resource report ("fp4moe_stream_gemm").
  virtual std::string_view kernel_prefix() const = 0;
  // Every configuration, independent of a problem.
  virtual std::vector<CandidateSpec> configs() const = 0;
  // The configurations for a problem (configs() with the problem's resource key and validity).
  virtual std::vector<CandidateSpec> candidates(const GemmProblem& problem) const = 0;
  // One configuration written as its label ("m1 n1 s8 w4", commas allowed), for `fp4moe explain`.
  // Throws Error naming the text and the expected form.
  virtual CandidateSpec parse(std::string_view config) const = 0;
  // How the layout adds up to dynamic_smem_bytes, term by term.
  virtual std::vector<ByteTerm> smem_terms(const CandidateSpec& spec) const = 0;
  // Only called for feasible candidates (blocks_per_sm >= 1).
  virtual CostEstimate cost(const CandidateSpec& spec, const GemmProblem& problem, const ArchInfo& arch,
                            const Occupancy& occupancy) const = 0;
  // Why the family cannot run on `arch` at all (an instruction it lacks), with the numbers; empty
  // when it can.
  virtual std::string unsupported(const ArchInfo& /*arch*/) const { return {}; }
};

// The prefill families' wave cost model (tile_gemm_plan.cpp; docs/PLANNER.md): items of `rows`
// weight rows x `tokens` tokens on SMs x blocks/SM resident CTAs, each wave bounded by DRAM,
// L2->SM, its ring's latency and its mma work at `tflops`. `extra_dram_bytes` are moved once
// besides the weights, activations and outputs.
struct PrefillShape {
  int rows = 0;
  int tokens = 0;
  int stages = 0;
  int stage_bytes = 0;
  double tflops = 0;
  std::string_view rate_name;  // "mma.sync", "wgmma"
  double extra_dram_bytes = 0;
  std::string_view extra_how;  // what the extra bytes are
};
CostEstimate prefill_cost(const PrefillShape& shape, const GemmProblem& problem, const ArchInfo& arch,
                          const Occupancy& occupancy);

// Resources, occupancy and the fit verdict of one candidate (no cost).
CandidateVerdict judge(const KernelFamily& family, const CandidateSpec& spec, const ArchInfo& arch,
                       const KernelResources* resources);

// The plan's table of candidates (all, or the `top` cheapest feasible ones plus the marked ones),
// each feasible row marked "PICK" when its index is `pick` and `chosen_word` when it is the
// plan's cheapest; then the cheapest with its cost breakdown, then the rejected with reasons.
std::string render_plan(const Plan& plan, int top, int pick, std::string_view chosen_word);
nlohmann::json problem_to_json(const GemmProblem& problem);

// judge() and, when the candidate is feasible, the family's cost estimate.
CandidateVerdict evaluate(const KernelFamily& family, const CandidateSpec& spec, const GemmProblem& problem,
                          const ArchInfo& arch, const KernelResources* resources);

// Judges every candidate of `family`: resources, occupancy, fit, cost; picks the cheapest.
Plan plan_family(const KernelFamily& family, const GemmProblem& problem, const ArchInfo& arch,
                 const KernelResources* resources);

// Reads a config label of `letters.size()` fields, each a letter and a positive number, in that
// order, separated by spaces or commas ("m4 n1 k2 s4 w8"). Throws Error naming the text, the
// expected `form` and `example` of `family`.
std::vector<int> parse_config_fields(std::string_view config, std::string_view letters,
                                     std::string_view family, std::string_view form,
                                     std::string_view example);

const KernelFamily& stream_gemm_family();
const KernelFamily& tile_gemm_family();
const KernelFamily& wgmma_gemm_family();

// The spec of one configuration for a problem (its resource key carries the problem's
// epilogue), whether or not it is among the family's candidates: how the layer's decision
// (layer_plan.cpp) judges a configuration it was handed.
CandidateSpec stream_gemm_spec(const kernels::StreamGemmConfig& config, const GemmProblem& problem);
CandidateSpec tile_gemm_spec(const kernels::TileGemmConfig& config, const GemmProblem& problem);
CandidateSpec wgmma_gemm_spec(const kernels::WgmmaGemmConfig& config, const GemmProblem& problem);

}  // namespace fp4moe::planner
