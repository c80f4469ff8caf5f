// Kernel resources: the build's report (cmake/resource_report.py from a ptxas log, read back by
// load_resource_report) and the lookup of an instance by the numbers in its name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "fp4moe/error.hpp"
#include "fp4moe/planner.hpp"
#include "test_util/run_command.hpp"
#include "test_util/shared.hpp"

namespace fp4moe {
namespace {

using test_util::error_of;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

const fs::path kSourceRoot = fs::path(__FILE__).parent_path().parent_path().parent_path();

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = fs::path(::testing::TempDir()) / name;
  std::ofstream(path) << text;
  return path.string();
}

KernelResources entries(std::vector<KernelResourceUsage> kernels) {
  KernelResources r;
  r.source = ResourceSource::kBuildReport;
  r.kernels = std::move(kernels);
  return r;
}

TEST(KernelResources, FindsAnInstanceByTheNumbersInItsName) {
  const auto r = entries({
      {"void fp4moe::kernels::fp4moe_stream_gemm<1, 2, (fp4moe::kernels::StreamEpilogue)0>(fp4moe::kernels::"
       "StreamGemmArgs, int, int)",
       120, 96, 0, 0},
      {"void fp4moe::kernels::fp4moe_stream_gemm<1, 2, (fp4moe::kernels::StreamEpilogue)2>(fp4moe::kernels::"
       "StreamGemmArgs, int, int)",
       120, 120, 0, 0},
      {"fp4moe_stream_gemm_m4_n1", 120, 64, 0, 0},
      {"fp4moe_stream_gemm<Config{2u, 2u}>", 120, 80, 0, 0},
      {"fp4moe_route_small<8>", 120, 40, 0, 0},
  });
  ASSERT_NE(r.find("fp4moe_stream_gemm", {1, 2, 0}, 120), nullptr);
  EXPECT_EQ(r.find("fp4moe_stream_gemm", {1, 2, 0}, 120)->registers, 96);
  EXPECT_EQ(r.find("fp4moe_stream_gemm", {1, 2, 2}, 120)->registers, 120);
  EXPECT_EQ(r.find("fp4moe_stream_gemm", {1, 2}, 120)->registers, 120);  // several: the most registers
  EXPECT_EQ(r.find("fp4moe_stream_gemm", {1, 2, 1}, 120), nullptr);
  EXPECT_EQ(r.find("fp4moe_stream_gemm", {1, 2, 0}, 90), nullptr);  // another architecture
  EXPECT_EQ(r.find("fp4moe_stream_gemm", {4, 1}, 120)->registers, 64);
  EXPECT_EQ(r.find("fp4moe_stream_gemm", {2, 2}, 120)->registers, 80);
  EXPECT_EQ(r.find("fp4moe_stream_gemm", {8}, 120), nullptr);  // "fp4moe_route_small<8>" is not the family
}

// The stream family's prefix also names the kernels with the ring depth compiled in
// (fp4moe_stream_gemm_fixed<m, n, epilogue, stages>, docs/KERNELS.md): a configuration launches
// one or the other by its depth, so the one with the most registers is what the planner judges.
TEST(KernelResources, CountsTheFixedDepthStreamKernelsWithTheirConfiguration) {
  const auto r = entries({
      {"void fp4moe::kernels::fp4moe_stream_gemm<4, 1, (fp4moe::kernels::StreamEpilogue)0>(fp4moe::kernels::"
       "StreamGemmArgs, int, int)",
       90, 108, 0, 0},
      {"void fp4moe::kernels::fp4moe_stream_gemm_fixed<4, 1, (fp4moe::kernels::StreamEpilogue)0, 3>(fp4moe::"
       "kernels::StreamGemmArgs, int, int)",
       90, 116, 0, 0},
      {"void fp4moe::kernels::fp4moe_stream_gemm_fixed<4, 1, (fp4moe::kernels::StreamEpilogue)2, 3>(fp4moe::"
       "kernels::StreamGemmArgs, int, int)",
       90, 101, 0, 0},
  });
  ASSERT_NE(r.find("fp4moe_stream_gemm", {4, 1, 0}, 90), nullptr);
  EXPECT_EQ(r.find("fp4moe_stream_gemm", {4, 1, 0}, 90)->registers, 116);
  EXPECT_EQ(r.find("fp4moe_stream_gemm", {4, 1, 2}, 90)->registers, 101);
}

TEST(ResourceReport, ScriptParsesAPtxasLogAndTheLibraryReadsIt) {
  const auto out = (fs::path(::testing::TempDir()) / "fp4moe_test_resources.json").string();
  const auto script = (kSourceRoot / "cmake" / "resource_report.py").string();
  const auto log = (kSourceRoot / "tests" / "planner" / "data" / "ptxas_sm120a.log").string();
  const auto r =
      test_util::run_command("python3 " + script + " --demangler '' --parse-log " + log + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto report = load_resource_report(out);
  EXPECT_EQ(report.source, ResourceSource::kBuildReport);
  EXPECT_EQ(report.origin, out);
  ASSERT_EQ(report.kernels.size(), 2u);  // _Z6helperPf is not an entry function
  const auto& a = report.kernels[0];
  EXPECT_EQ(
      a.kernel,
      "_ZN6fp4moe7kernels18fp4moe_stream_gemmILi2ELi4ELNS0_14StreamEpilogueE2EEEvNS0_14StreamGemmArgsEii");
  EXPECT_EQ(a.sm, 120);
  EXPECT_EQ(a.registers, 128);
  EXPECT_EQ(a.static_smem_bytes, 0);
  EXPECT_EQ(a.spill_bytes, 0);
  const auto& b = report.kernels[1];
  EXPECT_EQ(b.registers, 255);
  EXPECT_EQ(b.static_smem_bytes, 4096);
  EXPECT_EQ(b.spill_bytes, 16 + 12);
}

// ptxas's "Potential Performance Loss" advisories are kept per kernel; one that says the wgmmas
// are serialized fails the report (so the build) unless allowed, naming the kernel.
TEST(ResourceReport, SerializedWgmmaFailsTheReportUnlessAllowed) {
  const auto out = (fs::path(::testing::TempDir()) / "fp4moe_test_resources_serialized.json").string();
  const auto script = (kSourceRoot / "cmake" / "resource_report.py").string();
  const auto log = (kSourceRoot / "tests" / "planner" / "data" / "ptxas_sm90a_serialized.log").string();
  const std::string cmd = "python3 " + script + " --demangler '' --parse-log " + log + " --out " + out;
  const auto failed = test_util::run_command(cmd);
  EXPECT_EQ(failed.exit_code, 2) << failed.output;
  EXPECT_THAT(failed.output, HasSubstr("error: _ZN6fp4moe7kernels17fp4moe_wgmma_gemmILi8ELi8E"));
  EXPECT_THAT(failed.output, HasSubstr("C7513: wgmma.mma_async instructions are serialized"));
  EXPECT_THAT(failed.output, HasSubstr("FP4MOE_ALLOW_SERIALIZED_WGMMA"));
  const auto allowed = test_util::run_command(cmd + " --allow-serialized-wgmma");
  ASSERT_EQ(allowed.exit_code, 0) << allowed.output;
  EXPECT_THAT(allowed.output, HasSubstr("warning: _ZN6fp4moe7kernels17fp4moe_wgmma_gemmILi8ELi8E"));
  const auto report = load_resource_report(out);
  ASSERT_EQ(report.kernels.size(), 2u);
  EXPECT_EQ(report.kernels[0].sm, 90);
  EXPECT_EQ(report.kernels[1].registers, 168);
  // The clean log of the other test has no advisory and passes.
  const auto clean = test_util::run_command(
      "python3 " + script + " --demangler '' --parse-log " +
      (kSourceRoot / "tests" / "planner" / "data" / "ptxas_sm120a.log").string() + " --out " + out);
  EXPECT_EQ(clean.exit_code, 0) << clean.output;
}

TEST(ResourceReport, DemangledNamesMatchTheFamily) {
  const auto r = test_util::run_command("command -v c++filt");
  if (r.exit_code != 0) GTEST_SKIP() << "no c++filt on this machine";
  const auto out = (fs::path(::testing::TempDir()) / "fp4moe_test_resources_demangled.json").string();
  const auto script = (kSourceRoot / "cmake" / "resource_report.py").string();
  const auto log = (kSourceRoot / "tests" / "planner" / "data" / "ptxas_sm120a.log").string();
  const auto run = test_util::run_command("python3 " + script + " --demangler c++filt --parse-log " + log +
                                          " --out " + out);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto report = load_resource_report(out);
  ASSERT_EQ(report.kernels.size(), 2u);
  EXPECT_THAT(report.kernels[0].kernel,
              HasSubstr("fp4moe_stream_gemm<2, 4, (fp4moe::kernels::StreamEpilogue)2>"));
  EXPECT_EQ(report.find("fp4moe_stream_gemm", {2, 4, 2}, 120)->registers, 128);
  EXPECT_EQ(report.find("fp4moe_stream_gemm", {1, 1, 0}, 120)->registers, 255);
}

TEST(ResourceReport, MalformedReportsAreRefusedWithThePathAndTheField) {
  Errc code{};
  EXPECT_THAT(error_of([] { load_resource_report("/nonexistent/fp4moe_resources.json"); }, &code),
              HasSubstr("cannot open the resource report /nonexistent/fp4moe_resources.json"));
  EXPECT_EQ(code, Errc::kIo);
  const auto not_json = write_temp("r1.json", "{kernels");
  EXPECT_THAT(error_of([&] { load_resource_report(not_json); }, &code), HasSubstr(not_json + ": not JSON"));
  EXPECT_EQ(code, Errc::kBadFile);
  const auto no_array = write_temp("r2.json", R"({"kernels": 3})");
  EXPECT_THAT(error_of([&] { load_resource_report(no_array); }),
              HasSubstr("expected an object with a \"kernels\" array"));
  const auto missing = write_temp("r3.json", R"({"kernels": [{"name": "k", "arch": "sm_90a"}]})");
  EXPECT_THAT(error_of([&] { load_resource_report(missing); }), HasSubstr("kernels[0] has no \"registers\""));
  const auto negative = write_temp(
      "r4.json", R"({"kernels": [{"name": "k", "arch": "sm_90a", "registers": -1, "static_smem_bytes": 0,
                    "spill_store_bytes": 0, "spill_load_bytes": 0}]})");
  EXPECT_THAT(error_of([&] { load_resource_report(negative); }),
              HasSubstr("kernels[0].registers is not a non-negative integer (-1)"));
  const auto bad_arch = write_temp(
      "r5.json", R"({"kernels": [{"name": "k", "arch": "hopper", "registers": 1, "static_smem_bytes": 0,
                    "spill_store_bytes": 0, "spill_load_bytes": 0}]})");
  EXPECT_THAT(error_of([&] { load_resource_report(bad_arch); }),
              HasSubstr("kernels[0].arch 'hopper' is not sm_<number>"));
  const auto not_object = write_temp("r6.json", R"({"kernels": [1]})");
  EXPECT_THAT(error_of([&] { load_resource_report(not_object); }), HasSubstr("kernels[0] is not an object"));
}

TEST(ResourceReport, BuildWithoutCudaHasNoReportAndSaysWhy) {
  const auto& r = build_resources();
  if (r.source != ResourceSource::kNone) GTEST_SKIP() << "this build wrote a resource report: " << r.origin;
  EXPECT_THAT(r.origin, HasSubstr("no resource report at " + default_resource_report_path()));
}

}  // namespace
}  // namespace fp4moe
