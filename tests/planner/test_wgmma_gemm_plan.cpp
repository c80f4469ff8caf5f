// The wgmma (sm_90 prefill) GEMM family: plan == launch (shared memory from WgmmaGemmLayout),
// only sm_90 with the sm_90a image runs it, the cost model at wgmma's rate, explain.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fp4moe/error.hpp"
#include "fp4moe/planner.hpp"
#include "fp4moe/version.hpp"
#include "kernels/wgmma_gemm_layout.hpp"
#include "planner/wgmma_gemm_plan.hpp"
#include "test_util/shared.hpp"

namespace fp4moe {
namespace {

using kernels::WgmmaGemmLayout;
using test_util::layer;
using ::testing::HasSubstr;

const KernelResources kNoResources{};

Plan wgmma_plan(const LayerDesc& l, std::int64_t tokens, GemmKind kind, const ArchInfo& a) {
  return plan_kernels("wgmma-gemm", make_gemm_problem(l, tokens, kind), a, &kNoResources);
}

TEST(WgmmaGemmPlan, CandidatesAreTheCompiledTokenTilesTimesStagesWithTheLayoutsBytes) {
  const auto configs = planner::wgmma_gemm_candidates();
  ASSERT_EQ(configs.size(), 5u * 6u);  // n4 w8, n8 w8, n16 w8, n4 w16, n8 w16 x stages 3..8
  const auto p = wgmma_plan(layer(6144, 2048, 256, 8), 4096, GemmKind::kDown, arch_by_name("sm_90"));
  ASSERT_EQ(p.candidates.size(), configs.size());
  for (std::size_t i = 0; i < configs.size(); ++i) {
    EXPECT_EQ(p.candidates[i].dynamic_smem_bytes, WgmmaGemmLayout::cta_bytes(configs[i])) << i;
    // a producer warpgroup + the consumer warps
    EXPECT_EQ(p.candidates[i].threads, 128 + 32 * configs[i].consumer_warps) << i;
    EXPECT_EQ(p.candidates[i].label, planner::wgmma_gemm_label(configs[i])) << i;
    // n16 s8: 8 x (9216 + 16384 + 16) + 8 x 1024 (epilogue) + 1024 = 214144 B fits Hopper's 232448.
    EXPECT_TRUE(p.candidates[i].feasible) << p.candidates[i].label << ": " << p.candidates[i].reason;
  }
  EXPECT_EQ(planner::wgmma_gemm_label({16, 4, 8}), "n16 s4 w8");
  EXPECT_EQ(planner::wgmma_gemm_kernel_key(16, 8, 2), "fp4moe_wgmma_gemm<16, 8, 2>");
}

TEST(WgmmaGemmPlan, OnlySm90RunsIt) {
  for (const char* name : {"sm_80", "sm_89", "sm_100", "sm_120"}) {
    const auto p = wgmma_plan(layer(6144, 2048, 256, 8), 4096, GemmKind::kGateUp, arch_by_name(name));
    EXPECT_FALSE(p.ok()) << name;
    for (const auto& c : p.candidates) {
      EXPECT_EQ(c.reason,
                std::string(name) + " cannot run it: wgmma needs sm_90 and a build with the sm_90a image");
    }
  }
  // Forcing it there is unsupported, not a shape error.
  try {
    pick_layer_gemm(layer(6144, 2048, 256, 8), 4096, GemmKind::kDown, arch_by_name("sm_120"), nullptr,
                    GemmPreference{{GemmKernel::kWgmma, 2, 16, 4, 8, 1}, PickSource::kForced, "test"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUnsupported);
    EXPECT_THAT(e.what(), HasSubstr("wgmma-gemm n16 s4 w8 (test, forced by the caller) is rejected"));
  }
}

TEST(WgmmaGemmPlan, ThisBuildWithoutAnSm90aImageTurnsItOff) {
  const ArchInfo a = arch_for_this_build(arch_by_name("sm_90"));
  const bool has_90a = cuda_architectures().find("90a") != std::string::npos;
  EXPECT_EQ(a.wgmma, has_90a);
  if (!has_90a) {
    ASSERT_FALSE(a.notes.empty());
    EXPECT_THAT(a.notes.back(), HasSubstr("wgmma: this build has no sm_90a image"));
  }
  // Other architectures are left as they are.
  EXPECT_TRUE(arch_for_this_build(arch_by_name("sm_120")).notes.empty());
}

TEST(WgmmaGemmPlan, FixedRowsWarpsAndNoKSplit) {
  const auto& a = arch_by_name("sm_90");
  try {
    pick_layer_gemm(layer(6144, 2048, 256, 8), 4096, GemmKind::kDown, a, nullptr,
                    GemmPreference{{GemmKernel::kWgmma, 4, 16, 4, 8, 1}, PickSource::kForced, "test"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("m_tiles=4 k_split=1: the wgmma kernel runs 256 rows (m_tiles 2)"));
  }
  EXPECT_THAT(explain_kernel("wgmma-gemm", "n32 s4 w8", a).verdict.reason,
              HasSubstr("n32 w8 is not a compiled instance (n4 w8, n8 w8, n16 w8, n4 w16, n8 w16)"));
  EXPECT_THAT(explain_kernel("wgmma-gemm", "n16 s4 w16", a).verdict.reason,
              HasSubstr("n16 w16 is not a compiled instance"));
  EXPECT_THAT(explain_kernel("wgmma-gemm", "n16 s2 w8", a).verdict.reason, HasSubstr("3..8 stages"));
  try {
    explain_kernel("wgmma-gemm", "m2 n16 s4", a);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("wgmma-gemm config 'm2 n16 s4' is not 'n<n_tiles> s<stages> w<consumer warps>'"));
  }
}

// sm_90 with one SM where every resource is fast: each cost test slows down the one it is about.
ArchInfo one_fast_sm90() {
  ArchInfo a = arch_by_name("sm_90");
  a.sm_count = 1;
  a.dram_bandwidth_gbs = 1e6;
  a.l2_bandwidth_gbs = 1e6;
  a.memory_latency_ns = 1;
  a.mma_sync_bf16_tflops = 1e6;
  a.wgmma_bf16_tflops = 1e6;
  a.decode_values_per_ns_per_sm = 1e6;
  return a;
}

// The n16 s3 w8 candidate's estimate.
CandidateVerdict n16_s3(const Plan& p) {
  for (const auto& c : p.candidates) {
    if (c.label == "n16 s3 w8") return c;
  }
  ADD_FAILURE() << "no candidate n16 s3 w8";
  return {};
}

// One expert, the down GEMM of H = 256 rows (one item's rows) and K = I = 64, 128 tokens: one item
// of 2 x 256 rows x 128 tokens x 64 K = 4194304 FLOPs.
TEST(WgmmaGemmCost, ComputeBoundAtTheWgmmaRateByHand) {
  ArchInfo a = one_fast_sm90();
  a.wgmma_bf16_tflops = 1;  // 1e6 FLOP per us at the peak, 0.75e6 at the kernel's 75%
  const auto c = n16_s3(wgmma_plan(layer(256, 64, 1, 1), 128, GemmKind::kDown, a));
  EXPECT_NEAR(c.cost_us, 4.194304 / 0.75, 1e-9);
  EXPECT_THAT(c.cost_how, HasSubstr("compute-bound: 1 items of 256 rows x 128 tokens"));
  EXPECT_THAT(c.cost_how, HasSubstr("(wgmma at 75% of the peak, as measured, estimated)"));
}

// The same item bound by its decode: 256 rows x 64 K = 16384 values at 1 per ns.
TEST(WgmmaGemmCost, DecodeBoundAtTheSmsDecodeRateByHand) {
  ArchInfo a = one_fast_sm90();
  a.decode_values_per_ns_per_sm = 1;
  const auto c = n16_s3(wgmma_plan(layer(256, 64, 1, 1), 128, GemmKind::kDown, a));
  EXPECT_NEAR(c.cost_us, 16.384, 1e-9);
  EXPECT_THAT(c.cost_how, HasSubstr("decode-bound: 1 items of 256 rows x 128 tokens"));
  EXPECT_THAT(c.cost_how, HasSubstr("decode 16.38 us"));
}

TEST(WgmmaGemmCost, TheFirstGemmAlsoMovesThePermutedCopyOfX) {
  ArchInfo a = one_fast_sm90();
  a.dram_bandwidth_gbs = 1;  // 1000 B/us
  // gate_up of H = 64, I = 128: N = 256 rows, K = 64; 128 tokens, one expert. Weights 4 x 2304 =
  // 9216 B, x 128 x 64 x 2 = 16384 B, h 128 x 128 x 2 = 32768 B, the permuted copy read and
  // written: 2 x 16384 = 32768 B. 91136 B: 91.136 us.
  const auto c = n16_s3(wgmma_plan(layer(64, 128, 1, 1), 128, GemmKind::kGateUp, a));
  EXPECT_NEAR(c.cost_us, 91.136, 1e-9);
  EXPECT_THAT(c.cost_how, HasSubstr("with the k-permuted copy of x"));
}

// The copy is one row per token, not per pick: with top-2 of 2 experts the GEMM reads 256 slots'
// rows (2 x 16384 B of x, 2 x 32768 B of h, 2 x 9216 B of weights) and the copy is still 128 rows
// read and written: 2 x 16384 B. 149504 B: 149.504 us.
TEST(WgmmaGemmCost, ThePermutedCopyIsOneRowPerTokenWhateverTheTopK) {
  ArchInfo a = one_fast_sm90();
  a.dram_bandwidth_gbs = 1;
  const auto c = n16_s3(wgmma_plan(layer(64, 128, 2, 2), 128, GemmKind::kGateUp, a));
  EXPECT_NEAR(c.cost_us, 149.504, 1e-9);
}

TEST(WgmmaGemmExplain, BreakdownAddsUpToTheLayout) {
  const auto e = explain_kernel("wgmma-gemm", "n16 s4 w8", arch_by_name("sm_90"), &kNoResources);
  std::int64_t sum = 0;
  for (const auto& t : e.smem_terms) sum += t.bytes;
  EXPECT_EQ(sum, WgmmaGemmLayout::cta_bytes({16, 4, 8}));
  // stages, mbarriers, their round-up to 128, 8 warps' epilogue buffers, alignment slack
  EXPECT_EQ(sum, 4 * 25600 + 4 * 16 + 64 + 8 * 1024 + 1024);
  EXPECT_TRUE(e.verdict.feasible);
}

}  // namespace
}  // namespace fp4moe
