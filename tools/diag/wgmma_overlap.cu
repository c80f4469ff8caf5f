// Diagnostic (not part of the layer): does the FP4 decode overlap the tensor cores' work when
// other warps do it?
//
// The wgmma kernel's consumers decode each chunk's weights into registers and hand them to
// wgmma as the A operand (RS); on the H200 a chunk then costs its tensor work plus the decode
// (docs/PERF.md, "What limits each regime"). The alternative design has a third warpgroup decode
// into shared memory while the consumers only issue wgmmas reading A from shared memory (SS).
// This program times, on every SM (132 CTAs of three warpgroups, one per SM), per iteration one
// wgmma chunk of the kernel's largest item, 256 weight rows x 128 tokens x 64 K (16 x
// m64n128k16: 1024 tensor cycles an SM), and/or the decode of that chunk's 16384 values
// (the kernel's own decode_e2m1x8 and scale multiplies, 14 instructions a word of 8 values):
//
//   ss        consumers: SS wgmmas only
//   xf        the transform warpgroup only: per thread 16 words of FP4 from shared memory,
//             decoded and scaled, 256 bytes of bf16 stored to shared memory
//   ss+xf     both at once (independent: no barrier between them, so only shared resources
//             couple them: issue slots, register file, shared memory)
//   rs        consumers: RS wgmmas only (A registers decoded once, before the loop)
//   rs+xf     RS wgmmas and the transform warpgroup at once
//   rs+dec    the kernel's design: each consumer decodes its A registers (2 m64 blocks x 4
//             k-steps: 8 words a thread) before each chunk's wgmmas
//   xf2 ...   the same with two transform warpgroups, each decoding half the chunk
//   pipe      rs fed as the kernel feeds it (below: a producer thread, bulk copies, an mbarrier
//             ring), pipe+dec the same with the consumers' decode: the wgmma kernel in miniature;
//             +items32 / +items96 with an epilogue (bf16 stores) every 32 / 96 chunks, the down
//             and gate/up GEMMs' items; ... mc: CTA pairs multicasting the token block (half each;
//             "whole": the pair's first CTA all of it), s8: an 8-stage ring; tm: the token block
//             through a tensor map (unpaired), mctm: pairs multicasting halves through it; ra:
//             no decode in the loop, the A registers random FP4 decoded once (the layer's data);
//             gather: the token block gathered row by row with cp.async (the first GEMM's feed)
//   ... n160, n96, n64, n32: rs and rs+dec with 160, 96, 64 and 32 tokens (m64nNk16: 1280, 768,
//             512 and 256 tensor cycles an iteration for the same decode; n160's rs+dec wgmmas
//             are serialized, see main)
//   rs+dec3   rs+dec with three A register sets (wait_group 2): a chunk's decode runs while the
//             two chunks before it are in flight
//
// If ss+xf takes about max(ss, xf), a transform warpgroup hides the decode and the design pays;
// if about ss + xf, the decode costs the same wherever it runs.
//
// Alone: nvcc -std=c++17 -O3 -arch=sm_90a -I. -Iinclude -o wgmma_overlap tools/diag/wgmma_overlap.cu
// Prints a table. --random: random operands (the layer's case, which puts the GPU at its power
// cap) instead of near-constant ones; --sustain: each run after ~2 s of the same kernel back to
// back; --pipe-only: only the pipelined runs; --only a,b: only the rows named. TFLOP/s: the
// tensor work over the best run's time; GHz: the consumers' cycles over it.
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/sm90.cuh"
#include "kernels/weight_layout.hpp"
#include "tools/diag/check.hpp"

using namespace fp4moe::kernels;

// wgmma and setmaxnreg exist only in sm_90a code; the other architectures of the build get an
// empty kernel (main refuses to run off sm_90).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DIAG_WGMMA 1
#else
#define DIAG_WGMMA 0
#endif

enum Mode : int { kSS = 0, kXF = 1, kSSXF = 2, kRS = 3, kRSXF = 4, kRSDec = 5, kRSDec3 = 6 };

// Shared memory: B (128 tokens x 64 K bf16, 16 KB), A for SS (two warpgroups x 128 rows x 64 K
// bf16, 32 KB), the transform's FP4 source (8 KB) and its bf16 output (32 KB). 128-byte swizzled,
// K-major rows of 128 bytes: the descriptors are the kernel's.
[[maybe_unused]] constexpr int kB = 0;
[[maybe_unused]] constexpr int kA = 16384;
[[maybe_unused]] constexpr int kSrc = kA + 32768;
[[maybe_unused]] constexpr int kDst = kSrc + 8192;
constexpr int kSmem = kDst + 32768;

#define ACC64(d)                                                                                            \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),           \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),            \
      "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),            \
      "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),            \
      "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),            \
      "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),            \
      "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),            \
      "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define REGS64                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, "                                                                                                 \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "  \
  "%43, "                                                                                                 \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

__device__ __forceinline__ void wgmma_ss(float (&d)[64], std::uint64_t da, std::uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " REGS64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : ACC64(d)
      : "l"(da), "l"(db));
}
// m64n160k16 (160 tokens: a 128-token block with a 32-token tail in the same item), diag only.
__device__ __forceinline__ void wgmma_m64n160k16_rs(float (&d)[80], const std::uint32_t (&a)[4],
                                                    std::uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
      "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, "
      "%71, %72, %73, %74, %75, %76, %77, %78, %79}, {%80, %81, %82, %83}, %84, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
// m64n96k16 (96 tokens: the 96-token tail instance a branch once built, exp/wgmma-n12-tail), diag only.
__device__ __forceinline__ void wgmma_m64n96k16_rs(float (&d)[48], const std::uint32_t (&a)[4],
                                                   std::uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, "
      "%51}, %52, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
// RS wgmma with 160, 128, 96, 64 or 32 tokens (128, 64, 32: sm90.cuh's; 160, 96: above).
template <int N>
__device__ __forceinline__ void wgmma_rs_n(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t db) {
  if constexpr (N == 160) {
    wgmma_m64n160k16_rs(d, a, db);
  } else if constexpr (N == 128) {
    wgmma_m64n128k16_rs(d, a, db, 1);
  } else if constexpr (N == 96) {
    wgmma_m64n96k16_rs(d, a, db);
  } else if constexpr (N == 64) {
    wgmma_m64n64k16_rs(d, a, db, 1);
  } else {
    wgmma_m64n32k16_rs(d, a, db, 1);
  }
}

// Two bf16 of random sign and mantissa in +-[1, 2) from a hash of `key` (host and device).
__host__ __device__ inline std::uint32_t random_bf16x2(std::uint32_t key) {
  std::uint32_t h = key * 0x9e3779b9u;
  h ^= h >> 15;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  return (h & 0x807f807fu) | 0x3f803f80u;
}

// One word of 8 codes decoded and scaled, as the consumers do it.
__device__ __forceinline__ void decode_scaled(std::uint32_t w, std::uint32_t s_g, std::uint32_t s_g8,
                                              std::uint32_t (&a)[4]) {
  decode_e2m1x8(w, a);
  a[0] = bf16x2_mul(a[0], s_g);
  a[1] = bf16x2_mul(a[1], s_g8);
  a[2] = bf16x2_mul(a[2], s_g);
  a[3] = bf16x2_mul(a[3], s_g8);
}

// XFW: transform warpgroups (1 or 2; with 2 each decodes half the chunk).
template <int MODE, int XFW = 1, int N = 128>
__global__ void __launch_bounds__(128 * (2 + XFW), 1)
    overlap(int iters, int random, float* sink, long long* cycles) {
#if DIAG_WGMMA
  extern __shared__ __align__(1024) std::uint8_t smem[];
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int t = tid % 128;
  const std::uint32_t base = smem_addr(smem);
  // Small normal bf16 values everywhere (0x3c00.. ~ 0.0078), so no operand is NaN or subnormal;
  // `random`: random signs and mantissas in +-[1, 2) (random FP4 codes where read as weights).
  for (int i = tid * 4; i < kSmem; i += static_cast<int>(blockDim.x) * 4)
    *reinterpret_cast<std::uint32_t*>(smem + i) =
        random ? random_bf16x2(static_cast<std::uint32_t>(i) ^ (blockIdx.x << 20))
               : 0x3c003c00u + (static_cast<std::uint32_t>(i) & 0x007f007fu);
  __syncthreads();
  const bool consumer = wg < 2;
  const bool consumers_run = MODE != kXF;
  const bool transform_runs = MODE == kXF || MODE == kSSXF || MODE == kRSXF;
  long long t0 = clock64();
  if (consumer) {
    if constexpr (XFW == 1) {
      setmaxnreg_inc<232>();
    } else {
      setmaxnreg_inc<216>();
    }
    if (consumers_run) {
      float acc[2][N / 2];
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int q = 0; q < N / 2; ++q) acc[i][q] = 0.0f;
      const std::uint64_t db = b_descriptor(base + kB);
      const std::uint64_t da = b_descriptor(base + kA + wg * 16384);
      // RS: the A registers (2 blocks x 4 k-steps), decoded from a word of the source.
      std::uint32_t a[2][4][4];
      const std::uint32_t s_g = scale_pair_from_bytes(0x38383838u & 0x00ff00ffu);
      const std::uint32_t s_g8 = s_g;
      const std::uint32_t* src = reinterpret_cast<const std::uint32_t*>(smem + kSrc) + (t % 32) * 8;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int s = 0; s < 4; ++s) decode_scaled(src[i * 4 + s] & 0x77777777u, s_g, s_g8, a[i][s]);
      // One chunk's wgmmas on A set `a` (SS: A from shared memory), then, in rs+dec, the next
      // chunk's words decoded into the other set once the chunk before is done (wait_group 1), as
      // the kernel alternates its two A sets.
      auto chunk = [&](const std::uint32_t(&cur)[2][4][4], std::uint32_t(&next)[2][4][4], int it) {
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            if constexpr (MODE == kSS || MODE == kSSXF) {
              wgmma_ss(acc[i], da + i * (8192 >> 4) + 2 * s, db + 2 * s);
            } else {
              wgmma_rs_n<N>(acc[i], cur[i][s], db + 2 * s);
            }
          }
        }
        wgmma_commit();
        if constexpr (MODE == kRSDec3) {
          asm volatile("wgmma.wait_group.sync.aligned 2;\n" ::: "memory");
        } else {
          wgmma_wait_one();
        }
        if constexpr (MODE == kRSDec || MODE == kRSDec3) {
          // The next chunk's 8 words, one 16-byte load a block as the kernel reads them.
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const uint4 wq = lds128(base + kSrc + ((t % 32) * 16 + i * 512 + (it & 7) * 16) % 8192);
            const std::uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
            for (int s = 0; s < 4; ++s) decode_scaled(words[s], s_g, s_g8, next[i][s]);
          }
        }
      };
      // The other A sets start as copies of the first.
      auto copy_set = [](std::uint32_t(&dst)[2][4][4], const std::uint32_t(&src)[2][4][4]) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int r = 0; r < 4; ++r) dst[i][s][r] = src[i][s][r];
      };
      std::uint32_t b[2][4][4];
      copy_set(b, a);
      if constexpr (MODE == kRSDec3) {
        // Three sets: chunk c's wgmmas issued, then the set of chunk c - 2 (done: wait_group 2)
        // decoded for chunk c + 1, while c - 1 and c run.
        std::uint32_t e[2][4][4];
        copy_set(e, a);
        for (int it = 0; it + 2 < iters; it += 3) {
          chunk(a, b, it);
          chunk(b, e, it + 1);
          chunk(e, a, it + 2);
        }
      } else {
        for (int it = 0; it < iters; it += 2) {
          chunk(a, b, it);
          chunk(b, a, it + 1);
        }
      }
      wgmma_wait_all();
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int q = 0; q < N / 2; ++q) sum += acc[i][q];
      if (sum == 12345.0f) sink[tid] = sum;
    }
  } else {
    setmaxnreg_dec<40>();
    if (transform_runs) {
      // The whole CTA's chunk: 2048 words, 16 a thread (8 with two transform warpgroups), in
      // batches of one 16-byte load.
      const int xt = (wg - 2) * 128 + t;  // the thread among the transform threads
      const std::uint32_t s_g = scale_pair_from_bytes(0x38383838u & 0x00ff00ffu);
      for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int b = 0; b < 4 / XFW; ++b) {
          const uint4 wq = lds128(base + kSrc + ((b * 128 * XFW + xt) * 16 + (it & 3) * 4096) % 8192);
          const std::uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            std::uint32_t a[4];
            decode_scaled(words[s], s_g, s_g, a);
            // 16 bytes of bf16 a word; a thread's 16 words fill 256 bytes of the 32 KB.
            const std::uint32_t dst =
                base + kDst + (((b * 4 + s) * 128 * XFW + xt) * 16 ^ ((t & 7) << 4)) % 32768;
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(a[0]), "r"(a[1]),
                         "r"(a[2]), "r"(a[3])
                         : "memory");
          }
        }
      }
    }
  }
  const long long t1 = clock64();
  if (t == 0 && wg < 3) cycles[blockIdx.x * 3 + wg] = t1 - t0;
#endif
}

// The same chunk fed as the wgmma kernel feeds it: one producer thread copies each chunk's token
// block (16 KB, from an L2-resident buffer that groups of 16 CTAs share, as the 16 row groups of
// an expert's gate/up share theirs) and its 9216 bytes of weights (4 blocks of 2304, each CTA its
// own 117 MB stream over all CTAs: from HBM) into a ring of `kStages` stages with bulk copies
// completing on a "full" mbarrier; the consumers wait for it, decode (DEC) their words from the
// stage, issue the 16 RS wgmmas reading the token block from the stage, and free the stage before
// once its wgmmas are done ("empty" mbarrier, 256 arrivals). Two A register sets alternate, as in
// the kernel.
constexpr int kStages = 6;
constexpr int kStageBytes = 16384 + 9216 + 1024;  // token block, weights, to the next 1 KB
constexpr int kPipeChunks = 96;                   // chunks of an item (K = 6144) before the sources wrap
constexpr int pipe_smem(int stages) {
  return stages * kStageBytes + 1024;
}

// ITEM > 0: every ITEM chunks an item ends: the consumers wait for its wgmmas, store the
// accumulators as bf16 (64 KB a CTA, 16 bytes a lane, each instruction a warp's contiguous 512
// bytes, as the down GEMM's staged epilogue stores them) and start the next item from zero.
// MC 1: CTAs in clusters of two (the same token block, as two row groups of an expert), each
// loading half of every token block and multicasting it into both CTAs' stages, so that L2 sends
// each token block once per pair; a stage is then free only once both CTAs' consumers released
// it (one arrival per consumer warp on each CTA's "empty" barrier). MC 2: the same with the pair's
// first CTA multicasting the whole block. MC 3: as MC 1, but each half (64 token rows) copied through
// a tensor map (`cp.async.bulk.tensor ... .multicast::cluster`, 128-byte swizzle, as the kernel
// copies its down GEMM's token block); MC 4: unpaired, the whole block through a tensor map (MC 3's
// baseline). MC 5: MC 1 with the remote arrivals at cluster scope (`.release.cluster`, the first
// version's form, which ptxas fences with MEMBAR.ALL.GPU per arrival). MC 6: unpaired, the token
// block gathered row by row with cp.async by the producer warpgroup, as the kernel's first GEMM
// gathers it. STAGES: the ring's depth.
__host__ __device__ constexpr bool pair_of(int mc) {
  return mc >= 1 && mc <= 3 || mc == 5;
}
// RA (with DEC false): the A registers hold random FP4 codes decoded and scaled once before the
// loop, so that the tensor cores multiply data like the layer's with no decode in the loop (the
// A registers are zero otherwise).
template <bool DEC, int ITEM = 0, int MC = 0, int STAGES = kStages, bool RA = false>
__global__ void __launch_bounds__(384, 1)
    pipe(int iters, const std::uint8_t* tokens, const __grid_constant__ CUtensorMap tok_map,
         const std::uint8_t* weights, std::uint8_t* out, float* sink, long long* cycles) {
  constexpr bool kPair = pair_of(MC);
#if DIAG_WGMMA
  extern __shared__ __align__(1024) std::uint8_t smem[];
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int t = tid % 128;
  const std::uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  const std::uint32_t bars = base + STAGES * kStageBytes;  // full[s] at 8 s, empty[s] at 8 (STAGES + s)
  if (tid == 0) {
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(bars + 8 * st, MC == 6 ? 129 : 1);
      mbar_init(bars + 8 * (STAGES + st), kPair ? 16 : 256);
    }
    mbar_fence_init();
  }
  __syncthreads();
  std::uint32_t rank = 0;
  if constexpr (kPair) {
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
  }
  long long t0 = clock64();
  if (wg == 2) {
    setmaxnreg_dec<40>();
    if constexpr (MC == 6) {
      // The first GEMM's gathering producer: the warpgroup's 128 threads copy the token block's
      // rows with cp.async, thread t piece t % 8 of rows t / 8 + 16 j, to where the 128-byte
      // swizzle puts it; the rows are the group's 128 token rows of the tensor-map view
      // ([groups x 128][6144] bf16) in a scattered order. Thread 0 also copies the weights.
      const int piece = t & 7;
      const int row0 = t >> 3;
      const std::uint8_t* rows =
          tokens + static_cast<std::int64_t>(blockIdx.x / 16) * 128 * 12288 + piece * 16;
      const std::uint8_t* src[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) src[j] = rows + ((row0 + 16 * j) * 37 % 128) * 12288;
      const std::uint8_t* w = weights + static_cast<std::int64_t>(blockIdx.x) * kPipeChunks * 9216;
      for (int c = 0; c < iters; ++c) {
        const int st = c % STAGES;
        mbar_wait(bars + 8 * (STAGES + st), ((c / STAGES) & 1) ^ 1);
        const std::uint32_t sb = base + st * kStageBytes;
        if (t == 0) {
          mbar_arrive_expect_tx(bars + 8 * st, 9216);
          bulk_copy(sb + 16384, w + (c % kPipeChunks) * 9216, 9216, bars + 8 * st);
        }
        const int k = (c % kPipeChunks) * 128;
#pragma unroll
        for (int j = 0; j < 8; ++j) cp_async16(sb + swizzle128_offset(row0 + 16 * j, piece), src[j] + k);
        cp_async_arrive_noinc(bars + 8 * st);
      }
    } else if (t == 0) {
      const std::uint8_t* tok = tokens + static_cast<std::int64_t>(blockIdx.x / 16) * kPipeChunks * 16384;
      const std::uint8_t* w = weights + static_cast<std::int64_t>(blockIdx.x) * kPipeChunks * 9216;
      for (int c = 0; c < iters; ++c) {
        const int st = c % STAGES;
        mbar_wait(bars + 8 * (STAGES + st), ((c / STAGES) & 1) ^ 1);
        mbar_arrive_expect_tx(bars + 8 * st, 16384 + 9216);
        if constexpr (MC == 3 || MC == 4) {
          // Token rows of the tensor map: the CTA group's 128 (this CTA's 64 of them in a pair),
          // K from the chunk; into both CTAs' stages at the same offset (MC 3).
          const int row =
              static_cast<int>(blockIdx.x / 16) * 128 + (MC == 3 ? static_cast<int>(rank) * 64 : 0);
          const int k0 = (c % kPipeChunks) * 64;
          const std::uint32_t dst = base + st * kStageBytes + (MC == 3 ? rank * 8192 : 0);
          if constexpr (MC == 3) {
            asm volatile(
                "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::"
                "cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
                "l"(reinterpret_cast<std::uint64_t>(&tok_map)), "r"(k0), "r"(row), "r"(bars + 8 * st),
                "h"(static_cast<unsigned short>(3))
                : "memory");
          } else {
            tma_load_2d(dst, &tok_map, k0, row, bars + 8 * st);
          }
        } else if constexpr (MC != 0) {
          // MC 1: this CTA's half of the token block into both CTAs' stage (same offsets, same
          // barrier); MC 2: the pair's first CTA copies the whole block into both.
          const std::uint32_t off = MC != 2 ? rank * 8192 : 0;
          const std::uint32_t bytes = MC != 2 ? 8192 : 16384;
          if (MC != 2 || rank == 0) {
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
                "[%1], %2, [%3], %4;\n" ::"r"(base + st * kStageBytes + off),
                "l"(tok + (c % kPipeChunks) * 16384 + off), "r"(bytes), "r"(bars + 8 * st),
                "h"(static_cast<unsigned short>(3))
                : "memory");
          }
        } else {
          bulk_copy(base + st * kStageBytes, tok + (c % kPipeChunks) * 16384, 16384, bars + 8 * st);
        }
        bulk_copy(base + st * kStageBytes + 16384, w + (c % kPipeChunks) * 9216, 9216, bars + 8 * st);
      }
    }
  } else {
    setmaxnreg_inc<232>();
    float acc[2][64];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int q = 0; q < 64; ++q) acc[i][q] = 0.0f;
    const std::uint32_t s_g = scale_pair_from_bytes(0x38383838u & 0x00ff00ffu);
    const int lane = t % 32, wi = t / 32;
    std::uint32_t a[2][4][4] = {}, b[2][4][4] = {};
    if constexpr (RA) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          std::uint32_t h = (tid * 8 + i * 4 + s + 1) * 0x9e3779b9u + blockIdx.x * 0x85ebca6bu;
          h ^= h >> 16;
          h *= 0x7feb352du;
          h ^= h >> 15;
          decode_scaled(h, s_g, s_g, a[i][s]);
          decode_scaled(h * 0x2c1b3c6du, s_g, s_g, b[i][s]);
        }
    }
    // Chunk c from stage c % STAGES on A set `cur`; then the stage of chunk c - 1 freed.
    auto chunk = [&](std::uint32_t(&cur)[2][4][4], int c) {
      const int st = c % STAGES;
      const std::uint32_t sb = base + st * kStageBytes;
      mbar_wait(bars + 8 * st, (c / STAGES) & 1);
      if constexpr (DEC) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint4 wq = lds128(sb + 16384 + (wg * 2 + i) * 2304 + wi * 512 + lane * 16);
          const std::uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
          for (int s = 0; s < 4; ++s) decode_scaled(words[s], s_g, s_g, cur[i][s]);
        }
      }
      const std::uint64_t db = b_descriptor(sb);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int i = 0; i < 2; ++i) wgmma_m64n128k16_rs(acc[i], cur[i][s], db + 2 * s, 1);
      wgmma_commit();
      wgmma_wait_one();
      if (c > 0) {
        const std::uint32_t empty = bars + 8 * (STAGES + (c - 1) % STAGES);
        if constexpr (kPair) {
          if (lane == 0) {  // for the warp (past the warpgroup's wait), in both CTAs of the pair
            std::uint32_t remote;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                         : "=r"(remote)
                         : "r"(empty), "r"(rank ^ 1u));
            mbar_arrive(empty);
            if constexpr (MC == 5) {
              // Cluster-scope release: ptxas puts MEMBAR.ALL.GPU (and CGAERRBAR) before it.
              asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote)
                           : "memory");
            } else {
              // The default (.release.cta) semantics, as CUTLASS's ClusterBarrier::arrive: no fence.
              asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
            }
          }
        } else {
          mbar_arrive(empty);
        }
      }
    };
    auto item_end = [&](int c) {
      if constexpr (ITEM > 0) {
        if ((c + 1) % ITEM != 0) return;
        wgmma_wait_all();
        std::uint8_t* o = out + static_cast<std::int64_t>(blockIdx.x) * 65536 + tid * 16;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          uint4 v;
          v.x = bf16x2_from_f32(acc[j / 8][(j % 8) * 8 + 0], acc[j / 8][(j % 8) * 8 + 1]);
          v.y = bf16x2_from_f32(acc[j / 8][(j % 8) * 8 + 2], acc[j / 8][(j % 8) * 8 + 3]);
          v.z = bf16x2_from_f32(acc[j / 8][(j % 8) * 8 + 4], acc[j / 8][(j % 8) * 8 + 5]);
          v.w = bf16x2_from_f32(acc[j / 8][(j % 8) * 8 + 6], acc[j / 8][(j % 8) * 8 + 7]);
          stg128(o + j * 4096, v);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int q = 0; q < 64; ++q) acc[i][q] = 0.0f;
      }
    };
    for (int c = 0; c < iters; c += 2) {
      chunk(a, c);
      item_end(c);
      chunk(b, c + 1);
      item_end(c + 1);
    }
    wgmma_wait_all();
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int q = 0; q < 64; ++q) sum += acc[i][q];
    if (sum == 12345.0f) sink[tid] = sum;
  }
  const long long t1 = clock64();
  if (t == 0) cycles[blockIdx.x * 3 + wg] = t1 - t0;
  if constexpr (kPair) {  // no CTA leaves while its peer may still write or arrive into it
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
  }
#endif
}

// Whether the operands are random (the layer's case, which puts the GPU at its power cap) or
// near-constant, and whether each run follows ~2 s of the same kernel back to back.
struct Options {
  int random = 0;
  bool sustain = false;
  bool pipe_only = false;         // only the pipelined runs
  std::vector<std::string> only;  // --only: the rows of these names (all when empty)
  bool selected(const char* name) const {
    return only.empty() || std::find(only.begin(), only.end(), std::string(name)) != only.end();
  }
};

// Best of 5 launches after a warm-up (milliseconds), and the consumer and transform warpgroups'
// mean cycles per iteration (their first thread's clock64 span, over the CTAs).
struct Timing {
  float ms;
  double consumer, transform;
};
template <typename Launch>
Timing time_kernel(Launch launch, int sms, int iters, long long* cycles_d) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  launch();
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  float best = 1e30f;
  for (int r = 0; r < 5; ++r) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (ms < best) best = ms;
  }
  static long long cycles_h[3 * 1024];
  CHECK(cudaMemcpy(cycles_h, cycles_d, sizeof(long long) * 3 * sms, cudaMemcpyDeviceToHost));
  double wg0 = 0.0, wg2 = 0.0;
  for (int i = 0; i < sms; ++i) {
    wg0 += static_cast<double>(cycles_h[3 * i]);
    wg2 += static_cast<double>(cycles_h[3 * i + 2]);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return {best, wg0 / sms / iters, wg2 / sms / iters};
}

// The token buffer as a tensor map for MC 3 / 4: [groups x 128 token rows][6144 bf16] (the same
// bytes as the bulk copies' 96 chunks of 16 KB a group, in another order), boxes of 64 K x `rows`
// token rows written with the 128-byte swizzle, as the kernel's token-block map.
CUtensorMap token_map(const std::uint8_t* tok, int groups, int rows) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
    std::exit(1);
  }
  const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kPipeChunks) * 64,
                              static_cast<cuuint64_t>(groups) * 128};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kPipeChunks) * 64 * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<std::uint8_t*>(tok), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", static_cast<int>(r));
    std::exit(1);
  }
  return map;
}

template <bool DEC, int ITEM = 0, int MC = 0, int STAGES = kStages, bool RA = false>
void run_pipe(const char* name, int sms, int iters, const Options& o, const std::uint8_t* tok,
              const std::uint8_t* w, std::uint8_t* out, float* sink, long long* cycles_d) {
  if (!o.selected(name)) return;
  // Only the tensor-map rows read it (the others pass it unused).
  const CUtensorMap map =
      MC == 3 || MC == 4 ? token_map(tok, (sms + 15) / 16, MC == 3 ? 64 : 128) : CUtensorMap{};
  const auto fn = pipe<DEC, ITEM, MC, STAGES, RA>;
  CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, pipe_smem(STAGES)));
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(static_cast<unsigned>(sms / 2 * 2));
  lc.blockDim = dim3(384);
  lc.dynamicSmemBytes = pipe_smem(STAGES);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  lc.attrs = attr;
  lc.numAttrs = pair_of(MC) ? 1 : 0;
  auto launch = [&] { CHECK(cudaLaunchKernelEx(&lc, fn, iters, tok, map, w, out, sink, cycles_d)); };
  if (o.sustain) {
    for (int r = 0; r < 2000 / 3; ++r) launch();
  }
  const Timing r = time_kernel(launch, sms, iters, cycles_d);
  const double bytes = static_cast<double>(sms) * iters * (16384 + 9216);
  const double macs = 16.0 * 64.0 * 128.0 * 16.0 * sms * iters;
  std::printf(
      "%-12s %10.1f us %8.1f cycles/iter (consumer WG); %.2f TB/s to shared memory; %4.0f TFLOP/s %5.2f "
      "GHz\n",
      name, r.ms * 1000.0, r.consumer, bytes / (r.ms * 1e-3) / 1e12, 2.0 * macs / (r.ms * 1e-3) / 1e12,
      r.consumer * iters / (r.ms * 1e-3) / 1e9);
}

template <int MODE, int XFW = 1, int N = 128>
void run(const char* name, int sms, int iters, const Options& o, float* sink, long long* cycles_d) {
  if (!o.selected(name)) return;
  const auto fn = overlap<MODE, XFW, N>;
  CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  auto launch = [&] { fn<<<sms, 128 * (2 + XFW), kSmem>>>(iters, o.random, sink, cycles_d); };
  if (o.sustain) {
    for (int r = 0; r < 2000 / 3; ++r) launch();  // ~2 s of it before the timed runs
  }
  const Timing r = time_kernel(launch, sms, iters, cycles_d);
  const double macs = MODE == kXF ? 0.0 : 16.0 * 64.0 * N * 16.0 * sms * iters;
  const double cyc = MODE == kXF ? r.transform : r.consumer;
  std::printf(
      "%-12s %10.1f us %8.1f cycles/iter (consumer WG) %8.1f (transform WG); %4.0f TFLOP/s %5.2f GHz\n", name,
      r.ms * 1000.0, r.consumer, r.transform, 2.0 * macs / (r.ms * 1e-3) / 1e12,
      cyc * iters / (r.ms * 1e-3) / 1e9);
}

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--random") {
      o.random = 1;
    } else if (a == "--sustain") {
      o.sustain = true;
    } else if (a == "--pipe-only") {
      o.pipe_only = true;
    } else if (a == "--only" && i + 1 < argc) {
      std::string list = argv[++i];
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        o.only.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--random] [--sustain] [--pipe-only] [--only NAME,NAME...]\n", argv[0]);
      return 2;
    }
  }
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, dev));
  if (prop.major != 9 || prop.minor != 0) {
    std::fprintf(stderr, "%s is sm_%d%d: this program needs sm_90 (wgmma)\n", prop.name, prop.major,
                 prop.minor);
    return 1;
  }
  std::printf(
      "%s, %d SMs; per iteration: 16 x m64n128k16 (1024 tensor cycles an SM) and/or 2048 words decoded\n",
      prop.name, sms);
  float* sink = nullptr;
  long long* cycles = nullptr;
  CHECK(cudaMalloc(&sink, 512 * sizeof(float)));
  CHECK(cudaMalloc(&cycles, 3 * 1024 * sizeof(long long)));
  const int iters = 4000;
  for (int rep = 0; rep < (o.pipe_only ? 0 : o.sustain ? 1 : 2); ++rep) {
    run<kSS>("ss", sms, iters, o, sink, cycles);
    run<kXF>("xf", sms, iters, o, sink, cycles);
    run<kSSXF>("ss+xf", sms, iters, o, sink, cycles);
    run<kRS>("rs", sms, iters, o, sink, cycles);
    run<kRSXF>("rs+xf", sms, iters, o, sink, cycles);
    run<kRSDec>("rs+dec", sms, iters, o, sink, cycles);
    run<kXF, 2>("xf2", sms, iters, o, sink, cycles);
    run<kSSXF, 2>("ss+xf2", sms, iters, o, sink, cycles);
    run<kRSXF, 2>("rs+xf2", sms, iters, o, sink, cycles);
    run<kRS, 1, 64>("rs n64", sms, iters, o, sink, cycles);
    run<kRSDec, 1, 64>("rs+dec n64", sms, iters, o, sink, cycles);
    run<kRS, 1, 32>("rs n32", sms, iters, o, sink, cycles);
    run<kRSDec, 1, 32>("rs+dec n32", sms, iters, o, sink, cycles);
    run<kRSDec3, 1, 64>("rs+dec3 n64", sms, iters, o, sink, cycles);
    run<kRSDec3, 1, 32>("rs+dec3 n32", sms, iters, o, sink, cycles);
    // 160 tokens read 20 KB of B: past the 16 KB B region into the SS A region, unused by RS.
    // With the decode, 160 accumulators and two A sets (64 registers) exceed the consumers' 232:
    // ptxas serializes those wgmmas (C7512), so "rs+dec n160" times a serialized chunk.
    run<kRS, 1, 96>("rs n96", sms, iters, o, sink, cycles);
    run<kRSDec, 1, 96>("rs+dec n96", sms, iters, o, sink, cycles);
    run<kRS, 1, 160>("rs n160", sms, iters, o, sink, cycles);
    run<kRSDec, 1, 160>("rs+dec n160", sms, iters, o, sink, cycles);
  }
  // The pipelined runs: 9 token buffers of 96 chunks (13.5 MB, L2-resident), 132 weight streams
  // of 96 chunks (117 MB: HBM).
  std::uint8_t *tok = nullptr, *w = nullptr;
  const std::size_t tok_bytes = static_cast<std::size_t>((sms + 15) / 16) * kPipeChunks * 16384;
  const std::size_t w_bytes = static_cast<std::size_t>(sms) * kPipeChunks * 9216;
  CHECK(cudaMalloc(&tok, tok_bytes));
  CHECK(cudaMalloc(&w, w_bytes));
  std::uint8_t* out = nullptr;
  CHECK(cudaMalloc(&out, static_cast<std::size_t>(sms) * 65536));
  if (o.random) {
    std::vector<std::uint32_t> h(std::max(tok_bytes, w_bytes) / 4);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = random_bf16x2(static_cast<std::uint32_t>(i));
    CHECK(cudaMemcpy(tok, h.data(), tok_bytes, cudaMemcpyHostToDevice));
    for (std::size_t i = 0; i < h.size(); ++i)
      h[i] ^= random_bf16x2(static_cast<std::uint32_t>(i) ^ 0x5a5a5a5au) << 7;
    CHECK(cudaMemcpy(w, h.data(), w_bytes, cudaMemcpyHostToDevice));
  } else {
    CHECK(cudaMemset(tok, 0x3c, tok_bytes));
    CHECK(cudaMemset(w, 0x35, w_bytes));
  }
  for (int rep = 0; rep < (o.sustain ? 1 : 2); ++rep) {
    run_pipe<false>("pipe", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true>("pipe+dec", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 32>("+items32", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 96>("+items96", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 0, 1>("pipe+dec mc", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 96, 1>("+items96 mc", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 0, 0, 8>("pipe+dec s8", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 0, 1, 8>("mc s8", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 0, 2>("mc whole", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 0, 5>("mc relcl", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 0, 4>("pipe+dec tm", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 0, 3>("mc tm", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 96, 4>("+items96 tm", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 96, 3>("+items96 mctm", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<false, 0, 4>("pipe tm", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<false, 0, 3>("pipe mctm", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<false, 0, 0, kStages, true>("pipe ra", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 0, 6>("pipe+dec gather", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<true, 96, 6>("+items96 gather", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<false, 0, 6, kStages, true>("pipe ra gather", sms, iters, o, tok, w, out, sink, cycles);
    run_pipe<false, 96, 0, kStages, true>("+items96 ra", sms, iters, o, tok, w, out, sink, cycles);
  }
  CHECK(cudaFree(tok));
  CHECK(cudaFree(w));
  CHECK(cudaFree(out));
  CHECK(cudaFree(sink));
  CHECK(cudaFree(cycles));
  return 0;
}
