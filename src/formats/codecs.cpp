// Scalar codecs (E2M1, E4M3, UE8M0), format names and nibble packing.
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/fail.hpp"
#include "formats/tables.hpp"
#include "fp4moe/formats.hpp"

namespace fp4moe {
namespace {

// Rounds a non-negative float holding a value in [0, 2^24) to the nearest integer, ties to even,
// without depending on the floating-point environment's rounding mode.
float round_half_even(float q) {
  const float floor_q = std::floor(q);
  const float frac = q - floor_q;  // exact: q and floor_q share the exponent range
  if (frac > 0.5f) return floor_q + 1.0f;
  if (frac < 0.5f) return floor_q;
  return std::fmod(floor_q, 2.0f) == 0.0f ? floor_q : floor_q + 1.0f;
}

}  // namespace

float e2m1_to_float(std::uint8_t code) noexcept {
  return detail::kE2M1Values[code & 0x0f];
}

std::uint8_t float_to_e2m1(float x) noexcept {
  if (std::isnan(x)) return 0;
  const float a = std::fabs(x);
  // Midpoints between consecutive magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. At a midpoint the even
  // code (even mantissa bit) wins: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
  constexpr std::array<float, 7> kMidpoints = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  std::uint8_t code = 7;  // above 5 (infinity included): saturate to 6
  for (std::uint8_t k = 0; k < kMidpoints.size(); ++k) {
    if (a < kMidpoints[k] || (a == kMidpoints[k] && k % 2 == 0)) {
      code = k;
      break;
    }
    if (a == kMidpoints[k]) {
      code = static_cast<std::uint8_t>(k + 1);
      break;
    }
  }
  if (code == 0) return 0;  // zero is always +0, whatever the sign of x
  return std::signbit(x) ? static_cast<std::uint8_t>(code | 0x08) : code;
}

float e4m3_to_float(std::uint8_t code) noexcept {
  return detail::kE4M3Values[code];
}

std::uint8_t float_to_e4m3(float x, Saturation saturation) noexcept {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7f;
  const float a = std::fabs(x);
  constexpr std::uint8_t kMaxCode = 0x7e;  // 448
  constexpr std::uint8_t kNanCode = 0x7f;
  const std::uint8_t overflow = saturation == Saturation::kSaturate ? kMaxCode : kNanCode;
  if (std::isinf(a)) return sign | overflow;
  if (a < 0x1p-6f) {
    // Subnormal range: codes 0..7 are m * 2^-9; a rounding up to 8 is the smallest normal, code 8.
    const float m = round_half_even(a * 512.0f);  // exact scaling by a power of two
    return sign | static_cast<std::uint8_t>(m);
  }
  int e = std::ilogb(a);  // a in [2^e, 2^(e+1))
  if (e > 8) return sign | overflow;
  float m = round_half_even((std::ldexp(a, -e) - 1.0f) * 8.0f);  // mantissa in eighths, exact
  if (m == 8.0f) {
    m = 0.0f;
    ++e;
  }
  const int biased = e + 7;
  if (biased > 15 || (biased == 15 && m == 7.0f)) return sign | overflow;  // rounded above 448
  return sign | static_cast<std::uint8_t>((biased << 3) | static_cast<int>(m));
}

float ue8m0_to_float(std::uint8_t code) noexcept {
  if (code == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(code) - 127);
}

std::uint8_t ue8m0_from_exponent(int exponent) {
  require(exponent >= -127 && exponent <= 127,
          "UE8M0 exponent {} is out of range: expected -127..127 (code 255 is NaN)", exponent);
  return static_cast<std::uint8_t>(exponent + 127);
}

int block_size(WeightFormat format) noexcept {
  return format == WeightFormat::kMxfp4 ? kMxfp4BlockSize : kNvfp4BlockSize;
}

std::string_view format_name(WeightFormat format) noexcept {
  return format == WeightFormat::kMxfp4 ? "mxfp4" : "nvfp4";
}

WeightFormat parse_weight_format(std::string_view name) {
  if (name == "nvfp4") return WeightFormat::kNvfp4;
  if (name == "mxfp4") return WeightFormat::kMxfp4;
  fail(Errc::kInvalidArgument, "unknown weight format '{}': expected nvfp4 or mxfp4", name);
}

std::vector<std::uint8_t> pack_e2m1(std::span<const std::uint8_t> codes) {
  require(codes.size() % 2 == 0, "pack_e2m1: {} codes is odd: two codes make one byte", codes.size());
  std::vector<std::uint8_t> packed(codes.size() / 2);
  for (std::size_t j = 0; j < packed.size(); ++j) {
    const std::uint8_t lo = codes[2 * j];
    const std::uint8_t hi = codes[2 * j + 1];
    require(lo < 16 && hi < 16, "pack_e2m1: code {} at index {} is not a 4-bit E2M1 code (expected < 16)",
            lo < 16 ? hi : lo, lo < 16 ? 2 * j + 1 : 2 * j);
    packed[j] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
  return packed;
}

std::vector<std::uint8_t> unpack_e2m1(std::span<const std::uint8_t> packed) {
  std::vector<std::uint8_t> codes(packed.size() * 2);
  for (std::size_t j = 0; j < packed.size(); ++j) {
    codes[2 * j] = packed[j] & 0x0f;
    codes[2 * j + 1] = static_cast<std::uint8_t>(packed[j] >> 4);
  }
  return codes;
}

}  // namespace fp4moe
