// The tile GEMM family: candidates, their shared memory from TileGemmLayout, and the prefill
// cost model it shares with the wgmma family (docs/PLANNER.md, "The prefill families' cost
// model"): the longest of the DRAM bytes, the L2->SM bytes, the ring's latency and the mma work
// at the architecture's estimated rate, wave by wave. The tuner replaces the model with
// measurements; the shared-memory and occupancy verdicts stay.
#include "planner/tile_gemm_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/fail.hpp"
#include "planner/kernel_family.hpp"
#include "planner/stream_gemm_plan.hpp"

namespace fp4moe::planner {
namespace {

using kernels::TileGemmConfig;
using kernels::TileGemmLayout;

// NOTE: the weight layout pads rows to 64-row groups and K to chunks of 64 (weight_layout.hpp);
// one (group, chunk) block is 2304 B.
constexpr std::int64_t kRowGroup = 64;
constexpr int kChunkK = 64;

int param(const CandidateSpec& spec, std::string_view name) {
  for (const auto& [k, v] : spec.params) {
    if (k == name) return v;
  }
  fail(Errc::kInternal, "tile-gemm candidate {} has no parameter {}", spec.label, name);
}

TileGemmConfig config_of(const CandidateSpec& spec) {
  return {param(spec, "m_tiles"), param(spec, "n_tiles"), param(spec, "warps"), param(spec, "stages")};
}

bool compiled_tile(int m_tiles, int n_tiles) {
  for (const auto& shape : kernels::kTileShapes) {
    if (shape[0] == m_tiles && shape[1] == n_tiles) return true;
  }
  return false;
}

CandidateSpec make_spec(const TileGemmConfig& c) {
  CandidateSpec s;
  s.label = tile_gemm_label(c);
  s.params = {{"m_tiles", c.m_tiles}, {"n_tiles", c.n_tiles}, {"stages", c.stages}, {"warps", c.warps}};
  s.dynamic_smem_bytes = TileGemmLayout::cta_bytes(c);
  s.smem_how = fmt::format("{} stages x {} B", c.stages, TileGemmLayout::stage_bytes(c));
  s.threads = TileGemmLayout::threads(c);
  s.resource_key = {c.m_tiles, c.n_tiles};
  if (!compiled_tile(c.m_tiles, c.n_tiles)) {
    s.invalid = fmt::format("(m_tiles, n_tiles) = ({}, {}) is not a compiled instance", c.m_tiles, c.n_tiles);
  } else if (!TileGemmLayout::valid(c)) {
    s.invalid = fmt::format("stages={} warps={}: the kernel takes 2..8 stages and exactly {} warps", c.stages,
                            c.warps, TileGemmLayout::kWarps);
  }
  return s;
}

class TileGemmFamily final : public KernelFamily {
 public:
  std::string_view name() const override { return "tile-gemm"; }
  std::string_view kernel_prefix() const override { return "fp4moe_tile_gemm"; }

  std::vector<CandidateSpec> configs() const override {
    std::vector<CandidateSpec> specs;
    for (const auto& c : tile_gemm_candidates()) specs.push_back(make_spec(c));
    return specs;
  }

  std::vector<CandidateSpec> candidates(const GemmProblem& problem) const override {
    std::vector<CandidateSpec> specs;
    for (const auto& c : tile_gemm_candidates()) specs.push_back(tile_gemm_spec(c, problem));
    return specs;
  }

  CandidateSpec parse(std::string_view config) const override {
    const auto v = parse_config_fields(config, "mnsw", "tile-gemm",
                                       "m<m_tiles> n<n_tiles> s<stages> w<warps>", "m2 n8 s4 w8");
    return make_spec({v[0], v[1], v[3], v[2]});
  }

  std::vector<ByteTerm> smem_terms(const CandidateSpec& spec) const override {
    const auto c = config_of(spec);
    const int raw = TileGemmLayout::act_offset(c) + TileGemmLayout::tokens(c) * TileGemmLayout::kActRowBytes;
    const int stage = TileGemmLayout::stage_bytes(c);
    return {
        {"weights and scales", TileGemmLayout::act_offset(c),
         fmt::format("{} x {} B ({} rows: {} warps x {} x 16, in 64-row groups)", TileGemmLayout::groups(c),
                     TileGemmLayout::kBlockBytes, TileGemmLayout::rows(c), c.warps, c.m_tiles)},
        {"activations", TileGemmLayout::tokens(c) * TileGemmLayout::kActRowBytes,
         fmt::format("{} x {} B ({} tokens x 64 values x bf16)", TileGemmLayout::tokens(c),
                     TileGemmLayout::kActRowBytes, TileGemmLayout::tokens(c))},
        {fmt::format("round up to {}", TileGemmLayout::kStageAlign), stage - raw, "stage alignment", true},
        {"the ring's other stages", TileGemmLayout::cta_bytes(c) - stage,
         fmt::format("{} x {} B (a CTA-wide ring of {})", c.stages - 1, stage, c.stages)},
    };
  }

  CostEstimate cost(const CandidateSpec& spec, const GemmProblem& p, const ArchInfo& arch,
                    const Occupancy& occupancy) const override {
    const auto c = config_of(spec);
    return prefill_cost({TileGemmLayout::rows(c), TileGemmLayout::tokens(c), c.stages,
                         TileGemmLayout::stage_bytes(c), arch.mma_sync_bf16_tflops, "mma.sync", 0, ""},
                        p, arch, occupancy);
  }
};

}  // namespace

CostEstimate prefill_cost(const PrefillShape& shape, const GemmProblem& p, const ArchInfo& arch,
                          const Occupancy& occupancy) {
  const double rows = shape.rows;
  const double tokens = shape.tokens;
  const double groups = static_cast<double>((p.n + kRowGroup - 1) / kRowGroup);
  const double chunks = std::ceil(static_cast<double>(p.k) / kChunkK);
  const double row_blocks = std::ceil(groups * kRowGroup / rows);
  const double token_blocks = std::ceil(p.tokens_per_expert / tokens);
  // The shared expert's pieces take every token: their token blocks add items of their own.
  const double shared = static_cast<double>(p.shared_pieces);
  const double shared_blocks = shared * std::ceil(static_cast<double>(p.tokens) / tokens);
  const double items =
      std::max(1.0, std::ceil((p.active_experts * token_blocks + shared_blocks) * row_blocks));
  // An item streams its row block's weight blocks and its real tokens' activation rows per chunk
  // (the last row block of an expert holds only the groups that are left).
  const double item_groups = groups / row_blocks;
  const double l2_item = chunks * (item_groups * TileGemmLayout::kBlockBytes +
                                   p.tokens_per_expert / token_blocks * kChunkK * 2.0);
  // Every mma of an item runs, padding rows and tokens included.
  const double item_flops = 2.0 * rows * tokens * chunks * kChunkK;
  // DRAM: every active expert's weights once, the activations once, the outputs once (gate_up:
  // SwiGLU in bf16, N/2 values per slot; down: bf16), and the family's extra bytes.
  const double slots = static_cast<double>(p.tokens) * static_cast<double>(p.top_k + p.shared_pieces);
  const double out_bytes = p.kind == GemmKind::kGateUp ? slots * (p.n / 2.0) * 2.0 : slots * p.n * 2.0;
  const double dram = (p.active_experts + shared) * groups * chunks * TileGemmLayout::kBlockBytes +
                      slots * p.k * 2.0 + out_bytes + shape.extra_dram_bytes;
  // Items go to the resident CTAs in waves. A wave of b busy CTAs takes the longest of its DRAM
  // bytes, its L2->SM bytes, one CTA's chunks at the latency-bound rate of its ring (`stages`
  // chunks per memory latency), its mma work at the family's rate and its weight decode at the
  // SM's decode rate (b CTAs spread over the SMs, ceil(b / SMs) on the busiest).
  const double item_values = rows * chunks * kChunkK;
  const double resident = static_cast<double>(arch.sm_count) * occupancy.blocks_per_sm;
  struct Wave {
    double t_dram, t_l2, t_latency, t_compute, t_decode, t;
  };
  const auto wave = [&](double busy) {
    Wave w{};
    w.t_dram = busy * dram / items / (arch.dram_bandwidth_gbs * 1e3);  // bytes / (GB/s) in us
    w.t_l2 = busy * l2_item / (arch.l2_bandwidth_gbs * 1e3);
    w.t_latency = chunks * arch.memory_latency_ns * 1e-3 / shape.stages;
    w.t_compute = std::ceil(busy / arch.sm_count) * arch.sm_count * item_flops /
                  (shape.tflops * 1e6);  // FLOPs / (TFLOP/s) in us
    w.t_decode = arch.decode_values_per_ns_per_sm > 0 ? std::ceil(busy / arch.sm_count) * item_values /
                                                            (arch.decode_values_per_ns_per_sm * 1e3)
                                                      : 0.0;  // values / (values per ns) in us
    w.t = std::max({w.t_dram, w.t_l2, w.t_latency, w.t_compute, w.t_decode});
    return w;
  };
  const double full_waves = std::floor(items / resident);
  const double rest = items - full_waves * resident;
  const Wave first = wave(full_waves > 0 ? resident : rest);
  const double t = full_waves * wave(resident).t + (rest > 0 ? wave(rest).t : 0.0);
  const char* bound = first.t == first.t_dram      ? "DRAM"
                      : first.t == first.t_l2      ? "L2"
                      : first.t == first.t_latency ? "latency"
                      : first.t == first.t_decode  ? "decode"
                                                   : "compute";
  CostEstimate e;
  e.us = t;
  e.how = fmt::format(
      "{}-bound: {:.0f} items of {:.0f} rows x {:.0f} tokens on {:.0f} resident CTAs ({:.0f} full wave(s) + "
      "{:.0f} items); a wave: DRAM {:.2f} us, L2->SM {:.2f} us, latency {:.2f} us, mma {:.2f} us at {:.0f} "
      "TFLOP/s ({}, estimated), decode {:.2f} us; {:.2f} MB from DRAM at {:.0f} GB/s{}",
      bound, items, rows, tokens, resident, full_waves, rest, first.t_dram, first.t_l2, first.t_latency,
      first.t_compute, shape.tflops, shape.rate_name, first.t_decode, dram / 1e6, arch.dram_bandwidth_gbs,
      shape.extra_dram_bytes > 0 ? fmt::format(" (with {})", shape.extra_how) : std::string());
  e.in_flight_total = shape.stages * static_cast<double>(shape.stage_bytes) * std::min(items, resident);
  return e;
}

std::vector<TileGemmConfig> tile_gemm_candidates() {
  std::vector<TileGemmConfig> out;
  for (const auto& shape : kernels::kTileShapes) {
    for (int stages = kTileGemmStagesMin; stages <= kTileGemmStagesMax; ++stages) {
      const TileGemmConfig c{shape[0], shape[1], TileGemmLayout::kWarps, stages};
      if (TileGemmLayout::valid(c)) out.push_back(c);
    }
  }
  return out;
}

std::string tile_gemm_label(const TileGemmConfig& c) {
  return fmt::format("m{} n{} s{} w{}", c.m_tiles, c.n_tiles, c.stages, c.warps);
}

std::string tile_gemm_kernel_key(int m_tiles, int n_tiles, int epilogue) {
  return fmt::format("fp4moe_tile_gemm<{}, {}, {}>", m_tiles, n_tiles, epilogue);
}

CandidateSpec tile_gemm_spec(const TileGemmConfig& config, const GemmProblem& problem) {
  CandidateSpec s = make_spec(config);
  s.resource_key.push_back(stream_gemm_epilogue(problem));
  return s;
}

const KernelFamily& tile_gemm_family() {
  static const TileGemmFamily family;
  return family;
}

}  // namespace fp4moe::planner
