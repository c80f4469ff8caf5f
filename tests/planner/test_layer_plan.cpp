// The layer's decision (planner::pick_layer_gemm / plan_layer_gemm): the dispatcher's config is
// the pick wherever the planner accepts it; a rejected one falls back to the planner's cheapest
// with the reason; preferences (forced, tuned) come first; every family is listed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fp4moe/error.hpp"
#include "fp4moe/planner.hpp"
#include "gpu/dispatch.hpp"
#include "planner/stream_gemm_plan.hpp"
#include "test_util/shared.hpp"

namespace fp4moe {
namespace {

using test_util::error_of;
using test_util::glm5;
using test_util::layer;
using ::testing::HasSubstr;

GemmChoice dispatcher(const LayerDesc& l, std::int64_t tokens, GemmKind kind, const ArchInfo& a) {
  return gpu::choose_gemm(l, tokens, kind == GemmKind::kGateUp ? gpu::Gemm::kGateUp : gpu::Gemm::kDown,
                          {a.sm_count, a.smem_per_block_optin, a.smem_per_sm, a.wgmma});
}

int count_lines_with(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
  return n;
}

TEST(LayerPlan, TheDispatchersConfigIsThePickWhereThePlannerAcceptsIt) {
  const auto& a = arch_by_name("sm_90");
  for (const auto& l : {glm5(), layer(2880, 2880, 128, 4), layer(256, 128, 16, 4)}) {
    for (const std::int64_t t : {1, 7, 64, 300, 4096}) {
      for (const auto kind : {GemmKind::kGateUp, GemmKind::kDown}) {
        const auto pick = pick_layer_gemm(l, t, kind, a);
        SCOPED_TRACE(pick.problem.to_string());
        EXPECT_EQ(pick.source, PickSource::kDispatcher);
        EXPECT_EQ(pick.why, "picked by the dispatcher");
        EXPECT_EQ(pick.choice, dispatcher(l, t, kind, a)) << pick.choice.to_string();
        EXPECT_TRUE(pick.verdict.feasible);
        EXPECT_EQ(pick.verdict.label, gemm_choice_label(pick.choice));
        EXPECT_EQ(pick.verdict.family, gemm_family_name(pick.choice.kernel));
      }
    }
  }
}

TEST(LayerPlan, DecodeStreamsPrefillRunsWgmmaOnSm90AndTilesElsewhere) {
  ArchInfo no_wgmma = arch_by_name("sm_90");  // an sm_90 build without the sm_90a image
  no_wgmma.wgmma = false;
  for (const auto kind : {GemmKind::kGateUp, GemmKind::kDown}) {
    EXPECT_EQ(pick_layer_gemm(glm5(), 1, kind, arch_by_name("sm_90")).choice.kernel, GemmKernel::kStream);
    EXPECT_EQ(pick_layer_gemm(glm5(), 4096, kind, arch_by_name("sm_90")).choice.kernel, GemmKernel::kWgmma);
    EXPECT_EQ(pick_layer_gemm(glm5(), 4096, kind, arch_by_name("sm_120")).choice.kernel, GemmKernel::kTile);
    EXPECT_EQ(pick_layer_gemm(glm5(), 4096, kind, no_wgmma).choice.kernel, GemmKernel::kTile);
  }
}

TEST(LayerPlan, AWgmmaItemIs256RowsWhateverItsConsumerWarps) {
  // The layer cuts each expert's rows into items of rows_per_item(): the wgmma kernel covers 256
  // rows with 8 or 16 consumer warps alike (a 16-warp count once doubled it and skipped rows).
  for (const int warps : {8, 16}) {
    EXPECT_EQ((GemmChoice{GemmKernel::kWgmma, 2, 4, 3, warps, 1}).rows_per_item(), 256) << warps;
  }
  EXPECT_EQ((GemmChoice{GemmKernel::kTile, 2, 8, 4, 8, 1}).rows_per_item(), 256);
  EXPECT_EQ((GemmChoice{GemmKernel::kStream, 4, 1, 4, 8, 2}).rows_per_item(), 64);
  // On sm_90 the dispatcher takes the wgmma kernel from a few tokens per expert. With a shared
  // expert (the GLM-5 preset): 32-token blocks at T=255 (just under 8 per expert), 64-token ones
  // at T=256-384 (8-12), 128-token ones from T=416 (13).
  for (const auto& [t, n_tiles] : {std::pair{255, 4}, {256, 8}, {320, 8}, {384, 8}, {416, 16}, {4096, 16}}) {
    const GemmChoice c =
        pick_layer_gemm(layer_preset("glm5"), t, GemmKind::kGateUp, arch_by_name("sm_90")).choice;
    EXPECT_EQ(c.kernel, GemmKernel::kWgmma) << t;
    EXPECT_EQ(c.n_tiles, n_tiles) << t;
    EXPECT_EQ(c.warps, 8) << t;
  }
  // Without one (GLM-5's routed experts alone) 64-token blocks only from 10 per expert (T=320).
  for (const auto& [t, n_tiles] : {std::pair{256, 4}, {319, 4}, {320, 8}, {416, 16}}) {
    const GemmChoice c = pick_layer_gemm(glm5(), t, GemmKind::kGateUp, arch_by_name("sm_90")).choice;
    EXPECT_EQ(c.kernel, GemmKernel::kWgmma) << t;
    EXPECT_EQ(c.n_tiles, n_tiles) << t;
  }
}

TEST(LayerPlan, AWgmmaGemmsLastShortBlocksGoToNarrowerTailLaunches) {
  const auto& a = arch_by_name("sm_90");
  const GemmChoice n16{GemmKernel::kWgmma, 2, 16, 8, 8, 1};
  const auto t16 = gpu::tail_launches(n16, a.smem_per_block_optin);
  ASSERT_EQ(t16.size(), 2u);
  // Widest first: last blocks of 33-64 tokens on the 64-token instance, 1-32 on the 32-token one,
  // each with the deepest ring that fits; the rest of the launch is the main choice's.
  EXPECT_EQ(t16[0].choice, (GemmChoice{GemmKernel::kWgmma, 2, 8, 8, 8, 1}));
  EXPECT_EQ(t16[0].lo, 32);
  EXPECT_EQ(t16[0].hi, 64);
  EXPECT_EQ(t16[1].choice, (GemmChoice{GemmKernel::kWgmma, 2, 4, 8, 8, 1}));
  EXPECT_EQ(t16[1].lo, 0);
  EXPECT_EQ(t16[1].hi, 32);
  EXPECT_EQ(gpu::tail_max(n16), 64);
  // Every tail configuration is one the planner accepts where the main one is.
  for (const auto& t : t16) {
    EXPECT_NO_THROW(pick_layer_gemm(glm5(), 4096, GemmKind::kGateUp, a, nullptr,
                                    GemmPreference{t.choice, PickSource::kForced, "test"}));
  }
  const GemmChoice n8w16{GemmKernel::kWgmma, 2, 8, 5, 16, 1};
  const auto t8 = gpu::tail_launches(n8w16, a.smem_per_block_optin);
  ASSERT_EQ(t8.size(), 1u);
  EXPECT_EQ(t8[0].choice, (GemmChoice{GemmKernel::kWgmma, 2, 4, 8, 16, 1}));
  EXPECT_EQ(t8[0].hi, 32);
  EXPECT_EQ(gpu::tail_max(n8w16), 32);
  // 32-token blocks and the other kernels have none: every block is the main launch's.
  EXPECT_TRUE(gpu::tail_launches({GemmKernel::kWgmma, 2, 4, 8, 8, 1}, a.smem_per_block_optin).empty());
  EXPECT_TRUE(gpu::tail_launches({GemmKernel::kTile, 2, 8, 4, 8, 1}, a.smem_per_block_optin).empty());
  EXPECT_EQ(gpu::tail_max({GemmKernel::kStream, 4, 4, 3, 8, 1}), 0);
  // The main launch's blocks per expert (the routing's scan counts these).
  EXPECT_EQ(kernels::main_token_blocks(142, 128, 64), 1);  // 128 + 14 left to the 32-token tail
  EXPECT_EQ(kernels::main_token_blocks(200, 128, 64), 2);  // a last block of 72 stays
  EXPECT_EQ(kernels::main_token_blocks(64, 128, 64), 0);
  EXPECT_EQ(kernels::main_token_blocks(256, 128, 64), 2);
  EXPECT_EQ(kernels::main_token_blocks(142, 128, 0), 2);  // no tail launches: ceil
}

// The routing's scan counts main_token_blocks for the main launch and lists each expert under
// wgmma_tail_class for the tail launches; together they must cover every token of every expert
// once: the main launch's blocks (the last one partial only when no tail launch takes it) and at
// most one tail launch's block of exactly the rest, on an instance wide enough for it.
// With the small-expert launch (small_max 8 or 16), an expert of at most small_max tokens is its
// alone, and one item of the launch's configuration holds all its tokens.
TEST(LayerPlan, MainBlocksAndTailLaunchesCoverEveryTokenOnce) {
  for (const int small_max : {8, 16}) {
    EXPECT_TRUE(gpu::valid_small_expert_tokens(small_max));
    EXPECT_GE(8 * gpu::small_expert_choice(small_max).n_tiles, small_max);
  }
  for (const int small_max : {0, 8, 16})
    for (const int n_tiles : {4, 8, 16}) {
      const int block = 8 * n_tiles;
      const int tail_max = kernels::wgmma_tail_max(n_tiles);
      for (int count = 1; count <= 4 * block + 1; ++count) {
        SCOPED_TRACE(testing::Message()
                     << "block " << block << ", count " << count << ", small_max " << small_max);
        const int blocks = kernels::main_token_blocks(count, block, tail_max, small_max);
        const int in_main = std::min(count, blocks * block);
        const int cls = kernels::wgmma_tail_class(count, block, tail_max, small_max);
        const int in_tail = cls < 0 ? 0 : count - in_main;
        const int in_small = count <= small_max ? count : 0;
        EXPECT_TRUE(in_small == 0 || (in_main == 0 && in_tail == 0));
        EXPECT_EQ(in_main + in_tail + in_small, count);
        if (cls >= 0) {
          ASSERT_LT(cls, kernels::wgmma_tail_count(n_tiles));
          const kernels::WgmmaTail t = kernels::wgmma_tail(n_tiles, cls);
          EXPECT_GT(in_tail, t.lo);
          EXPECT_LE(in_tail, t.hi);
          EXPECT_LE(in_tail, 8 * t.n_tiles);  // fits the tail instance's block
          EXPECT_EQ(in_main % block, 0);      // the main launch's blocks are all full
        }
      }
    }
}

// `fp4moe plan` lists what a forward launches after a wgmma pick: its tail launches and the
// small-expert launch (for the down GEMM, only where the gate/up GEMM runs on wgmma too).
TEST(LayerPlan, AWgmmaPickListsItsTailLaunchesAndTheSmallExpertLaunch) {
  const auto& a = arch_by_name("sm_90");
  const LayerGemmPlan up = plan_layer_gemm(glm5(), 4096, GemmKind::kGateUp, a);
  ASSERT_TRUE(up.ok);
  ASSERT_EQ(up.pick.choice.kernel, GemmKernel::kWgmma);
  ASSERT_EQ(up.then.size(), 3u);
  EXPECT_EQ(up.then[0], "each expert's last 33-64 tokens: wgmma-gemm n8 s8 w8");
  EXPECT_EQ(up.then[1], "each expert's last 1-32 tokens: wgmma-gemm n4 s8 w8");
  // 224 MB over GLM-5's 21.2 MB per expert: 11.
  EXPECT_EQ(up.then[2],
            "the experts of 1-16 tokens, when at least 11: stream-gemm m4 n2 k2 s2 w16 (K split "
            "chosen on the GPU)");
  EXPECT_NE(up.to_string().find("  then each expert's last 1-32 tokens"), std::string::npos);
  EXPECT_NE(up.to_json().find("\"then\":["), std::string::npos);
  const LayerGemmPlan down = plan_layer_gemm(glm5(), 256, GemmKind::kDown, a);
  ASSERT_EQ(down.then.size(), 1u);  // 32-token blocks: no tail launches
  EXPECT_NE(down.then[0].find("and the gate/up GEMM runs on wgmma too"), std::string::npos) << down.then[0];
  EXPECT_TRUE(plan_layer_gemm(glm5(), 1, GemmKind::kGateUp, a).then.empty());  // the stream kernel
}

// The stream kernel's K split: the items counted with the shared expert's (9 x 64 at T=1, 17 x 64
// at T=2), and a 3-way split in one 15-warp CTA per SM where that gives every item a group in
// one round (Hopper only); the picks measured on the H200 at T=1-4 (PERF.md).
TEST(LayerPlan, TheDispatcherSplitsKThreeWaysWhereThatTakesOneRound) {
  const auto& a = arch_by_name("sm_90");
  const LayerDesc g = layer_preset("glm5");  // with its shared expert
  EXPECT_EQ(gemm_choice_label(dispatcher(g, 1, GemmKind::kGateUp, a)), "m4 n1 k3 s2 w15");
  EXPECT_EQ(gemm_choice_label(dispatcher(g, 2, GemmKind::kGateUp, a)), "m4 n1 k3 s2 w15");
  // One 16-warp CTA per SM without a K split takes 3 stages, not the 4 that fit (PERF.md history).
  EXPECT_EQ(gemm_choice_label(dispatcher(g, 4, GemmKind::kGateUp, a)), "m4 n1 k1 s3 w16");
  EXPECT_EQ(gemm_choice_label(dispatcher(g, 64, GemmKind::kDown, a)), "m4 n1 k1 s3 w16");
  EXPECT_EQ(gemm_choice_label(dispatcher(g, 2, GemmKind::kDown, a)), "m4 n1 k1 s3 w16");
  EXPECT_EQ(gemm_choice_label(dispatcher(g, 4, GemmKind::kDown, a)), "m4 n1 k2 s3 w16");
  // Without the shared expert T=1 has 512 items: a 4-way split's 528 groups take them in one round.
  EXPECT_EQ(gemm_choice_label(dispatcher(glm5(), 1, GemmKind::kGateUp, a)), "m4 n1 k4 s3 w4");
  // Not where it was not measured: sm_89 splits T=1's first GEMM 8 ways in 8-warp CTAs.
  EXPECT_EQ(gemm_choice_label(dispatcher(g, 1, GemmKind::kGateUp, arch_by_name("sm_89"))), "m4 n1 k8 s2 w8");
}

TEST(LayerPlan, TheDispatchersDownGemmAtOneOrTwoTokensTakes32RowItemsWhereTheyAreFew) {
  const auto& a = arch_by_name("sm_90");
  const LayerDesc gpt_oss = layer_preset("gpt-oss-120b");
  const LayerDesc mixtral = layer_preset("mixtral-8x7b");
  // One 16-warp CTA with a 4-stage ring, K split by the same cost model over twice the items.
  EXPECT_EQ(gemm_choice_label(dispatcher(gpt_oss, 1, GemmKind::kDown, a)), "m2 n1 k4 s4 w16");
  EXPECT_EQ(gemm_choice_label(dispatcher(gpt_oss, 2, GemmKind::kDown, a)), "m2 n1 k2 s4 w16");
  EXPECT_EQ(gemm_choice_label(dispatcher(mixtral, 1, GemmKind::kDown, a)), "m2 n1 k8 s4 w16");
  EXPECT_EQ(gemm_choice_label(dispatcher(layer_preset("glm5"), 1, GemmKind::kDown, a)), "m2 n1 k1 s4 w16");
  // Not from T=3 (measured slower at T=4), nor with more than 8 64-row items per SM (GLM-5 at T=2:
  // 18 x 96), nor for the first GEMM, nor where it was not measured (sm_89).
  for (const std::int64_t t : {3, 4, 8}) {
    EXPECT_EQ(dispatcher(gpt_oss, t, GemmKind::kDown, a).m_tiles, 4) << t;
    EXPECT_EQ(dispatcher(mixtral, t, GemmKind::kDown, a).m_tiles, 4) << t;
  }
  EXPECT_EQ(dispatcher(layer_preset("glm5"), 2, GemmKind::kDown, a).m_tiles, 4);
  EXPECT_EQ(dispatcher(gpt_oss, 1, GemmKind::kGateUp, a).m_tiles, 4);
  EXPECT_EQ(dispatcher(gpt_oss, 1, GemmKind::kDown, arch_by_name("sm_89")).m_tiles, 4);
}

TEST(LayerPlan, ARejectedDispatcherConfigFallsBackToThePlannersCheapest) {
  const auto& a = arch_by_name("sm_90");
  // 256 registers per thread (more than the 255 a thread may have) for every stream instance of
  // the down GEMM's epilogue: no stream config fits an SM, the tile configs do.
  KernelResources measured;
  measured.source = ResourceSource::kMeasured;
  measured.origin = "test";
  for (const auto& s : kernels::kStreamTileShapes) {
    measured.kernels.push_back({planner::stream_gemm_kernel_key(s[0], s[1], 2), 90, 256, 0, 0});
  }
  const auto d = dispatcher(glm5(), 1, GemmKind::kDown, a);
  ASSERT_EQ(d.kernel, GemmKernel::kStream);
  const auto plan = plan_layer_gemm(glm5(), 1, GemmKind::kDown, a, &measured);
  ASSERT_TRUE(plan.ok);
  EXPECT_EQ(plan.pick.source, PickSource::kCheapest);
  EXPECT_EQ(plan.pick.choice.kernel, GemmKernel::kTile);
  EXPECT_THAT(plan.pick.why,
              HasSubstr("the planner's cheapest feasible candidate; the dispatcher's stream-gemm " +
                        gemm_choice_label(d) +
                        " is rejected on sm_90: 256 registers x 512 threads = 131072 per "
                        "block, sm_90 allows 65536"));
  EXPECT_EQ(d.warps, 16);  // one CTA per SM on Hopper (K split 2 ways)
  // The cheapest of every feasible candidate of both families.
  for (const auto& p : plan.plans) {
    for (const auto& c : p.candidates) {
      // Within the families' 1 % tie band (the tie-break prefers more bytes in flight).
      if (c.feasible) {
        EXPECT_LE(plan.pick.verdict.cost_us, c.cost_us * 1.01 + 1e-9) << c.family << " " << c.label;
      }
    }
  }
  EXPECT_THAT(plan.to_string(), HasSubstr("PICK: tile-gemm"));
}

TEST(LayerPlan, TheDispatchersSm120ConfigThatIsOneKilobyteTooBigIsReplaced) {
  // GLM-5 at T=256: 8.0003 tokens per expert takes the dispatcher to two token tiles, m4 n2 with
  // a K split of 2 and its minimum of 2 stages: 8 x 2 x 4352 + 8 x 4096 = 102400 B > 101376 B.
  const auto& a = arch_by_name("sm_120");
  ASSERT_EQ(gemm_choice_label(dispatcher(glm5(), 256, GemmKind::kGateUp, a)), "m4 n2 k2 s2 w8");
  const auto pick = pick_layer_gemm(glm5(), 256, GemmKind::kGateUp, a);
  EXPECT_EQ(pick.source, PickSource::kCheapest);
  EXPECT_TRUE(pick.verdict.feasible);
  EXPECT_EQ(
      pick.why,
      "the planner's cheapest feasible candidate; the dispatcher's stream-gemm m4 n2 k2 s2 w8 is rejected on "
      "sm_120: needs 102400 B of shared memory per block (8 warps x 2 stages x 4352 B + 8 x 4096 B), sm_120 "
      "allows 101376 B: over by 1024 B");
  // Hopper takes the dispatcher's.
  EXPECT_EQ(pick_layer_gemm(glm5(), 256, GemmKind::kGateUp, arch_by_name("sm_90")).source,
            PickSource::kDispatcher);
}

TEST(LayerPlan, ATunedPreferenceComesFirstWhenAccepted) {
  const auto& a = arch_by_name("sm_120");
  const GemmChoice tuned{GemmKernel::kStream, 2, 1, 4, 8, 2};
  const auto pick = pick_layer_gemm(glm5(), 1, GemmKind::kGateUp, a, nullptr,
                                    GemmPreference{tuned, PickSource::kTuned, "tune cache x.json, bucket 1"});
  EXPECT_EQ(pick.source, PickSource::kTuned);
  EXPECT_EQ(pick.choice, tuned);
  EXPECT_EQ(pick.why, "tuned on this GPU (tune cache x.json, bucket 1)");
  EXPECT_EQ(pick.to_string(), "stream-gemm m2 n1 k2 s4 w8 (tuned on this GPU (tune cache x.json, bucket 1))");
  // 8 warps x 8 stages x 1664 B = 106496 B does not fit sm_120's 101376: passed over, the
  // dispatcher decides and says so.
  const GemmChoice too_big{GemmKernel::kStream, 1, 1, 8, 8, 1};
  const auto over =
      pick_layer_gemm(glm5(), 1, GemmKind::kGateUp, a, nullptr,
                      GemmPreference{too_big, PickSource::kTuned, "tune cache x.json, bucket 1"});
  EXPECT_EQ(over.source, PickSource::kDispatcher);
  EXPECT_EQ(over.choice, dispatcher(glm5(), 1, GemmKind::kGateUp, a));
  EXPECT_THAT(over.why, HasSubstr("picked by the dispatcher; stream-gemm m1 n1 k1 s8 w8 (tune cache x.json, "
                                  "bucket 1) passed over: needs 106496 B"));
}

TEST(LayerPlan, ARejectedForcedConfigThrowsThePlannersReason) {
  const auto& a = arch_by_name("sm_120");
  const auto forced = [&](const GemmChoice& c) {
    return GemmPreference{c, PickSource::kForced, "MoeLayerOptions::gemm1"};
  };
  Errc code{};
  EXPECT_THAT(
      error_of(
          [&] {
            pick_layer_gemm(glm5(), 1, GemmKind::kGateUp, a, nullptr,
                            forced({GemmKernel::kStream, 1, 1, 8, 8, 1}));
          },
          &code),
      HasSubstr("GEMM config stream-gemm m1 n1 k1 s8 w8 (MoeLayerOptions::gemm1, forced by the caller) is "
                "rejected by the planner for gate_up N=4096 K=6144"));
  EXPECT_EQ(code, Errc::kDoesNotFit);
  EXPECT_THAT(error_of(
                  [&] {
                    plan_layer_gemm(glm5(), 1, GemmKind::kGateUp, a, nullptr,
                                    forced({GemmKernel::kStream, 3, 1, 4, 8, 1}));
                  },
                  &code),
              HasSubstr("(m_tiles, n_tiles) = (3, 1) is not a compiled instance"));
  EXPECT_EQ(code, Errc::kInvalidArgument);
  EXPECT_THAT(error_of(
                  [&] {
                    pick_layer_gemm(glm5(), 1, GemmKind::kDown, a, nullptr,
                                    forced({GemmKernel::kTile, 2, 8, 4, 8, 2}));
                  },
                  &code),
              HasSubstr("k_split=2: the tile kernel does not split K"));
  EXPECT_EQ(code, Errc::kInvalidArgument);
}

TEST(LayerPlan, AForcedConfigOutsideTheCandidateGridIsJudgedAndListed) {
  // One warp, 5 stages: a valid launch that is not among the stream family's candidates.
  const GemmChoice one_warp{GemmKernel::kStream, 1, 1, 5, 1, 1};
  const auto plan = plan_layer_gemm(glm5(), 3, GemmKind::kDown, arch_by_name("sm_90"), nullptr,
                                    GemmPreference{one_warp, PickSource::kForced, "MoeLayerOptions::gemm2"});
  ASSERT_TRUE(plan.ok);
  EXPECT_EQ(plan.pick.choice, one_warp);
  EXPECT_EQ(plan.pick.why, "forced by the caller (MoeLayerOptions::gemm2)");
  ASSERT_EQ(plan.plans.size(), 3u);
  EXPECT_EQ(plan.plans[0].candidates.back().label, "m1 n1 k1 s5 w1");
  const auto text = plan.to_string();
  EXPECT_EQ(count_lines_with(text, "<- PICK"), 1) << text;
  EXPECT_THAT(text, HasSubstr("m1 n1 k1 s5 w1"));
}

TEST(LayerPlan, NothingFeasibleIsARefusalWithTheNumbers) {
  ArchInfo tiny = arch_by_name("sm_120");
  tiny.name = "sm_tiny";
  tiny.smem_per_block_optin = 8192;
  tiny.smem_per_sm = 9216;
  const auto plan = plan_layer_gemm(glm5(), 1, GemmKind::kDown, tiny);
  EXPECT_FALSE(plan.ok);
  EXPECT_THAT(plan.refusal, HasSubstr("plan: no configuration of any kernel family fits down N=6144 K=2048"));
  EXPECT_THAT(plan.refusal, HasSubstr("the dispatcher's stream-gemm"));
  EXPECT_THAT(plan.to_string(), HasSubstr("PICK: none"));
  EXPECT_TRUE(nlohmann::json::parse(plan.to_json()).at("pick").is_null());
  Errc code{};
  error_of([&] { pick_layer_gemm(glm5(), 1, GemmKind::kDown, tiny); }, &code);
  EXPECT_EQ(code, Errc::kDoesNotFit);
}

TEST(LayerPlan, PrintsThePickAndEveryFamily) {
  const auto plan = plan_layer_gemm(glm5(), 4096, GemmKind::kGateUp, arch_by_name("sm_120"));
  const auto text = plan.to_string(3);
  EXPECT_THAT(text, HasSubstr("PICK: tile-gemm " + plan.pick.verdict.label + ": picked by the dispatcher"));
  EXPECT_THAT(text, HasSubstr("plan: stream-gemm for gate_up N=4096 K=6144"));
  EXPECT_THAT(text, HasSubstr("plan: tile-gemm for gate_up N=4096 K=6144"));
  EXPECT_EQ(count_lines_with(text, "<- PICK"), 1) << text;
  EXPECT_EQ(count_lines_with(text, "cheapest estimate: "), 3) << text;
  EXPECT_EQ(count_lines_with(text, "cheapest estimate: none: no candidate is feasible on sm_120"), 1) << text;
  const auto j = nlohmann::json::parse(plan.to_json());
  EXPECT_EQ(j.at("pick").at("source"), "picked by the dispatcher");
  EXPECT_EQ(j.at("pick").at("family"), "tile-gemm");
  EXPECT_EQ(j.at("pick").at("kernel"), "tile");
  EXPECT_EQ(j.at("pick").at("params").at("warps"), 8);
  EXPECT_EQ(j.at("plans").size(), 3u);
  EXPECT_THAT(text, HasSubstr("sm_120 cannot run it: wgmma needs sm_90 and a build with the sm_90a image"));
  EXPECT_EQ(j.at("problem").at("tokens"), 4096);
}

TEST(LayerPlan, EveryCandidateConvertsToAChoiceAndBack) {
  const auto plan = plan_layer_gemm(glm5(), 16, GemmKind::kGateUp, arch_by_name("sm_90"));
  int n = 0;
  for (const auto& p : plan.plans) {
    for (const auto& c : p.candidates) {
      const GemmChoice g = choice_of_candidate(c);
      EXPECT_EQ(gemm_choice_label(g), c.label);
      EXPECT_EQ(gemm_family_name(g.kernel), c.family);
      ++n;
    }
  }
  EXPECT_GT(n, 200);
  CandidateVerdict other;
  other.family = "cutlass-grouped";
  EXPECT_THAT(error_of([&] { choice_of_candidate(other); }), HasSubstr("not one the layer runs"));
  EXPECT_EQ(choice_of_candidate(plan.plans[2].candidates[0]),
            (GemmChoice{GemmKernel::kWgmma, 2, 4, 3, 8, 1}));  // the first candidate: n4 s3 w8
  EXPECT_EQ(pick_source_name(PickSource::kCheapest), "the planner's cheapest feasible candidate");
}

}  // namespace
}  // namespace fp4moe
