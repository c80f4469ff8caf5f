// The tile (prefill) GEMM family: plan == launch (shared memory from TileGemmLayout), every
// accepted config fits, registers from the resources, the cost model worked by hand, explain.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fp4moe/error.hpp"
#include "fp4moe/planner.hpp"
#include "kernels/tile_gemm_layout.hpp"
#include "planner/tile_gemm_plan.hpp"
#include "test_util/shared.hpp"

namespace fp4moe {
namespace {

using kernels::TileGemmConfig;
using kernels::TileGemmLayout;
using test_util::error_of;
using test_util::layer;
using ::testing::HasSubstr;

const KernelResources kNoResources{};

Plan tile_plan(const LayerDesc& l, std::int64_t tokens, GemmKind kind, const ArchInfo& a,
               const KernelResources* r = &kNoResources) {
  return plan_kernels("tile-gemm", make_gemm_problem(l, tokens, kind), a, r);
}

const CandidateVerdict& find(const Plan& p, const std::string& label) {
  for (const auto& c : p.candidates) {
    if (c.label == label) return c;
  }
  throw Error(Errc::kInternal, "no candidate " + label);
}

TEST(TileGemmPlan, CandidatesAreTheCompiledShapesTimesStagesWithTheLayoutsBytes) {
  const auto configs = planner::tile_gemm_candidates();
  ASSERT_EQ(configs.size(), 2u * 7u);  // kTileShapes x stages 2..8
  const auto p = tile_plan(layer(6144, 2048, 256, 8), 4096, GemmKind::kGateUp, arch_by_name("sm_90"));
  ASSERT_EQ(p.candidates.size(), configs.size());
  for (std::size_t i = 0; i < configs.size(); ++i) {
    EXPECT_EQ(configs[i].warps, 8);
    EXPECT_EQ(p.candidates[i].dynamic_smem_bytes, TileGemmLayout::cta_bytes(configs[i])) << i;
    EXPECT_EQ(p.candidates[i].threads, 256) << i;
    EXPECT_EQ(p.candidates[i].label, planner::tile_gemm_label(configs[i])) << i;
    EXPECT_EQ(p.candidates[i].family, "tile-gemm");
  }
  EXPECT_EQ(planner::tile_gemm_label({2, 8, 8, 4}), "m2 n8 s4 w8");
  EXPECT_EQ(planner::tile_gemm_kernel_key(2, 4, 1), "fp4moe_tile_gemm<2, 4, 1>");
}

TEST(TileGemmPlan, OversizedStagesAreRejectedOnSm120WithTheirNumbers) {
  // m2 n8: 4 row groups x 2304 B + 64 tokens x 128 B = 17408 B a stage; m2 n4: 9216 + 4096 = 13312.
  const auto p = tile_plan(layer(6144, 2048, 256, 8), 4096, GemmKind::kDown, arch_by_name("sm_120"));
  EXPECT_TRUE(find(p, "m2 n8 s5 w8").feasible);
  EXPECT_EQ(find(p, "m2 n8 s6 w8").reason,
            "needs 104448 B of shared memory per block (6 stages x 17408 B), sm_120 allows 101376 B: over by "
            "3072 B");
  EXPECT_TRUE(find(p, "m2 n4 s7 w8").feasible);
  EXPECT_THAT(find(p, "m2 n4 s8 w8").reason, HasSubstr("106496 B"));
  // Hopper takes all of them.
  const auto h = tile_plan(layer(6144, 2048, 256, 8), 4096, GemmKind::kDown, arch_by_name("sm_90"));
  for (const auto& c : h.candidates) EXPECT_TRUE(c.feasible) << c.label << ": " << c.reason;
}

TEST(TileGemmPlan, EveryAcceptedConfigFitsItsArchitecture) {
  int accepted = 0;
  for (const auto& a : arch_table()) {
    for (const auto& l : {layer(6144, 2048, 256, 8), layer(2880, 2880, 128, 4)}) {
      for (const auto kind : {GemmKind::kGateUp, GemmKind::kDown}) {
        const auto p = tile_plan(l, 512, kind, a);
        for (const auto& c : p.candidates) {
          if (!c.feasible) {
            EXPECT_FALSE(c.reason.empty());
            continue;
          }
          ++accepted;
          ASSERT_LE(c.dynamic_smem_bytes, a.smem_per_block_optin) << a.name << " " << c.label;
          ASSERT_GE(c.occupancy.blocks_per_sm, 1) << a.name << " " << c.label;
          ASSERT_GT(c.cost_us, 0) << a.name << " " << c.label;
        }
        ASSERT_TRUE(p.ok()) << a.name;
      }
    }
  }
  EXPECT_GT(accepted, 100);
}

TEST(TileGemmPlan, RegistersOfTheInstanceLimitOccupancy) {
  KernelResources measured;
  measured.source = ResourceSource::kMeasured;
  measured.origin = "test";
  // 255 registers: 8160 per warp -> 8192; 8 warps = 65536: one block per SM. Epilogue 2: down.
  measured.kernels.push_back({planner::tile_gemm_kernel_key(2, 8, 2), 90, 255, 0, 0});
  const auto p =
      tile_plan(layer(6144, 2048, 256, 8), 4096, GemmKind::kDown, arch_by_name("sm_90"), &measured);
  for (const auto& c : p.candidates) {
    if (c.label.starts_with("m2 n8 ")) {
      EXPECT_EQ(c.registers, 255) << c.label;
      EXPECT_EQ(c.occupancy.by_registers, 1) << c.label;
      EXPECT_EQ(c.occupancy.blocks_per_sm, 1) << c.label;
      if (c.label == "m2 n8 s2 w8") {
        EXPECT_EQ(c.occupancy.limiter, "registers");  // shared memory allows 6
      }
    } else {
      EXPECT_EQ(c.registers, 0) << c.label;  // another tile's numbers never stand in
    }
  }
}

// One expert, the down GEMM of H = 256 rows (one row block of 256) and K = I = 64 (one chunk),
// 64 tokens (one token block of 64 for n8, two of 32 for n4).
TEST(TileGemmCost, ComputeBoundByHand) {
  ArchInfo a = arch_by_name("sm_120");
  a.sm_count = 1;
  a.dram_bandwidth_gbs = 1e6;
  a.l2_bandwidth_gbs = 1e6;
  a.memory_latency_ns = 1;
  a.mma_sync_bf16_tflops = 1;  // 1e6 FLOP per us
  const auto p = tile_plan(layer(256, 64, 1, 1), 64, GemmKind::kDown, a);
  // n8: one item of 2 x 256 rows x 64 tokens x 64 K = 2097152 FLOPs: 2.097152 us.
  const auto n8 = find(p, "m2 n8 s2 w8");
  EXPECT_NEAR(n8.cost_us, 2.097152, 1e-9);
  EXPECT_THAT(n8.cost_how, HasSubstr("compute-bound: 1 items of 256 rows x 64 tokens"));
  // n4: two items of half the FLOPs, both resident on the one SM: the same time.
  EXPECT_NEAR(find(p, "m2 n4 s2 w8").cost_us, 2.097152, 1e-9);
}

TEST(TileGemmCost, DramBoundByHand) {
  ArchInfo a = arch_by_name("sm_120");
  a.sm_count = 1;
  a.dram_bandwidth_gbs = 1;  // 1000 B/us
  a.l2_bandwidth_gbs = 1e6;
  a.memory_latency_ns = 1;
  a.mma_sync_bf16_tflops = 1e6;
  const auto p = tile_plan(layer(256, 64, 1, 1), 64, GemmKind::kDown, a);
  // Weights 4 groups x 1 chunk x 2304 B = 9216, activations 64 x 64 x 2 = 8192, bf16 outputs
  // 64 x 256 x 2 = 32768: 50176 B.
  const auto c = find(p, "m2 n8 s2 w8");
  EXPECT_NEAR(c.cost_us, 50.176, 1e-9);
  EXPECT_THAT(c.cost_how, HasSubstr("DRAM-bound"));
}

TEST(TileGemmCost, LatencyBoundWhenTheRingIsShallow) {
  ArchInfo a = arch_by_name("sm_90");
  a.sm_count = 1;
  a.dram_bandwidth_gbs = 1e6;
  a.l2_bandwidth_gbs = 1e6;
  a.memory_latency_ns = 1000;
  a.mma_sync_bf16_tflops = 1e6;
  a.decode_values_per_ns_per_sm = 1e6;  // not what this test is about
  // K = 256: 4 chunks; a ring of s stages has s chunks in flight per microsecond.
  const auto p = tile_plan(layer(256, 256, 1, 1), 1, GemmKind::kDown, a);
  EXPECT_NEAR(find(p, "m2 n8 s2 w8").cost_us, 2.0, 1e-9);
  EXPECT_NEAR(find(p, "m2 n8 s8 w8").cost_us, 0.5, 1e-9);
  EXPECT_THAT(find(p, "m2 n8 s2 w8").cost_how, HasSubstr("latency-bound"));
}

TEST(TileGemmExplain, BreakdownAddsUpAndFewerStagesIsTheFix) {
  const auto e = explain_kernel("tile-gemm", "m2 n8 s6 w8", arch_by_name("sm_120"), &kNoResources);
  std::int64_t sum = 0;
  for (const auto& t : e.smem_terms) sum += t.bytes;
  EXPECT_EQ(sum, TileGemmLayout::cta_bytes({2, 8, 8, 6}));
  EXPECT_EQ(sum, 104448);
  EXPECT_FALSE(e.verdict.feasible);
  ASSERT_EQ(e.alternatives.size(), 1u);
  EXPECT_EQ(e.alternatives[0].label, "m2 n8 s5 w8");
  EXPECT_EQ(e.alternatives[0].dynamic_smem_bytes, 87040);
  EXPECT_THAT(e.to_string(), HasSubstr("weights and scales"));
}

TEST(TileGemmExplain, BadConfigsAreNamed) {
  const auto& a = arch_by_name("sm_90");
  for (const char* bad : {"m2 n8 s4", "m2 n8 s4 w8 x", "n8 m2 s4 w8", "m2 n8 k1 s4 w8", "m0 n8 s4 w8"}) {
    EXPECT_THAT(error_of([&] { explain_kernel("tile-gemm", bad, a); }), HasSubstr("tile-gemm config")) << bad;
  }
  EXPECT_EQ(explain_kernel("tile-gemm", "m2,n4,s3,w8", a).verdict.label, "m2 n4 s3 w8");
  EXPECT_THAT(explain_kernel("tile-gemm", "m1 n8 s4 w8", a).verdict.reason,
              HasSubstr("(m_tiles, n_tiles) = (1, 8) is not a compiled instance"));
  EXPECT_THAT(explain_kernel("tile-gemm", "m2 n8 s4 w4", a).verdict.reason, HasSubstr("exactly 8 warps"));
  EXPECT_THAT(explain_kernel("tile-gemm", "m2 n8 s9 w8", a).verdict.reason, HasSubstr("2..8 stages"));
}

}  // namespace
}  // namespace fp4moe
