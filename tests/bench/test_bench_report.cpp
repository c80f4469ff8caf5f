// `fp4moe bench`'s report: the stage table and JSON made from prefix timings, the caller-routing
// mode, and the CLI's refusals of --stages and --caller-routing without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "bench/bench.hpp"
#include "fp4moe/moe_layer.hpp"
#include "test_util/run_command.hpp"

namespace fp4moe {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

bench::BenchReport gpu_report() {
  bench::BenchReport r;
  r.backend = "gpu";
  r.device = "Test GPU";
  r.sm = 90;
  r.copy_gbps = 4000.0;
  r.bf16_tflops = 800.0;
  bench::BenchRow row;
  row.tokens = 1;
  row.active_experts = 8.0;
  row.bytes = 180e6;
  row.flops = 1e9;
  row.floor_us = 45.0;
  row.fp4moe = {85.0, 84.0, 87.0, 20};
  r.rows.push_back(row);
  return r;
}

TEST(BenchReport, StagesAreTheDifferencesOfThePrefixMedians) {
  bench::BenchReport r = gpu_report();
  r.rows[0].launch_us = 4.0;
  r.rows[0].prefix_us = {10.0, 10.5, 59.0, 84.0, 89.0};  // routing, gather, gate/up, down, finalize
  const std::string text = bench::format_table(r);
  EXPECT_THAT(text, HasSubstr("stages in place"));
  EXPECT_THAT(text,
              HasSubstr("tokens    launch   routing    gather   gate/up      down  finalize       sum"));
  EXPECT_THAT(text,
              HasSubstr("     1       4.0       6.0       0.5      48.5      25.0       5.0      89.0\n"));
  const auto j = bench::to_json(r);
  const auto& st = j.at("rows").at(0).at("stages_us");
  EXPECT_DOUBLE_EQ(st.at("launch").get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(st.at("routing").get<double>(), 6.0);
  EXPECT_DOUBLE_EQ(st.at("gather").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(st.at("gate/up").get<double>(), 48.5);
  EXPECT_DOUBLE_EQ(st.at("down").get<double>(), 25.0);
  EXPECT_DOUBLE_EQ(st.at("finalize").get<double>(), 5.0);
}

TEST(BenchReport, NoStageTableWithoutPrefixTimings) {
  const bench::BenchReport r = gpu_report();
  EXPECT_THAT(bench::format_table(r), Not(HasSubstr("stages in place")));
  EXPECT_FALSE(bench::to_json(r).at("rows").at(0).contains("stages_us"));
}

TEST(BenchReport, StageNamesFollowTheLaunchOrder) {
  std::string names;
  for (const ForwardStage s : kForwardStages) names += std::string(forward_stage_name(s)) + " ";
  EXPECT_EQ(names, "routing gather gate/up down finalize ");
}

TEST(BenchCli, StagesNeedAGpu) {
  const auto r = test_util::run_cli("bench --cpu --stages --tokens 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--stages times the GPU kernels; this run has no GPU (--cpu given)"));
}

// --caller-routing times forward_routed: said above the table and in the JSON; refused without a
// GPU and with --stages (forward_until has no form that takes ids).
TEST(BenchReport, CallerRoutingIsSaid) {
  bench::BenchReport r = gpu_report();
  EXPECT_THAT(bench::format_table(r), Not(HasSubstr("forward_routed")));
  EXPECT_FALSE(bench::to_json(r).at("caller_routing").get<bool>());
  r.caller_routing = true;
  EXPECT_THAT(bench::format_table(r), HasSubstr("fp4moe timed through forward_routed"));
  EXPECT_TRUE(bench::to_json(r).at("caller_routing").get<bool>());
}

TEST(BenchCli, CallerRoutingNeedsAGpuAndNoStages) {
  const auto r = test_util::run_cli("bench --cpu --caller-routing --tokens 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--caller-routing times the GPU layer's forward_routed, without --stages "
                                  "(--cpu given)"));
}

}  // namespace
}  // namespace fp4moe
