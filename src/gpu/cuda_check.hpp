// Checking CUDA runtime calls from host code: a failure throws fp4moe::Error (kCuda) naming the
// statement, the error's name and text, the device and file:line, after clearing the sticky
// error state so that later calls start clean.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "fp4moe/error.hpp"

namespace fp4moe::gpu {

[[noreturn]] inline void throw_cuda(cudaError_t err, const char* what, const char* file, int line) {
  int device = -1;
  cudaGetDevice(&device);
  cudaGetLastError();
  throw Error(Errc::kCuda, fmt::format("{} failed: {} ({}) on device {} at {}:{}", what,
                                       cudaGetErrorName(err), cudaGetErrorString(err), device, file, line));
}

}  // namespace fp4moe::gpu

#define FP4MOE_CUDA_CHECK(expr)                                                                        \
  do {                                                                                                 \
    const cudaError_t fp4moe_err_ = (expr);                                                            \
    if (fp4moe_err_ != cudaSuccess) ::fp4moe::gpu::throw_cuda(fp4moe_err_, #expr, __FILE__, __LINE__); \
  } while (0)
