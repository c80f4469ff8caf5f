// The dispatcher: heuristics (tuned on an H200) that choose the kernel and configuration of each
// expert GEMM for a forward of T tokens. They are the default of the layer's decision
// (planner::pick_layer_gemm), which runs them only when the planner accepts them on the device.
#pragma once

#include <cstdint>
#include <string>

#include "fp4moe/layer.hpp"
#include "fp4moe/moe_layer.hpp"
#include "kernels/stream_gemm_layout.hpp"
#include "kernels/tile_gemm_layout.hpp"
#include "kernels/wgmma_gemm_layout.hpp"

namespace fp4moe::gpu {

enum class Gemm : int { kGateUp = 0, kDown = 1 };

struct DeviceLimits {
  int sm_count = 0;
  std::int64_t smem_per_block_optin = 0;
  std::int64_t smem_per_sm = 0;
  bool wgmma = false;  // the sm_90a wgmma kernel can run (an H100/H200 and a build with sm_90a)
};

// Expected number of experts that receive at least one of T tokens routed top-k of E uniformly,
// and the expected tokens per such expert.
double expected_active_experts(const LayerDesc& desc, std::int64_t tokens);

// The stream GEMM configuration for GEMM `which` at T tokens on a device with these limits.
kernels::StreamGemmConfig choose_stream_config(const LayerDesc& desc, std::int64_t tokens, Gemm which,
                                               const DeviceLimits& limits);

// The kernel and configuration for GEMM `which` at T tokens: the stream kernel while an expert
// sees few tokens (weight bytes dominate), the tiled kernel once each decoded weight can be
// reused for 32 or more tokens.
GemmChoice choose_gemm(const LayerDesc& desc, std::int64_t tokens, Gemm which, const DeviceLimits& limits);

kernels::StreamGemmConfig stream_config(const GemmChoice& c);
kernels::TileGemmConfig tile_config(const GemmChoice& c);
kernels::WgmmaGemmConfig wgmma_config(const GemmChoice& c);
std::int64_t smem_bytes(const GemmChoice& c);

std::string to_string(const kernels::StreamGemmConfig& c);

}  // namespace fp4moe::gpu
