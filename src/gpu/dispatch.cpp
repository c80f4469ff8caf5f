#include "gpu/dispatch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kernels/weight_layout.hpp"

namespace fp4moe::gpu {

using kernels::StreamGemmConfig;
using kernels::StreamGemmLayout;

double expected_active_experts(const LayerDesc& desc, std::int64_t tokens) {
  const double e = static_cast<double>(desc.experts);
  const double p_miss = std::pow(1.0 - static_cast<double>(desc.top_k) / e, static_cast<double>(tokens));
  return std::max(1.0, e * (1.0 - p_miss));
}

StreamGemmConfig choose_stream_config(const LayerDesc& desc, std::int64_t tokens, Gemm which,
                                      const DeviceLimits& limits) {
  // Tokens per active expert decides the token tile: one 8-token mma tile covers decode; more
  // tiles per item reuse each decoded weight fragment for more tokens.
  const double active = expected_active_experts(desc, tokens);
  const double per_expert = static_cast<double>(tokens * desc.top_k) / active;
  const int n_tiles = per_expert <= 8.0 ? 1 : (per_expert <= 16.0 ? 2 : 4);
  // 64 rows per item where registers allow: the per-chunk overhead (waits, addresses, the
  // activation loads) is then shared by four weight tiles.
  const int m_tiles = n_tiles == 4 ? 2 : 4;

  // Split K over as many warps as it takes to give every resident warp work: at T=1 GLM-5's
  // first GEMM has 8 experts x 64 row groups = 512 items for 2 x 8 x 132 resident warps.
  const std::int64_t rows = which == Gemm::kGateUp ? 2 * desc.intermediate : desc.hidden;
  const std::int64_t k = which == Gemm::kGateUp ? desc.hidden : desc.intermediate;
  const std::int64_t tiles = kernels::WeightLayout::groups(rows) * kernels::WeightLayout::kTilesPerGroup;
  const std::int64_t chunks = kernels::WeightLayout::chunks(k);
  const double items = active * std::ceil(per_expert / (8.0 * n_tiles)) * static_cast<double>(tiles / m_tiles);
  const double resident_warps = static_cast<double>(limits.sm_count) * 16.0;
  int k_split = 1;
  while (k_split < 8 && items * k_split < resident_warps && 2 * k_split <= chunks) k_split *= 2;

  // Two CTAs of 8 warps per SM, as deep a per-warp ring as the shared memory allows.
  StreamGemmConfig c{m_tiles, n_tiles, 2, 8, k_split};
  const std::int64_t budget = std::min(limits.smem_per_block_optin, limits.smem_per_sm / 2 - 1024);
  while (c.stages < 8) {
    StreamGemmConfig next = c;
    ++next.stages;
    if (StreamGemmLayout::cta_bytes(next) > budget) break;
    c = next;
  }
  return c;
}

std::string to_string(const StreamGemmConfig& c) {
  return fmt::format("stream m{}xn{}xk{} ({} rows x {} tokens per item, K split over {} warps), {} stages, {} warps, "
                     "{} B smem", c.m_tiles, c.n_tiles, c.k_split, 16 * c.m_tiles, 8 * c.n_tiles, c.k_split, c.stages,
                     c.warps, StreamGemmLayout::cta_bytes(c));
}

}  // namespace fp4moe::gpu
