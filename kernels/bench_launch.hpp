// Launchers of the benchmark's helper kernels (kernels/bench_kernels.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4moe::kernels {

// Roughly normal bf16 values with standard deviation `scale`, deterministic in seed.
cudaError_t launch_fill_random_bf16(std::uint16_t* out, std::int64_t n, std::uint64_t seed, float scale,
                                    cudaStream_t stream);

// Checkpoint-layout [rows, cols] NVFP4/MXFP4 -> bf16 rows at out + out_row_offset * cols.
struct DequantArgs {
  const std::uint8_t* packed = nullptr;
  const std::uint8_t* scales = nullptr;
  float global_scale = 1.0f;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  int block = 16;
  int mxfp4 = 0;
  std::uint16_t* out = nullptr;
  std::int64_t out_row_offset = 0;
};
cudaError_t launch_dequantize_bf16(const DequantArgs& args, cudaStream_t stream);

// out[s] = x[slot_token[s]] for rows of `cols` bf16 (cols a multiple of 8).
cudaError_t launch_gather_rows(const std::uint16_t* x, const std::int32_t* slot_token, int slots, int cols,
                               std::uint16_t* out, cudaStream_t stream);

// h[s][j] = act(gate_up[s][j], gate_up[s][I + j]) in bf16, gate_up fp32 [slots, 2I].
struct ActArgs {
  const float* gate_up = nullptr;
  int slots = 0;
  int inter = 0;
  int clamped = 0;
  float alpha = 1.702f;
  float limit = 7.0f;
  std::uint16_t* out = nullptr;
};
cudaError_t launch_swiglu_rows(const ActArgs& args, cudaStream_t stream);

// One CTA that does nothing: the bench's measure of what launching a graph costs by itself.
cudaError_t launch_empty(cudaStream_t stream);

}  // namespace fp4moe::kernels
