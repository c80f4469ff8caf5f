// The CUTLASS shared-memory model. Sources (CUTLASS 4.2.1 unless marked):
//   stage counts:  gemm/collective/builders/sm90_gmma_builder.inl (compute_stage_count_or_override),
//                  sm100_blockscaled_umma_builder.inl (sm100_compute_stage_count_or_override_blockscaled),
//                  sm120_blockscaled_mma_builder.inl (same formula, capacity 101376 B)
//   epilogues:     epilogue/collective/builders/sm90_builder.inl, sm100_builder.inl, sm120_builder.inl
//                  (epilogue tile, StagesC/StagesD, smem reuse), sm90_epilogue_array_tma_warpspecialized.hpp
//   kernel:        gemm/kernel/sm90_gemm_array_tma_warpspecialized_cooperative.hpp (SharedStorage)
//   SM100 extras:  gemm/collective/builders/sm100_pipeline_carveout.inl (read at a later commit)
// and /work/shared/PLANNER_FACTS.md, whose SM120 numbers were measured with sizeof on the real types.
#include "fp4moe/cutlass_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/fail.hpp"

namespace fp4moe {
namespace {

using i64 = std::int64_t;

constexpr i64 round_up(i64 x, i64 a) {
  return (x + a - 1) / a * a;
}

// NOTE: the capacities CUTLASS compiles in (cutlass/arch/arch.h, sm90_common.inl): the builders
// divide these, not what the device reports.
constexpr i64 kSm90Capacity = 232448;
constexpr i64 kSm100Capacity = 232448;
constexpr i64 kSm120Capacity = 101376;
// sizeof(PipelineTmaAsync<1>::SharedStorage) / PipelineTmaUmmaAsync<1>: one full and one empty
// mbarrier of 8 bytes each.
constexpr i64 kStageBarrier = 16;
constexpr i64 kTmaDescriptor = 128;  // sizeof(cute::TmaDescriptor)
// The grouped kernels' tile scheduler keeps 8 responses in flight (TileSchedulerStages = 8).
constexpr i64 kSchedulerStages = 8;
constexpr i64 kSchedulerResponse = 16;
// The fusion callbacks' own shared storage, after the C/D buffers. Measured totals pin it to
// 1..512 B for the seed's tiles (PLANNER_FACTS.md); the values are estimates inside that range.
constexpr i64 kNoneFusionBytes = 16;
constexpr i64 kFinalizeFusionBytes = 256;
constexpr int kMinStages = 2;

enum class Family { kSm90, kSm100, kSm120 };

struct Resolved {
  Family family = Family::kSm120;
  CutlassSchedule schedule = CutlassSchedule::kAuto;
  Operand ka = Operand::kNvfp4;  // the kernel's A and B (after swap_ab)
  Operand kb = Operand::kNvfp4;
  int smem_bits_a = 0;  // bits per element in shared memory
  int smem_bits_b = 0;
  int sf_vec = 0;  // scale-factor vector (16 NVFP4, 32 MX), 0 without scale factors
  bool mxf8f6f4 = false;
  int cta_m = 0;  // per-CTA tile (2-SM UMMA splits M and N across the CTA pair)
  int cta_n = 0;
  std::string model;
};

struct EpilogueModel {
  int epi_m = 0;
  int epi_n = 0;
  int stages_c = 0;
  int stages_d = 0;
  i64 tensor_storage = 0;
  i64 shared_storage = 0;
  std::vector<ByteTerm> terms;
};

bool is_block_scaled(Operand op) {
  return op == Operand::kNvfp4 || op == Operand::kMxfp4 || op == Operand::kMxfp8;
}

// Returns an empty string when supported, else the reason.
std::string resolve(const CutlassConfig& c, const ArchInfo& arch, Resolved& r) {
  const auto& t = c.tile;
  if (t.m <= 0 || t.n <= 0 || t.k <= 0)
    return fmt::format("tile {} has a non-positive extent", t.to_string());
  if (arch.sm < 90) {
    return fmt::format(
        "{} has no TMA (CUTLASS's TMA warp-specialized grouped GEMMs need sm_90+); fp4moe's own "
        "kernels run there",
        arch.name);
  }
  r.ka = c.swap_ab ? c.b : c.a;
  r.kb = c.swap_ab ? c.a : c.b;
  r.cta_m = t.m;
  r.cta_n = t.n;
  if (c.kernel == CutlassKernel::kGrouped) {
    if (arch.sm != 90) {
      return fmt::format("cutlass-grouped is modelled for sm_90 only; on {} use cutlass-grouped-blockscaled",
                         arch.name);
    }
    if (is_block_scaled(c.a) || is_block_scaled(c.b) || operand_bits(c.a) != operand_bits(c.b)) {
      return fmt::format(
          "cutlass-grouped on sm_90 takes bf16 x bf16 or fp8 x fp8, not {} x {} (sm_90 has no FP4 "
          "tensor cores: {})",
          operand_name(c.a), operand_name(c.b), arch.mma_families());
    }
    r.family = Family::kSm90;
    r.schedule = c.schedule == CutlassSchedule::kAuto ? CutlassSchedule::kCooperative : c.schedule;
    if (r.schedule != CutlassSchedule::kCooperative && r.schedule != CutlassSchedule::kPingpong) {
      return fmt::format("schedule {} does not exist on sm_90 (cooperative or pingpong)",
                         cutlass_schedule_name(r.schedule));
    }
    const int m_align = r.schedule == CutlassSchedule::kCooperative ? 128 : 64;
    if (t.m % m_align != 0) {
      return fmt::format("tile M={} is not a multiple of {} (the {} schedule's warpgroup tile)", t.m, m_align,
                         cutlass_schedule_name(r.schedule));
    }
    if (t.n % 16 != 0 || t.n > 256)
      return fmt::format("tile N={} is not a multiple of 16 in 16..256 (wgmma N)", t.n);
    if (t.k * operand_bits(c.a) / 8 % 64 != 0) {
      return fmt::format("tile K={} is not a multiple of {} elements (64 B, one swizzle atom)", t.k,
                         64 * 8 / operand_bits(c.a));
    }
    r.smem_bits_a = r.smem_bits_b = operand_bits(c.a);
    r.model = fmt::format("SM90 TMA warp-specialized grouped GEMM (sm90_gmma_builder.inl), {}",
                          cutlass_schedule_name(r.schedule));
    return {};
  }
  // Block-scaled.
  if (!arch.block_scaled_fp4) {
    return fmt::format(
        "{} has no block-scaled MMA (tensor cores: {}): FP4 weights must be widened to BF16 there "
        "(fp4moe's own kernels), or use cutlass-grouped with bf16 or fp8 operands",
        arch.name, arch.mma_families());
  }
  if (!is_block_scaled(c.a) || !is_block_scaled(c.b)) {
    return fmt::format("cutlass-grouped-blockscaled takes nvfp4, mxfp4 or mxfp8 operands, not {} x {}",
                       operand_name(c.a), operand_name(c.b));
  }
  if ((c.a == Operand::kNvfp4) != (c.b == Operand::kNvfp4)) {
    return fmt::format(
        "{} x {}: NVFP4 (E4M3 scale per 16) pairs only with NVFP4; MX types share UE8M0 scales per 32",
        operand_name(c.a), operand_name(c.b));
  }
  r.sf_vec = c.a == Operand::kNvfp4 ? 16 : 32;
  // NOTE: with an 8-bit operand the MMA is kind::f8f6f4 and both operands sit in shared memory in
  // 8-bit containers (SmemAllocType = uint8_t in both builders), FP4 included.
  r.mxf8f6f4 = c.a == Operand::kMxfp8 || c.b == Operand::kMxfp8;
  r.smem_bits_a = r.mxf8f6f4 ? 8 : 4;
  r.smem_bits_b = r.smem_bits_a;
  if (t.k % (4 * r.sf_vec) != 0) {
    return fmt::format(
        "tile K={} is not a multiple of {} (4 scale factors of {} values per row, one 32-bit word)", t.k,
        4 * r.sf_vec, r.sf_vec);
  }
  if (arch.sm >= 120) {
    r.family = Family::kSm120;
    r.schedule = c.schedule == CutlassSchedule::kAuto ? CutlassSchedule::kCooperative : c.schedule;
    if (r.schedule != CutlassSchedule::kCooperative && r.schedule != CutlassSchedule::kPingpong) {
      return fmt::format(
          "schedule {} does not exist on {} (cooperative or pingpong; no 2-SM MMA, cluster 1x1x1)",
          cutlass_schedule_name(r.schedule), arch.name);
    }
    if (t.m % 64 != 0) return fmt::format("tile M={} is not a multiple of 64", t.m);
    if (t.n < 32 || t.n % 32 != 0)
      return fmt::format("tile N={} is not a multiple of 32 (the builder needs N >= 32)", t.n);
    const int perm_k = r.mxf8f6f4 ? 32 : 64;
    if (t.k % perm_k != 0)
      return fmt::format("tile K={} is not a multiple of {} (the MMA's K permutation)", t.k, perm_k);
    r.model = fmt::format("SM120 block-scaled grouped GEMM (sm120_blockscaled_mma_builder.inl), {}",
                          cutlass_schedule_name(r.schedule));
    return {};
  }
  r.family = Family::kSm100;
  r.schedule = c.schedule;
  if (r.schedule == CutlassSchedule::kAuto)
    r.schedule = t.m >= 256 ? CutlassSchedule::k2Sm : CutlassSchedule::k1Sm;
  if (r.schedule != CutlassSchedule::k1Sm && r.schedule != CutlassSchedule::k2Sm) {
    return fmt::format("schedule {} does not exist on {} (1sm or 2sm)", cutlass_schedule_name(r.schedule),
                       arch.name);
  }
  const bool two_sm = r.schedule == CutlassSchedule::k2Sm;
  if (two_sm ? (t.m != 128 && t.m != 256) : (t.m != 64 && t.m != 128)) {
    return fmt::format("tile M={} is not a {} UMMA tile ({})", t.m, two_sm ? "2-SM" : "1-SM",
                       two_sm ? "128 or 256" : "64 or 128");
  }
  if (t.n % 16 != 0 || t.n < 16 || t.n > 256)
    return fmt::format("tile N={} is not a multiple of 16 in 16..256", t.n);
  if (two_sm) {
    r.cta_m = t.m / 2;
    r.cta_n = t.n / 2;
  }
  r.model = fmt::format("SM100 block-scaled grouped GEMM (sm100_blockscaled_umma_builder.inl), {} UMMA",
                        two_sm ? "2-SM" : "1-SM");
  return {};
}

// Alignment of the epilogue's smem buffers: the swizzle atom the builder picks for the
// contiguous extent of the subtile (SW128 -> 1024 B, SW64 -> 512 B, SW32 -> 256 B, else 128 B).
i64 swizzle_alignment(i64 contiguous_bytes) {
  if (contiguous_bytes % 128 == 0) return 1024;
  if (contiguous_bytes % 64 == 0) return 512;
  if (contiguous_bytes % 32 == 0) return 256;
  return 128;
}

EpilogueModel epilogue_model(const CutlassConfig& c, const Resolved& r) {
  EpilogueModel e;
  const bool est = r.family != Family::kSm120;
  // Epilogue subtile (EpilogueTileAuto).
  switch (r.family) {
    case Family::kSm120:
      e.epi_m = 64;
      e.epi_n = 32;
      break;
    case Family::kSm90:
      e.epi_m = (r.schedule == CutlassSchedule::kCooperative && r.cta_m >= 128) ? 128 : 64;
      e.epi_n = std::min(32, c.tile.n);
      break;
    case Family::kSm100:
      e.epi_m = std::min(r.cta_m, 128);
      e.epi_n = c.tile.n == 256 ? 128 : std::min(c.tile.n, c.tile.n <= 128 ? 32 : 64);
      break;
  }
  // The accumulator tile of one CTA: 2-SM UMMA halves M per CTA but not N.
  const int epi_tiles = ((r.cta_m + e.epi_m - 1) / e.epi_m) * ((c.tile.n + e.epi_n - 1) / e.epi_n);
  const i64 subtile = static_cast<i64>(e.epi_m) * e.epi_n * 2;  // bf16 C and D
  const std::string subtile_how = fmt::format("{} x {} x 2 B", e.epi_m, e.epi_n);
  e.stages_d = std::min(epi_tiles, 2);
  i64 collective = 0;
  if (c.epilogue == Epilogue::kNone) {
    // C and D are both bf16: D reuses C's buffers, with one more C stage than D stages.
    const int c_cap = r.family == Family::kSm120 ? 2 : 4;
    e.stages_c = std::max(std::min(epi_tiles, c_cap), e.stages_d + 1);
    collective = e.stages_c * subtile;
    e.terms.push_back({"C/D buffers", collective,
                       fmt::format("{} x {} (D reuses C)", e.stages_c, subtile_how), false, false, est});
  } else {
    // FINALIZE: C and D apart, two stages each (PLANNER_FACTS.md, measured on SM120).
    e.stages_c = e.stages_d;
    e.terms.push_back({"C buffers", e.stages_c * subtile, fmt::format("{} x {}", e.stages_c, subtile_how),
                       false, false, est});
    e.terms.push_back({"D scratch", e.stages_d * subtile, fmt::format("{} x {}", e.stages_d, subtile_how),
                       false, false, est});
    collective = (e.stages_c + e.stages_d) * subtile;
  }
  // NOTE: D is row-major (N contiguous) without swap_ab, column-major (M contiguous) with it.
  const i64 contiguous = (c.swap_ab ? e.epi_m : e.epi_n) * 2;
  const i64 align = swizzle_alignment(contiguous);
  const i64 fusion = c.epilogue == Epilogue::kNone ? kNoneFusionBytes : kFinalizeFusionBytes;
  e.terms.push_back(
      {"fusion storage", fusion,
       c.epilogue == Epilogue::kNone ? "linear-combination callbacks" : "bias broadcast, router scale", false,
       false, true});
  e.tensor_storage = round_up(collective + fusion, align);
  e.terms.push_back({fmt::format("round up to {}", align), e.tensor_storage - collective - fusion,
                     fmt::format("swizzle alignment of a {} B contiguous extent", contiguous), true, false,
                     est});
  const i64 pipeline = kStageBarrier * e.stages_c;
  e.terms.push_back(
      {"load pipeline", pipeline, fmt::format("{} x {} B", e.stages_c, kStageBarrier), false, false, est});
  e.shared_storage = round_up(e.tensor_storage + pipeline, align);
  e.terms.push_back({fmt::format("round up to {}", align), e.shared_storage - e.tensor_storage - pipeline, "",
                     true, false, est});
  return e;
}

// Sm100DenseGemmTmaUmmaCarveout for the grouped (pointer-array) kernel: storage the SM100 builder
// subtracts from its capacity before dividing by the stage size.
std::vector<ByteTerm> sm100_kernel_carveout(const CutlassConfig& c) {
  const i64 acc_stages = c.tile.n == 256 ? 1 : 2;
  return {
      {"accumulator pipeline", 16 * acc_stages, fmt::format("{} x 16", acc_stages), false, true, true},
      {"CLC pipelines", 16 * kSchedulerStages * 2, "2 x 8 x 16", false, true, true},
      {"load order barrier", 16, "", false, true, true},
      {"TMEM dealloc barrier", 8, "", false, true, true},
      {"CLC throttle pipeline", 16 * kSchedulerStages, "8 x 16", false, true, true},
      {"CLC responses", kSchedulerStages * kSchedulerResponse * 2, "2 x 8 x 16", false, true, true},
      {"TMEM base pointers", kSchedulerStages * 4, "8 x 4", false, true, true},
      {"tensor maps", kTmaDescriptor * 4 * 5, "5 x 4 x 128 (A, B, SFA, SFB)", false, true, true},
      {"tensor-map ready pipeline", 16 * kSchedulerStages, "8 x 16", false, true, true},
  };
}

i64 sum_bytes(const std::vector<ByteTerm>& terms) {
  i64 s = 0;
  for (const auto& t : terms) s += t.bytes;
  return s;
}

void push_round(std::vector<ByteTerm>& terms, i64 align, bool estimated) {
  const i64 before = sum_bytes(terms);
  terms.push_back(
      {fmt::format("round up to {}", align), round_up(before, align) - before, "", true, false, estimated});
}

CutlassVerdict evaluate(const CutlassConfig& c, const ArchInfo& arch) {
  CutlassVerdict v;
  v.config = c;
  v.arch = arch.name;
  v.limit_bytes = arch.smem_per_block_optin;
  Resolved r;
  if (auto why = resolve(c, arch, r); !why.empty()) {
    v.supported = false;
    v.unsupported_reason = why;
    v.reason = "not supported: " + why;
    return v;
  }
  v.model = r.model;
  const bool sm120 = r.family == Family::kSm120;
  const bool est = !sm120;
  const i64 k = c.tile.k;

  // One stage.
  const i64 a_bytes = static_cast<i64>(r.cta_m) * k * r.smem_bits_a / 8;
  const i64 b_bytes = static_cast<i64>(r.cta_n) * k * r.smem_bits_b / 8;
  v.stage_terms.push_back({"A tile", a_bytes, fmt::format("{} x {} x {} bit", r.cta_m, k, r.smem_bits_a)});
  v.stage_terms.push_back({"B tile", b_bytes, fmt::format("{} x {} x {} bit", r.cta_n, k, r.smem_bits_b)});
  if (r.family == Family::kSm90) {
    // NOTE: CUTLASS 4.2.1 rounds A+B up to 128 B before adding the barrier.
    push_round(v.stage_terms, 128, false);
  } else {
    const i64 sfa_rows = round_up(r.cta_m, 128);
    // 2-SM UMMA: each CTA holds the scale factors of the whole N tile (estimated).
    const i64 sfb_rows = round_up(r.family == Family::kSm100 ? c.tile.n : r.cta_n, 128);
    v.stage_terms.push_back({"SFA tile", sfa_rows * k / r.sf_vec,
                             fmt::format("{} rows x {}/{} scales x 1 B", sfa_rows, k, r.sf_vec)});
    v.stage_terms.push_back({"SFB tile", sfb_rows * k / r.sf_vec,
                             fmt::format("{} rows x {}/{} scales x 1 B", sfb_rows, k, r.sf_vec), false, false,
                             r.family == Family::kSm100});
  }
  v.stage_terms.push_back({"barrier", kStageBarrier, "full + empty mbarrier, 8 B each"});
  v.stage_bytes = sum_bytes(v.stage_terms);
  const i64 stage_tensors = v.stage_bytes - kStageBarrier;

  // The epilogue and the carveout.
  const EpilogueModel epi = epilogue_model(c, r);
  v.epilogue_tile = fmt::format("{}x{}", epi.epi_m, epi.epi_n);
  v.epilogue_stages_c = epi.stages_c;
  v.epilogue_stages_d = epi.stages_d;
  v.epilogue_terms = epi.terms;
  v.carveout_bytes = r.family == Family::kSm90 ? round_up(epi.shared_storage, 128) : epi.shared_storage;

  // The capacity the builder divides.
  std::vector<ByteTerm> sm100_extra;
  switch (r.family) {
    case Family::kSm90:
      v.capacity_bytes = kSm90Capacity / 128 * 128;
      break;
    case Family::kSm100:
      sm100_extra = sm100_kernel_carveout(c);
      v.capacity_bytes = kSm100Capacity - sum_bytes(sm100_extra);
      break;
    case Family::kSm120:
      v.capacity_bytes = kSm120Capacity;
      break;
  }
  if (c.stages > 0) {
    v.stages = c.stages;
    v.stages_how = fmt::format("StageCount<{}> (given)", c.stages);
  } else {
    v.stages = static_cast<int>((v.capacity_bytes - v.carveout_bytes) / v.stage_bytes);
    v.stage_spare_bytes = v.capacity_bytes - v.carveout_bytes - v.stages * v.stage_bytes;
    v.stages_how =
        fmt::format("StageCountAutoCarveout<{}>: ({} - {}) / {} = {}, {} B to spare", v.carveout_bytes,
                    v.capacity_bytes, v.carveout_bytes, v.stage_bytes, v.stages, v.stage_spare_bytes);
  }
  v.estimated = est;

  // The kernel's SharedStorage.
  auto& kt = v.kernel_terms;
  kt.push_back(
      {"mainloop tensors", v.stages * stage_tensors, fmt::format("{} x {}", v.stages, stage_tensors)});
  kt.push_back(
      {"epilogue tensors", epi.tensor_storage, "CollectiveEpilogue::TensorStorage", false, false, est});
  push_round(kt, 1024, est);
  kt.push_back({"mainloop + epilogue barriers", kStageBarrier * (v.stages + epi.stages_c),
                fmt::format("16 x {} + 16 x {} (in the stage and the carveout)", v.stages, epi.stages_c)});
  if (r.family == Family::kSm100) {
    for (const auto& t : sm100_extra) kt.push_back(t);
  } else {
    kt.push_back(
        {"scheduler pipeline + load order", kSchedulerStages * 16 + 16, "8 x 16 + 16", false, true, est});
    kt.push_back({"scheduler responses", kSchedulerStages * kSchedulerResponse, "8 x 16", false, true, est});
    if (sm120) {
      kt.push_back({"tensor maps", 7 * kTmaDescriptor,
                    "A, B, SFA, SFB, C, D descriptors + alignment (measured)", false, true, false});
    } else {
      kt.push_back(
          {"tensor maps", 5 * kTmaDescriptor, "A, B, C, D descriptors + alignment", false, true, true});
    }
  }
  push_round(kt, 1024, est);
  v.total_bytes = sum_bytes(kt);
  for (const auto& t : kt) {
    if (t.outside_carveout) v.outside_carveout_bytes += t.bytes;
  }

  // Verdict.
  if (v.stages < kMinStages) {
    v.fits = false;
    v.over_by_bytes = std::max<i64>(0, v.total_bytes - v.limit_bytes);
    v.reason = fmt::format(
        "only {} stage(s) of {} B fit in {} - {} B; CUTLASS needs at least {} "
        "(a static_assert: this configuration does not compile)",
        v.stages, v.stage_bytes, v.capacity_bytes, v.carveout_bytes, kMinStages);
    return v;
  }
  v.fits = v.total_bytes <= v.limit_bytes;
  v.over_by_bytes = v.fits ? 0 : v.total_bytes - v.limit_bytes;
  if (v.fits) {
    v.reason = fmt::format("fits: {} B <= {} B ({} B to spare)", v.total_bytes, v.limit_bytes,
                           v.limit_bytes - v.total_bytes);
  } else if (c.stages > 0) {
    v.reason = fmt::format(
        "StageCount<{}> asks for {} x {} B of mainloop buffers; with the epilogue ({} B) and {} B of "
        "kernel storage the block needs {} B > {} B",
        v.stages, v.stages, v.stage_bytes, epi.tensor_storage, v.outside_carveout_bytes, v.total_bytes,
        v.limit_bytes);
  } else {
    v.reason = fmt::format(
        "StageCountAutoCarveout<{}> reserves only the epilogue's storage, so {} stages leave {} B, "
        "but the kernel also needs {} B the formula never counts (scheduler pipeline and responses, "
        "tensor maps) and rounds its storage up to 1024 B: {} B > {} B",
        v.carveout_bytes, v.stages, v.stage_spare_bytes, v.outside_carveout_bytes, v.total_bytes,
        v.limit_bytes);
  }
  return v;
}

void add_alternative(CutlassVerdict& v, const ArchInfo& arch, std::string change, const CutlassConfig& cfg,
                     std::string note) {
  const CutlassVerdict alt = evaluate(cfg, arch);
  if (!alt.supported) return;
  v.alternatives.push_back({std::move(change), cfg, alt.stages, alt.total_bytes,
                            alt.fits && alt.stages >= kMinStages, std::move(note)});
}

void add_alternatives(CutlassVerdict& v, const ArchInfo& arch) {
  const CutlassConfig& c = v.config;
  // Fewer stages: the largest count below the current one that fits.
  for (int s = v.stages - 1; s >= kMinStages; --s) {
    CutlassConfig f = c;
    f.stages = s;
    const CutlassVerdict alt = evaluate(f, arch);
    if (!alt.fits && s > kMinStages) continue;
    std::string change = fmt::format("StageCount<{}>", s);
    if (c.stages == 0) {
      // The smallest carveout for which the automatic count drops to s.
      i64 carveout = v.capacity_bytes - static_cast<i64>(s + 1) * v.stage_bytes + 1;
      if (c.kernel == CutlassKernel::kGrouped) carveout = round_up(carveout, 128) - 127;
      change += fmt::format(" (or StageCountAutoCarveout<{}> or more)", carveout);
    }
    add_alternative(v, arch, change, f,
                    fmt::format("{} fewer pipeline stage(s) to hide memory latency", v.stages - s));
    break;
  }
  CutlassConfig swapped = c;
  swapped.swap_ab = !c.swap_ab;
  add_alternative(v, arch, swapped.swap_ab ? "swap_ab" : "without swap_ab", swapped,
                  "the kernel's M runs along the other operand; TensorRT-LLM has both variants");
  if (c.epilogue == Epilogue::kFinalize) {
    CutlassConfig none = c;
    none.epilogue = Epilogue::kNone;
    add_alternative(v, arch, "NONE epilogue + separate finalize pass", none,
                    "the finalize pass reads the T*k expert outputs once more and writes T rows");
  }
  if (c.tile.k >= 128) {
    CutlassConfig half = c;
    half.tile.k = c.tile.k / 2;
    add_alternative(v, arch, fmt::format("K tile {} ({})", half.tile.k, half.tile.to_string()), half,
                    "half the bytes per stage, twice the stages");
  }
}

std::string pad(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

std::string term_line(const ByteTerm& t, std::optional<i64> running) {
  std::string flags;
  if (t.outside_carveout) flags += " [outside carveout]";
  if (t.estimated) flags += " [estimated]";
  std::string line = fmt::format("    {}{}{:>8}", pad(t.name, 34), pad(t.how, 58), t.bytes);
  if (running) line += fmt::format("{:>9}", *running);
  return line + flags + "\n";
}

nlohmann::json terms_json(const std::vector<ByteTerm>& terms) {
  auto arr = nlohmann::json::array();
  for (const auto& t : terms) {
    arr.push_back({{"name", t.name},
                   {"bytes", t.bytes},
                   {"how", t.how},
                   {"rounding", t.rounding},
                   {"outside_carveout", t.outside_carveout},
                   {"estimated", t.estimated}});
  }
  return arr;
}

}  // namespace

std::string_view operand_name(Operand op) noexcept {
  switch (op) {
    case Operand::kBf16:
      return "bf16";
    case Operand::kFp8:
      return "fp8";
    case Operand::kNvfp4:
      return "nvfp4";
    case Operand::kMxfp4:
      return "mxfp4";
    case Operand::kMxfp8:
      return "mxfp8";
  }
  return "?";
}

Operand parse_operand(std::string_view name) {
  for (auto op : {Operand::kBf16, Operand::kFp8, Operand::kNvfp4, Operand::kMxfp4, Operand::kMxfp8}) {
    if (operand_name(op) == name) return op;
  }
  fail(Errc::kInvalidArgument, "unknown operand type '{}' (expected bf16, fp8, nvfp4, mxfp4 or mxfp8)", name);
}

int operand_bits(Operand op) noexcept {
  switch (op) {
    case Operand::kBf16:
      return 16;
    case Operand::kFp8:
    case Operand::kMxfp8:
      return 8;
    case Operand::kNvfp4:
    case Operand::kMxfp4:
      return 4;
  }
  return 0;
}

std::string_view cutlass_kernel_name(CutlassKernel kernel) noexcept {
  return kernel == CutlassKernel::kGrouped ? "cutlass-grouped" : "cutlass-grouped-blockscaled";
}

CutlassKernel parse_cutlass_kernel(std::string_view name) {
  for (auto k : {CutlassKernel::kGrouped, CutlassKernel::kGroupedBlockScaled}) {
    if (cutlass_kernel_name(k) == name) return k;
  }
  fail(Errc::kInvalidArgument,
       "unknown CUTLASS kernel '{}' (expected cutlass-grouped or cutlass-grouped-blockscaled)", name);
}

std::string_view cutlass_schedule_name(CutlassSchedule schedule) noexcept {
  switch (schedule) {
    case CutlassSchedule::kAuto:
      return "auto";
    case CutlassSchedule::kCooperative:
      return "cooperative";
    case CutlassSchedule::kPingpong:
      return "pingpong";
    case CutlassSchedule::k1Sm:
      return "1sm";
    case CutlassSchedule::k2Sm:
      return "2sm";
  }
  return "?";
}

CutlassSchedule parse_cutlass_schedule(std::string_view name) {
  for (auto s : {CutlassSchedule::kAuto, CutlassSchedule::kCooperative, CutlassSchedule::kPingpong,
                 CutlassSchedule::k1Sm, CutlassSchedule::k2Sm}) {
    if (cutlass_schedule_name(s) == name) return s;
  }
  fail(Errc::kInvalidArgument, "unknown schedule '{}' (expected auto, cooperative, pingpong, 1sm or 2sm)",
       name);
}

std::string_view epilogue_name(Epilogue epilogue) noexcept {
  return epilogue == Epilogue::kNone ? "none" : "finalize";
}

Epilogue parse_epilogue(std::string_view name) {
  if (name == "none") return Epilogue::kNone;
  if (name == "finalize") return Epilogue::kFinalize;
  fail(Errc::kInvalidArgument, "unknown epilogue '{}' (expected none or finalize)", name);
}

std::string TileShape::to_string() const {
  return fmt::format("{}x{}x{}", m, n, k);
}

TileShape parse_tile(std::string_view text) {
  int v[3] = {0, 0, 0};
  std::string_view rest = text;
  for (int i = 0; i < 3; ++i) {
    const auto x = rest.find('x');
    const std::string_view part = i < 2 ? rest.substr(0, x) : rest;
    const auto* end = part.data() + part.size();
    const auto r = std::from_chars(part.data(), end, v[i]);
    require(!part.empty() && r.ec == std::errc() && r.ptr == end && v[i] > 0 && (i == 2 || x != rest.npos),
            "tile '{}' is not MxNxK with three positive integers (e.g. 128x256x128)", text);
    if (i < 2) rest.remove_prefix(x + 1);
  }
  return {v[0], v[1], v[2]};
}

std::string CutlassConfig::to_string() const {
  return fmt::format("{} {} x {}, tile {}, epilogue {}, swap_ab {}, schedule {}, {}",
                     cutlass_kernel_name(kernel), operand_name(a), operand_name(b), tile.to_string(),
                     epilogue_name(epilogue), swap_ab ? "on" : "off", cutlass_schedule_name(schedule),
                     stages > 0 ? fmt::format("StageCount<{}>", stages) : std::string("auto stages"));
}

CutlassVerdict explain_cutlass(const CutlassConfig& config, const ArchInfo& arch) {
  CutlassVerdict v = evaluate(config, arch);
  if (v.supported && !v.fits) add_alternatives(v, arch);
  return v;
}

std::vector<TileShape> trtllm_sm120_tiles(Operand a, Operand b) {
  // K is given in bytes; FP4 x FP4 holds 2 elements per byte, anything with an 8-bit operand
  // stores both operands in 8-bit containers (one element per byte).
  const int per_byte = (operand_bits(a) == 4 && operand_bits(b) == 4) ? 2 : 1;
  return {{128, 128, 128 * per_byte},
          {128, 128, 64 * per_byte},
          {128, 256, 64 * per_byte},
          {256, 128, 64 * per_byte}};
}

std::string CutlassVerdict::one_line() const {
  const std::string head = fmt::format("{} {}{}", config.tile.to_string(), epilogue_name(config.epilogue),
                                       config.swap_ab ? " swap_ab" : "");
  if (!supported) return fmt::format("{}: NOT SUPPORTED: {}", head, unsupported_reason);
  if (fits) {
    return fmt::format("{}: fits {} B <= {} B ({} stages, {} B to spare){}", head, total_bytes, limit_bytes,
                       stages, limit_bytes - total_bytes, estimated ? " [estimated]" : "");
  }
  if (stages < kMinStages)
    return fmt::format("{}: DOES NOT COMPILE: {} stage(s) < {}", head, stages, kMinStages);
  return fmt::format("{}: DOES NOT FIT {} B > {} B ({} stages, over by {} B){}", head, total_bytes,
                     limit_bytes, stages, over_by_bytes, estimated ? " [estimated]" : "");
}

std::string CutlassVerdict::to_string() const {
  std::string s =
      fmt::format("{} on {}\n  {}\n", cutlass_kernel_name(config.kernel), arch, config.to_string());
  if (!supported) return s + "  verdict: NOT SUPPORTED: " + unsupported_reason + "\n";
  s += fmt::format("  model: {}{}\n\n", model, estimated ? " [estimated: see docs/PLANNER.md]" : "");
  s += fmt::format("  {}{:>8}\n", pad("one mainloop stage", 94), "bytes");
  for (const auto& t : stage_terms) s += term_line(t, std::nullopt);
  s += fmt::format("    {}{:>8}\n", pad("stage", 92), stage_bytes);
  s += fmt::format("  stages: {}\n\n", stages_how);
  s += fmt::format("  epilogue shared storage (the carveout): subtile {} bf16, StagesC {}, StagesD {}\n",
                   epilogue_tile, epilogue_stages_c, epilogue_stages_d);
  for (const auto& t : epilogue_terms) s += term_line(t, std::nullopt);
  s += fmt::format("    {}{:>8}\n\n", pad("carveout", 92), carveout_bytes);
  s += fmt::format("  {}{:>8}{:>9}\n", pad("kernel shared storage (what the launch asks for)", 94), "bytes",
                   "total");
  i64 running = 0;
  for (const auto& t : kernel_terms) {
    running += t.bytes;
    s += term_line(t, running);
  }
  s += fmt::format("  total {} B; limit {} B ({} opt-in shared memory per block)\n\n", total_bytes,
                   limit_bytes, arch);
  if (fits) {
    s += fmt::format("  verdict: FITS ({} B to spare)\n", limit_bytes - total_bytes);
  } else if (stages < kMinStages) {
    s += fmt::format("  verdict: DOES NOT COMPILE ({} stage(s), at least {} needed)\n", stages, kMinStages);
  } else {
    s += fmt::format("  verdict: DOES NOT FIT: over by {} B\n", over_by_bytes);
  }
  if (!fits) s += "  cause: " + reason + "\n";
  if (alternatives.empty()) return s;
  std::string fit_lines;
  std::string other_lines;
  for (const auto& a : alternatives) {
    std::string line =
        fmt::format("    {}{:>8} B  {} stages  {}\n", pad(a.change, 60), a.total_bytes, a.stages,
                    a.fits ? fmt::format("fits ({} B to spare); {}", limit_bytes - a.total_bytes, a.note)
                           : fmt::format("over by {} B", a.total_bytes - limit_bytes));
    (a.fits ? fit_lines : other_lines) += line;
  }
  s += fit_lines.empty() ? "  fixes that fit: none of the ones tried\n" : "  fixes that fit:\n" + fit_lines;
  if (!other_lines.empty()) s += "  tried, do not fit either:\n" + other_lines;
  return s;
}

std::string CutlassVerdict::to_json() const {
  nlohmann::json j;
  j["arch"] = arch;
  j["kernel"] = std::string(cutlass_kernel_name(config.kernel));
  j["a"] = std::string(operand_name(config.a));
  j["b"] = std::string(operand_name(config.b));
  j["tile"] = {config.tile.m, config.tile.n, config.tile.k};
  j["epilogue"] = std::string(epilogue_name(config.epilogue));
  j["swap_ab"] = config.swap_ab;
  j["schedule"] = std::string(cutlass_schedule_name(config.schedule));
  j["supported"] = supported;
  j["fits"] = supported && fits;
  j["total_bytes"] = total_bytes;
  j["limit_bytes"] = limit_bytes;
  j["stages"] = stages;
  j["over_by_bytes"] = over_by_bytes;
  j["reason"] = reason;
  j["estimated"] = estimated;
  if (supported) {
    j["model"] = model;
    j["stage_bytes"] = stage_bytes;
    j["capacity_bytes"] = capacity_bytes;
    j["carveout_bytes"] = carveout_bytes;
    j["stage_spare_bytes"] = stage_spare_bytes;
    j["outside_carveout_bytes"] = outside_carveout_bytes;
    j["epilogue_tile"] = epilogue_tile;
    j["epilogue_stages_c"] = epilogue_stages_c;
    j["epilogue_stages_d"] = epilogue_stages_d;
    j["breakdown"] = {{"stage", terms_json(stage_terms)},
                      {"epilogue", terms_json(epilogue_terms)},
                      {"kernel", terms_json(kernel_terms)}};
  }
  auto alts = nlohmann::json::array();
  for (const auto& a : alternatives) {
    alts.push_back({{"change", a.change},
                    {"tile", {a.config.tile.m, a.config.tile.n, a.config.tile.k}},
                    {"epilogue", std::string(epilogue_name(a.config.epilogue))},
                    {"swap_ab", a.config.swap_ab},
                    {"stages", a.stages},
                    {"total_bytes", a.total_bytes},
                    {"fits", a.fits},
                    {"note", a.note}});
  }
  j["alternatives"] = alts;
  return j.dump();
}

}  // namespace fp4moe
