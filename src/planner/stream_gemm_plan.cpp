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
  return {param(spec, "m_tiles"), param(spec, "n_tiles"), param(spec, "stages"), param(spec, "warps"),
          param(spec, "k_split")};
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
  s.params = {{"m_tiles", c.m_tiles},
              {"n_tiles", c.n_tiles},
              {"k_split", c.k_split},
              {"stages", c.stages},
              {"warps", c.warps}};
  s.dynamic_smem_bytes = StreamGemmLayout::cta_bytes(c);
  s.smem_how =
      fmt::format("{} warps x {} stages x {} B", c.warps, c.stages, StreamGemmLayout::stage_bytes(c));
  if (c.k_split > 1)
    s.smem_how += fmt::format(" + {} x {} B", c.warps, StreamGemmLayout::partial_bytes_per_warp(c));
  s.threads = StreamGemmLayout::threads(c);
  s.resource_key = {c.m_tiles, c.n_tiles};
  if (!compiled_tile(c.m_tiles, c.n_tiles)) {
    s.invalid = fmt::format("(m_tiles, n_tiles) = ({}, {}) is not a compiled instance", c.m_tiles, c.n_tiles);
  } else if (!StreamGemmLayout::valid(c)) {
    s.invalid = fmt::format(
        "stages={} warps={} k_split={}: the kernel takes 2..16 stages, 1..16 warps (1..8 with 4 "
        "token tiles) and a K split of 1, 2, 3, 4 or 8 that divides the warps",
        c.stages, c.warps, c.k_split);
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
    const auto v =
        parse_config_fields(config, "mnksw", "stream-gemm",
                            "m<m_tiles> n<n_tiles> k<k_split> s<stages> w<warps>", "m4 n1 k2 s4 w8");
    return make_spec({v[0], v[1], v[3], v[4], v[2]});
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
        {"the other warps' rings", StreamGemmLayout::reduction_offset(c) - StreamGemmLayout::warp_bytes(c),
         fmt::format("{} x {} B ({} warps)", c.warps - 1, StreamGemmLayout::warp_bytes(c), c.warps)},
        {"K-split reduction area", StreamGemmLayout::cta_bytes(c) - StreamGemmLayout::reduction_offset(c),
         fmt::format("{} warps x {} B (fp32 partials when K is split)", c.warps,
                     StreamGemmLayout::partial_bytes_per_warp(c))},
    };
  }

  CostEstimate cost(const CandidateSpec& spec, const GemmProblem& p, const ArchInfo& arch,
                    const Occupancy& occupancy) const override {
    const auto c = config_of(spec);
    const double rows = static_cast<double>((p.n + kRowGroup - 1) / kRowGroup * kRowGroup);
    const double chunks = std::ceil(static_cast<double>(p.k) / StreamGemmLayout::kChunkK);
    const double row_blocks = rows / (16.0 * c.m_tiles);
    const double blocks_per_expert = std::ceil(p.tokens_per_expert / (8.0 * c.n_tiles));
    // The shared expert's pieces take every token: their token blocks add items of their own.
    const double shared = static_cast<double>(p.shared_pieces);
    const double shared_blocks = shared * std::ceil(static_cast<double>(p.tokens) / (8.0 * c.n_tiles));
    const double items =
        std::max(1.0, std::ceil((p.active_experts * blocks_per_expert + shared_blocks) * row_blocks));
    // Bytes one work item streams, per 64-value chunk of K: its weight rows and scales, and its
    // real tokens' activations (padding rows of a token block are not loaded).
    const double weight_chunk =
        c.m_tiles * (StreamGemmLayout::kWeightTileBytes + StreamGemmLayout::kScaleTileBytes);
    const double act_chunk = p.tokens_per_expert / blocks_per_expert * StreamGemmLayout::kChunkK * 2.0;
    const double l2_item = (weight_chunk + act_chunk) * chunks;
    // DRAM: every active expert's weights once (further token blocks re-read them from L2), the
    // activations once, the outputs once: gate_up writes SwiGLU(gate, up) in bf16 (N/2 values per
    // slot), down writes bf16.
    const double slots = static_cast<double>(p.tokens) * static_cast<double>(p.top_k + p.shared_pieces);
    const double out_bytes = p.kind == GemmKind::kGateUp ? slots * (p.n / 2.0) * 2.0 : slots * p.n * 2.0;
    const double dram =
        (p.active_experts + shared) * row_blocks * weight_chunk * chunks + slots * p.k * 2.0 + out_bytes;
    const double dram_item = dram / items;
    // Every mma of an item runs, padding tokens of its token tiles included.
    const double item_flops = 2.0 * 16.0 * c.m_tiles * 8.0 * c.n_tiles * chunks * StreamGemmLayout::kChunkK;
    // Work items go round-robin to every resident group of k_split warps; each warp of a group
    // streams its share of the item's chunks. A round with b busy groups takes the longest of its
    // DRAM bytes, its L2->SM bytes, one warp's share at the latency-bound rate of one warp (its
    // ring in flight per memory latency), and its mma work at the SMs' mma.sync rate (b groups
    // spread over the SMs, ceil(b / SMs) on the busiest).
    const double groups =
        static_cast<double>(arch.sm_count) * occupancy.blocks_per_sm * (c.warps / c.k_split);
    const double warp_chunks = std::ceil(chunks / c.k_split);
    const double in_flight = c.stages * (weight_chunk + act_chunk);
    struct Round {
      double t_dram, t_l2, t_latency, t_compute, t;
    };
    const auto round = [&](double busy) {
      Round r{};
      r.t_dram = busy * dram_item / (arch.dram_bandwidth_gbs * 1e3);  // bytes / (GB/s) in us
      r.t_l2 = busy * l2_item / (arch.l2_bandwidth_gbs * 1e3);
      r.t_latency = warp_chunks * (weight_chunk + act_chunk) * arch.memory_latency_ns * 1e-3 / in_flight;
      r.t_compute = std::ceil(busy / arch.sm_count) * arch.sm_count * item_flops /
                    (arch.mma_sync_bf16_tflops * 1e6);  // FLOPs / (TFLOP/s) in us
      r.t = std::max({r.t_dram, r.t_l2, r.t_latency, r.t_compute});
      return r;
    };
    const double full_rounds = std::floor(items / groups);
    const double rest = items - full_rounds * groups;
    const Round first = round(full_rounds > 0 ? groups : rest);
    const double t = full_rounds * round(groups).t + (rest > 0 ? round(rest).t : 0.0);
    const char* bound = first.t == first.t_dram      ? "DRAM"
                        : first.t == first.t_l2      ? "L2"
                        : first.t == first.t_latency ? "latency"
                                                     : "compute";
    CostEstimate e;
    e.us = t;
    e.how = fmt::format(
        "{}-bound: {:.0f} items on {:.0f} groups of {} warp(s) ({:.0f} full round(s) + {:.0f} items); a "
        "round: DRAM {:.2f} us, L2->SM {:.2f} us, latency {:.2f} us ({:.0f} B in flight per warp), mma "
        "{:.2f} us; {:.2f} MB from DRAM at {:.0f} GB/s",
        bound, items, groups, c.k_split, full_rounds, rest, first.t_dram, first.t_l2, first.t_latency,
        in_flight, first.t_compute, dram / 1e6, arch.dram_bandwidth_gbs);
    e.in_flight_total = in_flight * std::min(items, groups) * std::min<double>(c.k_split, chunks);
    return e;
  }
};

}  // namespace

std::vector<StreamGemmConfig> stream_gemm_candidates() {
  std::vector<StreamGemmConfig> out;
  for (const auto& shape : kernels::kStreamTileShapes) {
    for (int warps : kStreamGemmWarps) {
      for (int k_split : kStreamGemmKSplits) {
        for (int stages : kStreamGemmStages) {
          const StreamGemmConfig c{shape[0], shape[1], stages, warps, k_split};
          // 15 warps only as five groups of a 3-way split (the dispatcher's use of it).
          if (StreamGemmLayout::valid(c) && (warps == 15) == (k_split == 3)) out.push_back(c);
        }
      }
    }
  }
  return out;
}

std::string stream_gemm_label(const StreamGemmConfig& c) {
  return fmt::format("m{} n{} k{} s{} w{}", c.m_tiles, c.n_tiles, c.k_split, c.stages, c.warps);
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
