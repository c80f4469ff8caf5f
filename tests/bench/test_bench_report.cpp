// `fp4moe bench`'s report: the stage table and JSON made from prefix timings, the caller-routing
// and uniform-routing modes, and the CLI's refusals of --stages and --caller-routing without a GPU.
#include <algorithm>
#include <random>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "bench/bench.hpp"
#include "bench/energy.hpp"
#include "fp4moe/moe_layer.hpp"
#include "fp4moe/reference.hpp"
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
  row.fp4moe = bench::summarize({85.0, 84.0, 87.0});
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

// --sustain: the back-to-back run's time per forward, its ratio to the burst median, and the power
// and energy per forward where the counter was read; "-" and the reason where it was not.
TEST(BenchReport, SustainedRunsAreTabulated) {
  bench::BenchReport r = gpu_report();
  EXPECT_THAT(bench::format_table(r), Not(HasSubstr("sustained")));
  EXPECT_FALSE(bench::to_json(r).at("rows").at(0).contains("sustained"));
  r.sustain_s = 2.0;
  r.rows[0].sustained = bench::BenchRow::Sustained{2.0, 20000, 1400.0};  // 100 us, 700 W, 70 mJ
  std::string text = bench::format_table(r);
  EXPECT_THAT(text, HasSubstr("replayed back to back for 2 s"));
  EXPECT_THAT(text, HasSubstr("tokens    time us  forwards  %floor vs burst    watts mJ/forward\n"));
  EXPECT_THAT(text, HasSubstr("     1      100.0     20000     45%    0.85x      700      70.00\n"));
  const auto j = bench::to_json(r).at("rows").at(0).at("sustained");
  EXPECT_DOUBLE_EQ(j.at("us_per_forward").get<double>(), 100.0);
  EXPECT_DOUBLE_EQ(j.at("watts").get<double>(), 700.0);
  EXPECT_DOUBLE_EQ(j.at("mj_per_forward").get<double>(), 70.0);
  r.rows[0].sustained->joules = -1.0;
  r.energy_note = "NVML (libnvidia-ml.so.1, from the NVIDIA driver) could not be loaded";
  text = bench::format_table(r);
  EXPECT_THAT(text, HasSubstr("     1      100.0     20000     45%    0.85x        -          -\n"));
  EXPECT_THAT(text, HasSubstr("energy not measured: NVML (libnvidia-ml.so.1"));
  EXPECT_TRUE(bench::to_json(r).at("rows").at(0).at("sustained").at("watts").is_null());
  // With the BF16 layer replayed too: its time, the speed-up and its energy per forward.
  r.rows[0].sustained->joules = 14.0;
  r.rows[0].baseline_sustained = bench::BenchRow::Sustained{2.0, 5000, 1300.0};  // 400 us, 260 mJ
  text = bench::format_table(r);
  EXPECT_THAT(text, HasSubstr("mJ/forward     bf16 us  speedup   bf16 mJ/fwd\n"));
  EXPECT_THAT(text,
              HasSubstr("     1      100.0     20000     45%    0.85x        7       0.70       400.0    "
                        "4.00x        260.00\n"));
  EXPECT_DOUBLE_EQ(
      bench::to_json(r).at("rows").at(0).at("baseline_sustained").at("us_per_forward").get<double>(), 400.0);
}

TEST(BenchCli, SustainNeedsAGpuAndABoundedTime) {
  auto r = test_util::run_cli("bench --cpu --sustain 1 --tokens 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--sustain replays the GPU layer; this run has no GPU (--cpu given)"));
  r = test_util::run_cli("bench --cpu --sustain -2 --tokens 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--sustain = -2 must be 0 (off) to 600 seconds"));
}

// Without the driver's NVML (CI) the counter is absent with a reason; with it, a bogus bus id is
// named in the reason.
TEST(EnergyCounter, SaysWhyItIsAbsent) {
  std::string why;
  const auto counter = bench::EnergyCounter::open("not-a-bus-id", &why);
  EXPECT_EQ(counter, nullptr);
  EXPECT_FALSE(why.empty());
  EXPECT_THAT(why, ::testing::AnyOf(HasSubstr("libnvidia-ml.so.1"), HasSubstr("nvmlInit failed"),
                                    HasSubstr("'not-a-bus-id'")));
}

// Every run's time goes to the JSON in run order; --trace-clock adds each run's SM clock and a table
// of the runs at the highest clock against the slower ones.
TEST(BenchReport, RunTimesAndTheClockTrace) {
  const bench::TimeStats t = bench::summarize({2050.0, 2040.0, 2360.0, 2370.0, 2380.0});
  EXPECT_EQ(t.samples_us, (std::vector<double>{2050.0, 2040.0, 2360.0, 2370.0, 2380.0}));
  EXPECT_DOUBLE_EQ(t.median_us, 2360.0);
  EXPECT_FALSE(bench::clock_split(t));  // no clock readings

  bench::BenchReport r = gpu_report();
  r.rows[0].fp4moe = t;
  auto j = bench::to_json(r);
  EXPECT_EQ(j.at("rows").at(0).at("fp4moe").at("samples_us").get<std::vector<double>>(), t.samples_us);
  EXPECT_FALSE(j.at("rows").at(0).at("fp4moe").contains("sm_clock_mhz"));
  EXPECT_FALSE(j.at("trace_clock").get<bool>());
  EXPECT_THAT(bench::format_table(r), Not(HasSubstr("SM clock")));

  r.trace_clock = true;
  r.rows[0].fp4moe.sm_clock_mhz = {1980, 1980, 1650, 1605, 1650};
  const std::optional<bench::ClockSplit> c = bench::clock_split(r.rows[0].fp4moe);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->min_mhz, 1605);
  EXPECT_EQ(c->median_mhz, 1650);
  EXPECT_EQ(c->max_mhz, 1980);
  EXPECT_EQ(c->runs_at_max, 2);
  EXPECT_EQ(c->runs_below, 3);
  EXPECT_DOUBLE_EQ(c->median_us_at_max, 2045.0);
  EXPECT_DOUBLE_EQ(c->median_us_below, 2370.0);
  const std::string text = bench::format_table(r);
  EXPECT_THAT(text, HasSubstr("SM clock after each timed run of fp4moe (MHz)"));
  EXPECT_THAT(text,
              HasSubstr("     1    1605    1650    1980          2     2045.0          3     2370.0\n"));
  j = bench::to_json(r);
  EXPECT_TRUE(j.at("trace_clock").get<bool>());
  EXPECT_EQ(j.at("clock_note").get<std::string>(), "");
  EXPECT_EQ(j.at("rows").at(0).at("fp4moe").at("sm_clock_mhz").get<std::vector<int>>(),
            (std::vector<int>{1980, 1980, 1650, 1605, 1650}));

  bench::TimeStats failed_read = r.rows[0].fp4moe;
  failed_read.sm_clock_mhz[3] = 0;  // a read that failed mid-run: no split from a partial trace
  EXPECT_FALSE(bench::clock_split(failed_read));

  r.clock_note = "NVML (libnvidia-ml.so.1, from the NVIDIA driver) could not be loaded";
  EXPECT_THAT(bench::format_table(r), HasSubstr("clock not traced: NVML (libnvidia-ml.so.1"));
}

TEST(BenchCli, TraceClockNeedsAGpu) {
  const auto r = test_util::run_cli("bench --cpu --trace-clock --tokens 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--trace-clock reads the GPU's clock; this run has no GPU (--cpu given)"));
}

// --uniform-routing zeroes the random layer's correction bias, so every expert is about equally
// likely: over 1024 tokens of N(0, 2) logits (the bench's) the CPU shape's busiest expert (32
// experts, top-4; 128 picks each on average) takes under 1.25x the mean, where the random bias
// gives it 1.4x (GLM-5's 256 experts: ~3x). Said above the table and in the JSON.
TEST(BenchReport, UniformRoutingZeroesTheCorrectionBias) {
  bench::BenchOptions o;
  o.desc = bench::cpu_default_desc();
  o.shape_name = "cpu-small";
  o.tokens = {4};
  o.iterations = 1;
  o.cpu = true;
  const LayerWeights skewed_w = bench::bench_weights(o);
  ASSERT_EQ(skewed_w.correction_bias.size(), 32u);
  EXPECT_NE(*std::max_element(skewed_w.correction_bias.begin(), skewed_w.correction_bias.end()), 0.0f);
  o.uniform_routing = true;
  const LayerWeights uniform_w = bench::bench_weights(o);
  for (const float b : uniform_w.correction_bias) EXPECT_EQ(b, 0.0f);

  constexpr std::int64_t kTokens = 1024;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> logits(static_cast<std::size_t>(kTokens * o.desc.experts));
  for (float& v : logits) v = dist(rng);
  const auto busiest = [&](const LayerWeights& w) {
    const Routing r = route(o.desc, logits, kTokens, w.correction_bias);
    std::vector<int> count(static_cast<std::size_t>(o.desc.experts), 0);
    for (const std::int32_t id : r.ids) ++count.at(static_cast<std::size_t>(id));
    return *std::max_element(count.begin(), count.end()) / (kTokens * o.desc.top_k / double(o.desc.experts));
  };
  EXPECT_GT(busiest(skewed_w), 1.3) << busiest(uniform_w);
  EXPECT_LT(busiest(uniform_w), 1.25);

  const bench::BenchReport uniform = bench::run_bench(o, [](const std::string&) {});
  EXPECT_THAT(bench::format_table(uniform), HasSubstr("correction bias zeroed (--uniform-routing)"));
  EXPECT_TRUE(bench::to_json(uniform).at("uniform_routing").get<bool>());
  bench::BenchReport g = gpu_report();
  EXPECT_THAT(bench::format_table(g), Not(HasSubstr("--uniform-routing")));
  EXPECT_FALSE(bench::to_json(g).at("uniform_routing").get<bool>());
  g.uniform_routing = true;
  EXPECT_THAT(bench::format_table(g), HasSubstr("correction bias zeroed (--uniform-routing)"));
}

}  // namespace
}  // namespace fp4moe
