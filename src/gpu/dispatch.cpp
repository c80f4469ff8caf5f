#include "gpu/dispatch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kernels/weight_layout.hpp"

namespace fp4moe::gpu {

using kernels::StreamGemmConfig;
using kernels::StreamGemmLayout;

StreamGemmConfig choose_stream_config(const LayerDesc& desc, std::int64_t tokens, Gemm which,
                                      const DeviceLimits& limits) {
  // Tokens per active expert decides the token tile: one 8-token mma tile covers decode; more
  // tiles per item reuse each decoded weight fragment for more tokens.
  const double active = desc.expected_active_experts(tokens);
  const double per_expert = static_cast<double>(tokens * desc.top_k) / active;
  const int n_tiles = per_expert <= 8.0 ? 1 : (per_expert <= 16.0 ? 2 : 4);
  // Split K over as many warps as it takes to give every resident warp work: at T=1 GLM-5's
  // first GEMM has 8 experts + 1 shared x 64 row groups = 576 items for 16 x 132 resident warps.
  const std::int64_t rows = which == Gemm::kGateUp ? 2 * desc.intermediate : desc.hidden;
  const std::int64_t k = which == Gemm::kGateUp ? desc.hidden : desc.intermediate;
  const std::int64_t tiles = kernels::WeightLayout::groups(rows) * kernels::WeightLayout::kTilesPerGroup;
  const std::int64_t chunks = kernels::WeightLayout::chunks(k);
  // Work items (token blocks x row blocks of m_tiles tiles). The shared expert's pieces see every
  // token.
  const double pieces = static_cast<double>(desc.shared_pieces());
  const auto items_of = [&](int m_tiles) {
    return (active * std::ceil(per_expert / (8.0 * n_tiles)) +
            pieces * std::ceil(static_cast<double>(tokens) / (8.0 * n_tiles))) *
           static_cast<double>(tiles / m_tiles);
  };
  // 64 rows per item where registers allow: the per-chunk overhead (waits, addresses, the
  // activation loads) is then shared by four weight tiles. But 32 for the down GEMM on Hopper at
  // 1-2 tokens where 64-row items would be at most 8 per SM: each warp's chain of chunks is then
  // what takes the time (part of the weights are in L2, prefetched during the first GEMM); half the
  // rows per item halve it and give twice the items to spread (and a smaller K split). The
  // in-layer tuner (2026-12-02, H200) took 32-row down items at T=1 for all five small layers it
  // ran (gpt-oss-120b, Qwen3-235B, Qwen3-30B, Mixtral-8x7B, GLM-4.5). In the layer (H200, against
  // 99d532a, alternated three times): T=1 gpt-oss-120b 1.051x, Mixtral 1.175x, Qwen3-30B 1.030x,
  // Qwen3-235B 1.032x, GLM-4.5 1.014x, DeepSeek-V3 1.014x, GLM-5 0.995x; T=2 gpt-oss-120b 1.058x,
  // Qwen3-235B 1.015x, Mixtral 1.009x, Qwen3-30B 1.001x. With more than 8 items per SM (GLM-4.5,
  // DeepSeek-V3 at T=2) 0.99x; at T=4 gpt-oss-120b 0.958x and Mixtral 0.982x (Qwen3-30B 1.036x).
  const bool short_down = limits.wgmma && which == Gemm::kDown && n_tiles == 1 && tokens <= 2 &&
                          items_of(4) <= 8.0 * static_cast<double>(limits.sm_count);
  const int m_tiles = n_tiles == 4 || short_down ? 2 : 4;
  const double items = items_of(m_tiles);
  // Cost of a split, in chunks a warp streams: rounds of items x (chunks per item + a fixed
  // per-item cost of about 4 chunks: pipeline fill, the reduction and the epilogue).
  // A 3-way split runs as one CTA of 15 warps per SM (five groups), only where measured: Hopper.
  const bool three_way = limits.wgmma && StreamGemmLayout::max_warps(n_tiles) >= 15;
  int k_split = 1;
  double best = 0.0;
  for (int ks : {1, 2, 3, 4, 8}) {
    if (ks > chunks || (ks == 3 && !three_way)) continue;
    const double resident_warps = static_cast<double>(limits.sm_count) * (ks == 3 ? 15.0 : 16.0);
    const double rounds = std::ceil(items * ks / resident_warps);
    const double cost = rounds * (std::ceil(static_cast<double>(chunks) / ks) + 4.0);
    if (ks == 1 || cost < best) {
      best = cost;
      k_split = ks;
    }
  }

  // 16 warps per SM: two CTAs of 8 warps, or four of 4 when K is split 2 or 4 ways and four such
  // CTAs fit with 2 stages (the H200 tuner measured 4-warp CTAs 1.10x faster for GLM-5's T=1
  // first GEMM, k_split 4, at b27d22a and 55 -> 48 us at 9ed8f90, 1.09x for T=4's down GEMM,
  // k_split 2, and 8-warp CTAs 1.01-1.03x faster without a split). As deep a per-warp ring as
  // the shared memory of that many CTAs allows.
  const auto budget_for = [&](int ctas_per_sm) {
    return std::min(limits.smem_per_block_optin, limits.smem_per_sm / ctas_per_sm - 1024);
  };
  const auto deepest = [&](StreamGemmConfig c, std::int64_t budget) {
    while (c.stages < 8) {
      StreamGemmConfig next = c;
      ++next.stages;
      if (StreamGemmLayout::cta_bytes(next) > budget) break;
      c = next;
    }
    return c;
  };
  if (short_down && k_split != 3 && StreamGemmLayout::max_warps(n_tiles) >= 16) {
    // As one 16-warp CTA with a 4-stage ring (the tuner's picks: 16 or 8 warps, 3-4 stages; a ring
    // of m4's bytes in flight).
    StreamGemmConfig one = deepest({m_tiles, n_tiles, 2, 16, k_split}, budget_for(1));
    one.stages = std::min(one.stages, 4);
    if (StreamGemmLayout::cta_bytes(one) <= budget_for(1)) return one;
  }
  if (k_split == 3) {
    // GLM-5's first GEMM at T=1: 576 items in one round on 660 groups (32 chunks a warp) instead
    // of a 4-way split's 528 groups, 48 of which took a second item (PERF.md, timeline); at T=2,
    // 1088 items instead of a 2-way split's 1056 groups and its 32-item second round. On the H200
    // the layer was 1.023x faster at T=1 and 1.092x at T=2, at par at T=4-256 (2026-11-30). With
    // 2 stages, not the deepest ring: the H200 tuner timed GLM-5's first GEMM at 39.4 us with 2
    // against 40.7 with 4 at T=1, 69.6 against 70.5 at T=2.
    const StreamGemmConfig fifteen{m_tiles, n_tiles, 2, 15, 3};
    if (StreamGemmLayout::cta_bytes(fifteen) <= budget_for(1)) return fifteen;
    k_split = 4;  // no room for 15 warps with 2 stages: split 4 ways instead
  }
  StreamGemmConfig c{m_tiles, n_tiles, 2, 8, k_split};
  std::int64_t budget = budget_for(2);
  const StreamGemmConfig four{m_tiles, n_tiles, 2, 4, k_split};
  if ((k_split == 2 || k_split == 4) && StreamGemmLayout::cta_bytes(four) <= budget_for(4)) {
    c = four;
    budget = budget_for(4);
  }
  c = deepest(c, budget);
  // Or the same 16 warps as one CTA, where its ring is as deep and K is split at most 2 ways: the
  // CTA an SM starts first gets the larger share of the issue slots, so with several CTAs the
  // launch ends with the later ones (PERF.md, timeline). On the H200 16-warp CTAs with the same
  // K split and stages made the layer 1.025x faster at T=4, 1.028x at T=16 and 1.038x at T=64
  // (2026-11-30, history); at T=1, where the first GEMM splits K 4 ways, they were not faster.
  // With a 4-way split from 4 tokens too: the tuner timing whole forwards (2026-12-02) took one
  // 16-warp CTA over four 4-warp ones for Qwen3-235B's first GEMM at T=8 (1.05x) and
  // DeepSeek-V3's at T=16 (1.04x, with an 8-way split), and kept the four at T=1-2. In the layer
  // (H200, same day, alternated twice) that made Qwen3-235B 1.056x faster at T=4 and 1.040x at
  // T=8, Mixtral-8x7B 1.074x / 1.011x / 1.010x at T = 4 / 8 / 16, GLM-4.5 1.007x / 0.988x / 1.021x,
  // DeepSeek-V3 1.012x at T=16 (GLM-5 never splits 4 ways from T=4: unchanged).
  // Only where that was measured: Hopper (the devices that run the wgmma kernel).
  if (limits.wgmma && (k_split <= 2 || (k_split == 4 && tokens >= 4)) &&
      StreamGemmLayout::max_warps(n_tiles) >= 16) {
    StreamGemmConfig one = deepest({m_tiles, n_tiles, 2, 16, k_split}, budget_for(1));
    if (StreamGemmLayout::cta_bytes(one) <= budget_for(1) && one.stages >= c.stages) {
      // Without a K split, 3 stages rather than the 4 that fit: on the H200 (GLM-5, 2026-11-30,
      // every such pick at T = 2-64 set to 3 through a tune cache, alternated three times) the layer
      // was 1.019x faster at T=4, 1.015x at T=8, 1.003-1.006x at T=2, 16, 32 and 64; 2 stages were
      // as fast at T=4 and slower at T=8 (0.990x) and T=64 (0.980x).
      if (k_split == 1) one.stages = std::min(one.stages, 3);
      return one;
    }
  }
  return c;
}

namespace {

// The wgmma kernel's TMA producer runs ahead across items: as deep a ring as fits (8 stages at
// most, 3 at least).
int deepest_wgmma_ring(GemmChoice c, std::int64_t smem_per_block_optin) {
  c.stages = 8;
  while (c.stages > 3 && kernels::WgmmaGemmLayout::cta_bytes(wgmma_config(c)) > smem_per_block_optin) {
    --c.stages;
  }
  return c.stages;
}

}  // namespace

GemmChoice choose_gemm(const LayerDesc& desc, std::int64_t tokens, Gemm which, const DeviceLimits& limits) {
  const double active = desc.expected_active_experts(tokens);
  const double per_expert = static_cast<double>(tokens * desc.top_k) / active;
  GemmChoice c;
  // sm_90: the wgmma kernel from 6 tokens per expert. With 32-token blocks it streams weights at
  // about HBM rate while its tensor work stays below the decode's, so it beats the stream
  // kernel (one weight decode per 8-32 tokens) from a few tokens per expert. With a shared expert
  // from 3: the shared expert sees all T tokens, which the stream kernel takes in T/8 passes over
  // its weights, wgmma in T/32, while the small-expert launch keeps the routed experts of at most
  // 8 tokens on the stream kernel (small_expert_max). On the H200 (GLM-5, 2026-11-30, wgmma forced
  // through a tune cache against the stream pick, alternated three times) the layer was 1.065x
  // faster at T=96 (3.15 per expert here), 1.068x at T=112 and 1.10x at T=128, at par at T=80
  // (2.71), 0.983x at T=64; without a shared expert (Qwen3-235B) 0.87-0.97x at T=32-64 (2.1-4.1).
  // The small-expert launch off (an A/B switch) does not change this rule.
  const double wgmma_from = desc.shared_pieces() > 0 ? 3.0 : 6.0;
  if (limits.wgmma && per_expert >= wgmma_from) {
    c.kernel = GemmKernel::kWgmma;
    c.m_tiles = 2;
    c.k_split = 1;
    // Token blocks: 32 tokens the fastest at T=256 (the H200 tuner, f76abf9; 8 per expert here).
    // From 13 per expert, 128-token blocks with their tail launches (each expert's short last
    // block on a narrower instance, overlapping the main launch under PDL). In the layer
    // (2026-11-30, f89be95 / b901d04, GLM-5, n16 forced through a tune cache, alternated twice):
    // against 64-token blocks 1.05x at T=896, 1.08x at T=1024, 1.12-1.13x at T=1536-2048, at par at
    // T=768; against 32-token blocks 1.12-1.15x at T=640 (20 per expert), at par at T=512 (16).
    // Since the small-expert launch (9cf3d82; a89b008's tree, alternated twice) against 32-token
    // blocks: 0.90-0.94x at T=96-256, 0.969x at T=320 (10 per expert), 0.976x at T=384 (12), 1.045x
    // at T=448 (14), 1.095x at T=512 (16); 64-token blocks were within 1-2% of 128-token ones at
    // T=384-512. The tuner, which runs the launches one after another, has n16 and n8 at par.
    // From 10 per expert to 13, 64-token blocks (their 32-token tail launch takes each expert's
    // short last block): a shared expert's T tokens cost T/64 decodes of its weights instead of
    // T/32, and an expert of 33-64 tokens one block instead of two. On the H200 (2026-12-01), n8
    // against n4 in the layer, each alternated twice: GLM-5 T=384 (12 per expert) 1.046x and
    // 1.079x (two runs), T=320 (10) 1.030x and 0.996x, T=256 (8) 1.018x and 1.012x, T=192 (6)
    // 1.012x, T=128 0.979x; DeepSeek-V3 T=384 1.039x, T=320 1.014x, T=256 0.980x; Qwen3-235B
    // (no shared expert) T=128 (8) 0.988x, T=160-192 (10-12) 1.002x. Against n16: GLM-5 T=512
    // (16) 0.957x, T=640 0.990x.
    // With a shared expert, 64-token blocks from 8 per expert (T=256 for GLM-5 and DeepSeek-V3):
    // since the small-expert launch takes the experts of at most 16 tokens (b5e38df), the wgmma
    // launches hold only experts of 17 or more, and the shared expert's T tokens; a 64-token block
    // decodes its weights once where 32-token ones decode them twice. On the H200 (2026-12-03, n8
    // forced through a tune cache against n4, four series of 2-3 alternations): GLM-5 T=256 1.022x,
    // 1.003x, 1.005x (the peers' routing 1.041x), DeepSeek-V3 T=256 1.082x, 1.127x, 1.013x (1.030x);
    // at T=192 (6 per expert) 0.997-1.064x and 0.969-1.021x, at T=128-160 0.995-0.999x: no rule
    // there. Without a shared expert (Qwen3-235B, 8 per expert at T=128) n8 lost, 0.987-0.989x.
    const double n8_from = desc.shared_pieces() > 0 ? 8.0 : 10.0;
    c.n_tiles = per_expert >= 13.0 ? 16 : per_expert >= n8_from ? 8 : 4;
    c.warps = 8;  // consumer warps
    c.stages = deepest_wgmma_ring(c, limits.smem_per_block_optin);
    return c;
  }
  if (per_expert <= 24.0) {
    const StreamGemmConfig s = choose_stream_config(desc, tokens, which, limits);
    c.kernel = GemmKernel::kStream;
    c.m_tiles = s.m_tiles;
    c.n_tiles = s.n_tiles;
    c.stages = s.stages;
    c.warps = s.warps;
    c.k_split = s.k_split;
    return c;
  }
  // 256 rows x 64 tokens per CTA (32 tokens when experts see fewer than 48), as deep a
  // pipeline as one CTA per SM allows, at most 6 stages.
  c.kernel = GemmKernel::kTile;
  c.m_tiles = 2;
  c.n_tiles = per_expert >= 48.0 ? 8 : 4;
  c.warps = 8;
  c.k_split = 1;
  c.stages = 2;
  while (c.stages < 6) {
    GemmChoice next = c;
    ++next.stages;
    if (kernels::TileGemmLayout::cta_bytes(tile_config(next)) > limits.smem_per_block_optin) break;
    c = next;
  }
  return c;
}

std::vector<TailLaunch> tail_launches(const GemmChoice& c, std::int64_t smem_per_block_optin) {
  std::vector<TailLaunch> tails;
  if (c.kernel != GemmKernel::kWgmma) return tails;
  for (int i = 0; i < kernels::wgmma_tail_count(c.n_tiles); ++i) {
    const kernels::WgmmaTail t = kernels::wgmma_tail(c.n_tiles, i);
    GemmChoice tc = c;
    tc.n_tiles = t.n_tiles;
    tc.stages = deepest_wgmma_ring(tc, smem_per_block_optin);
    tails.push_back({tc, t.lo, t.hi});
  }
  return tails;
}

int tail_max(const GemmChoice& c) {
  return c.kernel == GemmKernel::kWgmma ? kernels::wgmma_tail_max(c.n_tiles) : 0;
}

bool valid_small_expert_tokens(int max_tokens) {
  return std::find(std::begin(kSmallExpertTokenBounds), std::end(kSmallExpertTokenBounds), max_tokens) !=
         std::end(kSmallExpertTokenBounds);
}

int small_expert_max(const GemmChoice& gate_up, bool enabled, int max_tokens) {
  return enabled && gate_up.kernel == GemmKernel::kWgmma ? max_tokens : 0;
}

int small_expert_min(const LayerDesc& desc) {
  // The launch saves ~2 us per GLM-5 expert (21.2 MB of weights; the H200 tuner at T=64: the stream
  // kernel 565 against wgmma's 745 us for 148 experts' gate/up, 296 against 410 for down), ~0.094
  // us per MB. It costs ~21 us (Qwen3-235B at T=256, ~3 experts of 10.6 MB small: 18 us slower in
  // the layer, 2026-11-30). So it pays from ~224 MB of small experts' weights: 11 GLM-5 experts,
  // 22 of Qwen3-235B.
  constexpr double kPaysFromBytes = 224e6;
  const double per_value = desc.format == WeightFormat::kNvfp4 ? 0.5625 : 0.53125;
  const double expert_bytes = 3.0 * static_cast<double>(desc.hidden * desc.intermediate) * per_value;
  return static_cast<int>(std::ceil(kPaysFromBytes / expert_bytes));
}

GemmChoice small_expert_choice(int small_max) {
  // m4 n1 s3 w16 (m4 n2 s2 w16); k_split 2: a split > 1 sizes the reduction area (the same for any
  // split), and the kernel chooses the split from its item count (kernels::small_launch_k_split).
  if (small_max > 8) return GemmChoice{GemmKernel::kStream, 4, 2, 2, 16, 2};
  return GemmChoice{GemmKernel::kStream, 4, 1, 3, 16, 2};
}

StreamGemmConfig stream_config(const GemmChoice& c) {
  return {c.m_tiles, c.n_tiles, c.stages, c.warps, c.k_split};
}
kernels::TileGemmConfig tile_config(const GemmChoice& c) {
  return {c.m_tiles, c.n_tiles, c.warps, c.stages};
}
kernels::WgmmaGemmConfig wgmma_config(const GemmChoice& c) {
  return {c.n_tiles, c.stages, c.warps};
}

std::int64_t smem_bytes(const GemmChoice& c) {
  switch (c.kernel) {
    case GemmKernel::kTile:
      return kernels::TileGemmLayout::cta_bytes(tile_config(c));
    case GemmKernel::kWgmma:
      return kernels::WgmmaGemmLayout::cta_bytes(wgmma_config(c));
    case GemmKernel::kStream:
      break;
  }
  return StreamGemmLayout::cta_bytes(stream_config(c));
}

std::string to_string(const StreamGemmConfig& c) {
  return fmt::format(
      "stream m{}xn{}xk{} ({} rows x {} tokens per item, K split over {} warps), {} stages, {} warps, "
      "{} B smem",
      c.m_tiles, c.n_tiles, c.k_split, 16 * c.m_tiles, 8 * c.n_tiles, c.k_split, c.stages, c.warps,
      StreamGemmLayout::cta_bytes(c));
}

}  // namespace fp4moe::gpu

namespace fp4moe {

std::string GemmChoice::to_string() const {
  if (kernel == GemmKernel::kStream) return gpu::to_string(gpu::stream_config(*this));
  if (kernel == GemmKernel::kWgmma) {
    return fmt::format(
        "wgmma n{} w{} (256 rows x {} tokens per CTA, TMA producer + {} consumer warps), {} stages, {} B "
        "smem",
        n_tiles, warps, token_block(), warps, stages, gpu::smem_bytes(*this));
  }
  return fmt::format("tile m{}xn{} ({} rows x {} tokens per CTA), {} stages, {} warps, {} B smem", m_tiles,
                     n_tiles, rows_per_item(), token_block(), stages, warps, gpu::smem_bytes(*this));
}

}  // namespace fp4moe
