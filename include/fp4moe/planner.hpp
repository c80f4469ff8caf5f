// fp4moe: the planner for fp4moe's own kernels. Desc -> Plan -> Launch: a layer, a token count and
// an architecture go in; out comes every candidate configuration of a kernel family with its
// shared memory (from the kernel's own constexpr layout, so plan == launch by construction),
// threads, registers, occupancy, estimated time and verdict, and the one it picks. Nothing is
// launched that the plan did not accept; a refusal names the numbers.
//
// The GPU layer gets the typed configuration (e.g. kernels::StreamGemmConfig) from the family's
// internal header (src/planner/stream_gemm_plan.hpp); this header is what every caller, the CLI
// included, can use without the kernels' headers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp4moe/arch.hpp"
#include "fp4moe/cutlass_model.hpp"
#include "fp4moe/formats.hpp"
#include "fp4moe/layer.hpp"
#include "fp4moe/moe_layer.hpp"

namespace fp4moe {

enum class GemmKind : std::uint8_t {
  kGateUp,  // gate and up projections as one GEMM: weights [2I, H], K = H
  kDown,    // down projection: weights [H, I], K = I
};
std::string_view gemm_kind_name(GemmKind kind) noexcept;  // "gate_up", "down"
GemmKind parse_gemm_kind(std::string_view name);          // throws Error naming the value

// One grouped GEMM of a MoE layer at a token count, with the expected routing statistics.
struct GemmProblem {
  GemmKind kind = GemmKind::kGateUp;
  std::int64_t n = 0;  // weight rows per expert
  std::int64_t k = 0;  // reduction length
  std::int64_t experts = 0;
  std::int64_t top_k = 0;
  std::int64_t tokens = 0;
  WeightFormat format = WeightFormat::kNvfp4;
  Activation activation = Activation::kSwiGLU;  // the gate_up GEMM's fused activation
  // With T tokens each picking k of E experts uniformly: E * (1 - (1 - k/E)^T) experts get at
  // least one token, and each of those gets T*k / active tokens on average.
  double active_experts = 0;
  double tokens_per_expert = 0;
  // The shared expert's pieces (LayerDesc::shared_intermediate in slices of intermediate), each a
  // pseudo-expert that every one of the T tokens goes to: more items and weights for both GEMMs.
  std::int64_t shared_pieces = 0;

  // "gate_up N=4096 K=6144, 256 experts top-8, 16 tokens: 106.9 active experts x 1.20 tokens"
  std::string to_string() const;
};
// Throws Error naming the first bad value (LayerDesc::validate's rules, then tokens >= 1).
GemmProblem make_gemm_problem(const LayerDesc& layer, std::int64_t tokens, GemmKind kind);

// ---- registers and static shared memory of compiled kernels ----------------------------------

enum class ResourceSource : std::uint8_t {
  kNone,         // nothing known: occupancy from shared memory and threads only
  kMeasured,     // cudaFuncGetAttributes on the device (filled by the GPU layer)
  kBuildReport,  // ptxas --resource-usage at build time (cmake/ResourceReport.cmake)
};
std::string_view resource_source_name(ResourceSource source) noexcept;

struct KernelResourceUsage {
  std::string kernel;  // demangled name, or a family key such as "fp4moe_stream_gemm_m1_n1_s8_w8"
  int sm = 0;          // architecture the numbers are for (120 for sm_120a)
  int registers = 0;   // per thread
  std::int64_t static_smem_bytes = 0;
  std::int64_t spill_bytes = 0;  // spill stores + spill loads
};

struct KernelResources {
  ResourceSource source = ResourceSource::kNone;
  std::string origin;  // the report's path, or "cudaFuncGetAttributes on device 0"
  std::vector<KernelResourceUsage> kernels;

  // An entry for `sm` whose name holds `prefix` and whose numbers after it begin with `params`;
  // with several, the one with the most registers (the conservative one). A name's numbers are
  // the integers written as words of their own, optionally after one letter: "fp4moe_stream_gemm_m1_n2",
  // "fp4moe_stream_gemm<1, 2, (StreamEpilogue)0>(StreamGemmArgs, int)" and
  // "fp4moe_stream_gemm<Config{1, 2}>" all begin with {1, 2}. nullptr if none.
  const KernelResourceUsage* find(std::string_view prefix, const std::vector<int>& params, int sm) const;
};

// Reads the JSON the build writes ({"kernels": [{"name", "arch", "registers", "static_smem_bytes",
// "spill_store_bytes", "spill_load_bytes"}]}). Throws Error (kIo or kBadFile) naming the path and
// the offending field.
KernelResources load_resource_report(const std::string& path);
// The report this build writes (compiled in); empty when the build has none.
std::string default_resource_report_path();
// The build's report, read once per process: kBuildReport with its entries, or kNone with the
// reason in `origin` when this build has no report or the file is missing. Throws Error
// (kBadFile) when the file exists but is malformed.
const KernelResources& build_resources();

// ---- occupancy ------------------------------------------------------------------------------

struct Occupancy {
  int blocks_per_sm = 0;
  int by_smem = 0;
  int by_threads = 0;
  int by_registers = -1;  // -1: registers unknown
  int by_block_limit = 0;
  std::string limiter;  // "shared memory", "threads", "registers" or "blocks per SM"
};
// Blocks per SM as the CUDA occupancy calculator counts them: shared memory per SM over
// (smem + the 1 KB reserved per block), warps per SM over warps per block, registers per SM over
// registers per block (per warp rounded up to the allocation unit), and the block limit.
// registers_per_thread = 0 means unknown (not a limit).
Occupancy occupancy(const ArchInfo& arch, std::int64_t smem_per_block, int threads, int registers_per_thread);

// ---- plans ----------------------------------------------------------------------------------

struct CandidateVerdict {
  std::string family;  // "stream-gemm"
  std::string label;   // "m1 n1 s8 w4"
  std::vector<std::pair<std::string, int>> params;
  std::int64_t dynamic_smem_bytes = 0;  // from the kernel's constexpr layout
  std::string smem_how;                 // "4 warps x 8 stages x 1664 B"
  std::int64_t static_smem_bytes = 0;   // from the resources, 0 if unknown
  int threads = 0;
  int registers = 0;  // per thread; 0 if unknown
  std::int64_t spill_bytes = 0;
  ResourceSource registers_source = ResourceSource::kNone;
  Occupancy occupancy;
  bool feasible = false;
  std::string reason;  // why not, with the numbers; empty when feasible
  double cost_us = 0;  // the cost model's estimate (0 when infeasible)
  std::string cost_how;
  double in_flight_bytes = 0;  // loads in flight on the whole GPU (the tie-break between equal costs)
};

struct Plan {
  std::string family;
  GemmProblem problem;
  std::string arch;         // "sm_120"
  std::string arch_source;  // "table" or "device 0 (...)"
  std::string resources_note;
  std::vector<CandidateVerdict> candidates;
  int chosen = -1;  // index into candidates, -1 when nothing is feasible

  bool ok() const noexcept { return chosen >= 0; }
  // The chosen candidate; throws Error (kDoesNotFit) with the numbers of the closest candidate
  // when none is feasible.
  const CandidateVerdict& best() const;
  // Table of the feasible candidates (all, or the `top` cheapest), the pick and why, and the
  // rejected with their reasons.
  std::string to_string(int top = 0) const;
  std::string to_json() const;
};

// One configuration of one of fp4moe's kernel families, explained: how its layout adds up, and
// its fit and occupancy on an architecture (no cost: that needs a problem, see plan_kernels).
struct KernelExplanation {
  CandidateVerdict verdict;
  std::vector<ByteTerm> smem_terms;
  std::int64_t limit_bytes = 0;
  // When it does not fit: for each launch parameter, the configuration of the same compiled
  // instance that differs in that parameter only, fits, and keeps the most shared memory
  // (e.g. fewer stages; fewer warps).
  std::vector<CandidateVerdict> alternatives;
  std::string to_string() const;
  std::string to_json()
      const;  // fits, total_bytes, limit_bytes, stages, over_by_bytes, reason, alternatives[]
};
// `config` is the family's label, e.g. "m1 n1 s8 w4" (commas allowed). Throws Error for an
// unknown family or a malformed config.
KernelExplanation explain_kernel(std::string_view family, std::string_view config, const ArchInfo& arch,
                                 const KernelResources* resources = nullptr);

// The kernel families the planner knows ("stream-gemm", "tile-gemm", "wgmma-gemm").
std::vector<std::string> kernel_family_names();
// Every candidate of the family, judged on `arch` for `problem`. Throws Error naming the family
// when it is unknown.
Plan plan_kernels(std::string_view family, const GemmProblem& problem, const ArchInfo& arch,
                  const KernelResources* resources = nullptr);

// ---- the layer's decision: which kernel and configuration one GEMM runs ----------------------

enum class PickSource : std::uint8_t {
  kForced,      // MoeLayerOptions::gemm1 / gemm2
  kTuned,       // the tune cache: measured fastest on this GPU (docs/TUNING.md)
  kDispatcher,  // gpu::choose_gemm's heuristics (tuned on an H200): the default
  kCheapest,    // the planner's cheapest feasible candidate (the dispatcher's was rejected)
};
// "forced by the caller", "tuned on this GPU", "picked by the dispatcher", "the planner's
// cheapest feasible candidate".
std::string_view pick_source_name(PickSource source) noexcept;

// A configuration handed to the decision ahead of the dispatcher.
struct GemmPreference {
  GemmChoice choice;
  PickSource source = PickSource::kTuned;  // kForced or kTuned
  std::string origin;                      // "MoeLayerOptions::gemm1", "tune cache /x/tune.json, bucket 16"
};

struct LayerGemmPick {
  GemmProblem problem;
  GemmChoice choice;         // what runs
  CandidateVerdict verdict;  // the planner's verdict on it (feasible) with its cost estimate
  PickSource source = PickSource::kDispatcher;
  std::string why;  // pick_source_name(source), then why anything ahead of it was passed over

  // "stream-gemm m4 n1 k2 s3 w8 (picked by the dispatcher)"
  std::string to_string() const;
};

// The one decision procedure: the layer (MoeLayer) runs exactly this pick, `fp4moe plan` prints it.
//   1. `preference`, if the planner accepts it on `arch`. A rejected kForced preference throws
//      Error naming the planner's reason (kInvalidArgument for a shape the kernel does not take or
//      that is not compiled, kUnsupported for a kernel the architecture cannot run (wgmma off
//      sm_90), kDoesNotFit for the device's limits); a rejected kTuned one is passed over, with
//      the reason in `why`.
//   2. gpu::choose_gemm's configuration (the dispatcher), if the planner accepts it.
//   3. the planner's cheapest feasible candidate over every family, saying why the dispatcher's
//      was passed over.
// Throws Error (kDoesNotFit) with the numbers when no candidate is feasible.
LayerGemmPick pick_layer_gemm(const LayerDesc& layer, std::int64_t tokens, GemmKind which,
                              const ArchInfo& arch, const KernelResources* resources = nullptr,
                              const std::optional<GemmPreference>& preference = std::nullopt);

// The pick and every family's candidates with their verdicts and estimates (the pick is listed
// in its family's plan, appended when it is not one of the family's candidates).
struct LayerGemmPlan {
  std::vector<Plan> plans;  // one per family, in kernel_family_names() order
  bool ok = false;
  LayerGemmPick pick;   // meaningful when ok
  std::string refusal;  // when not ok: why nothing can run, with the numbers
  // The launches a forward makes after the pick's own (a wgmma pick's tail launches and the
  // small-expert launch, docs/KERNELS.md), one line each; empty for the other kernels.
  std::vector<std::string> then;
  // The pick first, then each family's table (the pick and each family's cheapest estimate marked)
  // and its rejected candidates; `top` > 0 keeps the `top` cheapest feasible rows per family.
  std::string to_string(int top = 0) const;
  std::string to_json() const;  // {"problem", "pick": {family, label, kernel, params, source, why, cost_us} |
                                // null, "then": [...], "refusal", "plans": [...]}
};
// Never throws for an infeasible problem (see `ok`); throws like pick_layer_gemm for a rejected
// forced preference and for bad input.
LayerGemmPlan plan_layer_gemm(const LayerDesc& layer, std::int64_t tokens, GemmKind which,
                              const ArchInfo& arch, const KernelResources* resources = nullptr,
                              const std::optional<GemmPreference>& preference = std::nullopt);

// The family name ("stream-gemm", "tile-gemm", "wgmma-gemm") and planner label ("m4 n1 k2 s3 w8") of a
// GemmChoice, and back: choice_of_candidate reads a verdict's params (throws Error for a family
// the layer cannot run).
std::string_view gemm_family_name(GemmKernel kernel) noexcept;
// "stream", "tile", "wgmma": the kernel's name in JSON (plan --json, the tune cache).
std::string_view gemm_kernel_name(GemmKernel kernel) noexcept;
std::string gemm_choice_label(const GemmChoice& choice);
GemmChoice choice_of_candidate(const CandidateVerdict& candidate);

// The architecture as this build runs it: `wgmma` off (with a note) when the build compiled no
// sm_90a image (cuda_architectures()). For planning the local GPU; a named architecture is planned
// as a build with every image would run it.
ArchInfo arch_for_this_build(ArchInfo arch);

}  // namespace fp4moe
