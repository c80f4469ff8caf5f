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
  // tiles per warp reuse each decoded weight fragment for more tokens.
  const double active = expected_active_experts(desc, tokens);
  const double per_expert = static_cast<double>(tokens * desc.top_k) / active;
  const int n_tiles = per_expert <= 8.0 ? 1 : (per_expert <= 16.0 ? 2 : 4);

  // Rows per warp item: as many as keeps every warp of the grid busy with several items (more
  // rows per item re-read the activations less often).
  const std::int64_t rows = which == Gemm::kGateUp ? 2 * desc.intermediate : desc.hidden;
  const std::int64_t tiles = kernels::WeightLayout::groups(rows) * kernels::WeightLayout::kTilesPerGroup;
  const double token_blocks = active * std::ceil(per_expert / (8.0 * n_tiles));
  const double resident_warps = static_cast<double>(limits.sm_count) * 16.0;
  int m_tiles = 1;
  for (int mt : {4, 2}) {
    if (n_tiles == 4 && mt == 4) continue;  // (4, 4) is not compiled (register budget)
    if (token_blocks * static_cast<double>(tiles / mt) >= 4.0 * resident_warps) {
      m_tiles = mt;
      break;
    }
  }
  // Two CTAs of 8 warps per SM, as deep a per-warp ring as the shared memory allows (in flight
  // bytes hide HBM latency), capped at 12 stages.
  StreamGemmConfig c{m_tiles, n_tiles, 2, 8};
  const std::int64_t budget = std::min(limits.smem_per_block_optin, limits.smem_per_sm / 2 - 1024);
  while (c.stages < 12) {
    StreamGemmConfig next = c;
    ++next.stages;
    if (StreamGemmLayout::cta_bytes(next) > budget) break;
    c = next;
  }
  return c;
}

std::string to_string(const StreamGemmConfig& c) {
  return fmt::format("stream m{}xn{} ({} rows x {} tokens per warp), {} stages, {} warps, {} B smem", c.m_tiles,
                     c.n_tiles, 16 * c.m_tiles, 8 * c.n_tiles, c.stages, c.warps, StreamGemmLayout::cta_bytes(c));
}

}  // namespace fp4moe::gpu
