#include "fp4moe/arch.hpp"

#include <fmt/format.h>

#include <charconv>
#include <optional>

#include "common/fail.hpp"

namespace fp4moe {
namespace {

// NOTE: figures from the CUDA C++ Programming Guide's table of compute capabilities (shared
// memory per SM and per block, threads and blocks per SM), cross-checked against NVIDIA/cccl
// arch_traits and CUTLASS (cutlass/arch/arch.h: sm90/sm100 232448 B, sm120 101376 B per block).
// Per-product figures (SMs, DRAM bandwidth) are datasheet numbers of the named GPU. The L2
// bandwidth (3x DRAM) and the loaded memory latency (700 ns) are estimates: see docs/PLANNER.md.
constexpr double kL2OverDram = 3.0;
constexpr double kLatencyNs = 700.0;
constexpr double kDecodeValuesPerNs = 32.8;  // per SM: 16384 values per 0.5 us (H200, f76abf9)

ArchInfo make(std::string name, int sm, std::string gpu, std::int64_t optin, std::int64_t per_sm,
              int threads_per_sm, int blocks_per_sm, int sm_count, double dram_gbs, double mma_tflops) {
  ArchInfo a;
  a.name = std::move(name);
  a.sm = sm;
  a.example_gpu = std::move(gpu);
  a.smem_per_block_optin = optin;
  a.smem_per_sm = per_sm;
  a.max_threads_per_sm = threads_per_sm;
  a.max_blocks_per_sm = blocks_per_sm;
  a.sm_count = sm_count;
  a.dram_bandwidth_gbs = dram_gbs;
  a.l2_bandwidth_gbs = dram_gbs * kL2OverDram;
  a.memory_latency_ns = kLatencyNs;
  a.decode_values_per_ns_per_sm = kDecodeValuesPerNs;
  a.mma_sync_bf16_tflops = mma_tflops;
  a.mma_sync_bf16 = true;
  return a;
}

// NOTE: the mma.sync BF16 rates (last column, TFLOP/s, dense, fp32 accumulate) are estimates:
// the example GPU's datasheet dense BF16 tensor peak (A100 312, RTX 3090 71, RTX 4090 165,
// H100 SXM 989, B200/B300 2250, RTX PRO 6000 Blackwell 504), Orin and GB10 from their SM count
// and clock at the rate per SM of their generation (42.5, 120). On sm_90 mma.sync reaches only
// about 60% of the peak (the peak needs wgmma): 593. Elsewhere the full peak is assumed, which
// overstates sm_100/sm_103, where the peak needs tcgen05.
std::vector<ArchInfo> build_table() {
  std::vector<ArchInfo> t;
  // Ampere: mma.sync only, cp.async (no TMA).
  t.push_back(make("sm_80", 80, "A100 SXM4 80GB", 166912, 167936, 2048, 32, 108, 2039, 312));
  t.push_back(make("sm_86", 86, "RTX 3090", 101376, 102400, 1536, 16, 82, 936, 71));
  t.push_back(make("sm_87", 87, "Jetson AGX Orin 64GB", 166912, 167936, 1536, 16, 16, 204.8, 42.5));
  // Ada: adds FP8 mma.sync.
  t.push_back(make("sm_89", 89, "RTX 4090", 101376, 102400, 1536, 24, 128, 1008, 165));
  t.back().mma_sync_fp8 = true;
  // Hopper: wgmma (sm_90a), TMA, clusters with multicast. No FP4 tensor cores.
  t.push_back(make("sm_90", 90, "H100 SXM5 80GB", 232448, 233472, 2048, 32, 132, 3350, 989 * 0.6));
  // Datacenter Blackwell: tcgen05/UMMA with tensor memory, block-scaled FP4 through tcgen05.mma.
  t.push_back(make("sm_100", 100, "B200", 232448, 233472, 2048, 32, 148, 8000, 2250));
  t.push_back(make("sm_103", 103, "B300", 232448, 233472, 2048, 32, 148, 8000, 2250));
  // Consumer / workstation Blackwell: block-scaled FP4 through mma.sync, TMA, clusters without
  // multicast (CUTLASS's SM120 builder static_asserts a 1x1x1 cluster), 99 KB per block.
  t.push_back(make("sm_120", 120, "RTX PRO 6000 Blackwell", 101376, 102400, 1536, 32, 188, 1792, 504));
  t.push_back(make("sm_121", 121, "DGX Spark (GB10)", 101376, 102400, 1536, 32, 48, 273, 120));
  for (auto& a : t) {
    a.mma_sync_fp8 = a.sm >= 89;
    a.wgmma = a.sm == 90;
    a.wgmma_bf16_tflops = a.wgmma ? 989 : 0;  // H100 SXM dense BF16 peak (estimated for wgmma)
    a.tcgen05 = a.sm == 100 || a.sm == 103;
    a.block_scaled_fp4 = a.sm >= 100;
    if (a.tcgen05) a.block_scaled_instr = "tcgen05.mma kind::mxf4nvf4";
    if (a.sm >= 120) a.block_scaled_instr = "mma.sync kind::mxf4nvf4.block_scale";
    a.tma = a.sm >= 90;
    a.clusters = a.sm >= 90;
    a.tma_multicast = a.sm >= 90 && a.sm < 120;
  }
  return t;
}

std::string known_names() {
  std::string s;
  for (const auto& a : arch_table()) s += (s.empty() ? "" : ", ") + a.name;
  return s;
}

std::optional<int> parse_int(std::string_view s) {
  int v = 0;
  const auto* end = s.data() + s.size();
  const auto r = std::from_chars(s.data(), end, v);
  if (r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return v;
}

std::optional<int> parse_sm(std::string_view name) {
  std::string_view s = name;
  if (s.starts_with("sm_")) {
    s.remove_prefix(3);
  } else if (s.starts_with("sm")) {
    s.remove_prefix(2);
  }
  // Arch-specific ("a") and family ("f") suffixes name the same chip.
  if (!s.empty() && (s.back() == 'a' || s.back() == 'f')) s.remove_suffix(1);
  if (const auto dot = s.find('.'); dot != std::string_view::npos) {
    const auto major = parse_int(s.substr(0, dot));
    const auto minor = parse_int(s.substr(dot + 1));
    if (!major || !minor || *minor > 9) return std::nullopt;
    return *major * 10 + *minor;
  }
  return parse_int(s);
}

}  // namespace

std::string ArchInfo::mma_families() const {
  std::string s;
  const auto add = [&s](const std::string& part) { s += (s.empty() ? "" : ", ") + part; };
  if (mma_sync_bf16) add(mma_sync_fp8 ? "mma.sync BF16/FP8" : "mma.sync BF16");
  if (wgmma) add("wgmma BF16/FP8");
  if (tcgen05) add("tcgen05/UMMA");
  if (block_scaled_fp4) add("block-scaled FP4 (" + block_scaled_instr + ")");
  return s;
}

std::string ArchInfo::to_string() const {
  std::string s = fmt::format("{} (figures of {}; source: {})\n", name, example_gpu, source);
  s += fmt::format("  shared memory: {} B per block (opt-in), {} B per SM, {} B reserved per block\n",
                   smem_per_block_optin, smem_per_sm, smem_reserved_per_block);
  s +=
      fmt::format("  registers: {} per SM, {} per block, {} per thread (allocated per warp in units of {})\n",
                  regs_per_sm, regs_per_block, regs_per_thread, reg_alloc_unit);
  s += fmt::format("  threads: {} per SM, {} per block; {} blocks per SM\n", max_threads_per_sm,
                   max_threads_per_block, max_blocks_per_sm);
  s += fmt::format("  tensor cores: {}\n", mma_families());
  s += fmt::format("  TMA: {}, clusters: {}, TMA multicast: {}\n", tma ? "yes" : "no",
                   clusters ? "yes" : "no", tma_multicast ? "yes" : "no");
  s += fmt::format(
      "  {} SMs, DRAM {:.0f} GB/s, L2 {:.0f} GB/s (estimated), memory latency {:.0f} ns (estimated), "
      "mma.sync BF16 {:.0f} TFLOP/s (estimated){}, E2M1 decode {:.1f} values/ns per SM (measured on an "
      "H200)\n",
      sm_count, dram_bandwidth_gbs, l2_bandwidth_gbs, memory_latency_ns, mma_sync_bf16_tflops,
      wgmma ? fmt::format(", wgmma BF16 {:.0f} TFLOP/s (estimated)", wgmma_bf16_tflops) : "",
      decode_values_per_ns_per_sm);
  for (const auto& n : notes) s += "  note: " + n + "\n";
  return s;
}

const std::vector<ArchInfo>& arch_table() {
  static const std::vector<ArchInfo> table = build_table();
  return table;
}

const ArchInfo& arch_by_sm(int sm) {
  for (const auto& a : arch_table()) {
    if (a.sm == sm) return a;
  }
  fail(Errc::kUnsupported,
       "compute capability {}.{} (sm_{}) is not in fp4moe's architecture table (known: {})", sm / 10, sm % 10,
       sm, known_names());
}

const ArchInfo& arch_by_name(std::string_view name) {
  const auto sm = parse_sm(name);
  if (sm) {
    for (const auto& a : arch_table()) {
      if (a.sm == *sm) return a;
    }
  }
  fail(Errc::kInvalidArgument, "unknown architecture '{}' (known: {}; also written sm120, 120 or 12.0)", name,
       known_names());
}

ArchInfo arch_from_gpu(const GpuInfo& gpu) {
  ArchInfo a = arch_by_sm(gpu.sm());
  a.source = fmt::format("device {} ({})", gpu.index, gpu.name);
  a.example_gpu = gpu.name;
  const auto take = [&a](const char* what, auto& field, auto device_value, const char* unit) {
    if (device_value <= 0 || device_value == field) return;
    a.notes.push_back(fmt::format("{}: device {}{}, table {}{} (using the device's)", what, device_value,
                                  unit, field, unit));
    field = device_value;
  };
  take("smem_per_block_optin", a.smem_per_block_optin, gpu.smem_per_block_optin, " B");
  take("smem_per_sm", a.smem_per_sm, gpu.smem_per_sm, " B");
  take("regs_per_sm", a.regs_per_sm, gpu.regs_per_sm, "");
  take("max_threads_per_sm", a.max_threads_per_sm, gpu.max_threads_per_sm, "");
  // SM count and bandwidth vary by product within an architecture: the device's figures replace
  // the example GPU's without a note of disagreement.
  if (gpu.sm_count > 0) {
    a.mma_sync_bf16_tflops *= static_cast<double>(gpu.sm_count) / a.sm_count;
    a.wgmma_bf16_tflops *= static_cast<double>(gpu.sm_count) / a.sm_count;
    a.sm_count = gpu.sm_count;
  }
  if (gpu.memory_clock_khz > 0 && gpu.memory_bus_bits > 0) {
    // NOTE: the runtime reports the memory clock such that 2 transfers per clock (DDR) times the
    // bus width gives the datasheet peak (H100 SXM: 2619 MHz x 5120 bit x 2 / 8 = 3.35 TB/s).
    const double gbs = 2.0 * gpu.memory_clock_khz * 1e3 * gpu.memory_bus_bits / 8.0 / 1e9;
    a.notes.push_back(
        fmt::format("DRAM bandwidth {:.0f} GB/s from the device's memory clock ({} kHz) and bus "
                    "({} bit); L2 bandwidth scaled with it",
                    gbs, gpu.memory_clock_khz, gpu.memory_bus_bits));
    a.dram_bandwidth_gbs = gbs;
    a.l2_bandwidth_gbs = gbs * kL2OverDram;
  }
  return a;
}

ArchInfo resolve_arch(std::string_view name) {
  if (!name.empty() && name != "local") return arch_by_name(name);
  std::string why;
  const auto gpus = list_gpus(&why);
  if (gpus.empty()) {
    fail(Errc::kUnsupported, "no local GPU to plan for ({}); name an architecture instead (known: {})", why,
         known_names());
  }
  return arch_from_gpu(gpus.front());
}

}  // namespace fp4moe
