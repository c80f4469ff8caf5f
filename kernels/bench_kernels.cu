// Kernels that the benchmark's baseline and ceilings need: random fill, dequantization of
// checkpoint-layout weights to bf16 (for the cuBLAS BF16 layer), row gather and the SwiGLU
// between the two cuBLAS GEMMs. Simple and memory-bound; not on fp4moe's own path.
#include "fp4moe/detail/portable_math.hpp"
#include "kernels/bench_launch.hpp"
#include "kernels/common.cuh"

namespace fp4moe::kernels {
namespace {

__device__ __forceinline__ std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

__global__ void fill_random_bf16_kernel(std::uint16_t* out, std::int64_t n, std::uint64_t seed, float scale) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t r = mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i));
    // Sum of 4 uniforms: roughly normal, mean 0, variance 1/3 -> times sqrt(3).
    float s = 0.0f;
    for (int q = 0; q < 4; ++q) s += static_cast<float>((r >> (16 * q)) & 0xffff) * (1.0f / 65536.0f) - 0.5f;
    out[i] = f32_to_bf16_bits(s * 1.7320508f * scale);
  }
}

__device__ __forceinline__ float e2m1_value(std::uint32_t code) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = mag[code & 7];
  return (code & 8) ? -v : v;
}

__device__ __forceinline__ float e4m3_value(std::uint32_t code) {
  const int e = (code >> 3) & 15, m = code & 7;
  float v;
  if (e == 15 && m == 7) {
    v = __int_as_float(0x7fc00000);
  } else if (e == 0) {
    v = ldexpf(static_cast<float>(m), -9);
  } else {
    v = ldexpf(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  }
  return (code & 0x80) ? -v : v;
}

__global__ void dequantize_bf16_kernel(const DequantArgs a) {
  const std::int64_t n = a.rows * a.cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / a.cols, c = i % a.cols;
    const std::uint8_t byte = a.packed[i / 2];
    const std::uint32_t code = (c & 1) ? (byte >> 4) : (byte & 15);
    const std::uint8_t sc = a.scales[r * (a.cols / a.block) + c / a.block];
    const float scale =
        a.mxfp4 ? (sc == 0xff ? __int_as_float(0x7fc00000) : ldexpf(1.0f, static_cast<int>(sc) - 127))
                : e4m3_value(sc) * a.global_scale;
    a.out[a.out_row_offset * a.cols + i] = f32_to_bf16_bits(e2m1_value(code) * scale);
  }
}

__global__ void gather_rows_kernel(const std::uint16_t* x, const std::int32_t* slot_token, int slots,
                                   int cols, std::uint16_t* out) {
  const int s = blockIdx.x;
  if (s >= slots) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + static_cast<std::int64_t>(slot_token[s]) * cols);
  uint4* dst = reinterpret_cast<uint4*>(out + static_cast<std::int64_t>(s) * cols);
  for (int i = threadIdx.x; i < cols / 8; i += blockDim.x) dst[i] = src[i];
}

__global__ void swiglu_rows_kernel(const ActArgs a) {
  const std::int64_t n = static_cast<std::int64_t>(a.slots) * a.inter;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t s = i / a.inter, j = i % a.inter;
    const float* row = a.gate_up + s * 2 * a.inter;
    float g = row[j], u = row[a.inter + j];
    float v;
    if (!a.clamped) {
      v = g * detail::portable_sigmoid(g) * u;
    } else {
      g = (a.limit < g) ? a.limit : g;
      u = (u < -a.limit) ? -a.limit : ((a.limit < u) ? a.limit : u);
      v = g * detail::portable_sigmoid(a.alpha * g) * (u + 1.0f);
    }
    a.out[i] = f32_to_bf16_bits(v);
  }
}

int blocks_for(std::int64_t n) {
  const std::int64_t b = (n + 255) / 256;
  return static_cast<int>(b < 65535 * 4 ? b : 65535 * 4);
}

}  // namespace

cudaError_t launch_fill_random_bf16(std::uint16_t* out, std::int64_t n, std::uint64_t seed, float scale,
                                    cudaStream_t stream) {
  fill_random_bf16_kernel<<<blocks_for(n), 256, 0, stream>>>(out, n, seed, scale);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_bf16(const DequantArgs& args, cudaStream_t stream) {
  dequantize_bf16_kernel<<<blocks_for(args.rows * args.cols), 256, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_gather_rows(const std::uint16_t* x, const std::int32_t* slot_token, int slots, int cols,
                               std::uint16_t* out, cudaStream_t stream) {
  if (slots == 0) return cudaSuccess;
  gather_rows_kernel<<<slots, 128, 0, stream>>>(x, slot_token, slots, cols, out);
  return cudaGetLastError();
}

namespace {
__global__ void empty_kernel() {}
}  // namespace

cudaError_t launch_empty(cudaStream_t stream) {
  empty_kernel<<<1, 32, 0, stream>>>();
  return cudaGetLastError();
}

cudaError_t launch_swiglu_rows(const ActArgs& args, cudaStream_t stream) {
  const std::int64_t n = static_cast<std::int64_t>(args.slots) * args.inter;
  if (n == 0) return cudaSuccess;
  swiglu_rows_kernel<<<blocks_for(n), 256, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace fp4moe::kernels
