// Shared-memory layout of the weight-streaming grouped GEMM (kernels/stream_gemm.cu), the
// decode-path kernel. This header is the single definition of the kernel's shared storage:
// the kernel carves its shared memory with these functions (and static_asserts on them), and
// the planner sizes configurations with the same functions, so a plan that fits always launches.
// Pure C++17 (no CUDA headers): host code includes it too.
//
// Work split:
//
//   weights of one expert [N rows, K]        activations of that expert's tokens [M, K]
//   +---------------------------+            +---------------------------+
//   | item: m_tiles*16 rows     | x          | n_tiles*8 tokens          |   -> acc[m_tiles*16 x n_tiles*8]
//   |  K split over k_split     |            |  same K chunks            |
//   |  warps, chunks of 64      |            |                           |
//   +---------------------------+            +---------------------------+
//
// A CTA of `warps` warps holds warps / k_split groups; the k_split warps of a group share one
// item, each streaming a contiguous part of K, and add their partial sums through shared memory
// in a fixed order (deterministic). Each warp owns a ring of `stages` buffers filled with
// cp.async; the ring runs on across items, so the next item's weights stream in while the
// current one is reduced and written. One stage holds, for one chunk of 64 K values:
//   weights  m_tiles x 512 B  (16 rows x 64 values x 4 bits, in mma fragment order)
//   scales   m_tiles x  64 B  (16 rows x 4 blocks of 16, one byte each)
//   acts     n_tiles x 1024 B (8 tokens x 64 values x bf16)
// After the rings: the reduction area, one partial accumulator tile set per warp
// (m_tiles x n_tiles x 4 floats x 32 lanes), present only when k_split > 1.
#pragma once

#include <cstdint>

namespace fp4moe::kernels {

struct StreamGemmConfig {
  int m_tiles = 1;  // 16-row mma tiles per item (1, 2 or 4)
  int n_tiles = 1;  // 8-token mma tiles per item (1, 2 or 4)
  int stages = 4;   // per-warp pipeline depth
  int warps = 8;    // warps per CTA (up to 16; 8 with 4 token tiles)
  int k_split = 1;  // warps sharing one item (1, 2, 3, 4 or 8; divides warps)

  constexpr bool operator==(const StreamGemmConfig& o) const {
    return m_tiles == o.m_tiles && n_tiles == o.n_tiles && stages == o.stages && warps == o.warps &&
           k_split == o.k_split;
  }
};

// The (m_tiles, n_tiles) template instances compiled into the library (kernel_for in
// stream_gemm.cu switches over exactly these). Stages, warps and the K split are launch-time
// values. The planner and the launcher read this one list.
inline constexpr int kStreamTileShapes[][2] = {{1, 1}, {2, 1}, {4, 1}, {1, 2},
                                               {2, 2}, {4, 2}, {1, 4}, {2, 4}};

struct StreamGemmLayout {
  static constexpr int kChunkK = 64;            // K values per pipeline stage
  static constexpr int kWeightTileBytes = 512;  // 16 x 64 x 0.5
  static constexpr int kScaleTileBytes = 64;    // 16 x 4
  static constexpr int kActTileBytes = 1024;    // 8 x 64 x 2
  static constexpr int kStageAlign = 128;
  static constexpr int kPartialTileBytes = 4 * 32 * 4;  // one m16n8 fp32 accumulator tile

  static constexpr int weight_offset(const StreamGemmConfig&) { return 0; }
  static constexpr int scale_offset(const StreamGemmConfig& c) { return c.m_tiles * kWeightTileBytes; }
  static constexpr int act_offset(const StreamGemmConfig& c) {
    return scale_offset(c) + c.m_tiles * kScaleTileBytes;
  }
  static constexpr int stage_bytes(const StreamGemmConfig& c) {
    const int raw = act_offset(c) + c.n_tiles * kActTileBytes;
    return (raw + kStageAlign - 1) / kStageAlign * kStageAlign;
  }
  static constexpr int warp_bytes(const StreamGemmConfig& c) { return c.stages * stage_bytes(c); }
  static constexpr int partial_bytes_per_warp(const StreamGemmConfig& c) {
    return c.k_split > 1 ? c.m_tiles * c.n_tiles * kPartialTileBytes : 0;
  }
  static constexpr std::int64_t reduction_offset(const StreamGemmConfig& c) {
    return static_cast<std::int64_t>(c.warps) * warp_bytes(c);
  }
  static constexpr std::int64_t cta_bytes(const StreamGemmConfig& c) {
    return reduction_offset(c) + static_cast<std::int64_t>(c.warps) * partial_bytes_per_warp(c);
  }
  static constexpr int threads(const StreamGemmConfig& c) { return c.warps * 32; }
  // Warps per CTA the instance is compiled for: 16 (one CTA of 512 threads, 128 registers each),
  // or 8 for 4 token tiles, whose instances may take more registers (kernels/stream_gemm.cu).
  static constexpr int max_warps(int n_tiles) { return n_tiles == 4 ? 8 : 16; }
  // Whether the kernel accepts the shape at all (the planner then checks the device limits).
  static constexpr bool valid(const StreamGemmConfig& c) {
    return c.stages >= 2 && c.stages <= 16 && c.warps >= 1 && c.warps <= max_warps(c.n_tiles) &&
           (c.k_split == 1 || c.k_split == 2 || c.k_split == 3 || c.k_split == 4 || c.k_split == 8) &&
           c.warps % c.k_split == 0;
  }
};

static_assert(StreamGemmLayout::stage_bytes({1, 1, 8, 8, 1}) == 1664);
// The K split of the small-expert launch (StreamGemmArgs::small_launch), which its kernel chooses
// from its item count: how many experts are small is known only on the device. The split whose
// rounds of items cost the fewest chunks per warp (the dispatcher's rule in choose_stream_config,
// a fixed cost of ~4 chunks per item), among 1, 2, 4 and 8 ways; ties go to the smaller split. A
// few small experts then spread their K over the idle warps instead of leaving one round of long
// items after the GEMM's other launches.
constexpr int small_launch_k_split(std::int64_t items, int chunks, std::int64_t resident_warps) {
  int best_split = 1;
  std::int64_t best = -1;
  for (int k = 1; k <= 8 && k <= chunks; k *= 2) {
    const std::int64_t rounds = (items * k + resident_warps - 1) / resident_warps;
    const std::int64_t cost = rounds * ((chunks + k - 1) / k + 4);
    if (best < 0 || cost < best) {
      best = cost;
      best_split = k;
    }
  }
  return best_split;
}
static_assert(small_launch_k_split(0, 96, 2112) == 1);
static_assert(small_launch_k_split(80 * 64, 96, 2112) == 2);  // GLM-5 gate/up, 80 small experts
static_assert(small_launch_k_split(80 * 96, 32, 2112) == 1);  // GLM-5 down
static_assert(small_launch_k_split(3 * 48, 64, 2112) == 8);   // Qwen3-235B gate/up, 3 small experts

static_assert(StreamGemmLayout::cta_bytes({1, 1, 8, 8, 1}) == 106496);
static_assert(StreamGemmLayout::cta_bytes({4, 1, 3, 8, 4}) == 8 * 3 * 3328 + 8 * 4 * 512);

}  // namespace fp4moe::kernels
