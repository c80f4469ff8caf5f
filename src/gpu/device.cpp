#include "fp4moe/device.hpp"

#include <fmt/format.h>

#if FP4MOE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fp4moe {

bool built_with_cuda() noexcept {
  return FP4MOE_WITH_CUDA != 0;
}

std::vector<GpuInfo> list_gpus(std::string* why_none) {
  std::vector<GpuInfo> gpus;
#if FP4MOE_WITH_CUDA
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why_none)
      *why_none = fmt::format("no CUDA device: {} ({})", cudaGetErrorName(err), cudaGetErrorString(err));
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return gpus;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = prop.name;
    g.cc_major = prop.major;
    g.cc_minor = prop.minor;
    g.sm_count = prop.multiProcessorCount;
    g.smem_per_block_optin = static_cast<std::int64_t>(prop.sharedMemPerBlockOptin);
    g.smem_per_sm = static_cast<std::int64_t>(prop.sharedMemPerMultiprocessor);
    g.l2_bytes = prop.l2CacheSize;
    g.global_memory_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
    g.regs_per_sm = prop.regsPerMultiprocessor;
    g.max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, i) == cudaSuccess) g.sm_clock_khz = v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, i) == cudaSuccess) g.memory_clock_khz = v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, i) == cudaSuccess) g.memory_bus_bits = v;
    gpus.push_back(std::move(g));
  }
  if (gpus.empty() && why_none) *why_none = "no CUDA device found";
#else
  if (why_none) *why_none = "built without CUDA (nvcc was not found at configure time)";
#endif
  return gpus;
}

}  // namespace fp4moe
