// fp4moe: the GPU architectures fp4moe knows, in one table.
//
// Every number the planner uses about a chip comes from an ArchInfo: the table below (one entry per
// compute capability, figures of a representative GPU where they vary by product), or the table
// entry overridden by what the device reports (arch_from_gpu). Where the device and the table
// disagree the device wins and the disagreement is kept in ArchInfo::notes, so `fp4moe plan` can
// show it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fp4moe/device.hpp"

namespace fp4moe {

struct ArchInfo {
  std::string name;         // "sm_120"
  int sm = 0;               // 120 (compute capability major*10 + minor)
  std::string example_gpu;  // the product the per-product figures (SMs, bandwidth) come from

  // Shared memory. NOTE: since sm_80 the driver reserves 1 KB of shared memory per block for
  // itself; the CUDA occupancy calculator counts it against the per-SM capacity, so a block
  // that asks for the full opt-in maximum leaves exactly smem_per_sm - optin - reserved unused.
  std::int64_t smem_per_block_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
  std::int64_t smem_per_sm = 0;           // cudaDevAttrMaxSharedMemoryPerMultiprocessor
  std::int64_t smem_reserved_per_block = 1024;

  // Registers and threads.
  int regs_per_sm = 65536;
  int regs_per_block = 65536;
  int regs_per_thread = 255;
  int reg_alloc_unit = 256;  // registers are allocated per warp in units of 256
  int max_threads_per_sm = 0;
  int max_threads_per_block = 1024;
  int max_blocks_per_sm = 0;

  // Tensor-core instruction families and data movement.
  bool mma_sync_bf16 = false;     // mma.sync.m16n8k16 BF16 (sm_80+)
  bool mma_sync_fp8 = false;      // mma.sync with .e4m3/.e5m2 operands (sm_89+)
  bool wgmma = false;             // warpgroup MMA (sm_90a only)
  bool tcgen05 = false;           // tcgen05 / UMMA with tensor memory (sm_100a, sm_103a)
  bool block_scaled_fp4 = false;  // MMA with per-block scale factors on FP4 (NVFP4/MXFP4)
  std::string
      block_scaled_instr;      // how: "tcgen05.mma kind::mxf4nvf4" or "mma.sync kind::mxf4nvf4.block_scale"
  bool tma = false;            // cp.async.bulk.tensor (sm_90+)
  bool clusters = false;       // thread-block clusters (sm_90+)
  bool tma_multicast = false;  // TMA multicast across a cluster (sm_90, sm_100, sm_103; not sm_120)

  // Figures of the example GPU (per product, not per architecture): used by the cost model only.
  int sm_count = 0;
  double dram_bandwidth_gbs = 0;  // nominal (datasheet) DRAM bandwidth, GB/s
  double l2_bandwidth_gbs = 0;    // L2 -> SM bandwidth, GB/s (estimated: see docs/PLANNER.md)
  double memory_latency_ns = 0;   // loaded DRAM latency, ns (estimated)
  // Dense BF16 rate (fp32 accumulate) that mma.sync reaches, TFLOP/s: the rate fp4moe's kernels
  // (mma.sync m16n8k16) can use. Estimated: the datasheet's dense BF16 tensor peak, times 0.6 on
  // sm_90 (mma.sync does not reach wgmma's rate on Hopper). Scaled with the device's SM count.
  double mma_sync_bf16_tflops = 0;
  // Dense BF16 rate of wgmma (sm_90 only; 0 elsewhere), TFLOP/s: the datasheet peak, estimated.
  // Scaled with the device's SM count.
  double wgmma_bf16_tflops = 0;
  // E2M1 values one SM's prefill kernel widens to BF16 per ns (the decode, with the block scale,
  // into the MMA's registers). Measured on an H200 for the wgmma kernel with 8 consumer warps
  // (a 256 x 64 chunk in ~0.5 us whatever the token block); assumed for every architecture.
  double decode_values_per_ns_per_sm = 0;

  std::string source = "table";    // "table" or "device 0 (NVIDIA H200)"
  std::vector<std::string> notes;  // where the device disagreed with the table, and how figures were set

  // Names the tensor-core families present, e.g. "mma.sync BF16/FP8, wgmma".
  std::string mma_families() const;
  // Several lines: every field with its unit.
  std::string to_string() const;
};

// Every known architecture, oldest first: sm_80, sm_86, sm_87, sm_89, sm_90, sm_100, sm_103,
// sm_120, sm_121.
const std::vector<ArchInfo>& arch_table();

// Accepts "sm_120", "sm120", "sm_120a", "120" or "12.0". Throws Error (kInvalidArgument) naming the
// value and listing the known architectures.
const ArchInfo& arch_by_name(std::string_view name);
// The table entry for a compute capability; throws Error (kUnsupported) naming it and the known list.
const ArchInfo& arch_by_sm(int sm);

// The table entry for the device's compute capability, with the device's own figures taking
// precedence: shared memory per block and per SM, registers, threads, SM count, and the DRAM
// bandwidth from its memory clock and bus width when both are reported. Each disagreement with
// the table is recorded in notes ("smem_per_sm: device 233472 B, table 232448 B").
ArchInfo arch_from_gpu(const GpuInfo& gpu);

// "local" (or empty): arch_from_gpu of CUDA device 0, throwing Error (kUnsupported) with the
// reason when there is none; anything else: arch_by_name.
ArchInfo resolve_arch(std::string_view name);

}  // namespace fp4moe
