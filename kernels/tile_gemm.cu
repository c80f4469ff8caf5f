// Tiled grouped GEMM for many tokens per expert (prefill): the CTA shares one token block in
// shared memory and each warp decodes its own weight rows once for all of the block's tokens
// (see tile_gemm_layout.hpp for the work split). mma.sync m16n8k16 bf16 with fp32 accumulators;
// runs on sm_80 and newer. The weights' fragment layout, the k-permutation and the decode are
// the stream kernel's (weight_layout.hpp), so both kernels read the same uploaded weights.
//
// Pipeline: a classic CTA-wide cp.async ring of `stages` K chunks; every thread copies a share
// of the chunk's weight blocks and token rows, then all warps compute on the oldest stage.
// Activation rows past K (the K tail) are zero-filled so that zero weights never meet NaN.
#include "fp4moe/detail/portable_math.hpp"
#include "kernels/common.cuh"
#include "kernels/epilogue.cuh"
#include "kernels/launch.hpp"
#include "kernels/tile_gemm_layout.hpp"
#include "kernels/weight_layout.hpp"

namespace fp4moe::kernels {

template <int MT, int NT, StreamEpilogue EPI>
__global__ void __launch_bounds__(256, 1) fp4moe_tile_gemm(const StreamGemmArgs p, const int stages) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  constexpr int kWarps = TileGemmLayout::kWarps;
  constexpr int kThreads = kWarps * 32;
  constexpr int kTokens = NT * 8;
  constexpr TileGemmConfig kShape{MT, NT, kWarps, 2};
  constexpr int kGroups = TileGemmLayout::groups(kShape);
  constexpr int kActOff = TileGemmLayout::act_offset(kShape);
  constexpr int kActPieces = kTokens * 8 / kThreads;  // 16-byte token pieces per thread per chunk
  static_assert(kTokens * 8 % kThreads == 0 && kGroups <= kWarps);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int stage_bytes = TileGemmLayout::stage_bytes({MT, NT, kWarps, stages});
  const std::uint32_t base = smem_addr(smem);
  // This lane's two B piece offsets (k-steps 0-1 and 2-3) within a token tile's 1 KB.
  const std::uint32_t b_off[2] = {static_cast<std::uint32_t>(swizzle128_offset(g, 2 * t)),
                                  static_cast<std::uint32_t>(swizzle128_offset(g, 2 * t + 1))};

  pdl_wait();
  pdl_launch_dependents();

  const int n_active = *p.n_active;
  const int expert_groups = (p.rows + WeightLayout::kGroupRows - 1) / WeightLayout::kGroupRows;
  // Items: (active expert, token block) major, row block minor; row_blocks is per CTA row block.
  const std::int64_t total_items = static_cast<std::int64_t>(p.tb_prefix[n_active]) * p.row_blocks;
  int cursor = 0;
  for (std::int64_t item = blockIdx.x; item < total_items; item += gridDim.x) {
    const int pb = static_cast<int>(item / p.row_blocks);
    const int rb = static_cast<int>(item % p.row_blocks);
    while (cursor + 1 < n_active && p.tb_prefix[cursor + 1] <= pb) ++cursor;
    const int expert = p.active[cursor];
    const int slot0 = p.offsets[expert] + (pb - p.tb_prefix[cursor]) * kTokens;
    const int m_count = min(kTokens, p.offsets[expert + 1] - slot0);
    const int group0 = rb * kGroups;  // first 64-row group of the block

    // What this thread copies each chunk, fixed for the item: warp w < kGroups copies row
    // group w's 2304-byte block (groups past the expert's last are never read: their rows are
    // never stored); every thread copies kActPieces 16-byte pieces of the token rows.
    const std::uint8_t* wsrc = nullptr;
    if (warp < kGroups && group0 + warp < expert_groups) {
      wsrc = p.weights + static_cast<std::int64_t>(expert) * p.expert_stride +
             static_cast<std::int64_t>(group0 + warp) * p.n_chunks * WeightLayout::kBlockBytes;
    }
    const std::uint16_t* asrc[kActPieces];
    std::uint32_t adst[kActPieces];
    bool avalid[kActPieces];
#pragma unroll
    for (int i = 0; i < kActPieces; ++i) {
      const int piece = threadIdx.x + i * kThreads;
      const int r = piece >> 3;
      const int c = piece & 7;
      avalid[i] = r < m_count;
      const std::int64_t row =
          !avalid[i] ? 0 : (p.slot_token != nullptr ? p.slot_token[slot0 + r] : slot0 + r);
      asrc[i] = p.act + row * p.act_ld + c * 8;
      adst[i] = static_cast<std::uint32_t>(kActOff + swizzle128_offset(r, c));
    }
    const int k_pieces = p.k / 8;  // 16-byte pieces of a token row; a piece at or past it is K tail

    int issue_slot = 0;
    auto issue = [&](int chunk) {
      const std::uint32_t st = base + issue_slot * stage_bytes;
      issue_slot = issue_slot + 1 == stages ? 0 : issue_slot + 1;
      if (wsrc != nullptr) {
        const std::uint8_t* blk = wsrc + static_cast<std::int64_t>(chunk) * WeightLayout::kBlockBytes;
        const std::uint32_t dst = st + warp * WeightLayout::kBlockBytes;
#pragma unroll
        for (int q = 0; q < 5; ++q) {
          const int piece = lane + 32 * q;  // 144 pieces of 16 B
          if (q < 4 || piece < 144) cp_async16(dst + piece * 16, blk + piece * 16);
        }
      }
#pragma unroll
      for (int i = 0; i < kActPieces; ++i) {
        const int kp = chunk * 8 + (threadIdx.x & 7);
        const bool valid = avalid[i] && kp < k_pieces;
        cp_async16_zfill(st + adst[i], asrc[i] + (valid ? chunk * WeightLayout::kChunkK : 0), valid);
      }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

    const int n_chunks = p.n_chunks;
    for (int c = 0; c < stages - 1; ++c) {
      if (c < n_chunks) issue(c);
      cp_async_commit();
    }
    int slot = 0;
    for (int c = 0; c < n_chunks; ++c) {
      cp_async_wait_dynamic(stages - 2);
      __syncthreads();  // chunk c is visible to all; every warp is done with chunk c - 1
      if (c + stages - 1 < n_chunks) issue(c + stages - 1);
      cp_async_commit();

      const std::uint32_t st = base + slot * stage_bytes;
      slot = slot + 1 == stages ? 0 : slot + 1;
      // This warp's weight tiles and their scale factors for the chunk.
      uint4 wq[MT];
      std::uint32_t s_g[MT], s_g8[MT];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int tile = warp * MT + i;
        const std::uint32_t blk = st + (tile >> 2) * WeightLayout::kBlockBytes;
        wq[i] = lds128(blk + (tile & 3) * WeightLayout::kTileWeightBytes + lane * 16);
        const std::uint32_t sc = lds16(blk + WeightLayout::kBlockWeightBytes +
                                       (tile & 3) * WeightLayout::kTileScaleBytes + lane * 2);
        s_g[i] = scale_pair_from_bytes(__byte_perm(sc, 0, 0x4040));
        s_g8[i] = scale_pair_from_bytes(__byte_perm(sc, 0, 0x4141));
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // k-steps 2h and 2h+1: one LDS.128 per token tile
        uint4 bq[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j)
          bq[j] = lds128(st + kActOff + j * 8 * TileGemmLayout::kActRowBytes + b_off[h]);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
#pragma unroll
          for (int ss = 0; ss < 2; ++ss) {
            const int step = 2 * h + ss;
            const std::uint32_t word = step == 0   ? wq[i].x
                                       : step == 1 ? wq[i].y
                                       : step == 2 ? wq[i].z
                                                   : wq[i].w;
            std::uint32_t a[4];
            decode_e2m1x8(word, a);
            a[0] = bf16x2_mul(a[0], s_g[i]);
            a[1] = bf16x2_mul(a[1], s_g8[i]);
            a[2] = bf16x2_mul(a[2], s_g[i]);
            a[3] = bf16x2_mul(a[3], s_g8[i]);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
              mma_bf16_16816(acc[i][j], a, ss == 0 ? bq[j].x : bq[j].z, ss == 0 ? bq[j].y : bq[j].w);
            }
          }
        }
      }
    }
    cp_async_wait<0>();

    // Epilogue: lane holds rows g, g+8 of each tile for tokens 8j + 2t + {0, 1}.
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      // tile index within the expert; its scales, biases and columns read before its stores
      const TileOut o = tile_out<EPI>(p, expert, group0 * 4 + warp * MT + i, g);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int n = 8 * j + 2 * t + q;
          if (n < m_count) store_token<EPI>(p, o, out_row_ptr(p, slot0 + n), acc[i][j][q], acc[i][j][2 + q]);
        }
      }
    }
    __syncthreads();  // the next item's prologue overwrites the stages
  }
}

namespace {

using TileKernelFn = void (*)(const StreamGemmArgs, const int);

template <int MT, int NT>
TileKernelFn tile_pick_epilogue(StreamEpilogue epi) {
  switch (epi) {
    case StreamEpilogue::kSwiGLU:
      return fp4moe_tile_gemm<MT, NT, StreamEpilogue::kSwiGLU>;
    case StreamEpilogue::kSwiGLUClamped:
      return fp4moe_tile_gemm<MT, NT, StreamEpilogue::kSwiGLUClamped>;
    case StreamEpilogue::kStoreBf16:
      return fp4moe_tile_gemm<MT, NT, StreamEpilogue::kStoreBf16>;
  }
  return nullptr;
}

// The one place where run-time tile shapes become template instances (kTileShapes).
TileKernelFn tile_kernel_for(const TileGemmConfig& c, StreamEpilogue epi) {
  switch (c.m_tiles * 10 + c.n_tiles) {
    case 28:
      return tile_pick_epilogue<2, 8>(epi);
    case 24:
      return tile_pick_epilogue<2, 4>(epi);
    default:
      return nullptr;
  }
}

}  // namespace

cudaError_t tile_gemm_setup(const TileGemmConfig& config, StreamEpilogue epilogue,
                            KernelAttributes* attributes) {
  const TileKernelFn fn = tile_kernel_for(config, epilogue);
  if (fn == nullptr || !TileGemmLayout::valid(config)) return cudaErrorInvalidValue;
  return setup_kernel(fn, TileGemmLayout::threads(config),
                      static_cast<int>(TileGemmLayout::cta_bytes(config)), attributes);
}

cudaError_t launch_tile_gemm(const StreamGemmArgs& args, const TileGemmConfig& config,
                             StreamEpilogue epilogue, int grid, bool pdl, cudaStream_t stream) {
  const TileKernelFn fn = tile_kernel_for(config, epilogue);
  if (fn == nullptr || !TileGemmLayout::valid(config)) return cudaErrorInvalidValue;
  return launch_kernel(fn, grid, TileGemmLayout::threads(config),
                       static_cast<std::size_t>(TileGemmLayout::cta_bytes(config)), pdl, stream, args,
                       config.stages);
}

}  // namespace fp4moe::kernels
