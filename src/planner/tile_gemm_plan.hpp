// The tile GEMM family (kernels/tile_gemm.cu, the prefill path) as the planner sees it. Shared
// memory comes from TileGemmLayout, the same constexpr functions the kernel carves its shared
// memory with.
#pragma once

#include <string>
#include <vector>

#include "fp4moe/planner.hpp"
#include "kernels/tile_gemm_layout.hpp"

namespace fp4moe::planner {

// The tile shapes are kernels::kTileShapes (the compiled instances, tile_gemm_layout.hpp); warps
// is fixed at TileGemmLayout::kWarps (the kernel's copy schedule is compiled for it); stages is a
// launch-time value.
inline constexpr int kTileGemmStagesMin = 2;
inline constexpr int kTileGemmStagesMax = 8;

// Every candidate, in the order the plan lists them: each compiled shape x stages 2..8.
std::vector<kernels::TileGemmConfig> tile_gemm_candidates();

// "m2 n8 s4 w8": m_tiles, n_tiles, stages, warps.
std::string tile_gemm_label(const kernels::TileGemmConfig& config);

// The name a measured KernelResources entry should carry for an instance: the kernel's template
// arguments (m_tiles, n_tiles, epilogue), e.g. "fp4moe_tile_gemm<2, 8, 0>". The epilogue is
// stream_gemm_epilogue's (both kernels share StreamEpilogue).
std::string tile_gemm_kernel_key(int m_tiles, int n_tiles, int epilogue);

}  // namespace fp4moe::planner
