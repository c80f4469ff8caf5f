// fp4moe: the GPUs this process can see.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe {

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  std::int64_t smem_per_block_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
  std::int64_t smem_per_sm = 0;
  std::int64_t l2_bytes = 0;
  std::int64_t global_memory_bytes = 0;
  int regs_per_sm = 0;
  int max_threads_per_sm = 0;
  int sm_clock_khz = 0;      // current SM clock as reported by the runtime (0 if unknown)
  int memory_clock_khz = 0;  // 0 if unknown
  int memory_bus_bits = 0;

  int sm() const noexcept { return cc_major * 10 + cc_minor; }  // 90 for H200
};

// Whether this build has the CUDA kernels.
bool built_with_cuda() noexcept;

// The GPUs found, or an empty list with the reason in `why_none` ("built without CUDA",
// "no CUDA device: cudaErrorNoDevice (no CUDA-capable device is detected)", ...).
std::vector<GpuInfo> list_gpus(std::string* why_none = nullptr);

}  // namespace fp4moe
