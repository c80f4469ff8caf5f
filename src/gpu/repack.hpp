// Host-side repacking of checkpoint-layout weights into the kernels' fragment layout
// (kernels/weight_layout.hpp). Pure host code: tested on the CPU, run once per layer upload.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "fp4moe/formats.hpp"

namespace fp4moe::gpu {

// One matrix in the fragment layout, with the fp32 factor its GEMM epilogue applies.
struct RepackedMatrix {
  std::int64_t rows = 0;  // logical rows (before padding to 64)
  std::int64_t k = 0;
  std::vector<std::uint8_t> bytes;  // WeightLayout::matrix_bytes(rows, k)
  // Epilogue factors: for a gate/up interleaved matrix, [0] applies to gate rows, [1] to up
  // rows; for a plain matrix both are equal.
  float post_scale[2] = {1.0f, 1.0f};
};

// Writes the fragment layout of W into `out` (WeightLayout::matrix_bytes(w.rows, w.cols) bytes).
// Returns the epilogue factor. Throws Error for a NaN scale or an unsupported format.
float repack_matrix(const QuantizedMatrix& w, std::span<std::uint8_t> out);

// The first GEMM's matrix: gate and up [I, H] interleaved so that 16-row tile q holds gate rows
// 8q..8q+7 (tile rows 0-7) then up rows 8q..8q+7 (tile rows 8-15). A thread's two accumulator
// rows g and g+8 are then the gate and up value of the same intermediate index, so SwiGLU is
// applied in registers. Returns {post_scale gate, post_scale up}.
struct GateUpScales {
  float gate = 1.0f;
  float up = 1.0f;
};
GateUpScales repack_gate_up(const QuantizedMatrix& gate, const QuantizedMatrix& up,
                            std::span<std::uint8_t> out);

// The row of the interleaved gate/up matrix that holds gate row j (up = false) or up row j.
constexpr std::int64_t gate_up_row(std::int64_t j, bool up) {
  return (j / 8) * 16 + (up ? 8 : 0) + j % 8;
}

// Rows [r0, r0 + n) of m, zero rows past its end (the shared expert's pieces).
QuantizedMatrix slice_rows(const QuantizedMatrix& m, std::int64_t r0, std::int64_t n);
// Columns [c0, c0 + n) of m, zero columns past its end; c0 and n multiples of the block.
QuantizedMatrix slice_cols(const QuantizedMatrix& m, std::int64_t c0, std::int64_t n);

// Convenience for tests: the whole matrix.
RepackedMatrix repack(const QuantizedMatrix& w);
RepackedMatrix repack(const QuantizedMatrix& gate, const QuantizedMatrix& up);

// A CPU model of what the stream kernel computes from the fragment layout (decode, scale
// multiply in bf16, k-permutation, fp32 accumulation, post_scale): returns y [tokens, rows] for
// activations x [tokens, k] given as bf16 bits. Used by the tests to check the layout, the
// decode and the scale encoding bit for bit against the dequantized matrix, without a GPU.
std::vector<float> simulate_fragment_gemm(const RepackedMatrix& m, std::span<const std::uint16_t> x,
                                          std::int64_t tokens);

}  // namespace fp4moe::gpu
