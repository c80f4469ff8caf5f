// Row-wise dequantization, shared by dequantize() and the CPU reference (which dequantizes one
// weight row at a time so that it never holds a whole expert in fp32).
#pragma once

#include <cstdint>

#include "fp4moe/formats.hpp"

namespace fp4moe::detail {

// The value of one block scale code: E4M3 for NVFP4, UE8M0 for MXFP4.
float block_scale_value(WeightFormat format, std::uint8_t code) noexcept;

// out[c] = (e2m1(r, c) * block_scale(r, c / block)) * global_scale for c in [0, cols): the same
// float operations, in the same order, as QuantizedMatrix::value. `q` must have passed validate().
void dequantize_row(const QuantizedMatrix& q, std::int64_t r, float* out) noexcept;

}  // namespace fp4moe::detail
