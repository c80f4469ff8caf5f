// The 128x4 swizzled block-scale layout of CUTLASS / FlashInfer block-scaled GEMMs: 128-row x
// 4-column tiles of 512 bytes, in which row r%32 picks a 16-byte group, (r%128)/32 a 4-byte group
// inside it and c%4 the byte, so that one 16-byte load serves 4 row quarters x 4 scale columns.
#include <limits>

#include "common/fail.hpp"
#include "fp4moe/formats.hpp"

namespace fp4moe {
namespace {

std::int64_t round_up(std::int64_t v, std::int64_t m) {
  return (v + m - 1) / m * m;
}

void check_scale_shape(std::string_view what, std::int64_t rows, std::int64_t scale_cols) {
  require(rows >= 0 && scale_cols >= 0, "{}: scale shape [{}, {}] has a negative dimension", what, rows,
          scale_cols);
  // Bound both padded dimensions so that Rp * Cp cannot overflow.
  constexpr std::int64_t kLimit = std::int64_t{1} << 31;
  require(rows < kLimit && scale_cols < kLimit,
          "{}: scale shape [{}, {}] is too large (each dimension < 2^31)", what, rows, scale_cols);
}

}  // namespace

std::int64_t swizzled_scale_offset(std::int64_t r, std::int64_t c, std::int64_t scale_cols) noexcept {
  const std::int64_t padded_cols = round_up(scale_cols, 4);
  return (r / 128) * (padded_cols * 128) + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

std::int64_t swizzled_scale_bytes(std::int64_t rows, std::int64_t scale_cols) noexcept {
  return round_up(rows, 128) * round_up(scale_cols, 4);
}

std::vector<std::uint8_t> swizzle_scales_128x4(std::span<const std::uint8_t> linear, std::int64_t rows,
                                               std::int64_t scale_cols) {
  check_scale_shape("swizzle_scales_128x4", rows, scale_cols);
  require(static_cast<std::int64_t>(linear.size()) == rows * scale_cols,
          "swizzle_scales_128x4: {} scale bytes, expected rows * scale_cols = {} * {} = {}", linear.size(),
          rows, scale_cols, rows * scale_cols);
  std::vector<std::uint8_t> swizzled(static_cast<std::size_t>(swizzled_scale_bytes(rows, scale_cols)), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < scale_cols; ++c) {
      swizzled[static_cast<std::size_t>(swizzled_scale_offset(r, c, scale_cols))] =
          linear[static_cast<std::size_t>(r * scale_cols + c)];
    }
  }
  return swizzled;
}

std::vector<std::uint8_t> unswizzle_scales_128x4(std::span<const std::uint8_t> swizzled, std::int64_t rows,
                                                 std::int64_t scale_cols) {
  check_scale_shape("unswizzle_scales_128x4", rows, scale_cols);
  const std::int64_t expected = swizzled_scale_bytes(rows, scale_cols);
  require(static_cast<std::int64_t>(swizzled.size()) == expected,
          "unswizzle_scales_128x4: {} bytes, expected {} (rows {} padded to {} x scale_cols {} padded to {})",
          swizzled.size(), expected, rows, round_up(rows, 128), scale_cols, round_up(scale_cols, 4));
  std::vector<std::uint8_t> linear(static_cast<std::size_t>(rows * scale_cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < scale_cols; ++c) {
      linear[static_cast<std::size_t>(r * scale_cols + c)] =
          swizzled[static_cast<std::size_t>(swizzled_scale_offset(r, c, scale_cols))];
    }
  }
  return linear;
}

}  // namespace fp4moe
