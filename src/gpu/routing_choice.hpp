// Which routing kernels a forward of T tokens launches (host side; CUDA builds only, as the
// launchers it names).
#pragma once

#include <cstdint>

#include "kernels/launch.hpp"

namespace fp4moe::gpu {

// The one-CTA router (kernels::launch_route_group_small: one launch, a warp per token, each warp
// taking its tokens one after another) or the multi-CTA kernels (route and count, scan, scatter:
// a warp per token on as many CTAs as the tokens need, four launches). The kernel takes up to
// kernels::kSmallRouteTokens; the layer uses it up to kOneCtaRouteTokens, where a warp has one
// token. On the H200 (2026-12-01, 63f4e39, GLM-5, the routing stage in place) the one CTA took
// 11.3 us at T=32, 16.5 at 48, 20 at 64, 27 at 96 and 51 at 128; the four kernels 11.2 at T=192
// and 11.6 at 256, and in a later run 8.9 at T=32 and 9.8 at 64 (one launch whose last CTA scans
// and scatters was slower still: docs/PERF.md, history). (At T <= 16 the first GEMM usually routes
// in its own CTAs: fused routing.)
inline constexpr int kOneCtaRouteTokens = 16;

inline bool one_cta_routing(std::int64_t tokens, std::int64_t experts) {
  return tokens <= kOneCtaRouteTokens && experts <= kernels::kSmallRouteExperts;
}

}  // namespace fp4moe::gpu
