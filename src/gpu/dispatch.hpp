// The dispatcher: heuristics (tuned on an H200) that choose the kernel and configuration of each
// expert GEMM for a forward of T tokens. They are the default of the layer's decision
// (planner::pick_layer_gemm), which runs them only when the planner accepts them on the device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// The stream GEMM configuration for GEMM `which` at T tokens on a device with these limits.
kernels::StreamGemmConfig choose_stream_config(const LayerDesc& desc, std::int64_t tokens, Gemm which,
                                               const DeviceLimits& limits);

// The kernel and configuration for GEMM `which` at T tokens: the stream kernel while an expert
// sees few tokens (weight bytes dominate), the tiled kernel once each decoded weight can be
// reused for 32 or more tokens.
GemmChoice choose_gemm(const LayerDesc& desc, std::int64_t tokens, Gemm which, const DeviceLimits& limits);

// The tail launches that run after a wgmma GEMM of choice c (kernels::wgmma_tail): each expert's
// last block, when it holds at most half of c's tokens, runs on a narrower wgmma instance, widest
// first, each with the deepest ring (at most 8 stages) that fits smem_per_block_optin. Empty for
// the other kernels and for 32-token blocks.
struct TailLaunch {
  GemmChoice choice;
  int lo = 0, hi = 0;  // the launch takes last blocks of r tokens, lo < r <= hi
};
std::vector<TailLaunch> tail_launches(const GemmChoice& c, std::int64_t smem_per_block_optin);
// The largest last block c's tail launches take (GroupArgs::tb_tail); 0 without tail launches.
int tail_max(const GemmChoice& c);

// The small-expert launch (kernels::StreamGemmArgs::small_launch). Where the first GEMM runs on
// wgmma, an expert with at most kSmallExpertTokens tokens runs whole on the stream kernel, in one
// launch after each wgmma GEMM's own: the wgmma kernel's time per block barely depends on its
// tokens below 32 (its decode bounds it), and the stream kernel streams such an expert's weights
// faster (the H200 tuner at T=64: 565 against 745 us for the first GEMM, 296 against 410 for
// the second). Both GEMMs take the same experts, or the second none (a stream second GEMM takes
// every expert): the small experts' h is written in natural k order, which only the stream kernel
// reads.
// kSmallExpertTokens is the default bound (MoeLayerOptions::small_expert_tokens): items of two
// 8-token tiles, whose experts of at most 8 tokens skip the second tile; 8 is the other bound
// compiled (one tile, a deeper ring). On the H200 (2026-12-01, 16 against 8, alternated four times)
// GLM-5 was 1.016x faster at T=128, 1.040x at T=160, 1.024x at T=256, at par at T=96, 192 and
// 1024; Qwen3-235B 1.062x at T=96, 1.055x at T=192, 1.114x at T=256, 0.987x at T=128 and 0.989x
// at T=384 (where neither bound takes any expert).
inline constexpr int kSmallExpertTokens = 16;
inline constexpr int kSmallExpertTokenBounds[] = {8, 16};
bool valid_small_expert_tokens(int max_tokens);
// The most tokens an expert of the small-expert launch holds under the first GEMM's choice
// (GroupArgs::tb_small of a wgmma GEMM), max_tokens (one of kSmallExpertTokenBounds) when the
// launch is enabled; 0: no small-expert launch.
int small_expert_max(const GemmChoice& gate_up, bool enabled, int max_tokens = kSmallExpertTokens);
// The fewest small experts for which the small-expert launch takes them (GroupArgs::small_min; the
// routing's scan decides per forward): with fewer, the launch's own cost exceeds what it saves.
int small_expert_min(const LayerDesc& desc);
// Its configuration for experts of at most small_max tokens: 64-row items of one 8-token tile (8),
// or of two (16), one CTA of 16 warps per SM with a 3-stage ring (the dispatcher's stream pick for
// a few tokens per expert on the H200), 2 stages with two tiles (3 do not fit beside the
// reduction area), and room for the K split that the kernel chooses from the number of small
// experts (kernels::small_launch_k_split; the configuration's k_split is 2, which sizes that room
// for any split).
GemmChoice small_expert_choice(int small_max = kSmallExpertTokens);

kernels::StreamGemmConfig stream_config(const GemmChoice& c);
kernels::TileGemmConfig tile_config(const GemmChoice& c);
kernels::WgmmaGemmConfig wgmma_config(const GemmChoice& c);
std::int64_t smem_bytes(const GemmChoice& c);

std::string to_string(const kernels::StreamGemmConfig& c);

}  // namespace fp4moe::gpu
