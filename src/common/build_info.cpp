#include <fmt/format.h>

#include "fp4moe/build_info.hpp"
#include "fp4moe/version.hpp"

#if FP4MOE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fp4moe {

std::string version() {
  return build_info::kVersion;
}
std::string build_commit() {
  return build_info::kCommit;
}
std::string cuda_architectures() {
  return build_info::kWithCuda ? build_info::kCudaArchitectures : "";
}

std::string cuda_runtime_version() {
#if FP4MOE_WITH_CUDA
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) return "unknown";
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
#else
  return "none";
#endif
}

}  // namespace fp4moe
