// SM90 grouped GEMM with wgmma for many tokens per expert (prefill): see wgmma_gemm_layout.hpp
// for the work split. The A operand (weights) is decoded into registers exactly as in the other
// kernels (weight_layout.hpp) and handed to wgmma.mma_async in its register form; the B operand
// (a block of up to 128 tokens) is read by the tensor cores from shared memory. One decode per
// weight feeds 64-128 tokens, against 8-64 for mma.sync, which is what keeps the tensor cores fed.
//
// Pipeline: a CTA-wide cp.async ring; per K chunk every warpgroup issues 2 x 4 wgmma (two m64
// row blocks x four k-steps) on the A registers decoded before, then decodes the next chunk into
// a second set of A registers while those run.
//
// NOTE: cp.async writes through the generic proxy while wgmma reads shared memory through the
// async proxy: each thread fences (fence.proxy.async.shared::cta) after its copies land and
// before the barrier that precedes the wgmmas (PTX ISA, "Asynchronous proxy").
#include "fp4moe/detail/portable_math.hpp"
#include "kernels/common.cuh"
#include "kernels/epilogue.cuh"
#include "kernels/launch.hpp"
#include "kernels/weight_layout.hpp"
#include "kernels/wgmma_gemm_layout.hpp"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FP4MOE_WGMMA 1
#else
#define FP4MOE_WGMMA 0
#endif

namespace fp4moe::kernels {
namespace {

#if FP4MOE_WGMMA
// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address >> 4,
// leading byte offset 1 (unused by K-major swizzled layouts), stride byte offset 1024 (8 rows of
// 128 B: the distance between swizzle atoms along N), swizzle mode 1 = 128 B.
__device__ __forceinline__ std::uint64_t b_descriptor(std::uint32_t smem) {
  return static_cast<std::uint64_t>((smem & 0x3ffff) >> 4) | (1ull << 16) |
         (static_cast<std::uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_one() {
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void keep_in_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const std::uint32_t (&a)[4],
                                                   std::uint64_t desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31}, {%32, %33, %34, %35}, %37, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc));
}

__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const std::uint32_t (&a)[4],
                                                    std::uint64_t desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
      "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %69, p, 1, 1, "
      "0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc));
}

template <int NT>
__device__ __forceinline__ void wgmma_rs(float (&d)[NT * 4], const std::uint32_t (&a)[4],
                                         std::uint64_t desc) {
  if constexpr (NT == 8) {
    wgmma_m64n64k16_rs(d, a, desc, 1);
  } else {
    wgmma_m64n128k16_rs(d, a, desc, 1);
  }
}
#endif

}  // namespace

template <int NT, StreamEpilogue EPI>
__global__ void __launch_bounds__(256, 1) fp4moe_wgmma_gemm(const StreamGemmArgs p, const int stages) {
#if FP4MOE_WGMMA
  extern __shared__ __align__(128) std::uint8_t smem[];
  constexpr int kThreads = WgmmaGemmLayout::kWarps * 32;
  constexpr int kTokens = NT * 8;
  constexpr WgmmaGemmConfig kShape{NT, 2};
  constexpr int kActOff = WgmmaGemmLayout::act_offset(kShape);
  constexpr int kActPieces = kTokens * 8 / kThreads;
  static_assert(kTokens * 8 % kThreads == 0);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int wg = warp >> 2;  // warpgroup
  const int wi = warp & 3;   // warp within the warpgroup
  const int g = lane >> 2;
  const int t = lane & 3;
  const int stage_bytes = WgmmaGemmLayout::stage_bytes({NT, stages});
  const std::uint32_t raw = smem_addr(smem);
  const std::uint32_t base =
      (raw + WgmmaGemmLayout::kAlign - 1) & ~static_cast<std::uint32_t>(WgmmaGemmLayout::kAlign - 1);

  pdl_wait();
  pdl_launch_dependents();

  const int n_active = *p.n_active;
  const int expert_groups = (p.rows + WeightLayout::kGroupRows - 1) / WeightLayout::kGroupRows;
  const std::int64_t total_items = static_cast<std::int64_t>(p.tb_prefix[n_active]) * p.row_blocks;
  int cursor = 0;
  for (std::int64_t item = blockIdx.x; item < total_items; item += gridDim.x) {
    const int pb = static_cast<int>(item / p.row_blocks);
    const int rb = static_cast<int>(item % p.row_blocks);
    while (cursor + 1 < n_active && p.tb_prefix[cursor + 1] <= pb) ++cursor;
    const int expert = p.active[cursor];
    const int slot0 = p.offsets[expert] + (pb - p.tb_prefix[cursor]) * kTokens;
    const int m_count = min(kTokens, p.offsets[expert + 1] - slot0);
    const int group0 = rb * WgmmaGemmLayout::kGroups;

    // Copy schedule, fixed for the item: warp w < 4 copies row group w's block; every thread
    // copies kActPieces 16-byte pieces of the (already k-permuted, slot-ordered) token rows.
    const std::uint8_t* wsrc = nullptr;
    if (warp < WgmmaGemmLayout::kGroups && group0 + warp < expert_groups) {
      wsrc = p.weights + static_cast<std::int64_t>(expert) * p.expert_stride +
             static_cast<std::int64_t>(group0 + warp) * p.n_chunks * WeightLayout::kBlockBytes;
    }
    const std::uint16_t* asrc[kActPieces];
    std::uint32_t adst[kActPieces];
    bool avalid[kActPieces];
#pragma unroll
    for (int i = 0; i < kActPieces; ++i) {
      const int piece = threadIdx.x + i * kThreads;
      const int r = piece >> 3;
      const int c = piece & 7;
      avalid[i] = r < m_count;
      asrc[i] = p.act + static_cast<std::int64_t>(avalid[i] ? slot0 + r : 0) * p.act_ld + c * 8;
      adst[i] = static_cast<std::uint32_t>(kActOff + swizzle128_offset(r, c));
    }

    int issue_slot = 0;
    auto issue = [&](int chunk) {
      const std::uint32_t st = base + issue_slot * stage_bytes;
      issue_slot = issue_slot + 1 == stages ? 0 : issue_slot + 1;
      if (wsrc != nullptr) {
        const std::uint8_t* blk = wsrc + static_cast<std::int64_t>(chunk) * WeightLayout::kBlockBytes;
        const std::uint32_t dst = st + warp * WeightLayout::kBlockBytes;
#pragma unroll
        for (int q = 0; q < 5; ++q) {
          const int piece = lane + 32 * q;
          if (q < 4 || piece < 144) cp_async16(dst + piece * 16, blk + piece * 16);
        }
      }
#pragma unroll
      for (int i = 0; i < kActPieces; ++i) {
        cp_async16_zfill(st + adst[i], asrc[i] + (avalid[i] ? chunk * WeightLayout::kChunkK : 0), avalid[i]);
      }
    };

    float acc[2][NT * 4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int q = 0; q < NT * 4; ++q) acc[i][q] = 0.0f;

    // This warp's two tiles (rows 128 wg + 64 i + 16 wi) of chunk `st`, decoded for the 4 k-steps.
    auto decode = [&](std::uint32_t st, std::uint32_t(&a)[2][4][4]) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int tile = wg * 8 + 4 * i + wi;
        const std::uint32_t blk = st + (tile >> 2) * WeightLayout::kBlockBytes;
        const uint4 wq = lds128(blk + (tile & 3) * WeightLayout::kTileWeightBytes + lane * 16);
        const std::uint32_t sc = lds16(blk + WeightLayout::kBlockWeightBytes +
                                       (tile & 3) * WeightLayout::kTileScaleBytes + lane * 2);
        const std::uint32_t s_g = scale_pair_from_bytes(__byte_perm(sc, 0, 0x4040));
        const std::uint32_t s_g8 = scale_pair_from_bytes(__byte_perm(sc, 0, 0x4141));
        const std::uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          decode_e2m1x8(words[s], a[i][s]);
          a[i][s][0] = bf16x2_mul(a[i][s][0], s_g);
          a[i][s][1] = bf16x2_mul(a[i][s][1], s_g8);
          a[i][s][2] = bf16x2_mul(a[i][s][2], s_g);
          a[i][s][3] = bf16x2_mul(a[i][s][3], s_g8);
        }
      }
    };
    auto mma = [&](std::uint32_t st, const std::uint32_t(&a)[2][4][4]) {
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const std::uint64_t desc = b_descriptor(st + kActOff + s * 32);
#pragma unroll
        for (int i = 0; i < 2; ++i) wgmma_rs<NT>(acc[i], a[i][s], desc);
      }
      wgmma_commit();
    };

    // Software pipeline: the wgmmas of chunk c run on the tensor cores while the warps wait for,
    // and decode, chunk c + 1 into the other A buffer. Commit groups: the prologue commits chunks
    // 0..stages-2; iteration c commits chunk c + stages - 1 into the slot chunk c - 1 used (free
    // once every warpgroup's wgmmas of c - 1 are done: wait_group 1, then the barrier).
    const int n_chunks = p.n_chunks;
    for (int c = 0; c < stages - 1; ++c) {
      if (c < n_chunks) issue(c);
      cp_async_commit();
    }
    cp_async_wait_dynamic(stages - 2);
    fence_proxy_async();
    __syncthreads();
    std::uint32_t a0[2][4][4], a1[2][4][4];
    decode(base, a0);
    int slot = 0;  // the stage of chunk c
    for (int c = 0; c < n_chunks; ++c) {
      const std::uint32_t st = base + slot * stage_bytes;
      if (c & 1)
        mma(st, a1);
      else
        mma(st, a0);
      slot = slot + 1 == stages ? 0 : slot + 1;
      if (c + 1 < n_chunks) {
        wgmma_wait_one();
        cp_async_wait_dynamic(stages - 3);
        fence_proxy_async();
        __syncthreads();  // chunk c + 1 visible to all; every warpgroup's wgmmas of c - 1 done
        if (c + stages - 1 < n_chunks) issue(c + stages - 1);
        cp_async_commit();
        if (c & 1)
          decode(base + slot * stage_bytes, a0);
        else
          decode(base + slot * stage_bytes, a1);
      }
    }
    wgmma_wait_all();
#pragma unroll
    for (int i = 0; i < 2; ++i) keep_in_registers(acc[i]);
    cp_async_wait<0>();

    // Epilogue: per m64 block i, this warp holds rows 16 wi + {g, g+8}; per 8-token block j,
    // acc[i][4j + q] is (row g, token 8j + 2t + q) for q < 2 and (row g + 8, ...) for q >= 2.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int tile = group0 * 4 + wg * 8 + 4 * i + wi;  // 16-row tile within the expert
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int n = 8 * j + 2 * t + q;
          if (n < m_count)
            store_token<EPI>(p, expert, tile, g, slot0 + n, acc[i][4 * j + q], acc[i][4 * j + 2 + q]);
        }
      }
    }
    __syncthreads();  // the next item's prologue overwrites the stages
  }
#endif
}

namespace {

using WgmmaKernelFn = void (*)(const StreamGemmArgs, const int);

template <int NT>
WgmmaKernelFn wgmma_pick_epilogue(StreamEpilogue epi) {
  switch (epi) {
    case StreamEpilogue::kSwiGLU:
      return fp4moe_wgmma_gemm<NT, StreamEpilogue::kSwiGLU>;
    case StreamEpilogue::kSwiGLUClamped:
      return fp4moe_wgmma_gemm<NT, StreamEpilogue::kSwiGLUClamped>;
    case StreamEpilogue::kStoreF32:
      return fp4moe_wgmma_gemm<NT, StreamEpilogue::kStoreF32>;
  }
  return nullptr;
}

WgmmaKernelFn wgmma_kernel_for(const WgmmaGemmConfig& c, StreamEpilogue epi) {
  switch (c.n_tiles) {
    case 8:
      return wgmma_pick_epilogue<8>(epi);
    case 16:
      return wgmma_pick_epilogue<16>(epi);
    default:
      return nullptr;
  }
}

// k-permuted gather: out[s][permuted_k(k)] = x[slot_token[s]][k], rows padded to k_padded with
// zeros. One CTA per slot; each thread moves 4 consecutive k (two pairs that land apart).
__global__ void __launch_bounds__(256)
    permute_gather_kernel(const std::uint16_t* x, const std::int32_t* slot_token,
                          const std::int32_t* total_slots, int k, int k_padded, std::uint16_t* out) {
  pdl_wait();
  const int s = blockIdx.x;
  if (s >= *total_slots) return;  // fewer slots than the bound: caller-given ids were dropped
  const std::uint16_t* src = x + static_cast<std::int64_t>(slot_token != nullptr ? slot_token[s] : s) * k;
  std::uint32_t* dst = reinterpret_cast<std::uint32_t*>(out + static_cast<std::int64_t>(s) * k_padded);
  for (int q = threadIdx.x; q < k_padded / 4; q += blockDim.x) {
    const int k0 = 4 * q;
    uint2 v = make_uint2(0u, 0u);
    if (k0 < k) v = *reinterpret_cast<const uint2*>(src + k0);
    dst[permuted_k(k0) / 2] = v.x;
    dst[permuted_k(k0 + 2) / 2] = v.y;
  }
}

}  // namespace

bool wgmma_supported() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  cudaFuncAttributes fa{};
  // The kernel has a body only in the sm_90a image; elsewhere it is compiled empty.
  return major == 9 && minor == 0 &&
         cudaFuncGetAttributes(&fa, fp4moe_wgmma_gemm<16, StreamEpilogue::kStoreF32>) == cudaSuccess &&
         fa.numRegs > 16;
}

cudaError_t wgmma_gemm_setup(const WgmmaGemmConfig& config, StreamEpilogue epilogue,
                             KernelAttributes* attributes) {
  const WgmmaKernelFn fn = wgmma_kernel_for(config, epilogue);
  if (fn == nullptr || !WgmmaGemmLayout::valid(config)) return cudaErrorInvalidValue;
  if (!wgmma_supported()) return cudaErrorNotSupported;
  return setup_kernel(fn, WgmmaGemmLayout::threads(config),
                      static_cast<int>(WgmmaGemmLayout::cta_bytes(config)), attributes);
}

cudaError_t launch_wgmma_gemm(const StreamGemmArgs& args, const WgmmaGemmConfig& config,
                              StreamEpilogue epilogue, int grid, bool pdl, cudaStream_t stream) {
  const WgmmaKernelFn fn = wgmma_kernel_for(config, epilogue);
  if (fn == nullptr || !WgmmaGemmLayout::valid(config)) return cudaErrorInvalidValue;
  return launch_kernel(fn, grid, WgmmaGemmLayout::threads(config),
                       static_cast<std::size_t>(WgmmaGemmLayout::cta_bytes(config)), pdl, stream, args,
                       config.stages);
}

cudaError_t launch_permute_gather(const std::uint16_t* x, const std::int32_t* slot_token,
                                  const std::int32_t* total_slots, int max_slots, int k, int k_padded,
                                  std::uint16_t* out, cudaStream_t stream) {
  if (max_slots == 0) return cudaSuccess;
  permute_gather_kernel<<<max_slots, 256, 0, stream>>>(x, slot_token, total_slots, k, k_padded, out);
  return cudaGetLastError();
}

}  // namespace fp4moe::kernels
