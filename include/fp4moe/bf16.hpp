// fp4moe: a host-side bfloat16 storage type.
//
// Bit-compatible with __nv_bfloat16 (1 sign, 8 exponent, 7 mantissa bits), so arrays of Bf16
// can be copied to and from the GPU as they are. Conversion from float rounds to nearest even;
// NaN stays NaN (quiet), infinities stay infinite.
#pragma once

#include <bit>
#include <cstdint>

namespace fp4moe {

struct Bf16 {
  std::uint16_t bits = 0;

  static constexpr Bf16 from_bits(std::uint16_t b) noexcept { return Bf16{b}; }
  static constexpr Bf16 from_float(float f) noexcept {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep the sign, force a quiet payload
      return Bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
    }
    const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return Bf16{static_cast<std::uint16_t>((u + rounding) >> 16)};
  }
  constexpr float to_float() const noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  friend constexpr bool operator==(Bf16 a, Bf16 b) noexcept { return a.bits == b.bits; }
};

static_assert(sizeof(Bf16) == 2);

// Rounds a float to the nearest bfloat16 and back (what storing to bf16 does to a value).
constexpr float round_to_bf16(float f) noexcept {
  return Bf16::from_float(f).to_float();
}

}  // namespace fp4moe
