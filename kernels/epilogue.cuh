// The epilogue shared by the three expert-GEMM kernels (stream, tile, wgmma): every kernel
// ends with a thread holding, for one 16-row weight tile and one token, the accumulators of rows
// g and g+8 (the mma/wgmma fragment layout), and hands them to store_token.
#pragma once

#include <cstdint>

#include "fp4moe/detail/portable_math.hpp"
#include "kernels/common.cuh"
#include "kernels/launch.hpp"
#include "kernels/weight_layout.hpp"

namespace fp4moe::kernels {

// SwiGLU, or gpt-oss's clamped variant written as std::min / std::clamp are (NaN handling
// included), in the CPU reference's operation order.
__device__ __forceinline__ float gemm_activation(StreamEpilogue epi, float gate, float up, float alpha,
                                                 float limit) {
  using detail::pm_add;
  using detail::pm_mul;
  if (epi == StreamEpilogue::kSwiGLU) return pm_mul(detail::portable_silu(gate), up);
  const float g = (limit < gate) ? limit : gate;
  const float u = (up < -limit) ? -limit : ((limit < up) ? limit : up);
  return pm_mul(pm_mul(g, detail::portable_sigmoid(pm_mul(alpha, g))), pm_add(u, 1.0f));
}

// Stores one token's results of 16-row tile `tile` (within the expert): rows tile*16 + g and
// tile*16 + g + 8 carry v_g and v_g8. GEMM2 (kStoreBf16): y[out_row][row] = bf16(v * post_scale
// (+ bias)). GEMM1: the tile's rows g and g+8 are the gate and up of intermediate index tile*8 + g;
// h[out_row][that index] = act(gate, up) in bf16, at its k-permuted column when out_permuted.
template <StreamEpilogue EPI>
__device__ __forceinline__ void store_token(const StreamGemmArgs& p, int expert, int tile, int g,
                                            std::int64_t out_row, float v_g, float v_g8) {
  const float* ps = p.post_scale + 2 * expert;
  if constexpr (EPI == StreamEpilogue::kStoreBf16) {
    std::uint16_t* y = static_cast<std::uint16_t*>(p.out) + out_row * p.out_ld;
    const float v[2] = {v_g, v_g8};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = tile * 16 + g + 8 * h;
      if (row >= p.rows) continue;
      float val = v[h] * ps[0];
      if (p.bias != nullptr) val += p.bias[static_cast<std::int64_t>(expert) * p.rows + row];
      y[row] = f32_to_bf16_bits(val);
    }
  } else {
    const int inter = p.rows / 2;
    const int jj = tile * 8 + g;
    if (jj >= inter) return;
    float gate = v_g * ps[0];
    float up = v_g8 * ps[1];
    if (p.bias != nullptr) {
      gate += p.bias[(static_cast<std::int64_t>(expert) * 2 + 0) * inter + jj];
      up += p.bias[(static_cast<std::int64_t>(expert) * 2 + 1) * inter + jj];
    }
    const float val = gemm_activation(EPI, gate, up, p.swiglu_alpha, p.swiglu_limit);
    const int col = p.out_permuted ? permuted_k(jj) : jj;
    static_cast<std::uint16_t*>(p.out)[out_row * p.out_ld + col] = f32_to_bf16_bits(val);
  }
}

// Host side: raises a kernel's dynamic shared-memory limit to the device's opt-in maximum (once
// for every configuration of that function) and reports its registers and occupancy at `smem`.
template <typename Kernel>
cudaError_t setup_kernel(Kernel fn, int threads, int smem, KernelAttributes* attributes) {
  int device = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  if (smem > optin) return cudaErrorInvalidValue;
  err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  if (err != cudaSuccess) return err;
  cudaFuncAttributes fa{};
  err = cudaFuncGetAttributes(&fa, fn);
  if (err != cudaSuccess) return err;
  int blocks = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, threads, smem);
  if (err != cudaSuccess) return err;
  if (attributes != nullptr) {
    attributes->registers = fa.numRegs;
    attributes->local_bytes = static_cast<int>(fa.localSizeBytes);
    attributes->max_blocks_per_sm = blocks;
  }
  return cudaSuccess;
}

// Host side: launches with programmatic dependent launch when `pdl` (the kernel then waits on
// griddepcontrol.wait before reading its predecessor's output).
template <typename Kernel, typename... Args>
cudaError_t launch_kernel(Kernel fn, int grid, int threads, std::size_t smem, bool pdl, cudaStream_t stream,
                          Args... args) {
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(static_cast<unsigned>(grid));
  lc.blockDim = dim3(static_cast<unsigned>(threads));
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&lc, fn, args...);
}

}  // namespace fp4moe::kernels
