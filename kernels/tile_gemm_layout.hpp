// Shared-memory layout of the tiled grouped GEMM (kernels/tile_gemm.cu), the prefill-path kernel.
// The single definition of the kernel's shared storage: the kernel carves its shared memory
// with these functions and the planner sizes configurations with them. Pure C++17.
//
// Work split: a CTA owns one work item = (expert, token block of 8*n_tiles tokens, row block
// of warps*m_tiles*16 weight rows). All its warps share the token block, loaded once per K
// chunk into shared memory; warp w owns rows [w*m_tiles*16, (w+1)*m_tiles*16) of the row block:
//
//          tokens (8 * n_tiles, shared by all warps)
//         +-----------------------+
//  warp 0 | m_tiles*16 rows       |   acc[m_tiles][n_tiles] m16n8 fp32 tiles per warp
//  warp 1 |                       |
//   ...   |                       |   weights: E2M1 -> bf16 x block scale in registers
//         +-----------------------+   (weight_layout.hpp), one decode per weight per CTA
//
// One pipeline stage (one K chunk of 64) holds:
//   weights+scales  (warps*m_tiles/4) row groups x 2304 B   (the fragment layout's blocks as is)
//   acts            8*n_tiles tokens x 128 B (bf16), 16-byte pieces swizzled by token % 8
#pragma once

#include <cstdint>

namespace fp4moe::kernels {

struct TileGemmConfig {
  int m_tiles = 2;  // 16-row mma tiles per warp
  int n_tiles = 8;  // 8-token mma tiles of the CTA's token block
  int warps = 8;    // warps per CTA: 8 (the copy schedule is compiled for it)
  int stages = 4;   // CTA-wide cp.async pipeline depth

  constexpr bool operator==(const TileGemmConfig& o) const {
    return m_tiles == o.m_tiles && n_tiles == o.n_tiles && warps == o.warps && stages == o.stages;
  }
};

// The (m_tiles, n_tiles) template instances compiled into the library (tile_kernel_for in
// tile_gemm.cu switches over exactly these); warps is fixed at 8, stages is a launch-time value.
// The planner and the launcher read this one list.
inline constexpr int kTileShapes[][2] = {{2, 8}, {2, 4}};

struct TileGemmLayout {
  static constexpr int kWarps = 8;
  static constexpr int kBlockBytes = 2304;  // one (64-row group, 64-K chunk) weight block
  static constexpr int kActRowBytes = 128;  // 64 bf16 of one token
  static constexpr int kStageAlign = 128;

  static constexpr int groups(const TileGemmConfig& c) { return c.warps * c.m_tiles / 4; }
  static constexpr int rows(const TileGemmConfig& c) { return c.warps * c.m_tiles * 16; }
  static constexpr int tokens(const TileGemmConfig& c) { return c.n_tiles * 8; }
  static constexpr int weight_offset(const TileGemmConfig&) { return 0; }
  static constexpr int act_offset(const TileGemmConfig& c) { return groups(c) * kBlockBytes; }
  static constexpr int stage_bytes(const TileGemmConfig& c) {
    const int raw = act_offset(c) + tokens(c) * kActRowBytes;
    return (raw + kStageAlign - 1) / kStageAlign * kStageAlign;
  }
  static constexpr std::int64_t cta_bytes(const TileGemmConfig& c) {
    return static_cast<std::int64_t>(c.stages) * stage_bytes(c);
  }
  static constexpr int threads(const TileGemmConfig& c) { return c.warps * 32; }
  static constexpr bool valid(const TileGemmConfig& c) {
    return c.warps == kWarps && (c.warps * c.m_tiles) % 4 == 0 && c.stages >= 2 && c.stages <= 8;
  }
};

static_assert(TileGemmLayout::stage_bytes({2, 8, 8, 4}) == 4 * 2304 + 64 * 128);
static_assert(TileGemmLayout::cta_bytes({2, 8, 8, 4}) == 4 * 17408);

}  // namespace fp4moe::kernels
