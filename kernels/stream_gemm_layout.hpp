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
//   |  K in chunks of 64        |            |  same K chunks            |
//   +---------------------------+            +---------------------------+
//
// The launch's work is items x chunks units (one 64-K chunk of one item). StreamSplit below
// hands every warp of the persistent grid an equal, contiguous run of units, whatever the item
// count (a per-item split leaves warps idle in a last, partial round: at T=1 GLM-5's first GEMM
// has 576 items for 528 groups of 4 warps). A warp whose run covers a whole item stores it; an
// item cut between warps is summed from their fp32 partials in warp order (deterministic) by
// the last of them to finish, through a global workspace of two partial slots per warp.
//
// Each warp owns a ring of `stages` buffers filled with cp.async; the ring runs on across items,
// so the next item's weights stream in while the current one is stored. One stage holds, for
// one chunk of 64 K values:
//   weights  m_tiles x 512 B  (16 rows x 64 values x 4 bits, in mma fragment order)
//   scales   m_tiles x  64 B  (16 rows x 4 blocks of 16, one byte each)
//   acts     n_tiles x 1024 B (8 tokens x 64 values x bf16)
#pragma once

#include <cstdint>

namespace fp4moe::kernels {

struct StreamGemmConfig {
  int m_tiles = 1;  // 16-row mma tiles per item (1, 2 or 4)
  int n_tiles = 1;  // 8-token mma tiles per item (1, 2 or 4)
  int stages = 4;   // per-warp pipeline depth
  int warps = 8;    // warps per CTA

  constexpr bool operator==(const StreamGemmConfig& o) const {
    return m_tiles == o.m_tiles && n_tiles == o.n_tiles && stages == o.stages && warps == o.warps;
  }
};

// The (m_tiles, n_tiles) template instances compiled into the library (kernel_for in
// stream_gemm.cu switches over exactly these). Stages and warps are launch-time values. The planner and the
// launcher read this one list.
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
  static constexpr std::int64_t cta_bytes(const StreamGemmConfig& c) {
    return static_cast<std::int64_t>(c.warps) * warp_bytes(c);
  }
  static constexpr int threads(const StreamGemmConfig& c) { return c.warps * 32; }
  // Global workspace: one warp's partial accumulators of an item ([tile][q][lane] fp32), two
  // slots per warp of the grid (StreamSplit::partial_slot).
  static constexpr int partial_bytes(int m_tiles, int n_tiles) {
    return m_tiles * n_tiles * kPartialTileBytes;
  }
  static constexpr int kPartialSlotsPerWarp = 2;
  // Whether the kernel accepts the shape at all (the planner then checks the device limits).
  static constexpr bool valid(const StreamGemmConfig& c) {
    return c.stages >= 2 && c.stages <= 16 && c.warps >= 1 && c.warps <= 8;
  }
};

static_assert(StreamGemmLayout::stage_bytes({1, 1, 8, 8}) == 1664);
static_assert(StreamGemmLayout::cta_bytes({1, 1, 8, 8}) == 106496);
static_assert(StreamGemmLayout::cta_bytes({4, 1, 3, 8}) == 8 * 3 * 3328);

// The balanced split of one launch (host code and the CPU tests use it too). Units are numbered
// item-major (unit u = chunk u % chunks of item u / chunks); warp w (global: CTA * warps + warp)
// streams units [begin(w), begin(w + 1)). Only the first `warps` = min(launched warps, units)
// warps get work, so every run has at least one unit. An item is cut when its first and last
// units have different owners; those warps (first_warp .. last_warp, each a non-empty run inside
// or at the edge of the item) write their partial sums to partial_slot and count themselves in
// counter[first_warp]: first_warp owns the item's first unit and its run ends inside the item,
// so no other cut item has the same first warp.
struct StreamSplit {
  std::int64_t units = 0;   // items x chunks
  std::int64_t warps = 1;   // warps with work: min(launched warps, units)
  std::int64_t chunks = 1;  // units per item

  static constexpr StreamSplit of(std::int64_t items, std::int64_t chunks, std::int64_t launched_warps) {
    const std::int64_t units = items * chunks;
    return {units, units < launched_warps ? (units > 0 ? units : 1) : launched_warps, chunks};
  }
  constexpr std::int64_t begin(std::int64_t w) const { return w * units / warps; }
  // The warp whose run holds unit u: the largest w with begin(w) <= u.
  constexpr std::int64_t owner(std::int64_t u) const { return ((u + 1) * warps - 1) / units; }
  constexpr std::int64_t first_warp(std::int64_t item) const { return owner(item * chunks); }
  constexpr std::int64_t last_warp(std::int64_t item) const { return owner((item + 1) * chunks - 1); }
  // Slot of warp w's partial sums of item `item` (w in first_warp .. last_warp): 2w for the item
  // holding the warp's first unit, 2w + 1 for the one holding its last (a run cuts at most two).
  constexpr std::int64_t partial_slot(std::int64_t w, std::int64_t item) const {
    return 2 * w + (begin(w) / chunks == item ? 0 : 1);
  }
};

static_assert(StreamSplit::of(576, 96, 2112).owner(0) == 0);
static_assert(StreamSplit::of(576, 96, 2112).owner(576 * 96 - 1) == 2111);
static_assert(StreamSplit::of(3, 2, 100).warps == 6);

}  // namespace fp4moe::kernels
