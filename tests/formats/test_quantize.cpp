// NVFP4 and MXFP4 quantization: hand-worked examples, edge cases, error bounds and bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "fp4moe/error.hpp"
#include "fp4moe/formats.hpp"

namespace fp4moe {
namespace {

using ::testing::HasSubstr;

template <typename Fn>
std::string error_of(const Fn& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Block 0: tensor amax 2.625 gives weight_scale_2 = 2.625 / 2688 = 2^-10 exactly, block scale
// 2.625 / (6 * 2^-10) = 448 (E4M3 0x7e), divisor 448 * 2^-10 = 0.4375; the values are 0.4375
// times the scaled value in the comment.
// Block 1: amax 0.7 gives 0.7 / (6 * 2^-10) = 119.47, between E4M3 112 and 120 (step 8 in
// [64, 128)): 120 = 1.875 * 2^6, code (13 << 3) | 7 = 0x6f; divisor 120 * 2^-10 = 0.1171875.
// Row 1 is all zero: block scales 0 become 1.0 (0x38), every code 0.
std::vector<float> nvfp4_example() {
  std::vector<float> x(64, 0.0f);
  const float block0[16] = {
      0.0f,        // 0            -> code 0
      0.21875f,    // 0.5          -> 1
      0.4375f,     // 1            -> 2
      0.65625f,    // 1.5          -> 3
      0.875f,      // 2            -> 4
      1.3125f,     // 3            -> 5
      1.75f,       // 4            -> 6
      2.625f,      // 6            -> 7
      -2.625f,     // -6           -> 0xf
      0.109375f,   // 0.25 (tie)   -> 0
      1.09375f,    // 2.5 (tie)    -> 4 (2.0)
      -2.1875f,    // -5 (tie)     -> 0xe (-4)
      -0.765625f,  // -1.75 (tie)  -> 0xc (-2)
      0.328125f,   // 0.75 (tie)   -> 2 (1.0)
      1.53125f,    // 3.5 (tie)    -> 6 (4.0)
      -0.05f,      // -0.114       -> 8 (-0: ModelOpt keeps the sign of a value rounded to zero)
  };
  const float block1[6] = {
      0.7f,          // 5.973       -> 7 (6.0)
      0.17578125f,   // 1.5         -> 3
      0.29296875f,   // 2.5 (tie)   -> 4 (2.0)
      -0.41015625f,  // -3.5 (tie)  -> 0xe (-4)
      0.02f,         // 0.171       -> 0
      -0.05859375f,  // -0.5        -> 9
  };
  std::copy(std::begin(block0), std::end(block0), x.begin());
  std::copy(std::begin(block1), std::end(block1), x.begin() + 16);
  return x;
}

// Bytes: element 2j in the low nibble of byte j.
const std::vector<std::uint8_t> kNvfp4ExamplePacked = {
    0x10, 0x32, 0x54, 0x76, 0x0f, 0xe4, 0x2c, 0x86,  // block 0
    0x37, 0xe4, 0x90, 0x00, 0x00, 0x00, 0x00, 0x00,  // block 1: codes 7 3 4 e 0 9, then zeros
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // row 1
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};

TEST(QuantizeNvfp4, HandWorkedExample) {
  const auto x = nvfp4_example();
  EXPECT_EQ(nvfp4_global_scale(x), 0x1p-10f);
  const QuantizedMatrix q = quantize_nvfp4(x, 2, 32);
  EXPECT_EQ(q.format, WeightFormat::kNvfp4);
  EXPECT_EQ(q.rows, 2);
  EXPECT_EQ(q.cols, 32);
  EXPECT_EQ(q.global_scale, 0x1p-10f);
  EXPECT_EQ(q.scales, (std::vector<std::uint8_t>{0x7e, 0x6f, 0x38, 0x38}));
  EXPECT_EQ(q.packed, kNvfp4ExamplePacked);
  EXPECT_EQ(q.scale_cols(), 2);
  EXPECT_EQ(q.value(0, 16), 6.0f * 120.0f * 0x1p-10f);  // 0.703125
  EXPECT_EQ(q.value(0, 8), -2.625f);
  EXPECT_EQ(q.value(1, 31), 0.0f);
}

TEST(QuantizeNvfp4, GlobalScaleOverride) {
  const auto x = nvfp4_example();
  // weight_scale_2 = 2^-8: block 0 scale 2.625 / (6 * 2^-8) = 112 (0x6e), divisor 0.4375 as before;
  // block 1 scale 0.7 / 0.0234375 = 29.87 -> 30 (step 2 in [16, 32)) = 0x5f, divisor 0.1171875 as
  // before. So the codes are the example's and only the scales change.
  const QuantizedMatrix q = quantize_nvfp4(x, 2, 32, 0x1p-8f);
  EXPECT_EQ(q.global_scale, 0x1p-8f);
  EXPECT_EQ(q.scales, (std::vector<std::uint8_t>{0x6e, 0x5f, 0x38, 0x38}));
  EXPECT_EQ(q.packed, kNvfp4ExamplePacked);
  // 2^-12: block 0 needs 2.625 / (6 * 2^-12) = 1792 > 448: the scale saturates to 448, the divisor is
  // 448 * 2^-12 = 0.109375, so 2.625 -> 24 saturates to 6 (code 7) and 0.21875 -> 2 (code 4).
  const QuantizedMatrix s = quantize_nvfp4(x, 2, 32, 0x1p-12f);
  EXPECT_EQ(s.scales[0], 0x7e);
  EXPECT_EQ(unpack_e2m1(s.packed)[7], 7);
  EXPECT_EQ(unpack_e2m1(s.packed)[1], 4);
}

TEST(QuantizeNvfp4, AllZeroTensor) {
  const std::vector<float> x(2 * 48, 0.0f);
  EXPECT_EQ(nvfp4_global_scale(x), 1.0f);
  const QuantizedMatrix q = quantize_nvfp4(x, 2, 48);
  EXPECT_EQ(q.global_scale, 1.0f);
  EXPECT_EQ(q.scales, std::vector<std::uint8_t>(6, 0x38));
  EXPECT_EQ(q.packed, std::vector<std::uint8_t>(48, 0));
  for (float v : dequantize(q)) ASSERT_EQ(v, 0.0f);
  // Negative zeros quantize like zeros.
  const std::vector<float> neg(16, -0.0f);
  EXPECT_EQ(quantize_nvfp4(neg, 1, 16).packed, std::vector<std::uint8_t>(8, 0));
}

TEST(QuantizeNvfp4, EmptyMatrix) {
  const QuantizedMatrix q = quantize_nvfp4({}, 0, 16);
  EXPECT_TRUE(q.packed.empty());
  EXPECT_TRUE(q.scales.empty());
  EXPECT_EQ(q.global_scale, 1.0f);
}

// Gaussian rows whose magnitudes span 2^-6..2^7, so the block scales cover much of E4M3's range.
std::vector<float> gaussian(std::int64_t rows, std::int64_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c)
      x[static_cast<std::size_t>(r * cols + c)] = std::ldexp(normal(rng), static_cast<int>(r % 14) - 6);
  }
  return x;
}

TEST(QuantizeNvfp4, DeterministicAndDequantizeMatchesValue) {
  const auto x = gaussian(8, 64, 1);
  const QuantizedMatrix a = quantize_nvfp4(x, 8, 64);
  const QuantizedMatrix b = quantize_nvfp4(x, 8, 64);
  EXPECT_EQ(a.packed, b.packed);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.global_scale, b.global_scale);
  const auto dq = dequantize(a);
  for (std::int64_t r = 0; r < 8; ++r) {
    for (std::int64_t c = 0; c < 64; ++c) {
      const float expected = e2m1_to_float(unpack_e2m1(a.packed)[static_cast<std::size_t>(r * 64 + c)]) *
                             e4m3_to_float(a.scales[static_cast<std::size_t>(r * 4 + c / 16)]) *
                             a.global_scale;
      ASSERT_EQ(a.value(r, c), expected) << "(" << r << ", " << c << ")";
      ASSERT_EQ(dq[static_cast<std::size_t>(r * 64 + c)], expected) << "(" << r << ", " << c << ")";
    }
  }
}

// Half the E2M1 spacing around a scaled magnitude: 0.5 apart below 2, 1 apart in [2, 4], 2 apart
// in [4, 6]. Above 6 (a normal E4M3 block scale rounded down by up to 1/16 of its power of two
// lets |x| / divisor reach 6 * 16/15 = 6.4) the value saturates to 6, an error of
// |x|/divisor - 6 < 1, inside the same bound. (A subnormal E4M3 scale, for a block 3.5e-5 times
// smaller than the tensor's amax, rounds more coarsely; the test data has none.)
double e2m1_half_step(double scaled) {
  const double a = std::fabs(scaled);
  return a <= 2 ? 0.25 : (a <= 4 ? 0.5 : 1.0);
}

// The bound: |dequant(quant(x)) - x| <= half an E2M1 step at |x| / divisor, times the divisor
// (float(e4m3 scale) * weight_scale_2), plus a few ulps of float rounding in the division and in
// the dequantized product.
TEST(QuantizeNvfp4, ErrorWithinHalfAStepTimesTheBlockScale) {
  const std::int64_t rows = 28, cols = 128;
  const auto x = gaussian(rows, cols, 2);
  const QuantizedMatrix q = quantize_nvfp4(x, rows, cols);
  const auto dq = dequantize(q);
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    const double divisor =
        static_cast<double>(e4m3_to_float(q.scales[static_cast<std::size_t>(i / 16)])) * q.global_scale;
    const double xi = x[static_cast<std::size_t>(i)];
    const double scaled = xi / divisor;
    ASSERT_GE(q.scales[static_cast<std::size_t>(i / 16)], 0x08)
        << "index " << i << ": a subnormal block scale";
    ASSERT_LE(std::fabs(scaled), 6.4) << "index " << i;
    const double bound = e2m1_half_step(scaled) * divisor + 1e-6 * std::fabs(xi);
    ASSERT_LE(std::fabs(dq[static_cast<std::size_t>(i)] - xi), bound) << "index " << i << " x " << xi;
  }
}

TEST(QuantizeNvfp4, RejectsBadInput) {
  std::vector<float> x(32, 1.0f);
  EXPECT_THAT(error_of([&] { quantize_nvfp4(x, 1, 24); }), HasSubstr("cols=24 is not a multiple of 16"));
  EXPECT_THAT(error_of([&] { quantize_nvfp4(x, 2, 32); }),
              HasSubstr("input has 32 values, expected rows * cols = 2 * 32 = 64"));
  EXPECT_THAT(error_of([&] { quantize_nvfp4(x, -1, 16); }), HasSubstr("negative"));
  x[21] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(error_of([&] { quantize_nvfp4(x, 2, 16); }),
              HasSubstr("non-finite input nan at (row 1, col 5)"));
  x[21] = 1.0f;
  x[3] = -std::numeric_limits<float>::infinity();
  EXPECT_THAT(error_of([&] { quantize_nvfp4(x, 2, 16); }),
              HasSubstr("non-finite input -inf at (row 0, col 3)"));
  x[3] = 1.0f;
  for (float bad :
       {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_THAT(error_of([&] { quantize_nvfp4(x, 2, 16, bad); }), HasSubstr("must be finite and positive"))
        << bad;
  }
  // amax / 2688 underflows to zero.
  const std::vector<float> tiny(16, 1e-45f);
  EXPECT_THAT(error_of([&] { quantize_nvfp4(tiny, 1, 16); }), HasSubstr("underflows to 0"));
  EXPECT_THAT(error_of([&] {
                nvfp4_global_scale(std::vector<float>{1.0f, std::numeric_limits<float>::infinity()});
              }),
              HasSubstr("non-finite input inf at index 1"));
}

// Block 0: amax 5 -> floor(log2 5) - 2 = 0, scale 2^0 (code 127); values round on the plain grid.
// Block 1: amax 0.3 -> floor(log2 0.3) - 2 = -4 (code 123); values times 16.
// Row 1: amax 7 -> exponent 0, 7 saturates to 6; amax 8 -> exponent 1 (code 128), 8 / 2 = 4.
// Row 2: zeros -> exponent 0 (code 127), codes 0.
TEST(QuantizeMxfp4, HandWorkedExample) {
  std::vector<float> x(3 * 64, 0.0f);
  const float values[][2] = {
      {0, 5.0f},       {1, 0.75f}, {2, -3.5f},    {3, 2.5f},      {4, -0.2f},
      {5, 1.25f},      {32, 0.3f}, {33, -0.125f}, {34, 0.09375f}, {35, 0.015625f},
      {36, 0.046875f}, {64, 7.0f}, {65, 1.0f},    {96, 8.0f},     {97, -1.0f},
  };
  for (const auto& [i, v] : values) x[static_cast<std::size_t>(i)] = v;
  const QuantizedMatrix q = quantize_mxfp4(x, 3, 64);
  EXPECT_EQ(q.format, WeightFormat::kMxfp4);
  EXPECT_EQ(q.global_scale, 1.0f);
  EXPECT_EQ(q.scales, (std::vector<std::uint8_t>{127, 123, 127, 128, 127, 127}));
  std::vector<std::uint8_t> packed(96, 0);
  packed[0] = 0x26;   // 5 -> 4 (tie, code 6); 0.75 -> 1 (code 2)
  packed[1] = 0x4e;   // -3.5 -> -4 (0xe); 2.5 -> 2 (code 4)
  packed[2] = 0x20;   // -0.2 -> +0; 1.25 -> 1 (code 2)
  packed[16] = 0xc6;  // 4.8 -> 4 (code 6); -2 (0xc)
  packed[17] = 0x03;  // 1.5 (code 3); 0.25 -> 0
  packed[18] = 0x02;  // 0.75 -> 1 (code 2)
  packed[32] = 0x27;  // 7 -> 6 (code 7); 1 (code 2)
  packed[48] = 0x96;  // 8 / 2 = 4 (code 6); -1 / 2 = -0.5 (code 9)
  EXPECT_EQ(q.packed, packed);
  EXPECT_EQ(q.value(1, 32), 8.0f);
  EXPECT_EQ(q.value(1, 0), 6.0f);    // 7 clipped to 6
  EXPECT_EQ(q.value(0, 32), 0.25f);  // 0.3 -> 4 * 2^-4
  EXPECT_EQ(quantize(WeightFormat::kMxfp4, x, 3, 64).packed, q.packed);
}

TEST(QuantizeMxfp4, ExponentClampsAtTheBottomOfUe8m0) {
  std::vector<float> x(32, 0.0f);
  x[0] = 1e-40f;  // floor(log2) = -133: the exponent -135 clamps to -127 (code 0)
  const QuantizedMatrix q = quantize_mxfp4(x, 1, 32);
  EXPECT_EQ(q.scales[0], 0);
  EXPECT_EQ(q.packed[0], 0);  // 1e-40 / 2^-127 = 0.017 rounds to 0
  x[0] = 3e38f;               // floor(log2) = 127: exponent 125
  EXPECT_EQ(quantize_mxfp4(x, 1, 32).scales[0], 125 + 127);
}

// The OCP recipe puts the block amax in [4, 8) after scaling, so values above 6 clip: the bound is
// half an E2M1 step, or |x| / scale - 6 where that is larger, times the block scale.
TEST(QuantizeMxfp4, ErrorWithinHalfAStepOrTheClip) {
  const std::int64_t rows = 28, cols = 128;
  const auto x = gaussian(rows, cols, 3);
  const QuantizedMatrix q = quantize_mxfp4(x, rows, cols);
  const QuantizedMatrix again = quantize_mxfp4(x, rows, cols);
  EXPECT_EQ(q.packed, again.packed);
  EXPECT_EQ(q.scales, again.scales);
  const auto dq = dequantize(q);
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    const double scale = ue8m0_to_float(q.scales[static_cast<std::size_t>(i / 32)]);
    const double xi = x[static_cast<std::size_t>(i)];
    const double scaled = xi / scale;
    ASSERT_LT(std::fabs(scaled), 8.0) << "index " << i;
    const double bound = std::max(e2m1_half_step(scaled), std::fabs(scaled) - 6.0) * scale;
    ASSERT_LE(std::fabs(dq[static_cast<std::size_t>(i)] - xi), bound) << "index " << i << " x " << xi;
  }
}

TEST(QuantizeMxfp4, RejectsBadInput) {
  std::vector<float> x(64, 1.0f);
  EXPECT_THAT(error_of([&] { quantize_mxfp4(x, 4, 16); }),
              HasSubstr("cols=16 is not a multiple of 32 (the mxfp4 block size)"));
  EXPECT_THAT(error_of([&] { quantize_mxfp4(x, 1, 32); }),
              HasSubstr("input has 64 values, expected rows * cols = 1 * 32 = 32"));
  x[40] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(error_of([&] { quantize(WeightFormat::kMxfp4, x, 2, 32); }),
              HasSubstr("non-finite input inf at (row 1, col 8)"));
}

TEST(QuantizedMatrix, ValidateRejectsInconsistentSizes) {
  QuantizedMatrix q = quantize_nvfp4(std::vector<float>(64, 1.0f), 2, 32);
  EXPECT_NO_THROW(q.validate());
  q.packed.pop_back();
  EXPECT_THAT(error_of([&] { q.validate(); }),
              HasSubstr("packed holds 31 bytes, expected 32 (= rows 2 * cols 32 / 2)"));
  q.packed.push_back(0);
  q.scales.push_back(0);
  EXPECT_THAT(error_of([&] { q.validate(); }),
              HasSubstr("scales holds 5 bytes, expected 4 (= rows 2 * cols 32 / 16)"));
  q.scales.pop_back();
  q.format = WeightFormat::kMxfp4;  // 32 columns are one MXFP4 block: 2 scales expected
  EXPECT_THAT(error_of([&] { q.validate(); }), HasSubstr("scales holds 4 bytes, expected 2"));
  q.format = WeightFormat::kNvfp4;
  q.cols = 40;
  EXPECT_THAT(error_of([&] { q.validate(); }), HasSubstr("cols=40 is not a multiple of 16"));
  q.cols = 32;
  EXPECT_THAT(error_of([&] { q.value(2, 0); }), HasSubstr("element (2, 0) is outside the [2, 32] matrix"));
  EXPECT_THAT(error_of([&] { q.value(0, -1); }), HasSubstr("outside"));
}

}  // namespace
}  // namespace fp4moe
