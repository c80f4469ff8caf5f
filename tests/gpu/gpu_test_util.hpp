// Helpers for GPU tests: skip without a GPU, device arrays, random inputs, comparisons.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp4moe/bf16.hpp"
#include "fp4moe/device.hpp"

namespace fp4moe::test {

#define FP4MOE_SKIP_WITHOUT_GPU()                                 \
  do {                                                            \
    std::string why_;                                             \
    if (::fp4moe::list_gpus(&why_).empty()) GTEST_SKIP() << why_; \
  } while (0)

#define FP4MOE_TEST_CUDA(expr)                                                                            \
  do {                                                                                                    \
    const cudaError_t e_ = (expr);                                                                        \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
  } while (0)

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    if (n > 0 && cudaMalloc(&p_, n * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  // Complete on return: a pageable copy may return before its DMA ends, and a test may go on
  // with a non-blocking stream, which does not wait for the legacy one.
  void upload(const std::vector<T>& v) {
    cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    if (n_ > 0) cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  void fill_bytes(int byte) { cudaMemset(p_, byte, n_ * sizeof(T)); }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

inline std::vector<Bf16> random_bf16(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<Bf16> v(n);
  for (auto& x : v) x = Bf16::from_float(dist(rng));
  return v;
}

inline std::vector<float> random_f32(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// ||a - b|| / ||b|| over bf16 vectors; NaN if either holds a NaN.
inline double relative_l2(const std::vector<Bf16>& a, const std::vector<Bf16>& b) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i].to_float(), y = b[i].to_float();
    if (std::isnan(x) || std::isnan(y)) return std::nan("");
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace fp4moe::test
