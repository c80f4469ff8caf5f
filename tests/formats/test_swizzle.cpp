// The 128x4 swizzled scale layout: offsets checked by hand, bijectivity, zero padding and round trips.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "fp4moe/error.hpp"
#include "fp4moe/formats.hpp"

namespace fp4moe {
namespace {

using ::testing::HasSubstr;

TEST(Swizzle, OffsetsCheckedByHand) {
  // scale_cols = 8: Cp = 8, a 128-row tile is 8 * 128 = 1024 bytes, a 4-column group 512.
  EXPECT_EQ(swizzled_scale_offset(0, 0, 8), 0);
  EXPECT_EQ(swizzled_scale_offset(1, 0, 8), 16);      // r%32 = 1 -> 16
  EXPECT_EQ(swizzled_scale_offset(32, 0, 8), 4);      // (r%128)/32 = 1 -> 4
  EXPECT_EQ(swizzled_scale_offset(0, 1, 8), 1);       // c%4 = 1
  EXPECT_EQ(swizzled_scale_offset(0, 4, 8), 512);     // c/4 = 1
  EXPECT_EQ(swizzled_scale_offset(127, 7, 8), 1023);  // 512 + 31*16 + 3*4 + 3
  EXPECT_EQ(swizzled_scale_offset(128, 0, 8), 1024);  // the second row tile
  EXPECT_EQ(swizzled_scale_offset(200, 5, 8), 1673);  // 1024 + 512 + 8*16 + 2*4 + 1
  // scale_cols = 3 pads to Cp = 4: a row tile is 512 bytes.
  EXPECT_EQ(swizzled_scale_offset(129, 2, 3), 530);  // 512 + 1*16 + 0 + 2
  EXPECT_EQ(swizzled_scale_bytes(130, 3), 256 * 4);
  EXPECT_EQ(swizzled_scale_bytes(128, 4), 512);
  EXPECT_EQ(swizzled_scale_bytes(0, 0), 0);
}

// Every (r, c) of the unpadded shape maps to a distinct offset inside the padded buffer, and the
// padded shape fills the buffer exactly.
TEST(Swizzle, OffsetsAreABijectionOntoThePaddedBuffer) {
  for (auto [rows, scale_cols] : {std::pair<std::int64_t, std::int64_t>{128, 4}, {256, 12}, {384, 8}}) {
    const std::int64_t bytes = swizzled_scale_bytes(rows, scale_cols);
    ASSERT_EQ(bytes, rows * scale_cols);
    std::vector<int> hits(static_cast<std::size_t>(bytes), 0);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < scale_cols; ++c) {
        const std::int64_t off = swizzled_scale_offset(r, c, scale_cols);
        ASSERT_GE(off, 0);
        ASSERT_LT(off, bytes) << "(" << r << ", " << c << ")";
        ASSERT_EQ(hits[static_cast<std::size_t>(off)]++, 0)
            << "(" << r << ", " << c << ") collides at " << off;
      }
    }
  }
}

std::vector<std::uint8_t> pattern(std::int64_t n) {
  std::vector<std::uint8_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(1 + i % 251);
  return v;
}

TEST(Swizzle, RoundTripsWithZeroPadding) {
  for (auto [rows, scale_cols] :
       {std::pair<std::int64_t, std::int64_t>{130, 3}, {1, 1}, {128, 4}, {300, 7}, {64, 9}, {0, 5}}) {
    const auto linear = pattern(rows * scale_cols);
    const auto swizzled = swizzle_scales_128x4(linear, rows, scale_cols);
    ASSERT_EQ(static_cast<std::int64_t>(swizzled.size()), swizzled_scale_bytes(rows, scale_cols));
    std::vector<bool> used(swizzled.size(), false);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < scale_cols; ++c) {
        const auto off = static_cast<std::size_t>(swizzled_scale_offset(r, c, scale_cols));
        used[off] = true;
        ASSERT_EQ(swizzled[off], linear[static_cast<std::size_t>(r * scale_cols + c)])
            << "(" << r << ", " << c << ")";
      }
    }
    for (std::size_t i = 0; i < swizzled.size(); ++i) {
      if (!used[i]) {
        ASSERT_EQ(swizzled[i], 0) << "padding byte " << i << " for [" << rows << ", " << scale_cols << "]";
      }
    }
    EXPECT_EQ(unswizzle_scales_128x4(swizzled, rows, scale_cols), linear) << rows << " x " << scale_cols;
  }
}

TEST(Swizzle, RejectsWrongSizes) {
  try {
    swizzle_scales_128x4(pattern(10), 4, 3);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("10 scale bytes, expected rows * scale_cols = 4 * 3 = 12"));
  }
  try {
    unswizzle_scales_128x4(pattern(12), 4, 3);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("12 bytes, expected 512"));
  }
  try {
    swizzle_scales_128x4({}, -1, 3);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("negative"));
  }
}

}  // namespace
}  // namespace fp4moe
