// Decode tables shared by the scalar codecs and the row dequantizer (a lookup per element is what
// keeps dequantizing a 5 GB layer cheap).
#pragma once

#include <array>
#include <cstdint>
#include <limits>

namespace fp4moe::detail {

inline constexpr std::array<float, 16> kE2M1Values = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// float8_e4m3fn: exponent field e (bias 7), mantissa m; e = 0 is subnormal (m * 2^-9); e = 15 with
// m = 7 is NaN (there are no infinities). Built with exact float arithmetic at compile time.
constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) {
    const int e = (code >> 3) & 15;
    const int m = code & 7;
    float magnitude;
    if (e == 15 && m == 7) {
      magnitude = std::numeric_limits<float>::quiet_NaN();
    } else {
      // (8 + m) * 2^(e - 10) for normals, m * 2^-9 for subnormals.
      float pow2 = 1.0f;
      const int exponent = e == 0 ? -9 : e - 10;
      for (int i = 0; i < exponent; ++i) pow2 *= 2.0f;
      for (int i = 0; i > exponent; --i) pow2 *= 0.5f;
      magnitude = static_cast<float>(e == 0 ? m : 8 + m) * pow2;
    }
    table[code] = (code & 0x80) ? -magnitude : magnitude;
  }
  return table;
}

inline constexpr std::array<float, 256> kE4M3Values = make_e4m3_table();

}  // namespace fp4moe::detail
