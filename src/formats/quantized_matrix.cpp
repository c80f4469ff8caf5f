// QuantizedMatrix: size checks, element access and dequantization.
#include <limits>

#include "common/fail.hpp"
#include "formats/dequantize_row.hpp"
#include "formats/tables.hpp"
#include "fp4moe/formats.hpp"

namespace fp4moe {
namespace detail {

float block_scale_value(WeightFormat format, std::uint8_t code) noexcept {
  return format == WeightFormat::kMxfp4 ? ue8m0_to_float(code) : kE4M3Values[code];
}

void dequantize_row(const QuantizedMatrix& q, std::int64_t r, float* out) noexcept {
  const std::int64_t block = block_size(q.format);
  const std::int64_t blocks = q.cols / block;
  const std::uint8_t* packed = q.packed.data() + r * (q.cols / 2);
  const std::uint8_t* scales = q.scales.data() + r * blocks;
  for (std::int64_t b = 0; b < blocks; ++b) {
    const float scale = block_scale_value(q.format, scales[b]);
    // The 16 values one nibble can take in this block: (e2m1 * scale) is exact, then one rounding
    // by the global scale, exactly as value() computes it.
    float lut[16];
    for (int n = 0; n < 16; ++n) lut[n] = (kE2M1Values[n] * scale) * q.global_scale;
    const std::uint8_t* bytes = packed + b * (block / 2);
    float* dst = out + b * block;
    for (std::int64_t j = 0; j < block / 2; ++j) {
      dst[2 * j] = lut[bytes[j] & 0x0f];
      dst[2 * j + 1] = lut[bytes[j] >> 4];
    }
  }
}

}  // namespace detail

std::int64_t QuantizedMatrix::scale_cols() const noexcept {
  return cols / block_size(format);
}

float QuantizedMatrix::value(std::int64_t r, std::int64_t c) const {
  validate();
  require(r >= 0 && r < rows && c >= 0 && c < cols, "element ({}, {}) is outside the [{}, {}] matrix", r, c,
          rows, cols);
  const std::uint8_t byte = packed[static_cast<std::size_t>(r * (cols / 2) + c / 2)];
  const std::uint8_t code = (c % 2 == 0) ? (byte & 0x0f) : static_cast<std::uint8_t>(byte >> 4);
  const float scale = detail::block_scale_value(
      format, scales[static_cast<std::size_t>(r * scale_cols() + c / block_size(format))]);
  return (e2m1_to_float(code) * scale) * global_scale;
}

void QuantizedMatrix::validate() const {
  const int block = block_size(format);
  require(rows >= 0 && cols >= 0, "matrix shape [{}, {}] has a negative dimension", rows, cols);
  require(cols % block == 0, "cols={} is not a multiple of {} (the {} block size)", cols, block,
          format_name(format));
  require(cols == 0 || rows <= std::numeric_limits<std::int64_t>::max() / cols,
          "matrix shape [{}, {}] has more elements than fit in 64 bits", rows, cols);
  const std::int64_t packed_bytes = rows * (cols / 2);
  const std::int64_t scale_bytes = rows * (cols / block);
  require(static_cast<std::int64_t>(packed.size()) == packed_bytes,
          "packed holds {} bytes, expected {} (= rows {} * cols {} / 2)", packed.size(), packed_bytes, rows,
          cols);
  require(static_cast<std::int64_t>(scales.size()) == scale_bytes,
          "scales holds {} bytes, expected {} (= rows {} * cols {} / {})", scales.size(), scale_bytes, rows,
          cols, block);
}

std::vector<float> dequantize(const QuantizedMatrix& q) {
  q.validate();
  std::vector<float> out(static_cast<std::size_t>(q.rows * q.cols));
  for (std::int64_t r = 0; r < q.rows; ++r) detail::dequantize_row(q, r, out.data() + r * q.cols);
  return out;
}

}  // namespace fp4moe
