// fp4moe: the number formats of NVFP4 and MXFP4 weights, bit for bit.
//
//   E2M1   4-bit float: sign, 2 exponent bits (bias 1), 1 mantissa bit. Codes 0..7 are
//          0, 0.5, 1, 1.5, 2, 3, 4, 6; codes 8..15 are their negatives (8 is -0).
//   E4M3   8-bit float "float8_e4m3fn": bias 7, no infinities, 0x7F/0xFF are NaN, max 448.
//   UE8M0  8-bit unsigned power of two 2^(code-127); 0xFF is NaN.
//
//   NVFP4  E2M1 values, one E4M3 scale per 16 consecutive values along K, one FP32 scale per
//          tensor (weight_scale_2): value = e2m1 * e4m3 * weight_scale_2. Quantized with
//          NVIDIA ModelOpt's recipe (see quantize_nvfp4).
//   MXFP4  E2M1 values, one UE8M0 scale per 32 values along K (OCP Microscaling v1.0).
//
// Layouts follow checkpoints: packed values are uint8 [rows, cols/2] with element 2j in the LOW
// nibble of byte j; scales are [rows, cols/block] ("linear"). The 128x4 swizzled scale layout
// of CUTLASS / FlashInfer block-scaled GEMMs is available through swizzle_scales_128x4.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace fp4moe {

inline constexpr int kNvfp4BlockSize = 16;
inline constexpr int kMxfp4BlockSize = 32;
inline constexpr float kE2M1Max = 6.0f;
inline constexpr float kE4M3Max = 448.0f;

// ---- scalar codecs --------------------------------------------------------------------------

// The value of an E2M1 code (only the low 4 bits of `code` are read).
float e2m1_to_float(std::uint8_t code) noexcept;
// Rounds to the nearest E2M1 value, ties to even; |x| > 6 saturates to +-6 (infinities too);
// -0 and values that round to zero encode as +0 (code 0); NaN encodes as code 0.
std::uint8_t float_to_e2m1(float x) noexcept;

float e4m3_to_float(std::uint8_t code) noexcept;
enum class Saturation : std::uint8_t {
  kSaturate,    // finite overflow and +-inf become +-448 (what quantizers do)
  kNoSaturate,  // finite overflow and +-inf become NaN (0x7F with the sign), like __NV_NOSAT
};
// Rounds to nearest even (subnormals included). NaN encodes as 0x7F (with its sign bit).
std::uint8_t float_to_e4m3(float x, Saturation saturation) noexcept;

// 2^(code-127); code 0xFF is NaN.
float ue8m0_to_float(std::uint8_t code) noexcept;
// The UE8M0 code of 2^e, for e in [-127, 127].
std::uint8_t ue8m0_from_exponent(int exponent);

// ---- formats --------------------------------------------------------------------------------

enum class WeightFormat : std::uint8_t { kNvfp4, kMxfp4 };

int block_size(WeightFormat format) noexcept;
std::string_view format_name(WeightFormat format) noexcept;  // "nvfp4", "mxfp4"
WeightFormat parse_weight_format(std::string_view name);     // throws Error naming the value

// ---- nibble packing -------------------------------------------------------------------------

// codes (one per byte, < 16) -> bytes; element 2j in the low nibble of byte j. Size must be even.
std::vector<std::uint8_t> pack_e2m1(std::span<const std::uint8_t> codes);
std::vector<std::uint8_t> unpack_e2m1(std::span<const std::uint8_t> packed);

// ---- quantized matrices ---------------------------------------------------------------------

// A [rows, cols] matrix quantized along cols (cols is the reduction dimension K of a GEMM whose
// weights are [N = rows, K = cols]), in checkpoint layout.
struct QuantizedMatrix {
  WeightFormat format = WeightFormat::kNvfp4;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<std::uint8_t> packed;  // [rows, cols/2]
  std::vector<std::uint8_t> scales;  // [rows, cols/block]: E4M3 (NVFP4) or UE8M0 (MXFP4) codes
  float global_scale = 1.0f;         // NVFP4 weight_scale_2; 1 for MXFP4

  std::int64_t scale_cols() const noexcept;
  // The dequantized element (r, c): e2m1 * block scale * global_scale, computed in float (exact
  // for finite scales: a product of an E2M1 and an E4M3 value has at most 6 significant bits).
  float value(std::int64_t r, std::int64_t c) const;
  // Throws Error when sizes disagree with rows/cols/format, or cols is not a multiple of the block.
  void validate() const;
};

// weight_scale_2 = amax / (6 * 448), the ModelOpt per-tensor scale; an all-zero tensor gets 1.
float nvfp4_global_scale(std::span<const float> x);

// ModelOpt NVFP4 recipe: per block of 16, scale = block_amax / (6 * weight_scale_2) cast to E4M3
// (nearest even, saturating), a scale that encodes to 0 becomes 1.0; each value is divided (true
// division) by float(e4m3 scale) * weight_scale_2 and rounded to E2M1 (nearest even, saturating),
// with ModelOpt's sign rule: a negative value that rounds to zero is stored as code 8 (-0).
// `global_scale` overrides weight_scale_2 (ModelOpt shares one between gate_proj and up_proj).
// Throws on non-finite input, naming the first bad index. Deterministic: same input, same bytes.
QuantizedMatrix quantize_nvfp4(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                               std::optional<float> global_scale = std::nullopt);

// OCP MX recipe: per block of 32, shared exponent = floor(log2(block_amax)) - 2 (E2M1's emax),
// clamped to [-127, 127]; values divided by 2^exponent and rounded to E2M1 (nearest even,
// saturating). An all-zero block gets exponent 0 (scale code 127).
QuantizedMatrix quantize_mxfp4(std::span<const float> x, std::int64_t rows, std::int64_t cols);

QuantizedMatrix quantize(WeightFormat format, std::span<const float> x, std::int64_t rows, std::int64_t cols);

std::vector<float> dequantize(const QuantizedMatrix& q);

// ---- 128x4 swizzled scale layout ------------------------------------------------------------
// Rp = roundup(rows, 128), Cp = roundup(scale_cols, 4), zero padded; scale (r, c) lives at
// (r/128)*(Cp*128) + (c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + (c%4).

std::int64_t swizzled_scale_offset(std::int64_t r, std::int64_t c, std::int64_t scale_cols) noexcept;
std::int64_t swizzled_scale_bytes(std::int64_t rows, std::int64_t scale_cols) noexcept;
std::vector<std::uint8_t> swizzle_scales_128x4(std::span<const std::uint8_t> linear, std::int64_t rows,
                                               std::int64_t scale_cols);
std::vector<std::uint8_t> unswizzle_scales_128x4(std::span<const std::uint8_t> swizzled, std::int64_t rows,
                                                 std::int64_t scale_cols);

}  // namespace fp4moe
