// `fp4moe explain` and `fp4moe plan` end to end: the seed's case, JSON that parses with the
// documented fields, and refusals with exit status 1 and a message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "fp4moe/device.hpp"
#include "test_util/run_command.hpp"

namespace fp4moe {
namespace {

using test_util::run_cli;
using ::testing::HasSubstr;

int count_lines_with(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
  return n;
}

const char* kSeed =
    "explain --arch sm_120 --kernel cutlass-grouped-blockscaled --a nvfp4 --b nvfp4 --tile 128x256x128 "
    "--epilogue finalize";

TEST(CliExplain, SeedCaseText) {
  const auto r = run_cli(kSeed);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(
      r.output,
      HasSubstr("stages: StageCountAutoCarveout<17408>: (101376 - 17408) / 27664 = 3, 976 B to spare"));
  EXPECT_THAT(r.output, HasSubstr("total 102400 B; limit 101376 B"));
  EXPECT_THAT(r.output, HasSubstr("verdict: DOES NOT FIT: over by 1024 B"));
  EXPECT_THAT(r.output, HasSubstr("StageCount<2>"));
  EXPECT_THAT(r.output, HasSubstr("NONE epilogue + separate finalize pass"));
}

TEST(CliExplain, SeedCaseJsonParsesWithTheDocumentedFields) {
  const auto r = run_cli(std::string(kSeed) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j.at("fits").is_boolean());
  EXPECT_EQ(j.at("fits"), false);
  EXPECT_EQ(j.at("total_bytes"), 102400);
  EXPECT_EQ(j.at("limit_bytes"), 101376);
  EXPECT_EQ(j.at("stages"), 3);
  EXPECT_EQ(j.at("over_by_bytes"), 1024);
  EXPECT_TRUE(j.at("reason").is_string());
  ASSERT_TRUE(j.at("alternatives").is_array());
  for (const auto& a : j.at("alternatives")) {
    EXPECT_TRUE(a.at("total_bytes").is_number_integer());
    EXPECT_TRUE(a.at("fits").is_boolean());
  }
}

TEST(CliExplain, SwapAbAndNoneVariants) {
  auto j = nlohmann::json::parse(run_cli(std::string(kSeed) + " --swap-ab --json").output);
  EXPECT_EQ(j.at("fits"), true);
  EXPECT_EQ(j.at("stages"), 2);
  EXPECT_EQ(j.at("carveout_bytes"), 18432);
  j = nlohmann::json::parse(run_cli("explain --arch sm_120 --kernel cutlass-grouped-blockscaled --tile "
                                    "128x256x128 --epilogue none --json")
                                .output);
  EXPECT_EQ(j.at("fits"), true);
  EXPECT_EQ(j.at("total_bytes"), 98304);
}

TEST(CliExplain, AllListsTrtLlmsSm120Tiles) {
  const auto r =
      run_cli("explain --arch sm_120 --kernel cutlass-grouped-blockscaled --a nvfp4 --b nvfp4 --all");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_lines_with(r.output, ": fits "), 6) << r.output;
  EXPECT_EQ(count_lines_with(r.output, ": DOES NOT FIT 102400 B > 101376 B"), 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("256x128x128 finalize: DOES NOT FIT"));
  const auto fin = run_cli("explain --arch sm_120 --a nvfp4 --b nvfp4 --all --epilogue finalize --json");
  ASSERT_EQ(fin.exit_code, 0) << fin.output;
  const auto j = nlohmann::json::parse(fin.output);
  ASSERT_EQ(j.size(), 4u);
  EXPECT_EQ(j[2].at("fits"), false);
  EXPECT_EQ(j[2].at("tile"), nlohmann::json({128, 256, 128}));
}

TEST(CliExplain, RefusalsAndUnsupportedConfigs) {
  auto r = run_cli("explain --arch sm_120 --tile 128x256");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("tile '128x256' is not MxNxK"));
  r = run_cli("explain --arch sm_77 --tile 128x128x128");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("unknown architecture 'sm_77'"));
  r = run_cli("explain --arch sm_120");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("needs --tile MxNxK (or --all)"));
  r = run_cli("explain --arch sm_90 --all");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("sm_90 is not an SM120-class architecture"));
  r = run_cli("explain --arch sm_90 --tile 128x128x128");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("NOT SUPPORTED: sm_90 has no block-scaled MMA"));
}

TEST(CliExplain, OwnKernelFromItsLayout) {
  const auto r = run_cli("explain --arch sm_120 --kernel stream-gemm --config \"m1 n1 k1 s8 w8\" --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j.at("fits"), false);
  EXPECT_EQ(j.at("total_bytes"), 106496);
  EXPECT_EQ(j.at("over_by_bytes"), 5120);
  EXPECT_EQ(j.at("stages"), 8);
  EXPECT_EQ(j.at("alternatives").size(), 2u);
  const auto bad = run_cli("explain --arch sm_120 --kernel stream-gemm");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("needs --config"));
}

const char* kGlm5 = "plan --arch sm_120 --hidden 6144 --intermediate 2048 --experts 256 --top-k 8";

TEST(CliPlan, TextShowsThePickAndTheRejected) {
  const auto r = run_cli(std::string(kGlm5) + " --tokens 4 --gemm down");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("PICK: stream-gemm"));
  EXPECT_THAT(r.output, HasSubstr("picked by the dispatcher"));
  EXPECT_THAT(r.output, HasSubstr("plan: stream-gemm for down N=6144 K=2048"));
  EXPECT_THAT(r.output, HasSubstr("plan: tile-gemm for down N=6144 K=2048"));
  EXPECT_EQ(count_lines_with(r.output, "<- PICK"), 1);
  EXPECT_THAT(r.output, HasSubstr("rejected:"));
  EXPECT_THAT(r.output, HasSubstr("over by 5120 B"));
  const auto only = run_cli(std::string(kGlm5) + " --tokens 4 --gemm down --family tile-gemm");
  ASSERT_EQ(only.exit_code, 0) << only.output;
  EXPECT_THAT(only.output, HasSubstr("PICK: stream-gemm"));
  EXPECT_EQ(count_lines_with(only.output, "plan: stream-gemm"), 0);
  const auto bad = run_cli(std::string(kGlm5) + " --tokens 4 --family prefill-gemm");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output,
              HasSubstr("unknown kernel family 'prefill-gemm' (known: stream-gemm, tile-gemm, wgmma-gemm)"));
}

TEST(CliPlan, PresetWithCommaSeparatedTokensPrintsBothGemmsAndBothFamilies) {
  const auto r = run_cli("plan --arch sm_90 --preset glm5 --tokens 1,4096 --top 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_lines_with(r.output, "PICK: "), 4) << r.output;
  EXPECT_EQ(count_lines_with(r.output, "<- PICK"), 4) << r.output;
  EXPECT_EQ(count_lines_with(r.output, "plan: stream-gemm for "), 4);
  EXPECT_EQ(count_lines_with(r.output, "plan: tile-gemm for "), 4);
  EXPECT_EQ(count_lines_with(r.output, "plan: wgmma-gemm for "), 4);
  EXPECT_EQ(count_lines_with(r.output, "PICK: stream-gemm"), 2) << r.output;  // T=1
  EXPECT_EQ(count_lines_with(r.output, "PICK: wgmma-gemm"), 2) << r.output;   // T=4096 on sm_90
  EXPECT_EQ(count_lines_with(r.output, "picked by the dispatcher"), 4);
}

TEST(CliPlan, JsonHasAGemmPerTokenCountAndEveryCandidateFits) {
  const auto r = run_cli(std::string(kGlm5) + " --tokens 1 256 --json --no-resources");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j.at("gemms").size(), 4u);
  // At T=256 the dispatcher's gate_up config needs 1 KB more than sm_120 has: the planner's
  // cheapest runs instead.
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(j.at("gemms")[i].at("pick").at("source"),
              i == 2 ? "the planner's cheapest feasible candidate" : "picked by the dispatcher");
  }
  for (const auto& g : j.at("gemms")) {
    ASSERT_TRUE(g.at("pick").is_object());
    ASSERT_EQ(g.at("plans").size(), 3u);
    bool pick_listed = false;
    for (const auto& p : g.at("plans")) {
      for (const auto& c : p.at("candidates")) {
        if (c.at("feasible") == true) {
          EXPECT_LE(c.at("dynamic_smem_bytes").get<int>() + c.at("static_smem_bytes").get<int>(), 101376);
          EXPECT_GE(c.at("blocks_per_sm").get<int>(), 1);
        } else {
          EXPECT_FALSE(c.at("reason").get<std::string>().empty());
        }
        pick_listed = pick_listed || (p.at("family") == g.at("pick").at("family") &&
                                      c.at("label") == g.at("pick").at("label") && c.at("feasible") == true);
      }
    }
    EXPECT_TRUE(pick_listed) << g.at("pick").dump();
    EXPECT_THAT(g.at("plans")[0].at("resources").get<std::string>(), HasSubstr("registers unknown"));
  }
}

TEST(CliPlan, OverridesAndRefusals) {
  const auto r = run_cli(std::string(kGlm5) + " --tokens 1 --gemm down --dram-gbs 1000 --sms 100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("note: DRAM bandwidth 1000 GB/s given on the command line"));
  EXPECT_THAT(r.output, HasSubstr("100 SMs, DRAM 1000 GB/s"));
  auto bad = run_cli(std::string(kGlm5) + " --tokens 0");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("tokens=0: a plan needs at least 1 token"));
  bad = run_cli("plan --arch sm_120 --hidden 6144 --intermediate 2048 --experts 8 --top-k 9 --tokens 1");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("top_k=9 must be between 1 and experts=8"));
  bad = run_cli(std::string(kGlm5) + " --tokens 1 --resources /nonexistent.json");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("cannot open the resource report /nonexistent.json"));
  std::string why;
  if (list_gpus(&why).empty()) {
    bad = run_cli("plan --hidden 6144 --intermediate 2048 --experts 256 --top-k 8 --tokens 1");
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_THAT(bad.output, HasSubstr("no local GPU to plan for"));
  }
}

TEST(CliPlan, HelpListsTheNewSubcommands) {
  const auto r = run_cli("--help");
  EXPECT_THAT(r.output, HasSubstr("explain"));
  EXPECT_THAT(r.output, HasSubstr("plan"));
}

}  // namespace
}  // namespace fp4moe
