// The fragment layout, its decode and the scale re-encoding, checked on the CPU: a model of the
// stream kernel's arithmetic (gpu::simulate_fragment_gemm) must reproduce a plain dot product
// over the dequantized matrix. The GPU tests then only have to show the kernel follows it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "fp4moe/bf16.hpp"
#include "fp4moe/error.hpp"
#include "fp4moe/formats.hpp"
#include "gpu/repack.hpp"
#include "kernels/weight_layout.hpp"

namespace fp4moe {
namespace {

using ::testing::HasSubstr;

float bf16_value(std::uint32_t bits) {
  return std::bit_cast<float>(bits << 16);
}

// A random matrix in checkpoint layout: every E2M1 code, and E4M3 scales that include
// subnormals, zero and negative codes (NVFP4), or UE8M0 scales over a wide range (MXFP4).
QuantizedMatrix random_matrix(WeightFormat f, std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  QuantizedMatrix m;
  m.format = f;
  m.rows = rows;
  m.cols = cols;
  m.packed.resize(static_cast<std::size_t>(rows * cols / 2));
  for (auto& b : m.packed) b = static_cast<std::uint8_t>(rng());
  m.scales.resize(static_cast<std::size_t>(rows * cols / block_size(f)));
  for (auto& s : m.scales) {
    if (f == WeightFormat::kNvfp4) {
      do {
        s = static_cast<std::uint8_t>(rng());
      } while ((s & 0x7f) == 0x7f);  // not NaN
    } else {
      s = static_cast<std::uint8_t>(100 + rng() % 40);  // 2^-27 .. 2^12
    }
  }
  m.global_scale = f == WeightFormat::kNvfp4 ? 3.0e-4f : 1.0f;
  return m;
}

std::vector<std::uint16_t> random_x(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<std::uint16_t> x(static_cast<std::size_t>(n));
  for (auto& v : x) v = Bf16::from_float(dist(rng)).bits;
  return x;
}

// y[t][r] = sum_k value(r, k) * x[t][k] in double.
double reference_dot(const QuantizedMatrix& m, std::int64_t r, const std::vector<std::uint16_t>& x,
                     std::int64_t t) {
  double acc = 0.0;
  for (std::int64_t k = 0; k < m.cols; ++k) {
    acc += static_cast<double>(m.value(r, k)) * bf16_value(x[static_cast<std::size_t>(t * m.cols + k)]);
  }
  return acc;
}

// Largest |a - b| relative to the largest |b| of a row set.
void expect_close(const std::vector<double>& want, const std::vector<float>& got, double tol) {
  ASSERT_EQ(want.size(), got.size());
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << "element " << i;
    ASSERT_NEAR(got[i], want[i], tol * scale) << "element " << i;
  }
}

// The decode's a2 (one multiply in place of two shifts) against the shifts it replaces, on words
// with one bit set, with one bit clear, and random ones: equal bit for bit.
TEST(Repack, DecodeMultiplyEqualsTheShifts) {
  auto by_shifts = [](std::uint32_t w) {
    return ((w << kernels::kSignShift[2]) & kernels::kSignBits) |
           ((w << kernels::kMagShift[2]) & kernels::kMagBits);
  };
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 1 << 20; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const std::uint32_t w = i < 32 ? 1u << i : (i < 64 ? ~(1u << (i - 32)) : static_cast<std::uint32_t>(x));
    std::uint32_t a[4];
    kernels::decode_e2m1x8(w, a);
    ASSERT_EQ(a[2], by_shifts(w)) << "word " << w;
  }
}

TEST(Repack, DecodeGivesEveryE2M1CodeTimes2PowMinus126) {
  for (std::uint32_t code = 0; code < 16; ++code) {
    for (int h = 0; h < 2; ++h) {
      for (int o = 0; o < 4; ++o) {
        std::uint32_t w = 0;
        for (int b = 0; b < 4; ++b) w |= ((code >> b) & 1u) << kernels::code_bit_position(h, o, b);
        std::uint32_t a[4];
        kernels::decode_e2m1x8(w, a);
        // (h, o) -> register: a0 (h0, o0/1), a1 (h1, o0/1), a2 (h0, o2/3), a3 (h1, o2/3); o odd = high half.
        const int reg = (o / 2) * 2 + h;
        ASSERT_EQ(reg, kernels::code_register(h, o));
        const std::uint32_t bits = (a[reg] >> (16 * (o & 1))) & 0xffff;
        EXPECT_EQ(std::ldexp(bf16_value(bits), 126), e2m1_to_float(code))
            << "code " << code << " h " << h << " o " << o;
        for (int other = 0; other < 4; ++other) {
          // Zero codes decode to all-zero bits: everything but this code's half must be 0.
          const std::uint32_t rest = other == reg ? (a[reg] & (0xffffu << (16 * (1 - (o & 1))))) : a[other];
          EXPECT_EQ(rest, 0u) << "code " << code << " leaked into register " << other;
        }
      }
    }
  }
}

TEST(Repack, CodeBitPositionsCoverTheWordOnce) {
  std::uint32_t seen = 0;
  for (int h = 0; h < 2; ++h)
    for (int o = 0; o < 4; ++o)
      for (int b = 0; b < 4; ++b) {
        const std::uint32_t bit = 1u << kernels::code_bit_position(h, o, b);
        EXPECT_EQ(seen & bit, 0u) << "h " << h << " o " << o << " b " << b;
        seen |= bit;
      }
  EXPECT_EQ(seen, 0xffffffffu);
}

TEST(Repack, PermutedKMatchesTheFragmentMapping) {
  // mma-k position p = 16 s + kappa holds, for lane t = (kappa % 8) / 2, real k 16t + 4s + o with
  // o = 2 * (kappa / 8) + kappa % 2 (weight_layout.hpp); permuted_k must send that k to p.
  std::vector<int> seen(128, 0);
  for (int k = 0; k < 128; ++k) {
    const int p = kernels::permuted_k(k);
    ASSERT_EQ(p / 64, k / 64) << "k " << k << " left its chunk";
    const int s = (p % 64) / 16;
    const int kappa = p % 16;
    const int t = (kappa % 8) / 2;
    const int o = 2 * (kappa / 8) + kappa % 2;
    EXPECT_EQ(k % 64, 16 * t + 4 * s + o) << "k " << k;
    ++seen[static_cast<std::size_t>(p)];
  }
  for (int p = 0; p < 128; ++p) EXPECT_EQ(seen[static_cast<std::size_t>(p)], 1) << "position " << p;
}

TEST(Repack, ScaleFactorTimesE2M1IsExactForEveryE4M3Scale) {
  // Every positive E4M3 code as a 1 x 16 matrix whose values are all the code 1 (0.5).
  for (int code = 1; code < 0x7f; ++code) {
    QuantizedMatrix m;
    m.rows = 1;
    m.cols = 16;
    m.packed.assign(8, 0x11);
    m.scales.assign(1, static_cast<std::uint8_t>(code));
    m.global_scale = 1.0f;
    const gpu::RepackedMatrix r = gpu::repack(m);
    std::vector<std::uint16_t> x(16, Bf16::from_float(1.0f).bits);
    const std::vector<float> y = gpu::simulate_fragment_gemm(r, x, 1);
    EXPECT_EQ(y[0], 16.0f * 0.5f * e4m3_to_float(static_cast<std::uint8_t>(code))) << "E4M3 code " << code;
  }
}

TEST(Repack, Nvfp4MatchesDotProductWithTailsAndSpecialScales) {
  for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{16, 16}, {64, 64}, {80, 144}, {200, 320}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const QuantizedMatrix m =
        random_matrix(WeightFormat::kNvfp4, rows, cols, static_cast<std::uint64_t>(rows * cols));
    const auto x = random_x(3 * cols, 7);
    const gpu::RepackedMatrix r = gpu::repack(m);
    EXPECT_EQ(static_cast<std::int64_t>(r.bytes.size()), kernels::WeightLayout::matrix_bytes(rows, cols));
    const std::vector<float> y = gpu::simulate_fragment_gemm(r, x, 3);
    std::vector<double> want;
    for (std::int64_t t = 0; t < 3; ++t)
      for (std::int64_t row = 0; row < rows; ++row) want.push_back(reference_dot(m, row, x, t));
    expect_close(want, y, 1e-5);
  }
}

TEST(Repack, Mxfp4MatchesDotProduct) {
  const QuantizedMatrix m = random_matrix(WeightFormat::kMxfp4, 96, 192, 3);
  const auto x = random_x(2 * 192, 8);
  const std::vector<float> y = gpu::simulate_fragment_gemm(gpu::repack(m), x, 2);
  std::vector<double> want;
  for (std::int64_t t = 0; t < 2; ++t)
    for (std::int64_t row = 0; row < 96; ++row) want.push_back(reference_dot(m, row, x, t));
  // Blocks more than 2^17 below the matrix's largest are flushed: relative to the row's scale
  // that is far below the fp32 tolerance.
  expect_close(want, y, 1e-5);
}

TEST(Repack, GateUpInterleaveKeepsGateAndUpOfOneIndexInOneTile) {
  QuantizedMatrix gate = random_matrix(WeightFormat::kNvfp4, 24, 64, 11);
  QuantizedMatrix up = random_matrix(WeightFormat::kNvfp4, 24, 64, 12);
  up.global_scale = 5.0e-4f;
  const auto x = random_x(64, 9);
  const gpu::RepackedMatrix r = gpu::repack(gate, up);
  const std::vector<float> y = gpu::simulate_fragment_gemm(r, x, 1);
  std::vector<double> want;
  std::vector<float> got;
  for (std::int64_t j = 0; j < 24; ++j) {
    want.push_back(reference_dot(gate, j, x, 0));
    got.push_back(y[static_cast<std::size_t>(gpu::gate_up_row(j, false))]);
    want.push_back(reference_dot(up, j, x, 0));
    got.push_back(y[static_cast<std::size_t>(gpu::gate_up_row(j, true))]);
  }
  expect_close(want, got, 1e-5);
}

TEST(Repack, RejectsNanScale) {
  QuantizedMatrix m = random_matrix(WeightFormat::kNvfp4, 16, 32, 4);
  m.scales[5] = 0x7f;
  try {
    gpu::repack(m);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("row 2, block 1 is NaN"));
  }
}

TEST(Repack, SlicesPadWithZeros) {
  const QuantizedMatrix m = random_matrix(WeightFormat::kNvfp4, 40, 64, 5);
  const QuantizedMatrix rows = gpu::slice_rows(m, 32, 16);
  EXPECT_EQ(rows.rows, 16);
  for (std::int64_t c = 0; c < 64; ++c) {
    EXPECT_EQ(rows.value(3, c), m.value(35, c));
    EXPECT_EQ(rows.value(12, c), 0.0f);
  }
  const QuantizedMatrix cols = gpu::slice_cols(m, 48, 32);
  EXPECT_EQ(cols.cols, 32);
  for (std::int64_t c = 0; c < 16; ++c) EXPECT_EQ(cols.value(7, c), m.value(7, 48 + c));
  for (std::int64_t c = 16; c < 32; ++c) EXPECT_EQ(cols.value(7, c), 0.0f);
}

}  // namespace
}  // namespace fp4moe
