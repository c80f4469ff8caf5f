// Scalar codecs: every code decoded against an independent formula, every finite code round
// tripped, rounding checked at and next to every midpoint, plus hand-checked vectors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "fp4moe/error.hpp"
#include "fp4moe/formats.hpp"

namespace fp4moe {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// E2M1 from its fields: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0.
double e2m1_formula(int code) {
  const int e = (code >> 1) & 3;
  const int m = code & 1;
  const double magnitude = e == 0 ? 0.5 * m : (1.0 + 0.5 * m) * std::pow(2.0, e - 1);
  return (code & 8) ? -magnitude : magnitude;
}

// E4M3 (float8_e4m3fn) from its fields: sign bit 7, exponent bits 6-3 (bias 7), mantissa bits 2-0.
double e4m3_formula(int code) {
  const int e = (code >> 3) & 15;
  const int m = code & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double magnitude = e == 0 ? std::pow(2.0, -6) * (m / 8.0) : std::pow(2.0, e - 7) * (1.0 + m / 8.0);
  return (code & 0x80) ? -magnitude : magnitude;
}

TEST(E2M1, DecodesEveryCodeLikeTheFormula) {
  for (int c = 0; c < 16; ++c) {
    ASSERT_EQ(static_cast<double>(e2m1_to_float(static_cast<std::uint8_t>(c))), e2m1_formula(c))
        << "code " << c;
  }
  EXPECT_TRUE(std::signbit(e2m1_to_float(8)));
  // Only the low nibble is read.
  EXPECT_EQ(e2m1_to_float(0xf7), 6.0f);
}

TEST(E2M1, EncodeOfDecodeIsTheCodeWithCanonicalZero) {
  for (int c = 0; c < 16; ++c) {
    const int expected = c == 8 ? 0 : c;  // -0 encodes as +0
    ASSERT_EQ(float_to_e2m1(e2m1_to_float(static_cast<std::uint8_t>(c))), expected) << "code " << c;
  }
}

TEST(E2M1, TiesRoundToEven) {
  const std::vector<std::pair<float, int>> cases = {
      {0.25f, 0},   {0.75f, 2},  {1.25f, 2},  {1.75f, 4},  {2.5f, 4},    {3.5f, 6},
      {5.0f, 6},    {5.5f, 7},   {7.0f, 7},   {-0.25f, 0}, {-0.75f, 10}, {-1.25f, 10},
      {-1.75f, 12}, {-2.5f, 12}, {-3.5f, 14}, {-5.0f, 14}, {-7.0f, 15}};
  for (const auto& [x, code] : cases) EXPECT_EQ(float_to_e2m1(x), code) << "x = " << x;
}

TEST(E2M1, RoundsToNearestNextToEveryMidpoint) {
  for (int c = 0; c < 7; ++c) {
    const float lo = e2m1_to_float(static_cast<std::uint8_t>(c));
    const float hi = e2m1_to_float(static_cast<std::uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;  // exact: two significant bits plus one
    ASSERT_EQ(float_to_e2m1(std::nextafter(mid, 0.0f)), c) << "just below " << mid;
    ASSERT_EQ(float_to_e2m1(std::nextafter(mid, kInf)), c + 1) << "just above " << mid;
    ASSERT_EQ(float_to_e2m1(mid), c % 2 == 0 ? c : c + 1) << "at " << mid;
    ASSERT_EQ(float_to_e2m1(-std::nextafter(mid, kInf)), (c + 1) | 8) << "just below " << -mid;
  }
}

TEST(E2M1, SaturatesAndHandlesZeroAndNan) {
  EXPECT_EQ(float_to_e2m1(6.0f), 7);
  EXPECT_EQ(float_to_e2m1(1e30f), 7);
  EXPECT_EQ(float_to_e2m1(kInf), 7);
  EXPECT_EQ(float_to_e2m1(-kInf), 15);
  EXPECT_EQ(float_to_e2m1(-0.0f), 0);
  EXPECT_EQ(float_to_e2m1(-0.1f), 0);  // rounds to zero: +0, not code 8
  EXPECT_EQ(float_to_e2m1(1e-40f), 0);
  EXPECT_EQ(float_to_e2m1(kNan), 0);
  EXPECT_EQ(float_to_e2m1(-kNan), 0);
}

TEST(E4M3, DecodesEveryCodeLikeTheFormula) {
  for (int c = 0; c < 256; ++c) {
    const double expected = e4m3_formula(c);
    const float got = e4m3_to_float(static_cast<std::uint8_t>(c));
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << "code " << c;
      ASSERT_EQ(std::signbit(got), c >= 0x80) << "code " << c;
    } else {
      ASSERT_EQ(static_cast<double>(got), expected) << "code " << c;
    }
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
}

TEST(E4M3, EncodeOfDecodeIsTheCodeInBothModes) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    const float v = e4m3_to_float(static_cast<std::uint8_t>(c));
    ASSERT_EQ(float_to_e4m3(v, Saturation::kSaturate), c) << "code " << c;
    ASSERT_EQ(float_to_e4m3(v, Saturation::kNoSaturate), c) << "code " << c;
  }
}

TEST(E4M3, RoundsToNearestEvenAtAndNextToEveryMidpoint) {
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = e4m3_to_float(static_cast<std::uint8_t>(c));
    const float hi = e4m3_to_float(static_cast<std::uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;          // exact: at most 5 significant bits
    const int even = c % 2 == 0 ? c : c + 1;  // the code's low bit is the mantissa's low bit
    for (auto mode : {Saturation::kSaturate, Saturation::kNoSaturate}) {
      ASSERT_EQ(float_to_e4m3(std::nextafter(mid, 0.0f), mode), c) << "just below " << mid;
      ASSERT_EQ(float_to_e4m3(std::nextafter(mid, kInf), mode), c + 1) << "just above " << mid;
      ASSERT_EQ(float_to_e4m3(mid, mode), even) << "at " << mid;
      ASSERT_EQ(float_to_e4m3(-mid, mode), even | 0x80) << "at " << -mid;
    }
  }
}

TEST(E4M3, Subnormals) {
  const auto enc = [](float x) { return float_to_e4m3(x, Saturation::kSaturate); };
  EXPECT_EQ(enc(0x1p-9f), 0x01);
  EXPECT_EQ(enc(0x1p-7f * 1.5f), 0x06);  // 6 * 2^-9
  EXPECT_EQ(enc(0x1p-10f), 0x00);        // half of the smallest subnormal: tie to 0
  EXPECT_EQ(enc(0x1p-10f * 3), 0x02);    // 1.5 * 2^-9: tie between codes 1 and 2 -> 2
  EXPECT_EQ(enc(0x1p-10f * 15), 0x08);   // 7.5 * 2^-9: rounds up into the smallest normal 2^-6
  EXPECT_EQ(enc(0x1p-6f), 0x08);
  EXPECT_EQ(enc(-0x1p-9f), 0x81);
  EXPECT_EQ(enc(1e-10f), 0x00);
  EXPECT_EQ(enc(-1e-10f), 0x80);  // the sign survives, as in CUDA's conversion
  EXPECT_EQ(enc(-0.0f), 0x80);
  EXPECT_EQ(enc(1e-45f), 0x00);  // float subnormal input
}

TEST(E4M3, SaturationModes) {
  const auto sat = [](float x) { return float_to_e4m3(x, Saturation::kSaturate); };
  const auto nosat = [](float x) { return float_to_e4m3(x, Saturation::kNoSaturate); };
  EXPECT_EQ(sat(448.0f), 0x7e);
  EXPECT_EQ(nosat(448.0f), 0x7e);
  // 464 is the midpoint between 448 and the would-be 480: it ties to 448 (even mantissa).
  EXPECT_EQ(sat(464.0f), 0x7e);
  EXPECT_EQ(nosat(464.0f), 0x7e);
  EXPECT_EQ(sat(std::nextafter(464.0f, kInf)), 0x7e);
  EXPECT_EQ(nosat(std::nextafter(464.0f, kInf)), 0x7f);
  EXPECT_EQ(sat(1e6f), 0x7e);
  EXPECT_EQ(nosat(1e6f), 0x7f);
  EXPECT_EQ(sat(-1e6f), 0xfe);
  EXPECT_EQ(nosat(-1e6f), 0xff);
  EXPECT_EQ(sat(kInf), 0x7e);
  EXPECT_EQ(nosat(kInf), 0x7f);
  EXPECT_EQ(sat(-kInf), 0xfe);
  EXPECT_EQ(nosat(-kInf), 0xff);
  EXPECT_EQ(sat(kNan), 0x7f);
  EXPECT_EQ(nosat(kNan), 0x7f);
  EXPECT_EQ(sat(-kNan), 0xff);
}

TEST(UE8M0, DecodesEveryCode) {
  for (int c = 0; c < 255; ++c) {
    ASSERT_EQ(static_cast<double>(ue8m0_to_float(static_cast<std::uint8_t>(c))), std::pow(2.0, c - 127))
        << "code " << c;
  }
  EXPECT_TRUE(std::isnan(ue8m0_to_float(0xff)));
}

TEST(UE8M0, FromExponentRoundTripsAndRejectsOutOfRange) {
  for (int e = -127; e <= 127; ++e) {
    const std::uint8_t code = ue8m0_from_exponent(e);
    ASSERT_EQ(code, e + 127);
    ASSERT_EQ(ue8m0_to_float(code), std::ldexp(1.0f, e)) << "exponent " << e;
  }
  for (int bad : {-128, 128, 1000}) {
    try {
      ue8m0_from_exponent(bad);
      ADD_FAILURE() << "no error for exponent " << bad;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(std::to_string(bad)));
      EXPECT_THAT(e.what(), HasSubstr("-127..127"));
    }
  }
}

TEST(WeightFormatNames, RoundTripAndReject) {
  for (auto f : {WeightFormat::kNvfp4, WeightFormat::kMxfp4})
    EXPECT_EQ(parse_weight_format(format_name(f)), f);
  EXPECT_EQ(block_size(WeightFormat::kNvfp4), 16);
  EXPECT_EQ(block_size(WeightFormat::kMxfp4), 32);
  try {
    parse_weight_format("fp8");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'fp8'"));
    EXPECT_THAT(e.what(), HasSubstr("nvfp4 or mxfp4"));
  }
}

TEST(Packing, LowNibbleHoldsTheEvenElement) {
  const std::vector<std::uint8_t> codes = {0x1, 0x2, 0xf, 0x0, 0x8, 0x7};
  EXPECT_EQ(pack_e2m1(codes), (std::vector<std::uint8_t>{0x21, 0x0f, 0x78}));
  EXPECT_EQ(unpack_e2m1(pack_e2m1(codes)), codes);
}

TEST(Packing, EveryByteRoundTrips) {
  std::vector<std::uint8_t> bytes(256);
  for (int b = 0; b < 256; ++b) bytes[b] = static_cast<std::uint8_t>(b);
  const auto codes = unpack_e2m1(bytes);
  ASSERT_EQ(codes.size(), 512u);
  for (int b = 0; b < 256; ++b) {
    ASSERT_EQ(codes[2 * b], b & 15) << "byte " << b;
    ASSERT_EQ(codes[2 * b + 1], b >> 4) << "byte " << b;
  }
  EXPECT_EQ(pack_e2m1(codes), bytes);
  EXPECT_TRUE(pack_e2m1({}).empty());
}

TEST(Packing, RejectsOddCountsAndWideCodes) {
  try {
    pack_e2m1(std::vector<std::uint8_t>{1, 2, 3});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("3 codes is odd"));
  }
  try {
    pack_e2m1(std::vector<std::uint8_t>{1, 2, 3, 16});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("code 16 at index 3"));
  }
}

}  // namespace
}  // namespace fp4moe
