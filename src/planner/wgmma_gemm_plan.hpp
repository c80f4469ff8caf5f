// The wgmma GEMM family (kernels/wgmma_gemm.cu, the sm_90 prefill path) as the planner sees it.
// Shared memory comes from WgmmaGemmLayout, the same constexpr functions the kernel carves its
// shared memory with. Only sm_90 with the sm_90a image runs it (ArchInfo::wgmma).
#pragma once

#include <string>
#include <vector>

#include "fp4moe/planner.hpp"
#include "kernels/wgmma_gemm_layout.hpp"

namespace fp4moe::planner {

// The (n_tiles, consumer warps) pairs are kernels::kWgmmaShapes (the compiled instances,
// wgmma_gemm_layout.hpp); rows (256) and the K split (none) are fixed; stages is a launch-time
// value, 3..8.
inline constexpr int kWgmmaGemmStagesMin = 3;
inline constexpr int kWgmmaGemmStagesMax = 8;

// Every candidate, in the order the plan lists them: each compiled shape x stages 3..8.
std::vector<kernels::WgmmaGemmConfig> wgmma_gemm_candidates();

// "n16 s4 w8": n_tiles, stages, consumer warps.
std::string wgmma_gemm_label(const kernels::WgmmaGemmConfig& config);

// The name a measured KernelResources entry should carry for an instance: the kernel's template
// arguments (n_tiles, epilogue), e.g. "fp4moe_wgmma_gemm<16, 2>".
std::string wgmma_gemm_kernel_key(int n_tiles, int consumer_warps, int epilogue);

}  // namespace fp4moe::planner
