// Weight-streaming grouped GEMM: the decode path's GEMM1 (gate/up + SwiGLU) and GEMM2 (down).
//
// At decode each active expert sees a handful of tokens, so the layer is bound by reading the
// experts' weights once. The kernel spreads every active expert's rows over all warps of all
// SMs and streams them through a per-warp cp.async ring (stream_gemm_layout.hpp):
//
//   work item = (active expert a, token block b of 8*NT tokens, row block r of 16*MT rows)
//   items are numbered (a, b) major, r minor, so neighbouring warps share activations in L2;
//   warp w of the persistent grid takes items w, w + W, w + 2W, ... (W = all warps).
//
//   per item:  for each K chunk of 64 (pipelined `stages` deep):
//                A = weights  [16*MT rows x 64]: E2M1 -> bf16 in registers, times the block
//                    scale (exact, see weight_layout.hpp), as mma A fragments
//                B = activations [64 x 8*NT tokens] bf16 (gathered rows for GEMM1)
//                acc[MT][NT] += A * B          (mma.sync m16n8k16, fp32)
//              epilogue: acc * post_scale (+ bias); GEMM1: act(gate, up) -> bf16 h;
//                        GEMM2: bf16 y per slot (finalize reduces the k picks).
//
// Each lane copies exactly the 16-byte weight fragment and the 32-byte activation piece that it
// later reads itself; only the scale bytes cross lanes (hence the __syncwarp after each wait).
#include "fp4moe/detail/portable_math.hpp"
#include "kernels/common.cuh"
#include "kernels/epilogue.cuh"
#include "kernels/launch.hpp"
#include "kernels/weight_layout.hpp"

namespace fp4moe::kernels {

// Where one work item's data lives (for the warp's loader and for its consumer).
template <int NT>
struct ItemView {
  int expert;
  int slot0;                      // first slot (row of the expert's token block in the grouped order)
  int m_count;                    // valid tokens in the block (<= 8 * NT)
  int tile0;                      // first 16-row tile within the expert
  const std::uint8_t* wbase;      // the expert's row group, chunk 0
  const std::uint16_t* arow[NT];  // this lane's activation row (token g of each 8-token tile), at 16t
  bool avalid[NT];
};

// The view of work item `item`. `cursor` is the active-expert index of the caller's previous
// item: a warp's items only grow, so the expert is found by walking forward from it (a binary
// search per item cost more than the chunk loop at decode sizes).
template <int MT, int NT>
__device__ __forceinline__ ItemView<NT> view_item(const StreamGemmArgs& p, std::int64_t item, int n_active,
                                                  int g, int t, int& cursor) {
  ItemView<NT> v;
  const int pb = static_cast<int>(item / p.row_blocks);
  const int rb = static_cast<int>(item % p.row_blocks);
  // Active expert a with tb_prefix[a] <= pb < tb_prefix[a + 1].
  while (cursor + 1 < n_active && p.tb_prefix[cursor + 1] <= pb) ++cursor;
  const int lo = cursor;
  v.expert = p.active[lo];
  v.slot0 = p.offsets[v.expert] + (pb - p.tb_prefix[lo]) * 8 * NT;
  v.m_count = min(8 * NT, p.offsets[v.expert + 1] - v.slot0);
  v.tile0 = rb * MT;
  v.wbase = p.weights + static_cast<std::int64_t>(v.expert) * p.expert_stride +
            static_cast<std::int64_t>(v.tile0 / WeightLayout::kTilesPerGroup) * p.n_chunks *
                WeightLayout::kBlockBytes +
            (v.tile0 % WeightLayout::kTilesPerGroup) * WeightLayout::kTileWeightBytes;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int s = 8 * j + g;
    v.avalid[j] = s < v.m_count;
    const std::int64_t row =
        !v.avalid[j] ? 0 : (p.slot_token != nullptr ? p.slot_token[v.slot0 + s] : v.slot0 + s);
    v.arow[j] = p.act + row * p.act_ld + 16 * t;
  }
  return v;
}

// Named barrier for the k_split warps of one group (ids 1..8; 0 is __syncthreads).
__device__ __forceinline__ void group_barrier(int group, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(group + 1), "r"(threads) : "memory");
}

// NOTE: each lane's 32 activation bytes are stored as two 16-byte halves, swapped for odd g, so
// that the 8 lanes of one LDS.128 phase hit 8 distinct 4-bank groups (no bank conflicts).
__device__ __forceinline__ int act_half_offset(int lane, int half) {
  return (half ^ ((lane >> 2) & 1)) * 16;
}

// Outside the anonymous namespace so the compiled name is stable (fp4moe_stream_gemm<MT, NT, EPI>):
// the build's resource report and `fp4moe plan` look kernels up by it.
template <int MT, int NT, StreamEpilogue EPI>
// Two CTAs per SM (128 registers a thread) except for 32-token items, whose accumulators and
// activation fragments need more on some architectures (sm_80, sm_120) and would spill.
__global__ void __launch_bounds__(256, NT == 4 ? 1 : 2)
    fp4moe_stream_gemm(const StreamGemmArgs p, const int stages, const int k_split) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const StreamGemmConfig cfg{MT, NT, stages, warps, k_split};
  const int stage_bytes = StreamGemmLayout::stage_bytes(cfg);
  const std::uint32_t ring = smem_addr(smem) + warp * StreamGemmLayout::warp_bytes(cfg);
  float* partials = reinterpret_cast<float*>(smem + StreamGemmLayout::reduction_offset(cfg));
  constexpr int kScaleOff = MT * StreamGemmLayout::kWeightTileBytes;
  constexpr int kActOff = kScaleOff + MT * StreamGemmLayout::kScaleTileBytes;
  static_assert(kActOff == StreamGemmLayout::act_offset({MT, NT, 2, 1, 1}), "layout drift");

  // Everything below reads what routing / the previous GEMM wrote. Once that is complete, a
  // PDL-launched successor may be scheduled onto SMs as this grid's CTAs retire.
  pdl_wait();
  pdl_launch_dependents();

  const int n_active = *p.n_active;
  const std::int64_t total_items = static_cast<std::int64_t>(p.tb_prefix[n_active]) * p.row_blocks;
  const int groups_per_cta = warps / k_split;
  const int group = warp / k_split;
  const int kw = warp % k_split;
  const std::int64_t first_item = static_cast<std::int64_t>(blockIdx.x) * groups_per_cta + group;
  const std::int64_t item_stride = static_cast<std::int64_t>(gridDim.x) * groups_per_cta;
  // This warp's share of K, in chunks of 64.
  const int kb = p.n_chunks * kw / k_split;
  const int ke = p.n_chunks * (kw + 1) / k_split;

  // The loader runs stages-1 chunks ahead of the consumer, across item boundaries.
  std::int64_t ld_item = first_item;
  int ld_chunk = kb;
  int ld_slot = 0;
  ItemView<NT> ld{};
  int ld_cursor = 0;
  int cur_cursor = 0;
  const bool has_chunks = ke > kb;
  if (has_chunks && ld_item < total_items) ld = view_item<MT, NT>(p, ld_item, n_active, g, t, ld_cursor);
  auto issue = [&]() {
    if (has_chunks && ld_item < total_items) {
      const std::uint32_t st = ring + ld_slot * stage_bytes;
      const std::uint8_t* blk = ld.wbase + static_cast<std::int64_t>(ld_chunk) * WeightLayout::kBlockBytes;
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        cp_async16(st + i * WeightLayout::kTileWeightBytes + lane * 16,
                   blk + i * WeightLayout::kTileWeightBytes + lane * 16);
      }
      if (lane < MT * 4) {
        // wbase points at tile tile_in_group; its scales follow the group's 4 weight tiles.
        const std::uint8_t* sc = blk -
                                 (ld.tile0 % WeightLayout::kTilesPerGroup) * WeightLayout::kTileWeightBytes +
                                 WeightLayout::kBlockWeightBytes +
                                 (ld.tile0 % WeightLayout::kTilesPerGroup) * WeightLayout::kTileScaleBytes;
        cp_async16(st + kScaleOff + lane * 16, sc + lane * 16);
      }
      if (ld_chunk * WeightLayout::kChunkK + 16 * t < p.k) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if (ld.avalid[j]) {
            const std::uint32_t dst = st + kActOff + j * StreamGemmLayout::kActTileBytes + lane * 32;
            const std::uint16_t* src = ld.arow[j] + ld_chunk * WeightLayout::kChunkK;
            cp_async16(dst + act_half_offset(lane, 0), src);
            cp_async16(dst + act_half_offset(lane, 1), src + 8);
          }
        }
      }
      if (++ld_chunk == ke) {
        ld_chunk = kb;
        ld_item += item_stride;
        if (ld_item < total_items) ld = view_item<MT, NT>(p, ld_item, n_active, g, t, ld_cursor);
      }
    }
    cp_async_commit();
    ld_slot = ld_slot + 1 == stages ? 0 : ld_slot + 1;
  };
  for (int i = 0; i < stages - 1; ++i) issue();

  int slot = 0;
  for (std::int64_t item = first_item; item < total_items; item += item_stride) {
    const ItemView<NT> cur = view_item<MT, NT>(p, item, n_active, g, t, cur_cursor);
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

    for (int c = kb; c < ke; ++c) {
      cp_async_wait_dynamic(stages - 2);
      __syncwarp();
      // Refill the slot consumed in the previous iteration (every lane is past it now).
      issue();

      const std::uint32_t st = ring + slot * stage_bytes;
      slot = slot + 1 == stages ? 0 : slot + 1;
      const bool k_ok = c * WeightLayout::kChunkK + 16 * t < p.k;
      std::uint32_t b[NT][4][2];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (cur.avalid[j] && k_ok) {
          const std::uint32_t src = st + kActOff + j * StreamGemmLayout::kActTileBytes + lane * 32;
          const uint4 lo4 = lds128(src + act_half_offset(lane, 0));
          const uint4 hi4 = lds128(src + act_half_offset(lane, 1));
          b[j][0][0] = lo4.x;
          b[j][0][1] = lo4.y;
          b[j][1][0] = lo4.z;
          b[j][1][1] = lo4.w;
          b[j][2][0] = hi4.x;
          b[j][2][1] = hi4.y;
          b[j][3][0] = hi4.z;
          b[j][3][1] = hi4.w;
        } else {
#pragma unroll
          for (int s = 0; s < 4; ++s) b[j][s][0] = b[j][s][1] = 0u;
        }
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const uint4 wq = lds128(st + i * WeightLayout::kTileWeightBytes + lane * 16);
        const std::uint32_t sc = lds16(st + kScaleOff + i * WeightLayout::kTileScaleBytes + lane * 2);
        // (byte, byte) -> bf16x2 scale factor: one PRMT and one IMAD each.
        const std::uint32_t s_row_g = scale_pair_from_bytes(__byte_perm(sc, 0, 0x4040));
        const std::uint32_t s_row_g8 = scale_pair_from_bytes(__byte_perm(sc, 0, 0x4141));
        const std::uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          std::uint32_t a[4];
          decode_e2m1x8(words[s], a);
          a[0] = bf16x2_mul(a[0], s_row_g);
          a[1] = bf16x2_mul(a[1], s_row_g8);
          a[2] = bf16x2_mul(a[2], s_row_g);
          a[3] = bf16x2_mul(a[3], s_row_g8);
#pragma unroll
          for (int j = 0; j < NT; ++j) mma_bf16_16816(acc[i][j], a, b[j][s][0], b[j][s][1]);
        }
      }
    }

    // Epilogue of one m16n8 tile: lane holds rows g and g+8 for tokens 8j + 2t + {0, 1}.
    auto store_tile = [&](int i, int j, const float(&v)[4]) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int n = 8 * j + 2 * t + q;
        if (n < cur.m_count) store_token<EPI>(p, cur.expert, cur.tile0 + i, g, cur.slot0 + n, v[q], v[2 + q]);
      }
    };

    if (k_split == 1) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) store_tile(i, j, acc[i][j]);
    } else {
      // Partial sums of the group's warps meet in shared memory: [warp][i][j][q][lane].
      float* mine = partials + warp * (MT * NT * 4 * 32);
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) mine[((i * NT + j) * 4 + q) * 32 + lane] = acc[i][j][q];
      group_barrier(group, k_split * 32);
      // Warp kw reduces tiles i = kw, kw + k_split, ... in the fixed warp order (deterministic).
      const float* first = partials + group * k_split * (MT * NT * 4 * 32);
      for (int i = kw; i < MT; i += k_split) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          for (int w = 0; w < k_split; ++w) {
#pragma unroll
            for (int q = 0; q < 4; ++q)
              v[q] += first[w * (MT * NT * 4 * 32) + ((i * NT + j) * 4 + q) * 32 + lane];
          }
          store_tile(i, j, v);
        }
      }
      group_barrier(group, k_split * 32);
    }
  }
  cp_async_wait<0>();
}

namespace {

using KernelFn = void (*)(const StreamGemmArgs, const int, const int);

template <int MT, int NT>
KernelFn pick_epilogue(StreamEpilogue epi) {
  switch (epi) {
    case StreamEpilogue::kSwiGLU:
      return fp4moe_stream_gemm<MT, NT, StreamEpilogue::kSwiGLU>;
    case StreamEpilogue::kSwiGLUClamped:
      return fp4moe_stream_gemm<MT, NT, StreamEpilogue::kSwiGLUClamped>;
    case StreamEpilogue::kStoreBf16:
      return fp4moe_stream_gemm<MT, NT, StreamEpilogue::kStoreBf16>;
  }
  return nullptr;
}

// The one place where run-time tile shapes become template instances (kStreamTileShapes).
KernelFn kernel_for(const StreamGemmConfig& c, StreamEpilogue epi) {
  const int key = c.m_tiles * 10 + c.n_tiles;
  switch (key) {
    case 11:
      return pick_epilogue<1, 1>(epi);
    case 21:
      return pick_epilogue<2, 1>(epi);
    case 41:
      return pick_epilogue<4, 1>(epi);
    case 12:
      return pick_epilogue<1, 2>(epi);
    case 22:
      return pick_epilogue<2, 2>(epi);
    case 42:
      return pick_epilogue<4, 2>(epi);
    case 14:
      return pick_epilogue<1, 4>(epi);
    case 24:
      return pick_epilogue<2, 4>(epi);
    default:
      return nullptr;
  }
}

}  // namespace

cudaError_t stream_gemm_setup(const StreamGemmConfig& config, StreamEpilogue epilogue,
                              KernelAttributes* attributes) {
  const KernelFn fn = kernel_for(config, epilogue);
  if (fn == nullptr || !StreamGemmLayout::valid(config)) return cudaErrorInvalidValue;
  return setup_kernel(fn, StreamGemmLayout::threads(config),
                      static_cast<int>(StreamGemmLayout::cta_bytes(config)), attributes);
}

cudaError_t launch_stream_gemm(const StreamGemmArgs& args, const StreamGemmConfig& config,
                               StreamEpilogue epilogue, int grid, bool pdl, cudaStream_t stream) {
  const KernelFn fn = kernel_for(config, epilogue);
  if (fn == nullptr || !StreamGemmLayout::valid(config)) return cudaErrorInvalidValue;
  return launch_kernel(fn, grid, StreamGemmLayout::threads(config),
                       static_cast<std::size_t>(StreamGemmLayout::cta_bytes(config)), pdl, stream, args,
                       config.stages, config.k_split);
}

}  // namespace fp4moe::kernels
