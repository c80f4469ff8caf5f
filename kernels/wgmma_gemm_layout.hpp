// Shared-memory layout of the wgmma grouped GEMM (kernels/wgmma_gemm.cu), the SM90 prefill
// kernel. The single definition of its shared storage, for the kernel and the planner. C++17.
//
// Work split: a CTA owns one item at a time = (expert, token block of 8*n_tiles tokens, 256
// weight rows) and walks the items round-robin (persistent). Warpgroup 0 is the producer: one
// thread fills the stage ring with TMA (bulk copies of the weight blocks, a tensor copy of the
// token block) and signals each stage on its "full" mbarrier. Warpgroups 1 and 2 consume:
// consumer warpgroup w covers rows [128w, 128w + 128) with two m64 wgmma instructions per
// k-step; inside them, warp i of the group holds rows 16i..16i+15 of each 64 as the A operand in
// registers (E2M1 decoded with its block scale, weight_layout.hpp), and the token block is the B
// operand, read by the tensor cores from shared memory (128-byte swizzle). Every consumer
// thread arrives on the stage's "empty" mbarrier once its warp's wgmmas of that stage are done.
//
// One pipeline stage (one K chunk of 64):
//   weights+scales  4 row groups x 2304 B  (the fragment layout's blocks as they are)
//   acts            8*n_tiles tokens x 128 B, 16-byte pieces swizzled by token % 8 (the wgmma
//                   128B-swizzle K-major layout, which TMA's SWIZZLE_128B writes), starting on a
//                   1024-byte boundary
// After the stages: a full and an empty mbarrier (8 B each) per stage, then per consumer warp a
// 1 KB buffer through which the down GEMM's epilogue turns its accumulators into token rows
// (stmatrix .trans: 32 tokens x 16 weight rows in bf16), so that each lane stores 16 bytes of one
// token at a time instead of 2 (the first GEMM's instances have it too and leave it unused).
// The activations are k-permuted (mma-k order) in global memory beforehand, so the tensor cores
// pair them with the permuted weight fragments.
#pragma once

#include <cstdint>

namespace fp4moe::kernels {

struct WgmmaGemmConfig {
  int n_tiles = 16;  // 8-token tiles per item: 4 (32 tokens), 8 (64 tokens) or 16 (128 tokens)
  int stages = 4;
  // Consumer warps: 8 (two warpgroups, 128 rows and two m64 blocks each) or 16 (four
  // warpgroups, 64 rows each: twice the warps to hide the decode's latency, half the
  // accumulators per thread).
  int consumer_warps = 8;

  constexpr bool operator==(const WgmmaGemmConfig& o) const {
    return n_tiles == o.n_tiles && stages == o.stages && consumer_warps == o.consumer_warps;
  }
};

// The (n_tiles, consumer_warps) template instances compiled into the library (wgmma_kernel_for
// in wgmma_gemm.cu switches over exactly these); stages is a launch-time value. The planner and
// the launcher read this one list.
struct WgmmaShape {
  int n_tiles;
  int consumer_warps;
};
// 8 consumer warps: two warpgroups of 128 rows (two m64 blocks each, 232 registers). 16: four
// warpgroups of 64 rows (104 registers each; n16 would spill, so 32 and 64 tokens only), twice
// the warps to hide the decode's latency at the cost of more per-chunk overhead per row.
inline constexpr WgmmaShape kWgmmaShapes[] = {{4, 8}, {8, 8}, {16, 8}, {4, 16}, {8, 16}};

struct WgmmaGemmLayout {
  static constexpr int kProducerWarps = 4;  // one warpgroup (one thread of it issues the copies)
  static constexpr int kBarrierBytes = 16;  // per stage: full + empty mbarrier
  static constexpr int kRows = 256;
  static constexpr int kGroups = 4;
  static constexpr int kBlockBytes = 2304;
  static constexpr int kActRowBytes = 128;
  static constexpr int kAlign = 1024;  // the 128-byte swizzle pattern repeats every 1024 bytes

  static constexpr int tokens(const WgmmaGemmConfig& c) { return c.n_tiles * 8; }
  static constexpr int act_offset(const WgmmaGemmConfig&) {
    return kGroups * kBlockBytes;
  }  // 9216 = 9 x 1024
  static constexpr int stage_bytes(const WgmmaGemmConfig& c) {
    const int raw = act_offset(c) + tokens(c) * kActRowBytes;
    return (raw + kAlign - 1) / kAlign * kAlign;
  }
  // From the aligned base: the mbarriers follow the stages.
  static constexpr int barrier_offset(const WgmmaGemmConfig& c) { return c.stages * stage_bytes(c); }
  // The epilogue's buffers: 32 tokens x 16 rows x bf16 per consumer warp, from a 128-byte boundary.
  static constexpr int kEpilogueTokens = 32;
  static constexpr int kEpilogueWarpBytes = kEpilogueTokens * 16 * 2;
  static constexpr int epilogue_offset(const WgmmaGemmConfig& c) {
    return (barrier_offset(c) + c.stages * kBarrierBytes + 127) / 128 * 128;
  }
  static constexpr int epilogue_bytes(const WgmmaGemmConfig& c) {
    return c.consumer_warps * kEpilogueWarpBytes;
  }
  // The dynamic allocation: the stages, their mbarriers, the epilogue's buffers, and slack to align
  // the first stage to 1024 bytes.
  static constexpr std::int64_t cta_bytes(const WgmmaGemmConfig& c) {
    return static_cast<std::int64_t>(epilogue_offset(c)) + epilogue_bytes(c) + kAlign;
  }
  static constexpr int threads(const WgmmaGemmConfig& c) { return (kProducerWarps + c.consumer_warps) * 32; }
  // Registers per thread after setmaxnreg. NOTE: the pool is the CTA's own allocation (threads x
  // the count the kernel was compiled to), not the SM's register file: setmaxnreg.inc waits
  // forever for registers the producer did not give back. 8 consumer warps, compiled to 168:
  // 128 x 40 + 256 x 232 = 64512 = 384 x 168; 16 consumer warps, compiled to 96:
  // 128 x 40 + 512 x 104 = 58368 <= 640 x 96.
  // A tail instance (wgmma_tail) gives its producer 48 (with 40 ptxas spilled its item walk) and
  // its consumers 8 fewer where they have 232 (its 32 or 64 tokens need far fewer).
  static constexpr int producer_regs(bool tail) { return tail ? 48 : 40; }
  static constexpr int consumer_regs(const WgmmaGemmConfig& c, bool tail = false) {
    return c.consumer_warps == 8 ? (tail ? 224 : 232) : 104;
  }
  static constexpr std::int64_t register_demand(const WgmmaGemmConfig& c, bool tail = false) {
    return static_cast<std::int64_t>(kProducerWarps) * 32 * producer_regs(tail) +
           static_cast<std::int64_t>(c.consumer_warps) * 32 * consumer_regs(c, tail);
  }
  // Arrivals that free a stage: every consumer thread, since an arrive releases only the
  // arriving thread's own reads of the stage (PTX memory model).
  static constexpr int empty_arrivals(const WgmmaGemmConfig& c) { return c.consumer_warps * 32; }
  static constexpr bool compiled(const WgmmaGemmConfig& c) {
    for (const WgmmaShape& s : kWgmmaShapes) {
      if (s.n_tiles == c.n_tiles && s.consumer_warps == c.consumer_warps) return true;
    }
    return false;
  }
  static constexpr bool valid(const WgmmaGemmConfig& c) {
    // 3+: the consumers hold two stages (the chunk in the tensor cores and the one decoded next)
    return compiled(c) && c.stages >= 3 && c.stages <= 8;
  }
};

// Token blocks of an expert with `count` tokens in the main launch of a GEMM with blocks of
// `block` tokens, when tail launches take a last block of at most `tail_max` tokens (0: no tail
// launches, every block is the main launch's) and the small-expert launch takes every expert of at
// most `small_max` tokens whole (0: none; GroupArgs::tb_small). The routing's scan and the host
// share this rule.
constexpr int main_token_blocks(int count, int block, int tail_max, int small_max = 0) {
  if (count <= small_max) return 0;
  return count / block + (count % block > tail_max ? 1 : 0);
}

// Tail launches (wgmma only): an expert's last r = count % block tokens, 0 < r <= block / 2, run as
// one block of a narrower instance, so the tensor cores skip most of the padding of that block.
// A 128-token main block leaves r in (32, 64] to a 64-token instance and r <= 32 to a 32-token
// one; a 64-token block leaves r <= 32 to the 32-token one. The narrowest instance has none.
struct WgmmaTail {
  int n_tiles;  // the tail instance's 8-token tiles
  int lo, hi;   // it takes r in (lo, hi]
};
constexpr int wgmma_tail_count(int n_tiles) {
  return n_tiles == 16 ? 2 : (n_tiles == 8 ? 1 : 0);
}
// The most tail launches any main launch has: the routing's per-GEMM tail lists and counts are
// sized for this many (GroupArgs::tail_experts, the layer's workspace).
inline constexpr int kMaxWgmmaTails = 2;
constexpr WgmmaTail wgmma_tail(int n_tiles, int i) {
  // i = 0: the widest tail instance, half the main block.
  const int half = n_tiles / 2;
  const bool last = i + 1 == wgmma_tail_count(n_tiles);
  const int nt = half >> i;
  return {nt, last ? 0 : 4 * nt, 8 * nt};
}
// The largest last block a main launch of n_tiles leaves to its tail launches.
constexpr int wgmma_tail_max(int n_tiles) {
  return wgmma_tail_count(n_tiles) > 0 ? 4 * n_tiles : 0;
}
// The tail launch (index i of wgmma_tail) that takes the last block of an expert with `count`
// tokens, under main blocks of `block` tokens whose tail launches take at most `tail_max` (0: none);
// -1 when no tail launch does (also for an expert of at most `small_max` tokens, which the
// small-expert launch takes). The routing's scan lists each tail launch's experts by this rule.
constexpr int wgmma_tail_class(int count, int block, int tail_max, int small_max = 0) {
  if (count <= small_max) return -1;
  const int r = count % block;
  if (tail_max == 0 || r == 0 || r > tail_max) return -1;
  for (int i = 0; i < wgmma_tail_count(block / 8); ++i) {
    const WgmmaTail t = wgmma_tail(block / 8, i);
    if (r > t.lo && r <= t.hi) return i;
  }
  return -1;
}

static_assert(wgmma_tail_count(16) <= kMaxWgmmaTails && wgmma_tail_count(8) <= kMaxWgmmaTails);
static_assert(wgmma_tail_max(16) == 64 && wgmma_tail_max(8) == 32 && wgmma_tail_max(4) == 0);
static_assert(wgmma_tail(16, 0).n_tiles == 8 && wgmma_tail(16, 0).lo == 32 && wgmma_tail(16, 0).hi == 64);
static_assert(wgmma_tail(16, 1).n_tiles == 4 && wgmma_tail(16, 1).lo == 0 && wgmma_tail(16, 1).hi == 32);
static_assert(wgmma_tail(8, 0).n_tiles == 4 && wgmma_tail(8, 0).lo == 0 && wgmma_tail(8, 0).hi == 32);
static_assert(main_token_blocks(142, 128, 64) == 1 && main_token_blocks(200, 128, 64) == 2);
static_assert(main_token_blocks(64, 128, 64) == 0 && main_token_blocks(65, 128, 0) == 1);
static_assert(wgmma_tail_class(128 + 33, 128, 64) == 0 && wgmma_tail_class(256 + 32, 128, 64) == 1);
static_assert(wgmma_tail_class(1, 64, 32) == 0 && wgmma_tail_class(33, 64, 32) == -1);
static_assert(wgmma_tail_class(128, 128, 64) == -1 && wgmma_tail_class(5, 128, 0) == -1);
static_assert(main_token_blocks(8, 32, 0, 8) == 0 && main_token_blocks(9, 32, 0, 8) == 1);
static_assert(wgmma_tail_class(8, 128, 64, 8) == -1 && wgmma_tail_class(9, 128, 64, 8) == 1);

static_assert(WgmmaGemmLayout::act_offset({}) % WgmmaGemmLayout::kAlign == 0);
static_assert(WgmmaGemmLayout::stage_bytes({16, 4}) == 9216 + 16384);
// The largest configuration: 8 stages, their mbarriers, 8 warps' epilogue buffers and the slack,
// within Hopper's 232448-byte opt-in limit per block.
static_assert(WgmmaGemmLayout::cta_bytes({16, 8, 8}) == 8 * 25600 + 128 + 8 * 1024 + 1024);
static_assert(WgmmaGemmLayout::cta_bytes({16, 8, 8}) <= 232448);

}  // namespace fp4moe::kernels
