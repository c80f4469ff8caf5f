// The CUTLASS model against the numbers measured in PLANNER_FACTS.md (CUTLASS 4.2.1, sizeof of the
// real types) and the seed write-up's four SM120 verdicts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fp4moe/cutlass_model.hpp"
#include "fp4moe/error.hpp"

namespace fp4moe {
namespace {

using ::testing::HasSubstr;

CutlassConfig sm120_nvfp4(TileShape tile, Epilogue epilogue, bool swap_ab = false) {
  CutlassConfig c;
  c.kernel = CutlassKernel::kGroupedBlockScaled;
  c.a = Operand::kNvfp4;
  c.b = Operand::kNvfp4;
  c.tile = tile;
  c.epilogue = epilogue;
  c.swap_ab = swap_ab;
  return c;
}

TEST(CutlassModel, SeedFinalize128x256DoesNotFitBy1024) {
  const auto v = explain_cutlass(sm120_nvfp4({128, 256, 128}, Epilogue::kFinalize), arch_by_name("sm_120"));
  ASSERT_TRUE(v.supported) << v.reason;
  EXPECT_EQ(v.stage_bytes, 27664);
  EXPECT_EQ(v.carveout_bytes, 17408);
  EXPECT_EQ(v.stages, 3);
  EXPECT_EQ(v.stage_spare_bytes, 976);
  EXPECT_EQ(v.total_bytes, 102400);
  EXPECT_EQ(v.limit_bytes, 101376);
  EXPECT_FALSE(v.fits);
  EXPECT_EQ(v.over_by_bytes, 1024);
  EXPECT_FALSE(v.estimated);
  std::printf("%s\n%s\n", v.to_string().c_str(), v.to_json().c_str());
}

}  // namespace
}  // namespace fp4moe
