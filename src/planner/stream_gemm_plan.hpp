// The stream GEMM family (kernels/stream_gemm.cu, the decode path) as the planner sees it, and
// the typed plan the GPU layer launches from. Shared memory comes from StreamGemmLayout, the
// same constexpr functions the kernel carves its shared memory with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fp4moe/planner.hpp"
#include "kernels/stream_gemm_layout.hpp"

namespace fp4moe::planner {

// The tile shapes are kernels::kStreamTileShapes (the compiled instances, stream_gemm_layout.hpp).
// Stages, warps and the K split are launch-time values (kernel arguments and the block size):
// the candidates are those of these that StreamGemmLayout::valid accepts.
inline constexpr int kStreamGemmStages[] = {2, 3, 4, 6, 8};
inline constexpr int kStreamGemmWarps[] = {4, 8, 15, 16};
inline constexpr int kStreamGemmKSplits[] = {1, 2, 3, 4, 8};

// Every candidate, in the order the plan lists them.
std::vector<kernels::StreamGemmConfig> stream_gemm_candidates();

// "m1 n2 k2 s8 w4": m_tiles, n_tiles, k_split (warps sharing one item), stages, warps.
std::string stream_gemm_label(const kernels::StreamGemmConfig& config);

// The name a measured KernelResources entry should carry for an instance: the kernel's template
// arguments (m_tiles, n_tiles, epilogue), e.g. "fp4moe_stream_gemm<1, 2, 0>".
std::string stream_gemm_kernel_key(int m_tiles, int n_tiles, int epilogue);

// The epilogue instance a GEMM runs with (StreamEpilogue in kernels/launch.hpp): 0 SwiGLU,
// 1 clamped SwiGLU (gpt-oss), 2 bf16 store (the down projection).
int stream_gemm_epilogue(const GemmProblem& problem);

struct StreamGemmPlan {
  kernels::StreamGemmConfig config;  // the pick (meaningful only when plan.ok())
  Plan plan;
};

// Plans the stream GEMM for one GEMM of `layer` at `tokens` on `arch`. `measured` (registers per
// kernel instance from cudaFuncGetAttributes) takes precedence over the build's resource report;
// with neither, occupancy counts shared memory and threads only (the plan says so).
// Never throws for a config that does not fit: check plan.ok() or call plan.best(), which throws
// with the numbers.
StreamGemmPlan plan_stream_gemm(const LayerDesc& layer, std::int64_t tokens, GemmKind which,
                                const ArchInfo& arch, const KernelResources* measured = nullptr);

}  // namespace fp4moe::planner
