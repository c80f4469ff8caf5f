// The wgmma GEMM family: candidates, their shared memory from WgmmaGemmLayout, and the prefill
// cost model shared with the tile family at wgmma's estimated rate, counting the k-permuted copy
// of x that its first GEMM reads (docs/PLANNER.md).
#include "planner/wgmma_gemm_plan.hpp"

#include <fmt/format.h>

#include "common/fail.hpp"
#include "planner/kernel_family.hpp"
#include "planner/stream_gemm_plan.hpp"

namespace fp4moe::planner {
namespace {

using kernels::WgmmaGemmConfig;
using kernels::WgmmaGemmLayout;

constexpr double kWgmmaTensorBusy = 0.75;

int param(const CandidateSpec& spec, std::string_view name) {
  for (const auto& [k, v] : spec.params) {
    if (k == name) return v;
  }
  fail(Errc::kInternal, "wgmma-gemm candidate {} has no parameter {}", spec.label, name);
}

WgmmaGemmConfig config_of(const CandidateSpec& spec) {
  return {param(spec, "n_tiles"), param(spec, "stages"), param(spec, "consumer_warps")};
}

std::string compiled_shapes() {
  std::string s;
  for (const auto& c : kernels::kWgmmaShapes) {
    s += fmt::format("{}n{} w{}", s.empty() ? "" : ", ", c.n_tiles, c.consumer_warps);
  }
  return s;
}

CandidateSpec make_spec(const WgmmaGemmConfig& c) {
  CandidateSpec s;
  s.label = wgmma_gemm_label(c);
  s.params = {{"n_tiles", c.n_tiles}, {"stages", c.stages}, {"consumer_warps", c.consumer_warps}};
  s.dynamic_smem_bytes = WgmmaGemmLayout::cta_bytes(c);
  s.smem_how = fmt::format("{} stages x {} B + {} B epilogue + {} B alignment", c.stages,
                           WgmmaGemmLayout::stage_bytes(c), WgmmaGemmLayout::epilogue_bytes(c),
                           WgmmaGemmLayout::kAlign);
  s.threads = WgmmaGemmLayout::threads(c);
  s.resource_key = {c.n_tiles, c.consumer_warps};
  if (!WgmmaGemmLayout::compiled(c)) {
    s.invalid = fmt::format("n{} w{} is not a compiled instance ({})", c.n_tiles, c.consumer_warps,
                            compiled_shapes());
  } else if (!WgmmaGemmLayout::valid(c)) {
    s.invalid = fmt::format("stages={}: the kernel takes 3..8 stages", c.stages);
  }
  return s;
}

class WgmmaGemmFamily final : public KernelFamily {
 public:
  std::string_view name() const override { return "wgmma-gemm"; }
  std::string_view kernel_prefix() const override { return "fp4moe_wgmma_gemm"; }

  std::vector<CandidateSpec> configs() const override {
    std::vector<CandidateSpec> specs;
    for (const auto& c : wgmma_gemm_candidates()) specs.push_back(make_spec(c));
    return specs;
  }

  std::vector<CandidateSpec> candidates(const GemmProblem& problem) const override {
    std::vector<CandidateSpec> specs;
    for (const auto& c : wgmma_gemm_candidates()) specs.push_back(wgmma_gemm_spec(c, problem));
    return specs;
  }

  CandidateSpec parse(std::string_view config) const override {
    const auto v = parse_config_fields(config, "nsw", "wgmma-gemm", "n<n_tiles> s<stages> w<consumer warps>",
                                       "n16 s4 w8");
    return make_spec({v[0], v[1], v[2]});
  }

  std::vector<ByteTerm> smem_terms(const CandidateSpec& spec) const override {
    const auto c = config_of(spec);
    const int raw =
        WgmmaGemmLayout::act_offset(c) + WgmmaGemmLayout::tokens(c) * WgmmaGemmLayout::kActRowBytes;
    const int stage = WgmmaGemmLayout::stage_bytes(c);
    return {
        {"weights and scales", WgmmaGemmLayout::act_offset(c),
         fmt::format("{} x {} B (256 rows in 64-row groups)", WgmmaGemmLayout::kGroups,
                     WgmmaGemmLayout::kBlockBytes)},
        {"activations", WgmmaGemmLayout::tokens(c) * WgmmaGemmLayout::kActRowBytes,
         fmt::format("{} x {} B ({} tokens x 64 values x bf16, 128-byte swizzle)", WgmmaGemmLayout::tokens(c),
                     WgmmaGemmLayout::kActRowBytes, WgmmaGemmLayout::tokens(c))},
        {fmt::format("round up to {}", WgmmaGemmLayout::kAlign), stage - raw, "stage alignment (the swizzle)",
         true},
        {"the ring's other stages", static_cast<std::int64_t>(c.stages - 1) * stage,
         fmt::format("{} x {} B (a ring of {}, filled by TMA)", c.stages - 1, stage, c.stages)},
        {"mbarriers", static_cast<std::int64_t>(c.stages) * WgmmaGemmLayout::kBarrierBytes,
         fmt::format("{} stages x (full + empty) x 8 B", c.stages)},
        {"round up to 128",
         WgmmaGemmLayout::epilogue_offset(c) - WgmmaGemmLayout::barrier_offset(c) -
             static_cast<std::int64_t>(c.stages) * WgmmaGemmLayout::kBarrierBytes,
         "the epilogue buffers' alignment", true},
        {"epilogue buffers", WgmmaGemmLayout::epilogue_bytes(c),
         fmt::format("{} consumer warps x {} B ({} tokens x 16 rows x bf16, the down GEMM's 16-byte stores)",
                     c.consumer_warps, WgmmaGemmLayout::kEpilogueWarpBytes,
                     WgmmaGemmLayout::kEpilogueTokens)},
        {"alignment slack", WgmmaGemmLayout::kAlign, "to align the first stage to 1024 B", true},
    };
  }

  CostEstimate cost(const CandidateSpec& spec, const GemmProblem& p, const ArchInfo& arch,
                    const Occupancy& occupancy) const override {
    const auto c = config_of(spec);
    // The first GEMM gathers its rows from a k-permuted copy of x: one more pass that reads each
    // token's row once and writes it padded to whole 64-chunks.
    const double chunks = static_cast<double>((p.k + 63) / 64);
    const double extra =
        p.kind == GemmKind::kGateUp ? static_cast<double>(p.tokens) * (p.k + chunks * 64) * 2.0 : 0.0;
    // The kernel keeps the tensor pipe busy about 75% of the time with 128-token blocks (ncu on
    // an H200, f76abf9: 74% gate/up, 63% down): its rate is that share of the peak.
    return prefill_cost({WgmmaGemmLayout::kRows, WgmmaGemmLayout::tokens(c), c.stages,
                         WgmmaGemmLayout::stage_bytes(c), arch.wgmma_bf16_tflops * kWgmmaTensorBusy,
                         "wgmma at 75% of the peak, as measured", extra, "the k-permuted copy of x"},
                        p, arch, occupancy);
  }

  std::string unsupported(const ArchInfo& arch) const override {
    if (arch.wgmma) return {};
    return fmt::format("{} cannot run it: wgmma needs sm_90 and a build with the sm_90a image", arch.name);
  }
};

}  // namespace

std::vector<WgmmaGemmConfig> wgmma_gemm_candidates() {
  std::vector<WgmmaGemmConfig> out;
  for (const auto& shape : kernels::kWgmmaShapes) {
    for (int stages = kWgmmaGemmStagesMin; stages <= kWgmmaGemmStagesMax; ++stages) {
      const WgmmaGemmConfig c{shape.n_tiles, stages, shape.consumer_warps};
      if (WgmmaGemmLayout::valid(c)) out.push_back(c);
    }
  }
  return out;
}

std::string wgmma_gemm_label(const WgmmaGemmConfig& c) {
  return fmt::format("n{} s{} w{}", c.n_tiles, c.stages, c.consumer_warps);
}

std::string wgmma_gemm_kernel_key(int n_tiles, int consumer_warps, int epilogue) {
  return fmt::format("fp4moe_wgmma_gemm<{}, {}, {}>", n_tiles, consumer_warps, epilogue);
}

CandidateSpec wgmma_gemm_spec(const WgmmaGemmConfig& config, const GemmProblem& problem) {
  CandidateSpec s = make_spec(config);
  s.resource_key.push_back(stream_gemm_epilogue(problem));
  return s;
}

const KernelFamily& wgmma_gemm_family() {
  static const WgmmaGemmFamily family;
  return family;
}

}  // namespace fp4moe::planner
