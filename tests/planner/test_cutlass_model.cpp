// The CUTLASS model against the numbers measured in PLANNER_FACTS.md (CUTLASS 4.2.1, sizeof of the
// real types) and the seed write-up's four SM120 verdicts, plus hand-worked SM90 / SM100 stages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fp4moe/cutlass_model.hpp"
#include "fp4moe/error.hpp"
#include "test_util/shared.hpp"

namespace fp4moe {
namespace {

using test_util::error_of;
using ::testing::HasSubstr;

std::int64_t ru1024(std::int64_t x) {
  return (x + 1023) / 1024 * 1024;
}
std::int64_t ru128(std::int64_t x) {
  return (x + 127) / 128 * 128;
}

CutlassConfig blockscaled(TileShape tile, Epilogue epilogue, bool swap_ab = false,
                          Operand a = Operand::kNvfp4, Operand b = Operand::kNvfp4) {
  CutlassConfig c;
  c.kernel = CutlassKernel::kGroupedBlockScaled;
  c.a = a;
  c.b = b;
  c.tile = tile;
  c.epilogue = epilogue;
  c.swap_ab = swap_ab;
  return c;
}

CutlassVerdict sm120(TileShape tile, Epilogue epilogue, bool swap_ab = false) {
  return explain_cutlass(blockscaled(tile, epilogue, swap_ab), arch_by_name("sm_120"));
}

// ---- the seed's case (PLANNER_FACTS.md, "The seed's case, reproduced") ----------------------

TEST(CutlassSeed, Finalize128x256x128NeedsOneKilobyteMoreThanSm120Has) {
  const auto v = sm120({128, 256, 128}, Epilogue::kFinalize);
  ASSERT_TRUE(v.supported) << v.reason;
  // stage = 8192 + 16384 + 1024 + 2048 + 16
  ASSERT_EQ(v.stage_terms.size(), 5u);
  EXPECT_EQ(v.stage_terms[0].bytes, 8192);
  EXPECT_EQ(v.stage_terms[1].bytes, 16384);
  EXPECT_EQ(v.stage_terms[2].bytes, 1024);
  EXPECT_EQ(v.stage_terms[3].bytes, 2048);
  EXPECT_EQ(v.stage_terms[4].bytes, 16);
  EXPECT_EQ(v.stage_bytes, 27664);
  EXPECT_EQ(v.capacity_bytes, 101376);
  EXPECT_EQ(v.carveout_bytes, 17408);
  EXPECT_EQ(v.stages, 3);  // (101376 - 17408) / 27664
  EXPECT_EQ(v.stage_spare_bytes, 976);
  EXPECT_EQ(v.total_bytes, 102400);
  EXPECT_EQ(v.limit_bytes, 101376);
  EXPECT_FALSE(v.fits);
  EXPECT_EQ(v.over_by_bytes, 1024);
  EXPECT_FALSE(v.estimated);
  EXPECT_EQ(v.stages_how, "StageCountAutoCarveout<17408>: (101376 - 17408) / 27664 = 3, 976 B to spare");
  EXPECT_THAT(v.reason, HasSubstr("3 stages leave 976 B"));
  EXPECT_THAT(v.reason, HasSubstr("102400 B > 101376 B"));
}

TEST(CutlassSeed, MainloopIsExactlyThreeStagesOf27648WithoutPadding) {
  const auto v = sm120({128, 256, 128}, Epilogue::kFinalize);
  ASSERT_GE(v.kernel_terms.size(), 1u);
  EXPECT_EQ(v.kernel_terms[0].name, "mainloop tensors");
  EXPECT_EQ(v.kernel_terms[0].bytes, 3 * 27648);
}

TEST(CutlassSeed, NoneEpilogueFitsIn98304) {
  const auto v = sm120({128, 256, 128}, Epilogue::kNone);
  EXPECT_EQ(v.carveout_bytes, 13312);
  EXPECT_EQ(v.stages, 3);
  EXPECT_EQ(v.total_bytes, 98304);
  EXPECT_TRUE(v.fits);
  EXPECT_EQ(v.over_by_bytes, 0);
  EXPECT_TRUE(v.alternatives.empty());
  EXPECT_EQ(v.reason, "fits: 98304 B <= 101376 B (3072 B to spare)");
}

TEST(CutlassSeed, Tile256x128HasTheSameBytesAndVerdicts) {
  const auto fin = sm120({256, 128, 128}, Epilogue::kFinalize);
  EXPECT_EQ(fin.stage_bytes, 27664);
  EXPECT_EQ(fin.stages, 3);
  EXPECT_EQ(fin.total_bytes, 102400);
  EXPECT_FALSE(fin.fits);
  const auto none = sm120({256, 128, 128}, Epilogue::kNone);
  EXPECT_EQ(none.total_bytes, 98304);
  EXPECT_TRUE(none.fits);
}

TEST(CutlassSeed, Tiles128x128FitWithBothEpilogues) {
  for (const TileShape tile : {TileShape{128, 128, 128}, TileShape{128, 128, 256}}) {
    for (const auto e : {Epilogue::kNone, Epilogue::kFinalize}) {
      const auto v = sm120(tile, e);
      EXPECT_TRUE(v.fits) << tile.to_string() << " " << epilogue_name(e) << ": " << v.reason;
    }
  }
  // Worked by hand: 128x128x128 stage = 8192 + 8192 + 1024 + 1024 + 16 = 18448; FINALIZE
  // (101376 - 17408) / 18448 = 4 stages; RU1024(4 x 18432 + 16896) = 91136; + 16x4 + 16x2 + 144 +
  // 128 + 896 = 92400 -> 93184.
  const auto v = sm120({128, 128, 128}, Epilogue::kFinalize);
  EXPECT_EQ(v.stage_bytes, 18448);
  EXPECT_EQ(v.stages, 4);
  EXPECT_EQ(v.total_bytes, 93184);
}

TEST(CutlassSeed, CarveoutsOfBothEpiloguesWithAndWithoutSwapAb) {
  EXPECT_EQ(sm120({128, 256, 128}, Epilogue::kNone).carveout_bytes, 13312);
  EXPECT_EQ(sm120({128, 256, 128}, Epilogue::kNone, true).carveout_bytes, 14336);
  EXPECT_EQ(sm120({128, 256, 128}, Epilogue::kFinalize).carveout_bytes, 17408);
  EXPECT_EQ(sm120({128, 256, 128}, Epilogue::kFinalize, true).carveout_bytes, 18432);
  EXPECT_EQ(sm120({128, 256, 128}, Epilogue::kNone).epilogue_stages_c, 3);
  EXPECT_EQ(sm120({128, 256, 128}, Epilogue::kNone).epilogue_stages_d, 2);
  EXPECT_EQ(sm120({128, 256, 128}, Epilogue::kFinalize).epilogue_stages_c, 2);
  EXPECT_EQ(sm120({128, 256, 128}, Epilogue::kFinalize).epilogue_tile, "64x32");
}

TEST(CutlassSeed, FixesEachWithItsOwnTotal) {
  const auto v = sm120({128, 256, 128}, Epilogue::kFinalize);
  ASSERT_EQ(v.alternatives.size(), 4u);
  const auto& fewer = v.alternatives[0];
  EXPECT_EQ(fewer.change, "StageCount<2> (or StageCountAutoCarveout<18385> or more)");
  EXPECT_EQ(fewer.stages, 2);
  // RU1024(RU1024(2 x 27648 + 16896) + 16x2 + 16x2 + 144 + 128 + 896) = RU1024(72704 + 1232)
  EXPECT_EQ(fewer.total_bytes, 74752);
  EXPECT_TRUE(fewer.fits);
  // 18385 is the smallest carveout that drops the count to 2: (101376 - 18385) / 27664 = 2.
  EXPECT_EQ((101376 - 18385) / 27664, 2);
  EXPECT_EQ((101376 - 18384) / 27664, 3);
  const auto& swap = v.alternatives[1];
  EXPECT_EQ(swap.change, "swap_ab");
  EXPECT_EQ(swap.stages, 2);  // (101376 - 18432) / 27664
  EXPECT_EQ(swap.total_bytes, 74752);
  EXPECT_TRUE(swap.fits);
  const auto& none = v.alternatives[2];
  EXPECT_EQ(none.change, "NONE epilogue + separate finalize pass");
  EXPECT_EQ(none.total_bytes, 98304);
  EXPECT_TRUE(none.fits);
  // Half the K tile doubles the stages and keeps the same mainloop bytes: still 1 KB over.
  const auto& half_k = v.alternatives[3];
  EXPECT_EQ(half_k.change, "K tile 64 (128x256x64)");
  EXPECT_EQ(half_k.stages, 6);
  EXPECT_EQ(half_k.total_bytes, 102400);
  EXPECT_FALSE(half_k.fits);
}

TEST(CutlassSeed, TextNamesTheVerdictTheCauseAndTheFixes) {
  const auto s = sm120({128, 256, 128}, Epilogue::kFinalize).to_string();
  EXPECT_THAT(s, HasSubstr("verdict: DOES NOT FIT: over by 1024 B"));
  EXPECT_THAT(s, HasSubstr("total 102400 B; limit 101376 B (sm_120 opt-in shared memory per block)"));
  EXPECT_THAT(s, HasSubstr("[outside carveout]"));
  EXPECT_THAT(s, HasSubstr("fixes that fit:"));
  EXPECT_THAT(s, HasSubstr("tried, do not fit either:"));
}

TEST(CutlassSeed, JsonHasTheDocumentedFields) {
  const auto j = nlohmann::json::parse(sm120({128, 256, 128}, Epilogue::kFinalize).to_json());
  EXPECT_EQ(j.at("fits"), false);
  EXPECT_EQ(j.at("total_bytes"), 102400);
  EXPECT_EQ(j.at("limit_bytes"), 101376);
  EXPECT_EQ(j.at("stages"), 3);
  EXPECT_EQ(j.at("over_by_bytes"), 1024);
  EXPECT_TRUE(j.at("reason").is_string());
  ASSERT_TRUE(j.at("alternatives").is_array());
  ASSERT_EQ(j.at("alternatives").size(), 4u);
  EXPECT_EQ(j.at("alternatives")[0].at("total_bytes"), 74752);
  EXPECT_EQ(j.at("alternatives")[0].at("fits"), true);
  EXPECT_EQ(j.at("carveout_bytes"), 17408);
  EXPECT_EQ(j.at("stage_spare_bytes"), 976);
  EXPECT_EQ(j.at("tile"), nlohmann::json({128, 256, 128}));
}

// ---- the SM120 formula as a property -------------------------------------------------------

TEST(CutlassSm120, TotalFollowsTheMeasuredFormulaForEveryTile) {
  // PLANNER_FACTS.md: Total = RU1024(RU1024(S*stage + EpilogueTensorStorage) + (16S + 16C + 144) + 128 +
  // 896), stage = A + B + SFA + SFB + 16, stages = (101376 - carveout) / stage.
  int checked = 0;
  for (int m : {64, 128, 256}) {
    for (int n = 32; n <= 256; n += 32) {
      for (int k : {64, 128, 256}) {
        for (const auto e : {Epilogue::kNone, Epilogue::kFinalize}) {
          for (bool swap : {false, true}) {
            const auto v = sm120({m, n, k}, e, swap);
            ASSERT_TRUE(v.supported) << v.reason;
            const std::int64_t stage = m * k / 2 + n * k / 2 + ru128(m) * k / 16 + ru128(n) * k / 16 + 16;
            ASSERT_EQ(v.stage_bytes, stage) << m << "x" << n << "x" << k;
            ASSERT_EQ(v.stages, (101376 - v.carveout_bytes) / stage);
            if (v.stages < 2) {
              EXPECT_FALSE(v.fits);
              EXPECT_THAT(v.reason, HasSubstr("does not compile"));
              continue;
            }
            const std::int64_t ets = v.kernel_terms[1].bytes;
            const std::int64_t total = ru1024(ru1024(v.stages * (stage - 16) + ets) +
                                              (16 * v.stages + 16 * v.epilogue_stages_c + 144) + 128 + 896);
            ASSERT_EQ(v.total_bytes, total)
                << m << "x" << n << "x" << k << " " << epilogue_name(e) << " " << swap;
            ASSERT_EQ(v.fits, total <= 101376);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 200);
}

TEST(CutlassSm120, Sm121UsesTheSameModel) {
  const auto v = explain_cutlass(blockscaled({128, 256, 128}, Epilogue::kFinalize), arch_by_name("sm_121"));
  EXPECT_EQ(v.total_bytes, 102400);
  EXPECT_FALSE(v.fits);
}

TEST(CutlassSm120, MxFp8TimesMxFp4StoresBothInBytes) {
  // MMA kind::f8f6f4: FP4 sits in 8-bit containers; MX scales are one per 32 values.
  const auto v =
      explain_cutlass(blockscaled({128, 128, 128}, Epilogue::kNone, false, Operand::kMxfp8, Operand::kMxfp4),
                      arch_by_name("sm_120"));
  ASSERT_TRUE(v.supported) << v.reason;
  EXPECT_EQ(v.stage_bytes, 16384 + 16384 + 512 + 512 + 16);
}

TEST(CutlassSm120, ExplicitStageCountAndTooFewStages) {
  auto c = blockscaled({128, 256, 128}, Epilogue::kFinalize);
  c.stages = 2;
  auto v = explain_cutlass(c, arch_by_name("sm_120"));
  EXPECT_EQ(v.total_bytes, 74752);
  EXPECT_TRUE(v.fits);
  EXPECT_EQ(v.stages_how, "StageCount<2> (given)");
  c.stages = 4;
  v = explain_cutlass(c, arch_by_name("sm_120"));
  EXPECT_FALSE(v.fits);
  EXPECT_THAT(v.reason, HasSubstr("StageCount<4> asks for 4 x 27664 B"));
  // A stage bigger than half the capacity: one stage, which CUTLASS refuses to compile.
  v = explain_cutlass(blockscaled({256, 256, 512}, Epilogue::kNone), arch_by_name("sm_120"));
  EXPECT_EQ(v.stages, 0);
  EXPECT_FALSE(v.fits);
  EXPECT_THAT(v.reason, HasSubstr("CUTLASS needs at least 2"));
  EXPECT_THAT(v.one_line(), HasSubstr("DOES NOT COMPILE"));
}

TEST(CutlassSm120, TrtLlmCandidateTilesInElements) {
  const auto fp4 = trtllm_sm120_tiles(Operand::kNvfp4, Operand::kNvfp4);
  EXPECT_EQ(fp4,
            (std::vector<TileShape>{{128, 128, 256}, {128, 128, 128}, {128, 256, 128}, {256, 128, 128}}));
  const auto f8f4 = trtllm_sm120_tiles(Operand::kMxfp8, Operand::kMxfp4);
  EXPECT_EQ(f8f4, (std::vector<TileShape>{{128, 128, 128}, {128, 128, 64}, {128, 256, 64}, {256, 128, 64}}));
  EXPECT_EQ(sm120({128, 256, 128}, Epilogue::kFinalize).one_line(),
            "128x256x128 finalize: DOES NOT FIT 102400 B > 101376 B (3 stages, over by 1024 B)");
  EXPECT_EQ(sm120({128, 256, 128}, Epilogue::kNone).one_line(),
            "128x256x128 none: fits 98304 B <= 101376 B (3 stages, 3072 B to spare)");
}

// ---- SM90 and SM100 (estimated beyond the stage formula) -------------------------------------

TEST(CutlassSm90, StageFormulaRoundsTheTilesTo128AndAddsTheBarrier) {
  CutlassConfig c;
  c.kernel = CutlassKernel::kGrouped;
  c.a = Operand::kBf16;
  c.b = Operand::kBf16;
  c.tile = {128, 128, 64};
  const auto v = explain_cutlass(c, arch_by_name("sm_90"));
  ASSERT_TRUE(v.supported) << v.reason;
  // A 128x64x2 + B 128x64x2 = 32768, already a multiple of 128, + 16.
  EXPECT_EQ(v.stage_bytes, 32784);
  // Epilogue (cooperative, M >= 128): subtile 128x32, 4 subtiles, StagesD 2, StagesC max(4, 3) = 4
  // reusing C for D: 4 x 8192 = 32768 + 16 fusion -> RU512 33280, + 4 x 16 -> RU512 33792,
  // carveout RU128 = 33792. Stages (232448 - 33792) / 32784 = 6.
  EXPECT_EQ(v.carveout_bytes, 33792);
  EXPECT_EQ(v.capacity_bytes, 232448);
  EXPECT_EQ(v.stages, 6);
  // RU1024(6 x 32768 + 33280) = 230400, + 16x6 + 16x4 + 144 + 128 + 640 = 231472 -> 232448: the
  // whole opt-in capacity, which still fits.
  EXPECT_EQ(v.total_bytes, 232448);
  EXPECT_TRUE(v.fits);
  EXPECT_TRUE(v.estimated);
  EXPECT_THAT(v.model, HasSubstr("cooperative"));
}

TEST(CutlassSm90, Fp8UsesOneBytePerElement) {
  CutlassConfig c;
  c.kernel = CutlassKernel::kGrouped;
  c.a = Operand::kFp8;
  c.b = Operand::kFp8;
  c.tile = {128, 256, 128};
  c.schedule = CutlassSchedule::kPingpong;
  const auto v = explain_cutlass(c, arch_by_name("sm_90"));
  ASSERT_TRUE(v.supported) << v.reason;
  EXPECT_EQ(v.stage_bytes, 128 * 128 + 256 * 128 + 16);
  EXPECT_EQ(v.epilogue_tile, "64x32");
}

TEST(CutlassSm100, TwoSmUmmaSplitsTheTileAcrossTheCtaPair) {
  const auto v = explain_cutlass(blockscaled({256, 256, 256}, Epilogue::kNone), arch_by_name("sm_100"));
  ASSERT_TRUE(v.supported) << v.reason;
  EXPECT_THAT(v.model, HasSubstr("2-SM UMMA"));
  // Per CTA: A 128 x 256 x 4 bit, B 128 x 256 x 4 bit, SFA 128 x 16, SFB 256 x 16 (whole N), + 16.
  EXPECT_EQ(v.stage_bytes, 16384 + 16384 + 2048 + 4096 + 16);
  EXPECT_TRUE(v.estimated);
  EXPECT_TRUE(v.fits);
  EXPECT_LT(v.capacity_bytes, 232448);  // the builder reserves its kernel storage first
}

// ---- refusals --------------------------------------------------------------------------------

TEST(CutlassRefusals, UnsupportedConfigurationsSayWhy) {
  const auto hopper = explain_cutlass(blockscaled({128, 128, 128}, Epilogue::kNone), arch_by_name("sm_90"));
  EXPECT_FALSE(hopper.supported);
  EXPECT_FALSE(hopper.fits);
  EXPECT_THAT(hopper.unsupported_reason, HasSubstr("sm_90 has no block-scaled MMA"));
  EXPECT_THAT(hopper.to_string(), HasSubstr("verdict: NOT SUPPORTED"));
  EXPECT_EQ(nlohmann::json::parse(hopper.to_json()).at("supported"), false);

  const auto ampere = explain_cutlass(blockscaled({128, 128, 128}, Epilogue::kNone), arch_by_name("sm_80"));
  EXPECT_THAT(ampere.unsupported_reason, HasSubstr("sm_80 has no TMA"));

  const auto mixed =
      explain_cutlass(blockscaled({128, 128, 128}, Epilogue::kNone, false, Operand::kNvfp4, Operand::kMxfp4),
                      arch_by_name("sm_120"));
  EXPECT_THAT(mixed.unsupported_reason, HasSubstr("NVFP4 (E4M3 scale per 16) pairs only with NVFP4"));

  const auto short_k = sm120({128, 128, 32}, Epilogue::kNone);
  EXPECT_THAT(short_k.unsupported_reason, HasSubstr("tile K=32 is not a multiple of 64"));

  const auto odd_n = sm120({128, 48, 128}, Epilogue::kNone);
  EXPECT_THAT(odd_n.unsupported_reason, HasSubstr("tile N=48 is not a multiple of 32"));

  auto dense = blockscaled({128, 128, 128}, Epilogue::kNone, false, Operand::kBf16, Operand::kBf16);
  dense.kernel = CutlassKernel::kGrouped;
  EXPECT_THAT(explain_cutlass(dense, arch_by_name("sm_120")).unsupported_reason,
              HasSubstr("cutlass-grouped is modelled for sm_90 only"));
  dense.b = Operand::kNvfp4;
  EXPECT_THAT(explain_cutlass(dense, arch_by_name("sm_90")).unsupported_reason,
              HasSubstr("takes bf16 x bf16 or fp8 x fp8, not bf16 x nvfp4"));

  auto two_sm = blockscaled({64, 128, 256}, Epilogue::kNone);
  two_sm.schedule = CutlassSchedule::k2Sm;
  EXPECT_THAT(explain_cutlass(two_sm, arch_by_name("sm_100")).unsupported_reason,
              HasSubstr("tile M=64 is not a 2-SM UMMA tile (128 or 256)"));
  two_sm.schedule = CutlassSchedule::k2Sm;
  EXPECT_THAT(explain_cutlass(two_sm, arch_by_name("sm_120")).unsupported_reason,
              HasSubstr("schedule 2sm does not exist on sm_120"));
}

TEST(CutlassRefusals, ParsersNameTheBadValue) {
  EXPECT_EQ(parse_tile("128x256x128"), (TileShape{128, 256, 128}));
  for (const char* bad : {"128x256", "128x256x0", "axbxc", "128x256x128x1", "", "128xx128", "-1x2x3"}) {
    EXPECT_THAT(error_of([bad] { parse_tile(bad); }), HasSubstr("is not MxNxK")) << bad;
  }
  EXPECT_THAT(error_of([] { parse_operand("fp16"); }),
              HasSubstr("unknown operand type 'fp16' (expected bf16, fp8, nvfp4, mxfp4 or mxfp8)"));
  EXPECT_THAT(error_of([] { parse_epilogue("scatter"); }), HasSubstr("unknown epilogue 'scatter'"));
  EXPECT_THAT(error_of([] { parse_cutlass_kernel("cutlass"); }),
              HasSubstr("unknown CUTLASS kernel 'cutlass'"));
  EXPECT_THAT(error_of([] { parse_cutlass_schedule("warp"); }), HasSubstr("unknown schedule 'warp'"));
  EXPECT_EQ(parse_cutlass_schedule("2sm"), CutlassSchedule::k2Sm);
  EXPECT_EQ(operand_bits(parse_operand("mxfp8")), 8);
}

}  // namespace
}  // namespace fp4moe
