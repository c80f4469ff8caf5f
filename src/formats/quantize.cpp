// NVFP4 (ModelOpt recipe) and MXFP4 (OCP MX recipe) quantization.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/fail.hpp"
#include "fp4moe/formats.hpp"

namespace fp4moe {
namespace {

// ModelOpt's 6 * 448: the largest E2M1 value times the largest E4M3 value.
constexpr float kNvfp4AmaxDivisor = kE2M1Max * kE4M3Max;
constexpr std::uint8_t kE4M3One = 0x38;  // 1.0

void check_shape(std::span<const float> x, std::int64_t rows, std::int64_t cols, int block,
                 WeightFormat format) {
  require(rows >= 0 && cols >= 0, "quantize_{}: shape [{}, {}] has a negative dimension", format_name(format),
          rows, cols);
  require(cols % block == 0, "quantize_{}: cols={} is not a multiple of {} (the {} block size)",
          format_name(format), cols, block, format_name(format));
  require(cols == 0 || rows <= std::numeric_limits<std::int64_t>::max() / cols,
          "quantize_{}: shape [{}, {}] has more elements than fit in 64 bits", format_name(format), rows,
          cols);
  require(static_cast<std::int64_t>(x.size()) == rows * cols,
          "quantize_{}: input has {} values, expected rows * cols = {} * {} = {}", format_name(format),
          x.size(), rows, cols, rows * cols);
  const auto bad = std::find_if(x.begin(), x.end(), [](float v) { return !std::isfinite(v); });
  if (bad != x.end()) {
    const std::int64_t i = bad - x.begin();
    fail(Errc::kInvalidArgument,
         "quantize_{}: non-finite input {} at (row {}, col {}); only finite values quantize",
         format_name(format), *bad, i / cols, i % cols);
  }
}

float block_amax(const float* v, std::size_t n) {
  float amax = 0.0f;
  for (std::size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
  return amax;
}

QuantizedMatrix empty_matrix(WeightFormat format, std::int64_t rows, std::int64_t cols) {
  QuantizedMatrix q;
  q.format = format;
  q.rows = rows;
  q.cols = cols;
  q.packed.resize(static_cast<std::size_t>(rows * cols / 2));
  q.scales.resize(static_cast<std::size_t>(rows * (cols / block_size(format))));
  return q;
}

void store_code(QuantizedMatrix& q, std::int64_t index, std::uint8_t code) {
  std::uint8_t& byte = q.packed[static_cast<std::size_t>(index / 2)];
  byte = (index % 2 == 0) ? static_cast<std::uint8_t>((byte & 0xf0) | code)
                          : static_cast<std::uint8_t>((byte & 0x0f) | (code << 4));
}

}  // namespace

float nvfp4_global_scale(std::span<const float> x) {
  float amax = 0.0f;
  for (std::size_t i = 0; i < x.size(); ++i) {
    require(std::isfinite(x[i]), "nvfp4_global_scale: non-finite input {} at index {}", x[i], i);
    amax = std::max(amax, std::fabs(x[i]));
  }
  if (amax == 0.0f) return 1.0f;
  return amax / kNvfp4AmaxDivisor;
}

QuantizedMatrix quantize_nvfp4(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                               std::optional<float> global_scale) {
  check_shape(x, rows, cols, kNvfp4BlockSize, WeightFormat::kNvfp4);
  const float gs = global_scale ? *global_scale : nvfp4_global_scale(x);
  if (global_scale) {
    require(std::isfinite(gs) && gs > 0.0f, "quantize_nvfp4: global_scale={} must be finite and positive",
            gs);
  } else if (gs == 0.0f) {
    fail(Errc::kInvalidArgument,
         "quantize_nvfp4: weight_scale_2 = amax / {} underflows to 0 (amax {}): the tensor is too small for "
         "NVFP4",
         kNvfp4AmaxDivisor, block_amax(x.data(), x.size()));
  }
  QuantizedMatrix q = empty_matrix(WeightFormat::kNvfp4, rows, cols);
  q.global_scale = gs;
  // ModelOpt computes 6 * weight_scale_2 once (fp32), then divides each block amax by it.
  const float block_divisor = kE2M1Max * gs;
  const std::int64_t blocks = rows * (cols / kNvfp4BlockSize);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const float* v = x.data() + b * kNvfp4BlockSize;
    std::uint8_t scale = float_to_e4m3(block_amax(v, kNvfp4BlockSize) / block_divisor, Saturation::kSaturate);
    if (scale == 0) scale = kE4M3One;  // an all-zero (or vanishing) block: scale 1, every code 0
    q.scales[static_cast<std::size_t>(b)] = scale;
    const float denom = e4m3_to_float(scale) * gs;
    for (int i = 0; i < kNvfp4BlockSize; ++i) {
      // NOTE: ModelOpt's E2M1 cast (NVFP4QTensor._cast_fp4) takes the sign bit from
      // `scaled < 0`, so a negative value that rounds to zero is stored as code 8 (-0); -0.0
      // itself is not < 0 and stays code 0. Both decode to zero; the bytes follow ModelOpt.
      const float scaled = v[i] / denom;
      std::uint8_t code = float_to_e2m1(scaled);
      if (code == 0 && scaled < 0.0f) code = 0x8;
      store_code(q, b * kNvfp4BlockSize + i, code);
    }
  }
  return q;
}

QuantizedMatrix quantize_mxfp4(std::span<const float> x, std::int64_t rows, std::int64_t cols) {
  check_shape(x, rows, cols, kMxfp4BlockSize, WeightFormat::kMxfp4);
  QuantizedMatrix q = empty_matrix(WeightFormat::kMxfp4, rows, cols);
  constexpr int kE2M1Emax = 2;  // 6 = 1.5 * 2^2
  const std::int64_t blocks = rows * (cols / kMxfp4BlockSize);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const float* v = x.data() + b * kMxfp4BlockSize;
    const float amax = block_amax(v, kMxfp4BlockSize);
    const int exponent = amax == 0.0f ? 0 : std::clamp(std::ilogb(amax) - kE2M1Emax, -127, 127);
    q.scales[static_cast<std::size_t>(b)] = ue8m0_from_exponent(exponent);
    const float scale = std::ldexp(1.0f, exponent);
    for (int i = 0; i < kMxfp4BlockSize; ++i)
      store_code(q, b * kMxfp4BlockSize + i, float_to_e2m1(v[i] / scale));
  }
  return q;
}

QuantizedMatrix quantize(WeightFormat format, std::span<const float> x, std::int64_t rows,
                         std::int64_t cols) {
  return format == WeightFormat::kMxfp4 ? quantize_mxfp4(x, rows, cols) : quantize_nvfp4(x, rows, cols);
}

}  // namespace fp4moe
