// Finalize: out[t] = bf16( sum_j w[t][j] * y[slot(t, j)] + sum_p y[slot(t, shared piece p)] ),
// accumulated in fp32 in rank order, then the shared expert's pieces: deterministic (no atomics).
//
//   grid (T, ceil(H / 2048)); each thread owns 8 consecutive hidden values (one 16-byte load of
//   8 bf16 per pick, one 16-byte store).
#include "kernels/common.cuh"
#include "kernels/epilogue.cuh"
#include "kernels/launch.hpp"

namespace fp4moe::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;

}  // namespace

// BATCH picks are loaded together: a batch's slots and weights, then its rows of y, before any of
// its sums, so a thread waits for two round trips per batch, not two per pick. The sums stay in
// rank order. The launcher takes a batch of 16 where it holds every pick (GLM-5's 8 + 1 shared
// piece: one batch, not two) at decode sizes (T <= 512), else 8.
template <int BATCH>
__global__ void __launch_bounds__(kThreads) fp4moe_finalize(const FinalizeArgs a) {
  const int t = blockIdx.x;
  const int h0 = (blockIdx.y * kThreads + threadIdx.x) * kPerThread;
  if (h0 >= a.hidden) return;
  const int picks = a.top_k + a.shared_pieces;
  const std::int32_t* slots = a.pair_slot + static_cast<std::int64_t>(t) * picks;
  float acc[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) acc[i] = 0.0f;
  std::int32_t slot[BATCH];
  float w[BATCH];
  // The first batch's slots and weights: routing's outputs (or the caller's), complete before this
  // grid starts, so read before the wait for the down GEMM, while its last CTAs run. This grid's
  // CTAs start only after every CTA of the down GEMM passed its own wait, which follows the first
  // GEMM's, which returned only once routing had completed and its writes were visible. Through
  // L2 (ld.global.cg), so that no line an earlier forward left in this SM's L1 is read.
  const auto load_batch = [&](int j0) {
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const int j = j0 + b;
      slot[b] =
          j < picks ? __ldcg(slots + j) : -1;  // < 0: past the picks, or a caller-given id outside [0, E)
      w[b] = j < a.top_k ? __ldcg(a.topk_weights + static_cast<std::int64_t>(t) * a.top_k + j) : 1.0f;
    }
  };
  load_batch(0);
  pdl_wait();
  for (int j0 = 0; j0 < picks; j0 += BATCH) {
    if (j0 > 0) load_batch(j0);
    uint4 y[BATCH];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      y[b] = slot[b] >= 0
                 ? *reinterpret_cast<const uint4*>(a.y + static_cast<std::int64_t>(slot[b]) * a.hidden + h0)
                 : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      if (slot[b] < 0) continue;
      const std::uint32_t yw[kPerThread / 2] = {y[b].x, y[b].y, y[b].z, y[b].w};
#pragma unroll
      for (int i = 0; i < kPerThread / 2; ++i) {
        acc[2 * i] = __fmaf_rn(w[b], bf16_bits_to_f32(yw[i] & 0xffffu), acc[2 * i]);
        acc[2 * i + 1] = __fmaf_rn(w[b], bf16_bits_to_f32(yw[i] >> 16), acc[2 * i + 1]);
      }
    }
  }
  uint4 packed;
  std::uint32_t* pw = &packed.x;
#pragma unroll
  for (int i = 0; i < kPerThread / 2; ++i) {
    pw[i] = static_cast<std::uint32_t>(f32_to_bf16_bits(acc[2 * i])) |
            (static_cast<std::uint32_t>(f32_to_bf16_bits(acc[2 * i + 1])) << 16);
  }
  *reinterpret_cast<uint4*>(a.out + static_cast<std::int64_t>(t) * a.hidden + h0) = packed;
}

cudaError_t launch_finalize(const FinalizeArgs& args, bool pdl, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.tokens),
                  static_cast<unsigned>((args.hidden + kThreads * kPerThread - 1) / (kThreads * kPerThread)));
  cudaLaunchConfig_t lc{};
  lc.gridDim = grid;
  lc.blockDim = dim3(kThreads);
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = pdl ? 1 : 0;
  // The batch of 16 takes 122 registers against 64: half the resident warps, which the latency-bound
  // decode sizes do not need and the bandwidth-bound large ones might.
  const int picks = args.top_k + args.shared_pieces;
  if (picks > 8 && picks <= 16 && args.tokens <= 512)
    return cudaLaunchKernelEx(&lc, fp4moe_finalize<16>, args);
  return cudaLaunchKernelEx(&lc, fp4moe_finalize<8>, args);
}

}  // namespace fp4moe::kernels
