// The architecture table: the documented figures, the name parser, and the device override.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fp4moe/arch.hpp"
#include "fp4moe/device.hpp"
#include "fp4moe/error.hpp"
#include "test_util/shared.hpp"

namespace fp4moe {
namespace {

using test_util::error_of;
using ::testing::HasSubstr;

TEST(Arch, TableListsTheNineArchitecturesOldestFirst) {
  std::vector<std::string> names;
  for (const auto& a : arch_table()) names.push_back(a.name);
  EXPECT_EQ(names, (std::vector<std::string>{"sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_103",
                                             "sm_120", "sm_121"}));
}

TEST(Arch, OptInSharedMemoryMatchesCudaAndCutlass) {
  // FORMATS.md (NVIDIA/cccl arch_traits) and PLANNER_FACTS.md (cutlass/arch/arch.h).
  EXPECT_EQ(arch_by_sm(80).smem_per_block_optin, 166912);
  EXPECT_EQ(arch_by_sm(86).smem_per_block_optin, 101376);
  EXPECT_EQ(arch_by_sm(89).smem_per_block_optin, 101376);
  EXPECT_EQ(arch_by_sm(90).smem_per_block_optin, 232448);
  EXPECT_EQ(arch_by_sm(100).smem_per_block_optin, 232448);
  EXPECT_EQ(arch_by_sm(120).smem_per_block_optin, 101376);
  EXPECT_EQ(arch_by_sm(121).smem_per_block_optin, 101376);
}

TEST(Arch, PerSmCapacityIsTheOptInPlusTheReservedKilobyte) {
  for (const auto& a : arch_table()) {
    EXPECT_EQ(a.smem_per_sm, a.smem_per_block_optin + a.smem_reserved_per_block) << a.name;
    EXPECT_EQ(a.smem_reserved_per_block, 1024) << a.name;
    EXPECT_GT(a.sm_count, 0) << a.name;
    EXPECT_GT(a.dram_bandwidth_gbs, 0) << a.name;
    EXPECT_GT(a.max_blocks_per_sm, 0) << a.name;
    EXPECT_EQ(a.max_threads_per_sm % 32, 0) << a.name;
  }
}

TEST(Arch, TensorCoreFamiliesAndDataMovement) {
  const auto& a80 = arch_by_sm(80);
  EXPECT_TRUE(a80.mma_sync_bf16);
  EXPECT_FALSE(a80.mma_sync_fp8);
  EXPECT_FALSE(a80.tma);
  EXPECT_TRUE(arch_by_sm(89).mma_sync_fp8);
  const auto& a90 = arch_by_sm(90);
  EXPECT_TRUE(a90.wgmma);
  EXPECT_FALSE(a90.block_scaled_fp4);
  EXPECT_TRUE(a90.tma && a90.clusters && a90.tma_multicast);
  for (int sm : {100, 103}) {
    const auto& a = arch_by_sm(sm);
    EXPECT_TRUE(a.tcgen05) << sm;
    EXPECT_FALSE(a.wgmma) << sm;
    EXPECT_TRUE(a.block_scaled_fp4) << sm;
    EXPECT_EQ(a.block_scaled_instr, "tcgen05.mma kind::mxf4nvf4") << sm;
  }
  for (int sm : {120, 121}) {
    const auto& a = arch_by_sm(sm);
    EXPECT_FALSE(a.tcgen05) << sm;
    EXPECT_TRUE(a.block_scaled_fp4) << sm;
    EXPECT_TRUE(a.tma && a.clusters) << sm;
    EXPECT_FALSE(a.tma_multicast) << sm;
  }
  EXPECT_EQ(a90.mma_families(), "mma.sync BF16/FP8, wgmma BF16/FP8");
  EXPECT_EQ(a80.mma_families(), "mma.sync BF16");
}

TEST(Arch, NamesInEveryUsualSpelling) {
  for (const char* name : {"sm_120", "sm120", "sm_120a", "120", "12.0", "sm_120f"}) {
    EXPECT_EQ(arch_by_name(name).sm, 120) << name;
  }
  EXPECT_EQ(arch_by_name("9.0").name, "sm_90");
  EXPECT_EQ(arch_by_name("sm_90a").name, "sm_90");
  EXPECT_EQ(arch_by_name("10.3").name, "sm_103");
}

TEST(Arch, UnknownNamesAreRefusedWithTheKnownList) {
  Errc code{};
  const auto msg = error_of([] { arch_by_name("sm_75"); }, &code);
  EXPECT_EQ(code, Errc::kInvalidArgument);
  EXPECT_THAT(msg, HasSubstr("unknown architecture 'sm_75'"));
  EXPECT_THAT(msg, HasSubstr("sm_80, sm_86, sm_87, sm_89, sm_90, sm_100, sm_103, sm_120, sm_121"));
  for (const char* bad : {"", "sm_", "12.x", "12.10", "hopper", "sm_90b"}) {
    EXPECT_THAT(error_of([bad] { arch_by_name(bad); }), HasSubstr("unknown architecture")) << bad;
  }
  EXPECT_THAT(error_of([] { arch_by_sm(75); }, &code), HasSubstr("compute capability 7.5 (sm_75)"));
  EXPECT_EQ(code, Errc::kUnsupported);
}

GpuInfo h200_like() {
  GpuInfo g;
  g.index = 1;
  g.name = "NVIDIA H200";
  g.cc_major = 9;
  g.cc_minor = 0;
  g.sm_count = 132;
  g.smem_per_block_optin = 232448;
  g.smem_per_sm = 233472;
  g.regs_per_sm = 65536;
  g.max_threads_per_sm = 2048;
  return g;
}

TEST(Arch, DeviceValuesTakePrecedenceAndDisagreementsAreNoted) {
  GpuInfo g = h200_like();
  ArchInfo a = arch_from_gpu(g);
  EXPECT_EQ(a.name, "sm_90");
  EXPECT_EQ(a.source, "device 1 (NVIDIA H200)");
  EXPECT_TRUE(a.notes.empty()) << a.to_string();

  g.smem_per_block_optin = 227 * 1024;  // a driver that reports a different opt-in limit
  g.sm_count = 114;
  a = arch_from_gpu(g);
  EXPECT_EQ(a.smem_per_block_optin, 232448);  // 227 KB is the same number
  g.smem_per_block_optin = 200000;
  a = arch_from_gpu(g);
  EXPECT_EQ(a.smem_per_block_optin, 200000);
  EXPECT_EQ(a.sm_count, 114);
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_EQ(a.notes[0], "smem_per_block_optin: device 200000 B, table 232448 B (using the device's)");
}

TEST(Arch, DramBandwidthFromTheDevicesMemoryClockAndBus) {
  GpuInfo g = h200_like();
  g.memory_clock_khz = 2619000;
  g.memory_bus_bits = 5120;
  const ArchInfo a = arch_from_gpu(g);
  // 2 x 2619 MHz x 5120 bit / 8 = 3352.32 GB/s.
  EXPECT_DOUBLE_EQ(a.dram_bandwidth_gbs, 3352.32);
  EXPECT_DOUBLE_EQ(a.l2_bandwidth_gbs, 3 * 3352.32);
  EXPECT_THAT(a.notes.back(), HasSubstr("DRAM bandwidth 3352 GB/s from the device's memory clock"));
}

TEST(Arch, UnknownDeviceArchitectureIsRefused) {
  GpuInfo g = h200_like();
  g.cc_major = 7;
  g.cc_minor = 5;
  Errc code{};
  EXPECT_THAT(error_of([&] { arch_from_gpu(g); }, &code),
              HasSubstr("sm_75) is not in fp4moe's architecture table"));
  EXPECT_EQ(code, Errc::kUnsupported);
}

TEST(Arch, ResolveTakesNamesOrTheLocalGpu) {
  EXPECT_EQ(resolve_arch("sm_89").name, "sm_89");
  std::string why;
  if (!list_gpus(&why).empty()) GTEST_SKIP() << "a GPU is present: 'local' resolves to it";
  Errc code{};
  EXPECT_THAT(error_of([] { resolve_arch("local"); }, &code),
              HasSubstr("no local GPU to plan for (" + why + ")"));
  EXPECT_EQ(code, Errc::kUnsupported);
}

TEST(Arch, PrintsEveryFigureWithItsUnit) {
  const auto s = arch_by_sm(120).to_string();
  EXPECT_THAT(s, HasSubstr("sm_120 (figures of RTX PRO 6000 Blackwell; source: table)"));
  EXPECT_THAT(s, HasSubstr("101376 B per block (opt-in), 102400 B per SM, 1024 B reserved per block"));
  EXPECT_THAT(s, HasSubstr("block-scaled FP4 (mma.sync kind::mxf4nvf4.block_scale)"));
  EXPECT_THAT(s, HasSubstr("188 SMs, DRAM 1792 GB/s"));
}

}  // namespace
}  // namespace fp4moe
