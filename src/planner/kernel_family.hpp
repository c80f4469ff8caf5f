// What a kernel family tells the planner: its candidate configurations, each with the shared
// memory its own constexpr layout gives and its threads, and an estimated time. The planner does
// the rest (resources, occupancy, verdicts, the pick). Adding a family = one class like
// StreamGemmFamily (stream_gemm_plan.cpp) and one line in planner.cpp's family list.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp4moe/arch.hpp"
#include "fp4moe/cutlass_model.hpp"
#include "fp4moe/planner.hpp"

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
};

// Resources, occupancy and the fit verdict of one candidate (no cost).
CandidateVerdict judge(const KernelFamily& family, const CandidateSpec& spec, const ArchInfo& arch,
                       const KernelResources* resources);

// Judges every candidate of `family`: resources, occupancy, fit, cost; picks the cheapest.
Plan plan_family(const KernelFamily& family, const GemmProblem& problem, const ArchInfo& arch,
                 const KernelResources* resources);

const KernelFamily& stream_gemm_family();

}  // namespace fp4moe::planner
