// The stream GEMM family: candidates, their shared memory from StreamGemmLayout, and the decode
// cost model (docs/PLANNER.md, "Cost model"). The autotuner replaces the cost model with
// measurements; the shared-memory and occupancy verdicts stay.
#include "planner/stream_gemm_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/fail.hpp"
#include "planner/kernel_family.hpp"

namespace fp4moe::planner {
namespace {

using kernels::StreamGemmConfig;
using kernels::StreamGemmLayout;

// NOTE: the kernel's weight layout pads rows to 64-row groups (kernels/weight_layout.hpp) and
// streams K in chunks of StreamGemmLayout::kChunkK, the last one padded.
constexpr std::int64_t kRowGroup = 64;

int param(const CandidateSpec& spec, std::string_view name) {
  for (const auto& [k, v] : spec.params) {
    if (k == name) return v;
  }
  fail(Errc::kInternal, "stream-gemm candidate {} has no parameter {}", spec.label, name);
}

StreamGemmConfig config_of(const CandidateSpec& spec) {
  return {param(spec, "m_tiles"), param(spec, "n_tiles"), param(spec, "stages"), param(spec, "warps")};
}

bool compiled_tile(int m_tiles, int n_tiles) {
  for (const auto& shape : kernels::kStreamTileShapes) {
    if (shape[0] == m_tiles && shape[1] == n_tiles) return true;
  }
  return false;
}

CandidateSpec make_spec(const StreamGemmConfig& c) {
  CandidateSpec s;
  s.label = stream_gemm_label(c);
  s.params = {{"m_tiles", c.m_tiles}, {"n_tiles", c.n_tiles}, {"stages", c.stages}, {"warps", c.warps}};
  s.dynamic_smem_bytes = StreamGemmLayout::cta_bytes(c);
  s.smem_how =
      fmt::format("{} warps x {} stages x {} B", c.warps, c.stages, StreamGemmLayout::stage_bytes(c));
  s.threads = StreamGemmLayout::threads(c);
  s.resource_key = {c.m_tiles, c.n_tiles};
  if (!compiled_tile(c.m_tiles, c.n_tiles)) {
    s.invalid = fmt::format("(m_tiles, n_tiles) = ({}, {}) is not a compiled instance", c.m_tiles, c.n_tiles);
  } else if (!StreamGemmLayout::valid(c)) {
    s.invalid =
        fmt::format("stages={} warps={}: the kernel takes 2..16 stages and 1..8 warps", c.stages, c.warps);
  }
  return s;
}

class StreamGemmFamily final : public KernelFamily {
 public:
  std::string_view name() const override { return "stream-gemm"; }
  std::string_view kernel_prefix() const override { return "fp4moe_stream_gemm"; }

  std::vector<CandidateSpec> configs() const override {
    std::vector<CandidateSpec> specs;
    for (const auto& c : stream_gemm_candidates()) specs.push_back(make_spec(c));
    return specs;
  }

  std::vector<CandidateSpec> candidates(const GemmProblem& problem) const override {
    std::vector<CandidateSpec> specs;
    for (const auto& c : stream_gemm_candidates()) specs.push_back(stream_gemm_spec(c, problem));
    return specs;
  }

  CandidateSpec parse(std::string_view config) const override {
    const auto v = parse_config_fields(config, "mnsw", "stream-gemm",
                                       "m<m_tiles> n<n_tiles> s<stages> w<warps>", "m4 n1 s4 w8");
    return make_spec({v[0], v[1], v[2], v[3]});
  }

  std::vector<ByteTerm> smem_terms(const CandidateSpec& spec) const override {
    const auto c = config_of(spec);
    const int raw = StreamGemmLayout::act_offset(c) + c.n_tiles * StreamGemmLayout::kActTileBytes;
    const int stage = StreamGemmLayout::stage_bytes(c);
    return {
        {"weights", c.m_tiles * StreamGemmLayout::kWeightTileBytes,
         fmt::format("{} x {} B (16 rows x 64 values x 4 bit)", c.m_tiles,
                     StreamGemmLayout::kWeightTileBytes)},
        {"scales", c.m_tiles * StreamGemmLayout::kScaleTileBytes,
         fmt::format("{} x {} B (16 rows x 4 blocks)", c.m_tiles, StreamGemmLayout::kScaleTileBytes)},
        {"activations", c.n_tiles * StreamGemmLayout::kActTileBytes,
         fmt::format("{} x {} B (8 tokens x 64 values x bf16)", c.n_tiles, StreamGemmLayout::kActTileBytes)},
        {fmt::format("round up to {}", StreamGemmLayout::kStageAlign), stage - raw, "stage alignment", true},
        {"the ring's other stages", static_cast<std::int64_t>(StreamGemmLayout::warp_bytes(c)) - stage,
         fmt::format("{} x {} B (a ring of {} per warp)", c.stages - 1, stage, c.stages)},
        {"the other warps' rings", StreamGemmLayout::cta_bytes(c) - StreamGemmLayout::warp_bytes(c),
         fmt::format("{} x {} B ({} warps)", c.warps - 1, StreamGemmLayout::warp_bytes(c), c.warps)},
    };
  }

  CostEstimate cost(const CandidateSpec& spec, const GemmProblem& p, const ArchInfo& arch,
                    const Occupancy& occupancy) const override {
    const auto c = config_of(spec);
    const double rows = static_cast<double>((p.n + kRowGroup - 1) / kRowGroup * kRowGroup);
    const double chunks = std::ceil(static_cast<double>(p.k) / StreamGemmLayout::kChunkK);
    const double row_blocks = rows / (16.0 * c.m_tiles);
    const double blocks_per_expert = std::ceil(p.tokens_per_expert / (8.0 * c.n_tiles));
    const double items = std::max(1.0, std::ceil(p.active_experts * blocks_per_expert * row_blocks));
    // Bytes one work item streams, per 64-value chunk of K: its weight rows and scales, and its
    // real tokens' activations (padding rows of a token block are not loaded).
    const double weight_chunk =
        c.m_tiles * (StreamGemmLayout::kWeightTileBytes + StreamGemmLayout::kScaleTileBytes);
    const double act_chunk = p.tokens_per_expert / blocks_per_expert * StreamGemmLayout::kChunkK * 2.0;
    const double l2_item = (weight_chunk + act_chunk) * chunks;
    // DRAM: every active expert's weights once (further token blocks re-read them from L2), the
    // activations once, the outputs once: gate_up writes SwiGLU(gate, up) in bf16 (N/2 values per
    // slot), down writes fp32.
    const double slots = static_cast<double>(p.tokens * p.top_k);
    const double out_bytes = p.kind == GemmKind::kGateUp ? slots * (p.n / 2.0) * 2.0 : slots * p.n * 4.0;
    const double dram = p.active_experts * row_blocks * weight_chunk * chunks + slots * p.k * 2.0 + out_bytes;
    // Every mma of an item runs, padding tokens of its token tiles included.
    const double item_flops = 2.0 * 16.0 * c.m_tiles * 8.0 * c.n_tiles * chunks * StreamGemmLayout::kChunkK;
    // The kernel splits the items x chunks units evenly over every resident warp
    // (kernels::StreamSplit), so the launch takes the longest of: its DRAM bytes, its L2->SM bytes
    // (with the fp32 partials of the items cut between warps, written and read back), one warp's
    // share of units at the latency-bound rate of one warp (its ring in
    // flight per memory latency), and its mma work at the SMs' mma.sync rate.
    const double warps =
        std::max(1.0, static_cast<double>(arch.sm_count) * occupancy.blocks_per_sm * c.warps);
    const double units = items * chunks;
    const double busy = std::min(warps, units);
    const double warp_units = std::ceil(units / busy);
    const double unit_bytes = weight_chunk + act_chunk;
    const double in_flight = c.stages * unit_bytes;
    // Each warp boundary inside an item cuts it: both warps write a partial, the last reads.
    const auto split =
        kernels::StreamSplit::of(static_cast<std::int64_t>(std::llround(items)),
                                 static_cast<std::int64_t>(chunks), static_cast<std::int64_t>(warps));
    std::int64_t cuts = 0;
    for (std::int64_t w = 1; w < split.warps; ++w) cuts += split.begin(w) % split.chunks != 0 ? 1 : 0;
    const double partials =
        static_cast<double>(cuts) * 2.0 * StreamGemmLayout::partial_bytes(c.m_tiles, c.n_tiles) * 2.0;
    const double t_dram = dram / (arch.dram_bandwidth_gbs * 1e3);  // bytes / (GB/s) in us
    const double t_l2 = (items * l2_item + partials) / (arch.l2_bandwidth_gbs * 1e3);
    const double t_latency = warp_units * unit_bytes * arch.memory_latency_ns * 1e-3 / in_flight;
    const double t_compute =
        items * item_flops / (arch.mma_sync_bf16_tflops * 1e6);  // FLOPs / (TFLOP/s) in us
    const double t = std::max({t_dram, t_l2, t_latency, t_compute});
    const char* bound = t == t_dram ? "DRAM" : t == t_l2 ? "L2" : t == t_latency ? "latency" : "compute";
    CostEstimate e;
    e.us = t;
    e.how = fmt::format(
        "{}-bound: {:.0f} items x {:.0f} chunks on {:.0f} warps ({:.0f} chunks each, {} items cut); DRAM "
        "{:.2f} us, L2->SM {:.2f} us, latency {:.2f} us ({:.0f} B in flight per warp), mma {:.2f} us; {:.2f} "
        "MB from DRAM at {:.0f} GB/s",
        bound, items, chunks, busy, warp_units, cuts, t_dram, t_l2, t_latency, in_flight, t_compute,
        dram / 1e6, arch.dram_bandwidth_gbs);
    e.in_flight_total = in_flight * busy;
    return e;
  }
};

}  // namespace

std::vector<StreamGemmConfig> stream_gemm_candidates() {
  std::vector<StreamGemmConfig> out;
  for (const auto& shape : kernels::kStreamTileShapes) {
    for (int warps : kStreamGemmWarps) {
      for (int stages : kStreamGemmStages) {
        const StreamGemmConfig c{shape[0], shape[1], stages, warps};
        if (StreamGemmLayout::valid(c)) out.push_back(c);
      }
    }
  }
  return out;
}

std::string stream_gemm_label(const StreamGemmConfig& c) {
  return fmt::format("m{} n{} s{} w{}", c.m_tiles, c.n_tiles, c.stages, c.warps);
}

std::string stream_gemm_kernel_key(int m_tiles, int n_tiles, int epilogue) {
  return fmt::format("fp4moe_stream_gemm<{}, {}, {}>", m_tiles, n_tiles, epilogue);
}

int stream_gemm_epilogue(const GemmProblem& problem) {
  if (problem.kind == GemmKind::kDown) return 2;
  return problem.activation == Activation::kSwiGLUClamped ? 1 : 0;
}

CandidateSpec stream_gemm_spec(const StreamGemmConfig& config, const GemmProblem& problem) {
  CandidateSpec s = make_spec(config);
  s.resource_key.push_back(stream_gemm_epilogue(problem));
  return s;
}

const KernelFamily& stream_gemm_family() {
  static const StreamGemmFamily family;
  return family;
}

StreamGemmPlan plan_stream_gemm(const LayerDesc& layer, std::int64_t tokens, GemmKind which,
                                const ArchInfo& arch, const KernelResources* measured) {
  const GemmProblem problem = make_gemm_problem(layer, tokens, which);
  const KernelResources* resources = measured != nullptr ? measured : &build_resources();
  StreamGemmPlan out;
  out.plan = plan_family(stream_gemm_family(), problem, arch, resources);
  if (out.plan.ok()) out.config = stream_gemm_candidates()[static_cast<std::size_t>(out.plan.chosen)];
  return out;
}

}  // namespace fp4moe::planner
