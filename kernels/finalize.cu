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

__global__ void __launch_bounds__(kThreads) fp4moe_finalize(const FinalizeArgs a) {
  pdl_wait();
  const int t = blockIdx.x;
  const int h0 = (blockIdx.y * kThreads + threadIdx.x) * kPerThread;
  if (h0 >= a.hidden) return;
  const int picks = a.top_k + a.shared_pieces;
  const std::int32_t* slots = a.pair_slot + static_cast<std::int64_t>(t) * picks;
  float acc[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) acc[i] = 0.0f;
  for (int j = 0; j < picks; ++j) {
    if (slots[j] < 0) continue;  // a caller-given id outside [0, E)
    const float w = j < a.top_k ? a.topk_weights[static_cast<std::int64_t>(t) * a.top_k + j] : 1.0f;
    const uint4 y =
        *reinterpret_cast<const uint4*>(a.y + static_cast<std::int64_t>(slots[j]) * a.hidden + h0);
    const std::uint32_t yw[kPerThread / 2] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int i = 0; i < kPerThread / 2; ++i) {
      acc[2 * i] = __fmaf_rn(w, bf16_bits_to_f32(yw[i] & 0xffffu), acc[2 * i]);
      acc[2 * i + 1] = __fmaf_rn(w, bf16_bits_to_f32(yw[i] >> 16), acc[2 * i + 1]);
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
  return cudaLaunchKernelEx(&lc, fp4moe_finalize, args);
}

}  // namespace fp4moe::kernels
