// fp4moe: math that gives bitwise the same result on the CPU and on the GPU.
//
// Routing decisions must be identical between the CPU reference and the GPU kernels, and the
// sigmoid router ranks experts by sigmoid(logit) + bias: an exp() that differs by one ulp
// between libm and CUDA would flip near-ties. These functions use only correctly rounded
// operations (IEEE add, multiply, divide, fma) in a fixed order, so host and device agree bit
// for bit. Host code is compiled with -std=c++20 (not gnu++20), where GCC does not contract
// a*b+c into an fma; device code uses the explicit _rn intrinsics, which nvcc never contracts.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP4MOE_HD __host__ __device__ __forceinline__
#else
#define FP4MOE_HD inline
#endif

namespace fp4moe::detail {

FP4MOE_HD float pm_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FP4MOE_HD float pm_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FP4MOE_HD float pm_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FP4MOE_HD float pm_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
FP4MOE_HD float pm_bits_to_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;  // C++17 (the kernels include this header): memcpy rather than std::bit_cast
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// exp(x) within 2 ulp: x = n*ln2 + r (Cody-Waite), exp(r) by a degree-7 Taylor polynomial in
// Horner form (|r| <= ln2/2, truncation error < 2^-30), then scaled by 2^n in two steps so that
// results near the subnormal range round once. NaN propagates; exp(+inf) = +inf, exp(-inf) = 0.
FP4MOE_HD float portable_exp(float x) {
  if (!(x == x)) return x;
  if (x > 88.72283935546875f) return pm_bits_to_float(0x7f800000u);
  if (x < -103.972084045410156f) return 0.0f;
  constexpr float kLog2e = 1.44269502162933349609375f;
  constexpr float kLn2Hi = 0.693145751953125f;         // ln 2 with 12 trailing zero bits
  constexpr float kLn2Lo = 1.428606765330187045e-06f;  // ln 2 - kLn2Hi
  constexpr float kRound = 12582912.0f;                // 1.5 * 2^23: adding it rounds to an integer
  const float n = pm_add(pm_add(pm_mul(x, kLog2e), kRound), -kRound);
  float r = pm_fma(-n, kLn2Hi, x);
  r = pm_fma(-n, kLn2Lo, r);
  float p = 1.0f / 5040.0f;
  p = pm_fma(p, r, 1.0f / 720.0f);
  p = pm_fma(p, r, 1.0f / 120.0f);
  p = pm_fma(p, r, 1.0f / 24.0f);
  p = pm_fma(p, r, 1.0f / 6.0f);
  p = pm_fma(p, r, 0.5f);
  p = pm_fma(p, r, 1.0f);
  p = pm_fma(p, r, 1.0f);
  // 2^n = 2^a * 2^b with a = n/2 (truncated), b = n - a: each factor is a normal float.
  const int ni = static_cast<int>(n);
  const int a = ni / 2;
  const int b = ni - a;
  const float two_a = pm_bits_to_float(static_cast<std::uint32_t>(a + 127) << 23);
  const float two_b = pm_bits_to_float(static_cast<std::uint32_t>(b + 127) << 23);
  return pm_mul(pm_mul(p, two_a), two_b);
}

// 1 / (1 + exp(-x)), bitwise identical on host and device.
FP4MOE_HD float portable_sigmoid(float x) {
  return pm_div(1.0f, pm_add(1.0f, portable_exp(-x)));
}

// x * sigmoid(x).
FP4MOE_HD float portable_silu(float x) {
  return pm_mul(x, portable_sigmoid(x));
}

// "a ranks before b" for routing: larger score first, NaN below every number, and equal scores
// (or two NaNs) broken by the lower index. A strict weak order over (score, index) pairs.
FP4MOE_HD bool ranks_before(float a, int ia, float b, int ib) {
  const bool a_nan = !(a == a);
  const bool b_nan = !(b == b);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a != b) return a > b;
  return ia < ib;
}

}  // namespace fp4moe::detail
