// The epilogue shared by the three expert-GEMM kernels (stream, tile, wgmma): every kernel
// ends with a thread holding, for one 16-row weight tile and one token, the accumulators of rows
// g and g+8 (the mma/wgmma fragment layout), and hands them to store_token.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/launch.hpp"
#include "kernels/weight_layout.hpp"

namespace fp4moe::kernels {

// NOTE: the activation uses the SFU's approximate ex2 and rcp (MUFU.EX2, MUFU.RCP: relative error
// about 2^-22 each, PTX ISA "ex2", "rcp"), where the CPU reference computes exp and the division
// correctly rounded (portable_math.hpp). The result is rounded to bf16 (relative step 2^-8), so
// the two agree except, rarely, by one bf16 unit where the fp32 value lies on a rounding
// boundary: far inside the tests' 1e-2 bound. The correctly rounded version cost ~90 instructions
// per value with two branches, more than a chunk's decode per item in the wgmma kernel, while
// the tensor cores waited (docs/PERF.md). Overflow behaves as in the reference: exp(-x) = inf
// gives sigmoid 0, NaN propagates.
__device__ __forceinline__ float fast_sigmoid(float x) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(e) : "f"(x * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(1.0f + e));
  return r;
}

// SwiGLU, or gpt-oss's clamped variant written as std::min / std::clamp are (NaN handling
// included), in the CPU reference's operation order.
__device__ __forceinline__ float gemm_activation(StreamEpilogue epi, float gate, float up, float alpha,
                                                 float limit) {
  if (epi == StreamEpilogue::kSwiGLU) return gate * fast_sigmoid(gate) * up;
  const float g = (limit < gate) ? limit : gate;
  const float u = (up < -limit) ? -limit : ((limit < up) ? limit : up);
  return g * fast_sigmoid(alpha * g) * (u + 1.0f);
}

// What storing one 16-row weight tile's results needs besides the accumulators, read once per
// tile before its stores: reading it per value costs a dependent global load each (a store
// might alias it, so the compiler reloads it after every store).
struct TileOut {
  float scale[2];  // GEMM2: post_scale of rows g, g+8; GEMM1: of the gate and the up row
  float bias[2];   // the same rows' biases; -0.0f without one (x + -0 = x for every x, -0 included)
  int col[2];      // GEMM2: output column of row g, g+8; GEMM1: col[0], of intermediate tile*8 + g;
                   // -1: past the matrix, nothing to store
};

// GEMM2 (kStoreBf16): y[out_row][row] = bf16(v * post_scale (+ bias)) for rows tile*16 + g and
// tile*16 + g + 8. GEMM1: the tile's rows g and g+8 are the gate and up of intermediate index
// tile*8 + g; h[out_row][that index] = act(gate, up) in bf16, at its k-permuted column when
// out_permuted.
template <StreamEpilogue EPI>
__device__ __forceinline__ TileOut tile_out(const StreamGemmArgs& p, int expert, int tile, int g) {
  const float* ps = p.post_scale + 2 * expert;
  TileOut o{};
  if constexpr (EPI == StreamEpilogue::kStoreBf16) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = tile * 16 + g + 8 * h;
      const bool in = row < p.rows;
      o.col[h] = in ? row : -1;
      o.scale[h] = ps[0];
      o.bias[h] =
          (in && p.bias != nullptr) ? p.bias[static_cast<std::int64_t>(expert) * p.rows + row] : -0.0f;
    }
  } else {
    const int inter = p.rows / 2;
    const int jj = tile * 8 + g;
    const bool in = jj < inter;
    o.col[0] = in ? (p.out_permuted ? permuted_k(jj) : jj) : -1;
    o.col[1] = -1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      o.scale[h] = ps[h];
      o.bias[h] = (in && p.bias != nullptr) ? p.bias[(static_cast<std::int64_t>(expert) * 2 + h) * inter + jj]
                                            : -0.0f;
    }
  }
  return o;
}

__device__ __forceinline__ std::uint16_t* out_row_ptr(const StreamGemmArgs& p, std::int64_t out_row) {
  return static_cast<std::uint16_t*>(p.out) + out_row * p.out_ld;
}

// Stores one token's results of a tile (see tile_out): v_g and v_g8 are rows g and g+8.
template <StreamEpilogue EPI>
__device__ __forceinline__ void store_token(const StreamGemmArgs& p, const TileOut& o, std::uint16_t* row,
                                            float v_g, float v_g8) {
  if constexpr (EPI == StreamEpilogue::kStoreBf16) {
    if (o.col[0] >= 0) row[o.col[0]] = f32_to_bf16_bits(v_g * o.scale[0] + o.bias[0]);
    if (o.col[1] >= 0) row[o.col[1]] = f32_to_bf16_bits(v_g8 * o.scale[1] + o.bias[1]);
  } else {
    if (o.col[0] < 0) return;
    const float gate = v_g * o.scale[0] + o.bias[0];
    const float up = v_g8 * o.scale[1] + o.bias[1];
    row[o.col[0]] = f32_to_bf16_bits(gemm_activation(EPI, gate, up, p.swiglu_alpha, p.swiglu_limit));
  }
}

// The same for kernels that store a tile's tokens one at a time, far apart.
template <StreamEpilogue EPI>
__device__ __forceinline__ void store_token(const StreamGemmArgs& p, int expert, int tile, int g,
                                            std::int64_t out_row, float v_g, float v_g8) {
  store_token<EPI>(p, tile_out<EPI>(p, expert, tile, g), out_row_ptr(p, out_row), v_g, v_g8);
}

// Host side: raises a kernel's dynamic shared-memory limit to the device's opt-in maximum less its
// static shared memory (once for every configuration of that function) and reports its registers
// and occupancy at `smem` dynamic bytes; cudaErrorInvalidValue where smem and the static bytes
// together exceed the opt-in maximum.
template <typename Kernel>
cudaError_t setup_kernel(Kernel fn, int threads, int smem, KernelAttributes* attributes) {
  int device = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  cudaFuncAttributes fa{};
  err = cudaFuncGetAttributes(&fa, fn);
  if (err != cudaSuccess) return err;
  const int static_bytes = static_cast<int>(fa.sharedSizeBytes);
  if (smem + static_bytes > optin) return cudaErrorInvalidValue;
  err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - static_bytes);
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
