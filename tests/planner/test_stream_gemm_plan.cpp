// The planner for fp4moe's own kernels: plan == launch (shared memory from the kernel's layout),
// every accepted config fits, occupancy and the cost model worked by hand, refusals with numbers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "fp4moe/error.hpp"
#include "fp4moe/planner.hpp"
#include "kernels/launch.hpp"
#include "kernels/stream_gemm_layout.hpp"
#include "planner/stream_gemm_plan.hpp"
#include "test_util/shared.hpp"

namespace fp4moe {
namespace {

using kernels::StreamGemmConfig;
using kernels::StreamGemmLayout;
using test_util::error_of;
using test_util::glm5;
using test_util::layer;
using ::testing::HasSubstr;

const KernelResources kNoResources{};

// ---- problems --------------------------------------------------------------------------------

TEST(GemmProblem, ShapesAndRoutingStatistics) {
  const auto up = make_gemm_problem(glm5(), 1, GemmKind::kGateUp);
  EXPECT_EQ(up.n, 4096);
  EXPECT_EQ(up.k, 6144);
  EXPECT_DOUBLE_EQ(up.active_experts, 8.0);  // 256 * (1 - (1 - 8/256)^1)
  EXPECT_DOUBLE_EQ(up.tokens_per_expert, 1.0);
  const auto down = make_gemm_problem(glm5(), 1000, GemmKind::kDown);
  EXPECT_EQ(down.n, 6144);
  EXPECT_EQ(down.k, 2048);
  EXPECT_NEAR(down.active_experts, 256.0 * (1.0 - std::pow(248.0 / 256.0, 1000.0)), 1e-9);
  EXPECT_NEAR(down.tokens_per_expert, 8000.0 / down.active_experts, 1e-12);
  EXPECT_EQ(up.to_string(),
            "gate_up N=4096 K=6144 nvfp4, 256 experts top-8, 1 tokens: 8.0 active experts x 1.00 tokens");
  EXPECT_EQ(up.shared_pieces, 0);
}

// The shared expert is a pseudo-expert of every token (two pieces when it is wider than a routed
// one): it adds items and weight bytes to the estimates. GLM-5's first GEMM at T=1 has 9 x 64
// items of 64 rows, the number the 3-way split is sized for (the dispatcher's own count).
TEST(GemmProblem, TheSharedExpertCountsInTheEstimates) {
  LayerDesc g = glm5();
  g.shared_intermediate = 2048;
  const auto up = make_gemm_problem(g, 1, GemmKind::kGateUp);
  EXPECT_EQ(up.shared_pieces, 1);
  EXPECT_EQ(up.to_string(),
            "gate_up N=4096 K=6144 nvfp4, 256 experts top-8, 1 tokens: 8.0 active experts x 1.00 tokens + 1 "
            "shared x 1 tokens");
  g.shared_intermediate = 4096;
  EXPECT_EQ(make_gemm_problem(g, 1, GemmKind::kDown).shared_pieces, 2);
  const auto& a = arch_by_name("sm_90");
  const auto cost_of = [&](const LayerDesc& l) {
    const auto p = planner::plan_stream_gemm(l, 1, GemmKind::kGateUp, a, &kNoResources);
    for (const auto& c : p.plan.candidates) {
      if (c.label == "m4 n1 k3 s2 w15") return c;
    }
    ADD_FAILURE() << "no m4 n1 k3 s2 w15 candidate";
    return CandidateVerdict{};
  };
  g.shared_intermediate = 2048;
  const CandidateVerdict with = cost_of(g), without = cost_of(glm5());
  EXPECT_THAT(with.cost_how, HasSubstr("576 items on 660 groups of 3 warp(s)"));
  EXPECT_THAT(without.cost_how, HasSubstr("512 items on 660 groups of 3 warp(s)"));
  EXPECT_GT(with.cost_us, without.cost_us);
}

TEST(GemmProblem, BadValuesAreNamed) {
  Errc code{};
  EXPECT_THAT(error_of([] { make_gemm_problem(glm5(), 0, GemmKind::kGateUp); }, &code),
              HasSubstr("tokens=0: a plan needs at least 1 token"));
  EXPECT_EQ(code, Errc::kInvalidArgument);
  EXPECT_THAT(error_of([] { make_gemm_problem(layer(64, 64, 8, 9), 1, GemmKind::kDown); }),
              HasSubstr("top_k=9 must be between 1 and experts=8"));
  EXPECT_THAT(error_of([] { make_gemm_problem(layer(0, 64, 8, 1), 1, GemmKind::kDown); }),
              HasSubstr("hidden=0"));
  EXPECT_THAT(error_of([] { parse_gemm_kind("up"); }),
              HasSubstr("unknown GEMM 'up' (expected gate_up or down)"));
}

// ---- occupancy -------------------------------------------------------------------------------

TEST(Occupancy, SharedMemoryCountsTheReservedKilobyte) {
  const auto& a = arch_by_name("sm_120");
  // 102400 / (26624 + 1024) = 3 blocks; 48 warps / 4 = 12 by threads.
  const auto o = occupancy(a, 26624, 128, 0);
  EXPECT_EQ(o.by_smem, 3);
  EXPECT_EQ(o.by_threads, 12);
  EXPECT_EQ(o.by_registers, -1);
  EXPECT_EQ(o.blocks_per_sm, 3);
  EXPECT_EQ(o.limiter, "shared memory");
  // The whole opt-in block leaves exactly the reserved kilobyte: one block.
  EXPECT_EQ(occupancy(a, 101376, 128, 0).blocks_per_sm, 1);
  EXPECT_EQ(occupancy(a, 101377, 128, 0).blocks_per_sm, 0);
}

TEST(Occupancy, RegistersAreAllocatedPerWarpIn256s) {
  const auto& a = arch_by_name("sm_90");
  // 41 registers x 32 lanes = 1312 -> 1536 per warp; 8 warps -> 12288 per block; 65536 / 12288 = 5.
  auto o = occupancy(a, 0, 256, 41);
  EXPECT_EQ(o.by_registers, 5);
  EXPECT_EQ(o.by_threads, 8);
  EXPECT_EQ(o.blocks_per_sm, 5);
  EXPECT_EQ(o.limiter, "registers");
  // 40 registers: 1280 per warp exactly; 65536 / 10240 = 6.
  EXPECT_EQ(occupancy(a, 0, 256, 40).by_registers, 6);
  EXPECT_EQ(occupancy(a, 0, 256, 256).by_registers, 0);  // above the 255 per thread
  EXPECT_EQ(occupancy(a, 0, 32, 0).blocks_per_sm, 32);   // the block limit
  EXPECT_EQ(occupancy(a, 0, 32, 0).limiter, "blocks per SM");
}

// ---- plan == launch, and every accepted config fits ------------------------------------------

TEST(StreamGemmPlan, SharedMemoryIsTheKernelLayoutsOwnNumber) {
  const auto candidates = planner::stream_gemm_candidates();
  const auto p =
      planner::plan_stream_gemm(glm5(), 16, GemmKind::kGateUp, arch_by_name("sm_120"), &kNoResources);
  ASSERT_EQ(p.plan.candidates.size(), candidates.size());
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    EXPECT_EQ(p.plan.candidates[i].dynamic_smem_bytes, StreamGemmLayout::cta_bytes(candidates[i])) << i;
    EXPECT_EQ(p.plan.candidates[i].threads, StreamGemmLayout::threads(candidates[i])) << i;
    EXPECT_EQ(p.plan.candidates[i].label, planner::stream_gemm_label(candidates[i])) << i;
  }
  ASSERT_TRUE(p.plan.ok());
  EXPECT_EQ(p.config, candidates[static_cast<std::size_t>(p.plan.chosen)]);
  EXPECT_EQ(&p.plan.best(), &p.plan.candidates[static_cast<std::size_t>(p.plan.chosen)]);
}

TEST(StreamGemmPlan, EveryAcceptedConfigFitsItsArchitecture) {
  const std::vector<LayerDesc> layers = {glm5(), layer(2880, 2880, 128, 4), layer(4096, 14336, 8, 2)};
  KernelResources measured;
  measured.source = ResourceSource::kMeasured;
  measured.origin = "test";
  int accepted = 0;
  for (const auto& a : arch_table()) {
    for (const auto& l : layers) {
      for (const auto kind : {GemmKind::kGateUp, GemmKind::kDown}) {
        for (std::int64_t t : {1, 7, 4096}) {
          // Alternate between no registers and a heavy register count per instance.
          measured.kernels.clear();
          for (const auto& shape : kernels::kStreamTileShapes) {
            measured.kernels.push_back({planner::stream_gemm_kernel_key(shape[0], shape[1], 0), a.sm,
                                        static_cast<int>(64 + 40 * shape[0] + 16 * shape[1]), 512, 0});
          }
          const auto p = planner::plan_stream_gemm(l, t, kind, a, t == 7 ? &kNoResources : &measured);
          for (const auto& c : p.plan.candidates) {
            if (!c.feasible) {
              EXPECT_FALSE(c.reason.empty());
              continue;
            }
            ++accepted;
            const std::int64_t smem = c.dynamic_smem_bytes + c.static_smem_bytes;
            ASSERT_LE(smem, a.smem_per_block_optin) << a.name << " " << c.label;
            ASSERT_LE(c.threads, a.max_threads_per_block) << a.name << " " << c.label;
            ASSERT_GE(a.smem_per_sm / (smem + a.smem_reserved_per_block), 1) << a.name << " " << c.label;
            ASSERT_GE(a.max_threads_per_sm / c.threads, 1) << a.name << " " << c.label;
            if (c.registers > 0) {
              const int per_warp = (c.registers * 32 + 255) / 256 * 256;
              ASSERT_LE(c.registers, a.regs_per_thread);
              ASSERT_GE(a.regs_per_sm / (per_warp * (c.threads / 32)), 1) << a.name << " " << c.label;
            }
            ASSERT_GT(c.cost_us, 0);
          }
          ASSERT_TRUE(p.plan.ok()) << a.name << " " << p.plan.problem.to_string();
          const auto& best = p.plan.best();
          ASSERT_TRUE(best.feasible);
          for (const auto& c : p.plan.candidates) {
            if (c.feasible) {
              ASSERT_LE(best.cost_us, c.cost_us * 1.01 + 1e-9) << a.name << " " << c.label;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(accepted, 1000);
}

TEST(StreamGemmPlan, OversizedConfigsAreRejectedWithTheirNumbers) {
  const auto p =
      planner::plan_stream_gemm(glm5(), 1, GemmKind::kGateUp, arch_by_name("sm_120"), &kNoResources);
  bool found = false;
  for (const auto& c : p.plan.candidates) {
    if (c.label != "m1 n1 k1 s8 w8") continue;
    found = true;
    EXPECT_FALSE(c.feasible);
    EXPECT_EQ(c.reason,
              "needs 106496 B of shared memory per block (8 warps x 8 stages x 1664 B), sm_120 allows "
              "101376 B: over by 5120 B");
  }
  EXPECT_TRUE(found);
  // The same config fits Hopper's 227 KB.
  const auto h =
      planner::plan_stream_gemm(glm5(), 1, GemmKind::kGateUp, arch_by_name("sm_90"), &kNoResources);
  for (const auto& c : h.plan.candidates) {
    if (c.label == "m1 n1 k1 s8 w8") {
      EXPECT_TRUE(c.feasible) << c.reason;
    }
  }
}

TEST(StreamGemmPlan, NothingFitsMeansARefusalWithTheClosestNumbers) {
  ArchInfo tiny = arch_by_name("sm_120");
  tiny.name = "sm_tiny";
  tiny.smem_per_block_optin = 8192;
  tiny.smem_per_sm = 9216;
  const auto p = planner::plan_stream_gemm(glm5(), 1, GemmKind::kDown, tiny, &kNoResources);
  EXPECT_FALSE(p.plan.ok());
  Errc code{};
  const auto msg = error_of([&] { p.plan.best(); }, &code);
  EXPECT_EQ(code, Errc::kDoesNotFit);
  EXPECT_THAT(msg, HasSubstr("plan: no stream-gemm config fits down N=6144 K=2048"));
  EXPECT_THAT(
      msg,
      HasSubstr("the smallest, m1 n1 k1 s2 w4, needs 13312 B of shared memory per block (4 warps x 2 stages "
                "x 1664 B), sm_tiny allows 8192 B: over by 5120 B"));
  EXPECT_THAT(p.plan.to_string(), HasSubstr("chosen: none"));
}

TEST(StreamGemmPlan, RegistersComeFromTheResourcesAndCanLimitOccupancy) {
  KernelResources measured;
  measured.source = ResourceSource::kMeasured;
  measured.origin = "cudaFuncGetAttributes on device 0";
  // 255 registers: 8160 per warp -> 8192; 8 warps = 65536: one block per SM.
  measured.kernels.push_back({planner::stream_gemm_kernel_key(1, 1, 2), 90, 255, 0, 0});
  const auto p = planner::plan_stream_gemm(glm5(), 1, GemmKind::kDown, arch_by_name("sm_90"), &measured);
  EXPECT_THAT(p.plan.resources_note, HasSubstr("measured (cudaFuncGetAttributes on device 0)"));
  for (const auto& c : p.plan.candidates) {
    if (c.label == "m1 n1 k1 s2 w8") {
      EXPECT_EQ(c.registers, 255);
      EXPECT_EQ(c.registers_source, ResourceSource::kMeasured);
      EXPECT_EQ(c.occupancy.by_registers, 1);
      EXPECT_EQ(c.occupancy.blocks_per_sm, 1);
      EXPECT_EQ(c.occupancy.limiter, "registers");
    }
    if (c.label == "m2 n1 k1 s2 w8") {
      EXPECT_EQ(c.registers, 0);  // not measured: unknown
    }
  }
  // gate_up runs epilogue 0, which was not measured: the same tile's other epilogue stands in,
  // and other tiles stay unknown (a different tile's numbers never do).
  const auto up = planner::plan_stream_gemm(glm5(), 1, GemmKind::kGateUp, arch_by_name("sm_90"), &measured);
  for (const auto& c : up.plan.candidates) {
    EXPECT_EQ(c.registers, c.label.starts_with("m1 n1 ") ? 255 : 0) << c.label;
  }
  // Another architecture's numbers never do either.
  const auto other = planner::plan_stream_gemm(glm5(), 1, GemmKind::kDown, arch_by_name("sm_120"), &measured);
  for (const auto& c : other.plan.candidates) EXPECT_EQ(c.registers, 0) << c.label;
}

TEST(StreamGemmPlan, WithoutResourcesThePlanSaysSo) {
  const auto p = planner::plan_stream_gemm(glm5(), 1, GemmKind::kDown, arch_by_name("sm_90"), &kNoResources);
  EXPECT_THAT(p.plan.resources_note, HasSubstr("registers unknown"));
  EXPECT_THAT(p.plan.resources_note, HasSubstr("occupancy from shared memory and threads only"));
}

// ---- the cost model, worked by hand ---------------------------------------------------------

TEST(StreamGemmCost, OneExpertOneTokenByHand) {
  // One expert, one token: N = H = 64 rows (one 64-row group: 4 row blocks of 16 for m_tiles 1),
  // K = I = 64 (one chunk).
  ArchInfo a = arch_by_name("sm_120");
  a.sm_count = 1;
  a.dram_bandwidth_gbs = 1;  // 1000 B/us
  a.l2_bandwidth_gbs = 2;
  a.memory_latency_ns = 1000;
  const auto p = planner::plan_stream_gemm(layer(64, 64, 1, 1), 1, GemmKind::kDown, a, &kNoResources);
  const CandidateVerdict* c = nullptr;
  for (const auto& x : p.plan.candidates) {
    if (x.label == "m1 n1 k1 s2 w4") c = &x;
  }
  ASSERT_NE(c, nullptr);
  // Items: 4 (4 row blocks x 1 token block); per item 576 B of weights + scales and 1 token x 64 x
  // 2 B = 128 B of activations: 704 B. DRAM: 4 x 576 + 64 x 2 (activations) + 64 x 2 (bf16 out)
  // = 2560 B, 640 per item. 7 blocks of 4 warps fit an SM, so one round of 4 busy warps:
  // DRAM 4 x 640 / 1000 = 2.56 us, L2 4 x 704 / 2000 = 1.408 us, latency 704 x 1 us / (2 x 704) =
  // 0.5 us.
  EXPECT_EQ(c->occupancy.blocks_per_sm, 7);
  EXPECT_NEAR(c->cost_us, 2.56, 1e-12);
  EXPECT_THAT(c->cost_how, HasSubstr("DRAM-bound: 4 items on 28 groups of 1 warp(s)"));
}

TEST(StreamGemmCost, LatencyBoundWhenTheRingIsShallow) {
  ArchInfo a = arch_by_name("sm_120");
  a.sm_count = 1;
  a.dram_bandwidth_gbs = 1e6;
  a.l2_bandwidth_gbs = 1e6;
  a.memory_latency_ns = 1000;
  const auto p = planner::plan_stream_gemm(layer(64, 64, 1, 1), 1, GemmKind::kDown, a, &kNoResources);
  for (const auto& c : p.plan.candidates) {
    if (c.label != "m1 n1 k1 s2 w4" && c.label != "m1 n1 k1 s4 w4") continue;
    // One item at the latency-bound rate of one warp: 704 B / (stages x 704 B per us).
    EXPECT_NEAR(c.cost_us, c.label == "m1 n1 k1 s2 w4" ? 0.5 : 0.25, 1e-9) << c.label;
    EXPECT_THAT(c.cost_how, HasSubstr("latency-bound")) << c.label;
  }
}

TEST(StreamGemmCost, SplittingKShortensTheLatencyBoundItem) {
  // One 64-row item (m_tiles 4) over K = 512 (8 chunks of 2304 B of weights and scales + 128 B
  // of the one token's activations): a lone warp with 2 stages in flight takes 8 chunks x 1 us /
  // 2 = 4 us; split over 8 warps, each streams one chunk: 0.5 us.
  ArchInfo a = arch_by_name("sm_90");
  a.sm_count = 1;
  a.dram_bandwidth_gbs = 1e6;
  a.l2_bandwidth_gbs = 1e6;
  a.memory_latency_ns = 1000;
  const auto p = planner::plan_stream_gemm(layer(64, 512, 1, 1), 1, GemmKind::kDown, a, &kNoResources);
  int seen = 0;
  for (const auto& c : p.plan.candidates) {
    if (c.label == "m4 n1 k1 s2 w8") {
      EXPECT_NEAR(c.cost_us, 4.0, 1e-9);
      ++seen;
    }
    if (c.label == "m4 n1 k8 s2 w8") {
      EXPECT_NEAR(c.cost_us, 0.5, 1e-9);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 2);
  EXPECT_THAT(p.plan.best().label, HasSubstr("k8"));
}

// ---- explain for our kernels, family lookup, printing ----------------------------------------

TEST(ExplainKernel, BreakdownAddsUpToTheLayout) {
  const auto e = explain_kernel("stream-gemm", "m1 n1 k1 s8 w8", arch_by_name("sm_120"), &kNoResources);
  std::int64_t sum = 0;
  for (const auto& t : e.smem_terms) sum += t.bytes;
  EXPECT_EQ(sum, StreamGemmLayout::cta_bytes({1, 1, 8, 8, 1}));
  EXPECT_EQ(sum, 106496);
  EXPECT_FALSE(e.verdict.feasible);
  // One fix per launch parameter that has one: fewer stages (6 of the candidates' 2, 3, 4, 6, 8),
  // fewer warps (4). A K split only adds the reduction area.
  ASSERT_EQ(e.alternatives.size(), 2u);
  EXPECT_EQ(e.alternatives[0].label, "m1 n1 k1 s6 w8");
  EXPECT_EQ(e.alternatives[0].dynamic_smem_bytes, 79872);
  EXPECT_EQ(e.alternatives[1].label, "m1 n1 k1 s8 w4");
  EXPECT_EQ(e.alternatives[1].dynamic_smem_bytes, 53248);
  const auto j = nlohmann::json::parse(e.to_json());
  EXPECT_EQ(j.at("fits"), false);
  EXPECT_EQ(j.at("total_bytes"), 106496);
  EXPECT_EQ(j.at("limit_bytes"), 101376);
  EXPECT_EQ(j.at("stages"), 8);
  EXPECT_EQ(j.at("over_by_bytes"), 5120);
  EXPECT_TRUE(j.at("reason").is_string());
  EXPECT_EQ(j.at("alternatives").size(), 2u);
  EXPECT_THAT(e.to_string(),
              HasSubstr("fixes that fit (the same compiled instance, one launch parameter changed):"));
}

TEST(ExplainKernel, KSplitAddsTheReductionArea) {
  // The layout header's own example: 8 warps x 3 stages x 3328 B + 8 x 4 x 512 B.
  const auto e = explain_kernel("stream-gemm", "m4 n1 k4 s3 w8", arch_by_name("sm_90"), &kNoResources);
  EXPECT_EQ(e.verdict.dynamic_smem_bytes, 8 * 3 * 3328 + 8 * 4 * 512);
  ASSERT_FALSE(e.smem_terms.empty());
  EXPECT_EQ(e.smem_terms.back().name, "K-split reduction area");
  EXPECT_EQ(e.smem_terms.back().bytes, 8 * 4 * 512);
  EXPECT_TRUE(e.verdict.feasible);
  EXPECT_TRUE(e.alternatives.empty());
}

TEST(ExplainKernel, BadConfigsAndFamiliesAreNamed) {
  const auto& a = arch_by_name("sm_90");
  for (const char* bad : {"m1 n1 k1 s8", "m1 n1 k1 s8 w8 x", "n1 m1 k1 s8 w8", "m0 n1 k1 s8 w8",
                          "m1,n1,k1,s8,wx", "m1 n1 s8 w8"}) {
    EXPECT_THAT(error_of([&] { explain_kernel("stream-gemm", bad, a); }), HasSubstr("stream-gemm config"))
        << bad;
  }
  EXPECT_EQ(explain_kernel("stream-gemm", "m1,n1,k1,s8,w8", a).verdict.label, "m1 n1 k1 s8 w8");
  EXPECT_THAT(explain_kernel("stream-gemm", "m3 n1 k1 s8 w8", a).verdict.reason,
              HasSubstr("(m_tiles, n_tiles) = (3, 1) is not a compiled instance"));
  EXPECT_THAT(explain_kernel("stream-gemm", "m1 n1 k1 s8 w32", a).verdict.reason, HasSubstr("1..16 warps"));
  EXPECT_THAT(explain_kernel("stream-gemm", "m1 n4 k1 s2 w16", a).verdict.reason, HasSubstr("1..8 with 4"));
  EXPECT_THAT(explain_kernel("stream-gemm", "m1 n1 k3 s8 w8", a).verdict.reason,
              HasSubstr("a K split of 1, 2, 3, 4 or 8 that divides the warps"));
  EXPECT_THAT(explain_kernel("stream-gemm", "m1 n1 k5 s8 w15", a).verdict.reason,
              HasSubstr("a K split of 1, 2, 3, 4 or 8 that divides the warps"));
  EXPECT_EQ(explain_kernel("stream-gemm", "m4 n1 k3 s4 w15", a).verdict.reason, "");
  EXPECT_THAT(
      error_of([&] { plan_kernels("prefill-gemm", make_gemm_problem(glm5(), 1, GemmKind::kDown), a); }),
      HasSubstr("unknown kernel family 'prefill-gemm' (known: stream-gemm, tile-gemm, wgmma-gemm)"));
  EXPECT_EQ(kernel_family_names(), (std::vector<std::string>{"stream-gemm", "tile-gemm", "wgmma-gemm"}));
}

TEST(PlanPrinting, TextAndJsonCarryThePickAndTheRejected) {
  const auto p = plan_kernels("stream-gemm", make_gemm_problem(glm5(), 4, GemmKind::kGateUp),
                              arch_by_name("sm_120"), &kNoResources);
  const auto s = p.to_string();
  EXPECT_THAT(s, HasSubstr("plan: stream-gemm for gate_up N=4096 K=6144"));
  EXPECT_THAT(s, HasSubstr("<- chosen"));
  EXPECT_THAT(s, HasSubstr("chosen: " + p.best().label));
  EXPECT_THAT(s, HasSubstr("m1 n1 k1 s8 w8: needs 106496 B"));
  const auto j = nlohmann::json::parse(p.to_json());
  EXPECT_EQ(j.at("chosen"), p.best().label);
  EXPECT_EQ(j.at("candidates").size(), p.candidates.size());
  EXPECT_EQ(j.at("problem").at("n"), 4096);
}

// ---- the fused decode path's routing tables (kernels::launch_stream_gemm_routed) ---------------

// Its tables are static shared memory beside the configuration's layout: with GLM-5's decode
// configurations they fit the H200's 232,448 bytes per block; the dynamic part after them stays
// 128-byte aligned.
TEST(FusedRouting, TheTablesFitBesideTheDecodeConfigs) {
  EXPECT_EQ(kernels::kFusedRouteTableBytes % 128, 0);
  EXPECT_LT(kernels::kFusedRouteTableBytes, 20 * 1024);
  for (const StreamGemmConfig c : {StreamGemmConfig{4, 1, 2, 15, 3}, StreamGemmConfig{4, 1, 3, 16, 1},
                                   StreamGemmConfig{4, 1, 3, 16, 2}, StreamGemmConfig{4, 1, 4, 16, 1}}) {
    EXPECT_LE(StreamGemmLayout::cta_bytes(c) + kernels::kFusedRouteTableBytes, 232448)
        << StreamGemmLayout::cta_bytes(c);
  }
}

// Which forwards the tables and the CTA hold: T <= 16, one scanning thread per expert and shared
// piece, T * (k + P) slots, and no wgmma tail or small-expert lists.
TEST(FusedRouting, FitsOnlyWhatItsTablesHold) {
  kernels::RouteArgs r;
  r.tokens = 16;
  r.experts = 256;
  r.top_k = 8;
  kernels::GroupArgs g;
  g.shared_pieces = 1;
  const StreamGemmConfig w15{4, 1, 2, 15, 3}, w8{4, 1, 3, 8, 1};
  EXPECT_TRUE(kernels::fused_route_fits(r, g, w15));
  EXPECT_FALSE(kernels::fused_route_fits(r, g, w8));  // 257 experts and pieces, 256 threads
  g.shared_pieces = 0;
  EXPECT_TRUE(kernels::fused_route_fits(r, g, w8));
  r.tokens = 17;
  EXPECT_FALSE(kernels::fused_route_fits(r, g, w15));
  r.tokens = 0;
  EXPECT_FALSE(kernels::fused_route_fits(r, g, w15));
  r.tokens = 16;
  r.top_k = 32;
  g.shared_pieces = 1;
  EXPECT_FALSE(kernels::fused_route_fits(r, g, w15));  // 16 * 33 slots > 512
  r.top_k = 8;
  g.tb_tail[0] = 32;
  EXPECT_FALSE(kernels::fused_route_fits(r, g, w15));
  g.tb_tail[0] = 0;
  g.tb_small[1] = 16;
  EXPECT_FALSE(kernels::fused_route_fits(r, g, w15));
}

}  // namespace
}  // namespace fp4moe
