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
#include "kernels/routing.cuh"
#include "kernels/weight_layout.hpp"

#include <algorithm>
#include <type_traits>

namespace fp4moe::kernels {

// NOTE: LDGSTS encodes a signed 12-bit immediate address offset (-2048 .. 2047 bytes). The
// loader's weight pointer runs this far ahead of the lane's piece of the item's first tile, so
// that the 4 tiles of a row group (-1024 .. +512) and, for MT = 4, its scales (+1024) are all
// immediate offsets of one register.
constexpr int kWeightSrcBias = 1024;

// Where one work item's data lives (for the warp's loader and for its consumer).
template <int NT>
struct ItemView {
  int expert;
  int slot0;                      // first slot (row of the expert's token block in the grouped order)
  int m_count;                    // valid tokens in the block (<= 8 * NT)
  int tile0;                      // first 16-row tile within the expert
  const std::uint8_t* wsrc;       // this lane's 16 weight bytes of the first tile, chunk 0, + bias
  int scale_rel;                  // this lane's 16 scale bytes (lanes < 4 * MT), from wsrc
  const std::uint16_t* arow[NT];  // this lane's activation row (token g of each 8-token tile), at 16t
  int achunks[NT];                // chunks in which that row holds this lane's 16 K values (0: no token)
};

// The view of work item `item`. `cursor` is the active-expert index of the caller's previous
// item: a warp's items only grow, so the expert is found by walking forward from it (a binary
// search per item cost more than the chunk loop at decode sizes).
// DIRECT: the small-expert launch, whose tb_prefix is 0, 1, 2, ... (one block per expert): the
// block index is the active index.
template <int MT, int NT, bool DIRECT = false>
__device__ __forceinline__ ItemView<NT> view_item(const StreamGemmArgs& p, std::int64_t item, int n_active,
                                                  int lane, int& cursor) {
  const int g = lane >> 2;
  const int t = lane & 3;
  ItemView<NT> v;
  const int pb = static_cast<int>(item / p.row_blocks);
  const int rb = static_cast<int>(item % p.row_blocks);
  // Active expert a with tb_prefix[a] <= pb < tb_prefix[a + 1].
  if constexpr (DIRECT) {
    cursor = pb;
  } else {
    while (cursor + 1 < n_active && p.tb_prefix[cursor + 1] <= pb) ++cursor;
  }
  const int lo = cursor;
  v.expert = p.active[lo];
  v.slot0 = p.offsets[v.expert] + (pb - p.tb_prefix[lo]) * 8 * NT;
  v.m_count = min(8 * NT, p.offsets[v.expert + 1] - v.slot0);
  v.tile0 = rb * MT;
  // The item's tiles start at tile tile_in_group of its row group (always 0 for MT = 4: written
  // so that the compiler sees it); the group's scales follow its 4 weight tiles.
  static_assert(WeightLayout::kTilesPerGroup % MT == 0, "an item's tiles lie in one row group");
  const int tile_in_group = rb % (WeightLayout::kTilesPerGroup / MT) * MT;
  const std::uint8_t* block0 = p.weights + static_cast<std::int64_t>(v.expert) * p.expert_stride +
                               static_cast<std::int64_t>(v.tile0 / WeightLayout::kTilesPerGroup) *
                                   p.n_chunks * WeightLayout::kBlockBytes;
  v.wsrc = block0 + tile_in_group * WeightLayout::kTileWeightBytes + lane * 16 + kWeightSrcBias;
  v.scale_rel = WeightLayout::kBlockWeightBytes + tile_in_group * WeightLayout::kTileScaleBytes -
                tile_in_group * WeightLayout::kTileWeightBytes - kWeightSrcBias;
  // K is a multiple of 16, so a lane's 16 values 16t .. 16t+15 of a chunk are all below K or
  // none is (only in the last chunk when K % 64 != 0).
  const int k_chunks = (p.k - 16 * t + WeightLayout::kChunkK - 1) / WeightLayout::kChunkK;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int s = 8 * j + g;
    const bool valid = s < v.m_count;
    v.achunks[j] = valid ? k_chunks : 0;
    const std::int64_t row = !valid ? 0 : (p.slot_token != nullptr ? p.slot_token[v.slot0 + s] : v.slot0 + s);
    v.arow[j] = p.act + row * p.act_ld + 16 * t;
  }
  return v;
}

// Prefetches into L2 the weights of up to p.l2_prefetch_chunks K chunks [kb, ...) of work item
// `item`: whole 2304-byte blocks of its row group, so with MT < 4 only the warp of the group's
// first tiles issues it, for the group's other items as well. Called before the PDL wait, so it
// reads routing's outputs then: only for launches that start after routing completed
// (StreamGemmArgs::l2_prefetch_chunks). Nothing it reads decides a result.
template <int MT>
__device__ __forceinline__ void prefetch_item_weights(const StreamGemmArgs& p, std::int64_t item, int kb,
                                                      int ke) {
  const int n_active = *p.n_active;
  if (item >= static_cast<std::int64_t>(p.tb_prefix[n_active]) * p.row_blocks) return;
  const int pb = static_cast<int>(item / p.row_blocks);
  const int rb = static_cast<int>(item % p.row_blocks);
  if (rb % (WeightLayout::kTilesPerGroup / MT) != 0) return;
  int a = 0;
  while (a + 1 < n_active && p.tb_prefix[a + 1] <= pb) ++a;
  const int chunks = min(ke - kb, p.l2_prefetch_chunks);
  if (chunks <= 0) return;
  const std::uint8_t* src =
      p.weights + static_cast<std::int64_t>(p.active[a]) * p.expert_stride +
      (static_cast<std::int64_t>(rb * MT / WeightLayout::kTilesPerGroup) * p.n_chunks + kb) *
          WeightLayout::kBlockBytes;
  prefetch_l2(src, static_cast<std::uint32_t>(chunks * WeightLayout::kBlockBytes));
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

// The kernel's body. STAGES > 0: the ring is that deep (the launch's `stages` equals it), so each
// chunk waits with one cp.async.wait_group; 0: any depth, read at run time, each wait a binary
// search over the immediates (~7 more instructions a chunk, 2% of the decode-shape chunk loop).
// SMALL: the small-expert launch after a wgmma GEMM (StreamGemmArgs::small_launch): no PDL wait at
// the start, one before exiting.
template <int MT, int NT, StreamEpilogue EPI, int STAGES, bool SMALL = false>
__device__ __forceinline__ void stream_gemm_body(const StreamGemmArgs& p, const int stages_rt,
                                                 const int k_split_arg) {
  // The small-expert launch chooses its K split from its item count (small_launch_k_split); its
  // launch's split only sized the reduction area. It reads the count before any wait: the launch
  // before it waited for routing.
  const int k_split =
      SMALL ? small_launch_k_split(static_cast<std::int64_t>(p.tb_prefix[*p.n_active]) * p.row_blocks,
                                   p.n_chunks, static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5))
            : k_split_arg;
  extern __shared__ __align__(128) std::uint8_t smem[];
  const int stages = STAGES > 0 ? STAGES : stages_rt;
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

  // While the previous kernel runs on: this warp's first weights into L2 (see the args). The
  // first item and K share are those of the loop below. Compiled into GEMM2's instances only (the
  // bf16-store epilogue), so GEMM1's code stays as it was: ptxas, at its 128-register cap there,
  // scheduled GEMM1's chunk loop 2% longer with it.
  if (EPI == StreamEpilogue::kStoreBf16 && !SMALL && p.l2_prefetch_chunks > 0 && lane == 0) {
    const int kw0 = warp % k_split;
    prefetch_item_weights<MT>(p, static_cast<std::int64_t>(warp / k_split) * gridDim.x + blockIdx.x,
                              p.n_chunks * kw0 / k_split, p.n_chunks * (kw0 + 1) / k_split);
  }

  // Everything below reads what routing / the previous GEMM wrote. Once that is complete, a
  // PDL-launched successor may be scheduled onto SMs as this grid's CTAs retire. The small-expert
  // launch reads only what the launch before it waited for (routing's lists, x or h rows that
  // launch does not write); it waits for that launch at its end.
  if constexpr (!SMALL) pdl_wait();
  pdl_launch_dependents();

  const int n_active = *p.n_active;
  const std::int64_t total_items = static_cast<std::int64_t>(p.tb_prefix[n_active]) * p.row_blocks;
  const int groups_per_cta = warps / k_split;
  const int group = warp / k_split;
  const int kw = warp % k_split;
  // Items go round-robin over the groups group-major: item i of a round to group i / gridDim.x of
  // CTA i % gridDim.x, so a last, partial round takes one group of every CTA before a second group
  // of any (CTA-major, it filled the first CTAs' groups). On the H200 this made T=4 1.01-1.02x
  // faster and left T=1-64 otherwise unchanged (PERF.md, history 2847285).
  const std::int64_t first_item = static_cast<std::int64_t>(group) * gridDim.x + blockIdx.x;
  const std::int64_t item_stride = static_cast<std::int64_t>(gridDim.x) * groups_per_cta;
  // This warp's share of K, in chunks of 64.
  const int kb = p.n_chunks * kw / k_split;
  const int ke = p.n_chunks * (kw + 1) / k_split;

  // This lane's shared addresses in one ring stage: its 16 weight bytes (stage + 16 * lane; the
  // scale bytes it copies follow at kScaleOff, the scale pair it reads at sc_rel) and the two
  // 16-byte halves of its activation bytes of token tile 0. Kept per stage rather than
  // recomputed from a slot index: the loader reuses the consumer's previous ones.
  struct LaneStage {
    std::uint32_t w, a_lo, a_hi;
  };
  // (Through opaque moves, as the ring's bounds below: GEMM2's instances recomputed them from
  // S2R every chunk.)
  const int sc_rel = static_cast<int>(opaque_u32(kScaleOff + lane * 2 - lane * 16));
  const int a_lo_rel = static_cast<int>(opaque_u32(kActOff + lane * 16 + act_half_offset(lane, 0)));
  const int a_hi_rel = static_cast<int>(opaque_u32(kActOff + lane * 16 + act_half_offset(lane, 1)));
  const auto lane_stage = [&](std::uint32_t w) { return LaneStage{w, w + a_lo_rel, w + a_hi_rel}; };

  // The small-expert launch without a K split claims its items (StreamGemmArgs::small_claims):
  // lane 0 asks for the item after the loader's current one when the loader starts that one, so
  // the atomic's latency passes while the item streams. The consumer then takes the loader's
  // item when it ends one, which needs the loader at most one item ahead: items of at least
  // `stages` chunks. Any warp may take any item: each is one warp's, so results do not change.
  const bool claims = SMALL && k_split == 1 && p.n_chunks >= stages && total_items > 0;
  int next_claim = 0;  // lane 0: the claimed item after the loader's
  const auto claim = [&]() {
    if (lane == 0) next_claim = atomicAdd(p.small_claims, 1);
  };
  const auto claimed = [&]() -> std::int64_t { return __shfl_sync(0xffffffffu, next_claim, 0); };

  // The loader runs stages-1 chunks ahead of the consumer, across item boundaries. A warp
  // without K chunks loads nothing (it still commits its empty groups).
  const std::uint64_t w_policy = l2_policy(p.l2_evict_first != 0);
  std::int64_t ld_item = ke > kb ? first_item : total_items;
  if (claims) {
    claim();
    ld_item = claimed();
    if (ld_item < total_items) claim();
  }
  int ld_chunk = kb;
  ItemView<NT> ld;  // read only while ld_item < total_items
  int ld_cursor = 0;
  int cur_cursor = 0;
  if (ld_item < total_items) ld = view_item<MT, NT, SMALL>(p, ld_item, n_active, lane, ld_cursor);
  // Fills stage `st` with the loader's next chunk (or commits an empty group once the warp's
  // items are done, keeping the group count in step with the consumer).
  auto issue = [&](const LaneStage& st) {
    if (ld_item < total_items) {
      const std::uint8_t* w = ld.wsrc + static_cast<std::int64_t>(ld_chunk) * WeightLayout::kBlockBytes;
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        cp_async16_hint(st.w + i * WeightLayout::kTileWeightBytes,
                        w + i * WeightLayout::kTileWeightBytes - kWeightSrcBias, w_policy);
      }
      if (lane < MT * 4) {
        cp_async16_hint(st.w + kScaleOff, w + ld.scale_rel, w_policy);
      }
      // Token rows past the block and K past the matrix are zero-filled (src-size 0: nothing is
      // read), so the consumer reads zeros there.
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const bool valid = ld_chunk < ld.achunks[j];
        const std::uint16_t* src = ld.arow[j] + ld_chunk * WeightLayout::kChunkK;
        cp_async16_zfill(st.a_lo + j * StreamGemmLayout::kActTileBytes, src, valid);
        cp_async16_zfill(st.a_hi + j * StreamGemmLayout::kActTileBytes, src + 8, valid);
      }
      if (++ld_chunk == ke) {
        ld_chunk = kb;
        if (claims) {
          ld_item = claimed();
          if (ld_item < total_items) claim();
        } else {
          ld_item += item_stride;
        }
        if (ld_item < total_items) ld = view_item<MT, NT, SMALL>(p, ld_item, n_active, lane, ld_cursor);
      }
    }
    cp_async_commit();
  };
  const std::uint32_t ring_first = ring + lane * 16;
  for (int i = 0; i < stages - 1; ++i) issue(lane_stage(ring_first + i * stage_bytes));

  // The loader refills the stage the consumer read last, the one before the stage it reads next.
  const std::uint32_t ring_end = ring_first + stages * stage_bytes;
  // Both held in registers across the loop (opaque moves): in GEMM2's instances ptxas otherwise
  // recomputed them every chunk from S2R reads of the thread and cluster-CTA ids (with the lane
  // offsets above, 13 more instructions a chunk than GEMM1's loop).
  const std::uint32_t ring_first_r = opaque_u32(ring_first);
  const std::uint32_t ring_end_r = opaque_u32(ring_end);
  LaneStage st = lane_stage(ring_first + (stages - 1) * stage_bytes);
  const std::int64_t consumer_first = claims ? ld_item : first_item;
  for (std::int64_t item = consumer_first; item < total_items; item = claims ? ld_item : item + item_stride) {
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

    // The chunk loop over the first NJ token tiles (NJ = NT but in the small-expert launch's
    // two-tile instances, whose items of at most 8 tokens skip the second tile's loads and mma).
    auto chunk_loop = [&](auto nj) {
      constexpr int NJ = decltype(nj)::value;
      for (int c = kb; c < ke; ++c) {
        if constexpr (STAGES > 0) {
          cp_async_wait<STAGES - 2>();
        } else {
          cp_async_wait_dynamic(stages - 2);
        }
        __syncwarp();
        // Refill the stage consumed in the previous iteration (every lane is past it now).
        issue(st);
        st = lane_stage(st.w + stage_bytes == ring_end_r ? ring_first_r : st.w + stage_bytes);

        std::uint32_t b[NJ][4][2];
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const uint4 lo4 = lds128(st.a_lo + j * StreamGemmLayout::kActTileBytes);
          const uint4 hi4 = lds128(st.a_hi + j * StreamGemmLayout::kActTileBytes);
          b[j][0][0] = lo4.x;
          b[j][0][1] = lo4.y;
          b[j][1][0] = lo4.z;
          b[j][1][1] = lo4.w;
          b[j][2][0] = hi4.x;
          b[j][2][1] = hi4.y;
          b[j][3][0] = hi4.z;
          b[j][3][1] = hi4.w;
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const uint4 wq = lds128(st.w + i * WeightLayout::kTileWeightBytes);
          const std::uint32_t sc = lds16(st.w + sc_rel + i * WeightLayout::kTileScaleBytes);
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
            for (int j = 0; j < NJ; ++j) mma_bf16_16816(acc[i][j], a, b[j][s][0], b[j][s][1]);
          }
        }
      }
    };
    if constexpr (SMALL && NT == 2) {
      // One expert per token block (the launch's tb_prefix is 0, 1, 2, ...).
      const int e = p.active[item / p.row_blocks];
      if (p.offsets[e + 1] - p.offsets[e] <= 8) {
        chunk_loop(std::integral_constant<int, 1>{});
      } else {
        chunk_loop(std::integral_constant<int, 2>{});
      }
    } else {
      chunk_loop(std::integral_constant<int, NT>{});
    }

    // The item's output rows and tokens, looked up only now: from the item's start they would hold
    // four registers across the chunk loop (the <4, 2> instances sit at the 128 registers of 2 CTAs
    // per SM and spilled on sm_120).
    const ItemView<NT> cur = view_item<MT, NT, SMALL>(p, item, n_active, lane, cur_cursor);
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
  if (claims && lane == 0) {
    // Every warp has made its last claim once it counts itself finished: the last one leaves
    // the counters zero for the next launch.
    const int warps_total = static_cast<int>(gridDim.x) * warps;
    if (atomicAdd(p.small_claims + 1, 1) == warps_total - 1) {
      atomicExch(p.small_claims, 0);
      atomicExch(p.small_claims + 1, 0);
    }
  }
  if constexpr (SMALL) pdl_wait();
}

// Outside the anonymous namespace so the compiled name is stable (fp4moe_stream_gemm<MT, NT, EPI>):
// the build's resource report and `fp4moe plan` look kernels up by it.
template <int MT, int NT, StreamEpilogue EPI>
// Up to 512 threads (so at most 128 registers a thread: two 8-warp CTAs or one 16-warp CTA per SM)
// except for 32-token items, at most 256 threads, whose accumulators and activation fragments need
// more registers on some architectures (sm_80, sm_120) and would spill.
__global__ void __launch_bounds__(StreamGemmLayout::max_warps(NT) * 32, 1)
    fp4moe_stream_gemm(const StreamGemmArgs p, const int stages, const int k_split) {
  stream_gemm_body<MT, NT, EPI, 0>(p, stages, k_split);
}

// The same with the ring depth compiled in, for the decode shapes (one token tile) at the depths
// the dispatcher picks (2-4): separate kernels rather than copies of the loop in one, whose larger
// code made every launch of it slower in the layer on the H200 (docs/PERF.md, history). Same
// launch bounds (at most 128 registers with up to 16 warps); the planner judges a configuration by
// the most registers among this kernel and fp4moe_stream_gemm<MT, NT, EPI> (PLANNER.md 3.4).
template <int MT, int NT, StreamEpilogue EPI, int STAGES>
__global__ void __launch_bounds__(StreamGemmLayout::max_warps(NT) * 32, 1)
    fp4moe_stream_gemm_fixed(const StreamGemmArgs p, const int stages, const int k_split) {
  stream_gemm_body<MT, NT, EPI, STAGES>(p, stages, k_split);
}

// The small-expert launch (StreamGemmArgs::small_launch) of the same shapes: its own kernels, so
// that the other instances' code stays as it was (a stream kernel's code size alone moved its time
// in the layer: docs/PERF.md, history "J"). Compiled for the 64-row items of one or two token
// tiles only, the shapes the dispatcher gives it (gpu::small_expert_choice); the two-tile ones
// run an expert of at most 8 tokens on one tile.
template <int MT, int NT, StreamEpilogue EPI, int STAGES>
__global__ void __launch_bounds__(StreamGemmLayout::max_warps(NT) * 32, 1)
    fp4moe_stream_gemm_small(const StreamGemmArgs p, const int stages, const int k_split) {
  stream_gemm_body<MT, NT, EPI, STAGES, true>(p, stages, k_split);
}

// The fused decode path's first GEMM (launch_stream_gemm_routed): each CTA routes and groups the
// forward's few tokens into its own shared tables first (routing::route_group_cta; CTA 0 also
// writes routing's outputs for the later kernels), then runs the fixed-depth kernel's body over
// them. It replaces the routing kernel and its handoff: the first kernel of a forward, launched
// without PDL. PER: experts per lane of the router (4: E <= 128, 8: E <= 256). Its own instances
// (m4 n1, the first GEMM's epilogues, depths 2-4), so that the other kernels' code is unchanged.
template <int MT, int NT, StreamEpilogue EPI, int STAGES, int PER>
__global__ void __launch_bounds__(StreamGemmLayout::max_warps(NT) * 32, 1)
    fp4moe_stream_gemm_routed(const StreamGemmArgs p, const int stages, const int k_split, const RouteArgs ra,
                              const GroupArgs ga) {
  static_assert(sizeof(FusedRouteTables) == kFusedRouteTableBytes, "the host sizes the tables by this");
  __shared__ FusedRouteTables rt;
  const ByteRange warm = aligned_share(p.l2_warm_bytes, gridDim.x, blockIdx.x, 16);  // this CTA's share
  routing::route_group_cta<PER>(ra, ga, rt, blockIdx.x == 0, p.l2_warm + warm.begin, warm.end - warm.begin);
  // The body looks its items up in this CTA's tables (shared memory at fixed addresses: no
  // registers, and the lookups compile to shared-memory loads).
  StreamGemmArgs q = p;
  q.n_active = &rt.n_active;
  q.tb_prefix = rt.tb_prefix[0];
  q.active = rt.active;
  q.offsets = rt.offsets;
  q.slot_token = rt.slot_token;
  stream_gemm_body<MT, NT, EPI, STAGES>(q, stages, k_split);
}

namespace {

using KernelFn = void (*)(const StreamGemmArgs, const int, const int);

using RoutedKernelFn = void (*)(const StreamGemmArgs, const int, const int, const RouteArgs, const GroupArgs);

template <StreamEpilogue EPI, int PER>
RoutedKernelFn routed_by_depth(int stages) {
  switch (stages) {
    case 2:
      return fp4moe_stream_gemm_routed<4, 1, EPI, 2, PER>;
    case 3:
      return fp4moe_stream_gemm_routed<4, 1, EPI, 3, PER>;
    case 4:
      return fp4moe_stream_gemm_routed<4, 1, EPI, 4, PER>;
    default:
      return nullptr;
  }
}

// The fused first GEMM's instance for (config, epilogue, routed experts E); nullptr where none is
// compiled.
RoutedKernelFn routed_kernel_for(const StreamGemmConfig& c, StreamEpilogue epi, int experts) {
  if (c.m_tiles != 4 || c.n_tiles != 1 || experts < 1 || experts > 256) return nullptr;
  const bool wide = experts > 128;
  switch (epi) {
    case StreamEpilogue::kSwiGLU:
      return wide ? routed_by_depth<StreamEpilogue::kSwiGLU, 8>(c.stages)
                  : routed_by_depth<StreamEpilogue::kSwiGLU, 4>(c.stages);
    case StreamEpilogue::kSwiGLUClamped:
      return wide ? routed_by_depth<StreamEpilogue::kSwiGLUClamped, 8>(c.stages)
                  : routed_by_depth<StreamEpilogue::kSwiGLUClamped, 4>(c.stages);
    default:
      return nullptr;
  }
}

// The kernel of compiled ring depth S: the small-expert launch's or the fixed-depth one.
template <int MT, int NT, StreamEpilogue EPI, int S, bool SMALL>
KernelFn depth_instance() {
  if constexpr (SMALL) {
    return fp4moe_stream_gemm_small<MT, NT, EPI, S>;
  } else {
    return fp4moe_stream_gemm_fixed<MT, NT, EPI, S>;
  }
}

// The depths compiled in (2-4); nullptr for any other.
template <int MT, int NT, StreamEpilogue EPI, bool SMALL>
KernelFn by_depth(int stages) {
  switch (stages) {
    case 2:
      return depth_instance<MT, NT, EPI, 2, SMALL>();
    case 3:
      return depth_instance<MT, NT, EPI, 3, SMALL>();
    case 4:
      return depth_instance<MT, NT, EPI, 4, SMALL>();
    default:
      return nullptr;
  }
}

template <int MT, int NT, StreamEpilogue EPI>
KernelFn pick_stages(int stages, bool small) {
  if (small) {
    if constexpr (MT == 4 && (NT == 1 || NT == 2)) return by_depth<MT, NT, EPI, true>(stages);
    return nullptr;
  }
  if constexpr (NT == 1) {
    if (const KernelFn fn = by_depth<MT, NT, EPI, false>(stages)) return fn;
  }
  return fp4moe_stream_gemm<MT, NT, EPI>;
}

template <int MT, int NT>
KernelFn pick_epilogue(StreamEpilogue epi, int stages, bool small) {
  switch (epi) {
    case StreamEpilogue::kSwiGLU:
      return pick_stages<MT, NT, StreamEpilogue::kSwiGLU>(stages, small);
    case StreamEpilogue::kSwiGLUClamped:
      return pick_stages<MT, NT, StreamEpilogue::kSwiGLUClamped>(stages, small);
    case StreamEpilogue::kStoreBf16:
      return pick_stages<MT, NT, StreamEpilogue::kStoreBf16>(stages, small);
  }
  return nullptr;
}

// The one place where run-time tile shapes (kStreamTileShapes) and ring depths become template
// instances. small: the small-expert launch's kernels (nullptr where none is compiled).
KernelFn kernel_for(const StreamGemmConfig& c, StreamEpilogue epi, bool small) {
  const int key = c.m_tiles * 10 + c.n_tiles;
  switch (key) {
    case 11:
      return pick_epilogue<1, 1>(epi, c.stages, small);
    case 21:
      return pick_epilogue<2, 1>(epi, c.stages, small);
    case 41:
      return pick_epilogue<4, 1>(epi, c.stages, small);
    case 12:
      return pick_epilogue<1, 2>(epi, c.stages, small);
    case 22:
      return pick_epilogue<2, 2>(epi, c.stages, small);
    case 42:
      return pick_epilogue<4, 2>(epi, c.stages, small);
    case 14:
      return pick_epilogue<1, 4>(epi, c.stages, small);
    case 24:
      return pick_epilogue<2, 4>(epi, c.stages, small);
    default:
      return nullptr;
  }
}

}  // namespace

cudaError_t stream_gemm_setup(const StreamGemmConfig& config, StreamEpilogue epilogue,
                              KernelAttributes* attributes) {
  const KernelFn fn = kernel_for(config, epilogue, false);
  if (fn == nullptr || !StreamGemmLayout::valid(config)) return cudaErrorInvalidValue;
  const int threads = StreamGemmLayout::threads(config);
  const int smem = static_cast<int>(StreamGemmLayout::cta_bytes(config));
  KernelAttributes a{};
  const cudaError_t err = setup_kernel(fn, threads, smem, &a);
  if (err != cudaSuccess) return err;
  // The same configuration's small-expert kernel, where there is one (it may run as the
  // small-expert launch): set up alike, and the attributes are the more demanding of the two.
  if (const KernelFn small_fn = kernel_for(config, epilogue, true); small_fn != nullptr) {
    KernelAttributes t{};
    const cudaError_t serr = setup_kernel(small_fn, threads, smem, &t);
    if (serr != cudaSuccess) return serr;
    a.registers = std::max(a.registers, t.registers);
    a.local_bytes = std::max(a.local_bytes, t.local_bytes);
    a.max_blocks_per_sm = std::min(a.max_blocks_per_sm, t.max_blocks_per_sm);
  }
  if (attributes != nullptr) *attributes = a;
  return cudaSuccess;
}

cudaError_t launch_stream_gemm(const StreamGemmArgs& args, const StreamGemmConfig& config,
                               StreamEpilogue epilogue, int grid, bool pdl, cudaStream_t stream) {
  const KernelFn fn = kernel_for(config, epilogue, args.small_launch != 0);
  if (fn == nullptr || !StreamGemmLayout::valid(config)) return cudaErrorInvalidValue;
  return launch_kernel(fn, grid, StreamGemmLayout::threads(config),
                       static_cast<std::size_t>(StreamGemmLayout::cta_bytes(config)), pdl, stream, args,
                       config.stages, config.k_split);
}

bool stream_gemm_routed_compiled(const StreamGemmConfig& config, StreamEpilogue epilogue, int experts) {
  return routed_kernel_for(config, epilogue, experts) != nullptr;
}

cudaError_t stream_gemm_routed_setup(const StreamGemmConfig& config, StreamEpilogue epilogue, int experts,
                                     KernelAttributes* attributes) {
  const RoutedKernelFn fn = routed_kernel_for(config, epilogue, experts);
  if (fn == nullptr || !StreamGemmLayout::valid(config)) return cudaErrorInvalidValue;
  return setup_kernel(fn, StreamGemmLayout::threads(config),
                      static_cast<int>(StreamGemmLayout::cta_bytes(config)), attributes);
}

cudaError_t launch_stream_gemm_routed(const StreamGemmArgs& args, const StreamGemmConfig& config,
                                      StreamEpilogue epilogue, int grid, const RouteArgs& route,
                                      const GroupArgs& group, cudaStream_t stream) {
  const RoutedKernelFn fn = routed_kernel_for(config, epilogue, route.experts);
  if (fn == nullptr || !StreamGemmLayout::valid(config) ||
      (route.logits == nullptr && group.topk_ids == nullptr) || !fused_route_fits(route, group, config))
    return cudaErrorInvalidValue;
  return launch_kernel(fn, grid, StreamGemmLayout::threads(config),
                       static_cast<std::size_t>(StreamGemmLayout::cta_bytes(config)), false, stream, args,
                       config.stages, config.k_split, route, group);
}

}  // namespace fp4moe::kernels
