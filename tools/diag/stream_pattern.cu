// Diagnostic (not part of the build): does the decode kernels' access pattern cap their HBM rate?
//
// The stream kernel's warps each walk their own contiguous stretch of weights (one row group's
// K range, or a K split's part of it) in 2304-byte blocks through a cp.async ring, so at any time
// ~2000 warps read ~2000 scattered places. The copy ceiling reads consecutive addresses. This
// program streams the same bytes with the kernel's per-lane copies (four 16-byte pieces a lane and
// one more for 16 lanes, plus 2 x 16 bytes of an L2-resident "activation" buffer) and ring, and no
// decode, in two orders:
//   own:         warp g reads blocks g*C .. g*C + C-1 (the weight layout's order for a warp)
//   interleaved: warp g reads blocks c*G + g for c = 0 .. C-1 (neighbouring warps neighbouring
//                blocks at every step, as a copy kernel does)
// and, beside them, a plain read of the buffer (grid-stride 16-byte loads). Optionally `work`
// dependent integer operations per chunk and lane stand in for the decode.
//
// The build makes it as fp4moe_diag_stream_pattern (no arguments; prints a table). Alone:
//   nvcc -std=c++17 -O3 -arch=sm_90a -I. -Iinclude -o stream_pattern tools/diag/stream_pattern.cu &&
//   ./stream_pattern
// On the H200 (2026-12-02) both orders ran at the same rate, 3.5-4.0 TB/s without work (docs/PERF.md).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/common.cuh"
#include "kernels/stream_gemm_layout.hpp"
#include "kernels/weight_layout.hpp"
#include "tools/diag/check.hpp"

// The stream kernel's block and m4 n1 stage (2304 weight bytes + 1024 activation bytes).
constexpr int kBlock = fp4moe::kernels::WeightLayout::kBlockBytes;
constexpr int kStages = 3;
constexpr int kStageBytes = fp4moe::kernels::StreamGemmLayout::stage_bytes({4, 1, kStages, 16, 1});
static_assert(kBlock == 2304 && kStageBytes == 3328);

using fp4moe::kernels::cp_async16;
using fp4moe::kernels::cp_async_commit;
using fp4moe::kernels::cp_async_wait;
using fp4moe::kernels::smem_addr;

__global__ void stream_kernel(const std::uint8_t* w, const std::uint8_t* act, int chunks, int interleaved,
                              int work, std::uint32_t* sink) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const long long g = static_cast<long long>(blockIdx.x) * warps + warp;
  const long long G = static_cast<long long>(gridDim.x) * warps;
  const std::uint32_t ring = smem_addr(smem) + warp * kStages * kStageBytes;
  auto block_of = [&](int c) -> const std::uint8_t* {
    const long long b = interleaved ? static_cast<long long>(c) * G + g : g * chunks + c;
    return w + b * kBlock;
  };
  auto issue = [&](int c, int s) {
    if (c < chunks) {
      const std::uint8_t* src = block_of(c);
      const std::uint32_t st = ring + s * kStageBytes;
#pragma unroll
      for (int i = 0; i < 4; ++i) cp_async16(st + i * 512 + lane * 16, src + i * 512 + lane * 16);
      if (lane < 16) cp_async16(st + 2048 + lane * 16, src + 2048 + lane * 16);
      const std::uint8_t* a = act + (c % 8) * 1024;
      cp_async16(st + 2304 + lane * 16, a + lane * 16);
      cp_async16(st + 2304 + 512 + lane * 16, a + 512 + lane * 16);
    }
    cp_async_commit();
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s, s);
  std::uint32_t acc = 0;
  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<kStages - 2>();
    __syncwarp();
    issue(c + kStages - 1, (c + kStages - 1) % kStages);
    const std::uint32_t st = ring + (c % kStages) * kStageBytes;
    std::uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(st + lane * 16));
    for (int i = 0; i < work; ++i) v = (v << 3) ^ (v >> 5) ^ static_cast<std::uint32_t>(i);
    acc ^= v;
  }
  cp_async_wait<0>();
  if (acc == 0x12345678u) sink[g] = acc;  // keeps the loads and the work
}

__global__ void read_kernel(const uint4* p, long long n, std::uint32_t* sink) {
  std::uint32_t acc = 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[threadIdx.x] = acc;
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const std::size_t bytes = 512ull << 20;  // several buffers' worth: each run starts cold in L2
  std::uint8_t *w = nullptr, *act = nullptr;
  std::uint32_t* sink = nullptr;
  CHECK(cudaMalloc(&w, bytes));
  CHECK(cudaMalloc(&act, 8 * 1024));
  CHECK(cudaMalloc(&sink, 1 << 20));
  CHECK(cudaMemset(w, 1, bytes));
  CHECK(cudaMemset(act, 1, 8 * 1024));
  CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             16 * kStages * kStageBytes));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const int reps = 20;
  // Plain read of 128 MB windows, rotated through the buffer.
  {
    const long long n = (128ll << 20) / 16;
    read_kernel<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(w), n, sink);
    CHECK(cudaEventRecord(e0));
    for (int r = 0; r < reps; ++r)
      read_kernel<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(w + (r % 4) * (128ll << 20)), n, sink);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    std::printf("plain read 128 MB: %.1f us, %.0f GB/s\n", ms * 1e3 / reps,
                (128ll << 20) * reps / (ms * 1e-3) / 1e9);
  }
  struct Case {
    int warps, chunks, work;
  };
  // 16 warps x 13 chunks ~ T=1's down GEMM (64 MB), 15 x 28 ~ its gate/up (127 MB), 16 x 32, and
  // with stand-in work.
  const Case cases[] = {{16, 13, 0},  {15, 28, 0},  {16, 32, 0},   {8, 32, 0},
                        {16, 13, 64}, {15, 28, 64}, {16, 13, 128}, {15, 28, 128}};
  for (const Case& c : cases) {
    for (int interleaved = 0; interleaved < 2; ++interleaved) {
      const long long blocks = static_cast<long long>(sms) * c.warps * c.chunks;
      const long long used = blocks * kBlock;
      const int windows = static_cast<int>(bytes / used);
      const int smem = c.warps * kStages * kStageBytes;
      stream_kernel<<<sms, c.warps * 32, smem>>>(w, act, c.chunks, interleaved, c.work, sink);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(e0));
      for (int r = 0; r < reps; ++r)
        stream_kernel<<<sms, c.warps * 32, smem>>>(w + (r % windows) * used, act, c.chunks, interleaved,
                                                   c.work, sink);
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = ms * 1e3 / reps;
      std::printf(
          "warps %2d x %3d SMs, %2d chunks a warp (%5.1f MB), work %3d, %-11s: %7.1f us, %5.0f GB/s\n",
          c.warps, sms, c.chunks, used / 1e6, c.work, interleaved ? "interleaved" : "own", us,
          used / (us * 1e-6) / 1e9);
    }
  }
  return 0;
}
