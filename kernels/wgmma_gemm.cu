// SM90 grouped GEMM with wgmma for many tokens per expert (prefill): see wgmma_gemm_layout.hpp
// for the work split. The A operand (weights) is decoded into registers exactly as in the other
// kernels (weight_layout.hpp) and handed to wgmma.mma_async in its register form; the B operand
// (a block of up to 128 tokens) is read by the tensor cores from shared memory. One decode per
// weight feeds 64-128 tokens, against 8-64 for mma.sync, which is what keeps the tensor cores fed.
//
// Pipeline (warp-specialized): a producer thread fills a ring of stages with TMA: per K chunk the
// four 2304-byte weight blocks (cp.async.bulk) and, for GEMM2, the token block (cp.async.bulk.tensor
// through a tensor map with the 128-byte swizzle), all completing on the stage's "full" mbarrier;
// GEMM1's token rows are scattered over x, so its whole producer warpgroup gathers them with
// cp.async into the same swizzled layout (produce_gathered: no slot-ordered copy of x). Each
// consumer warp issues 2 x 4 wgmma (two m64 row blocks x four k-steps) on A registers decoded
// before, then, once the previous chunk's wgmmas are done (wait_group 1), frees that chunk's
// stage ("empty" mbarrier) and decodes the next chunk into the other A register set while the
// tensor cores run. No CTA-wide barrier in the loop; the producer runs ahead across items, so
// the next item's first chunks are in flight during the epilogue.
//
// Tokens past the item's count (the next expert's rows, or zeros past the buffer) are loaded
// too; each only feeds its own output column, which the epilogue does not store.
#include "fp4moe/detail/portable_math.hpp"
#include "kernels/common.cuh"
#include "kernels/epilogue.cuh"
#include "kernels/launch.hpp"
#include "kernels/sm90.cuh"
#include "kernels/weight_layout.hpp"
#include "kernels/wgmma_gemm_layout.hpp"

#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FP4MOE_WGMMA 1
#else
#define FP4MOE_WGMMA 0
#endif

namespace fp4moe::kernels {

// The threads that gather GEMM1's token rows: the producer warpgroup.
constexpr int kGatherThreads = WgmmaGemmLayout::kProducerWarps * 32;

// One item: 256 weight rows of one expert against one block of its tokens.
struct WgmmaItem {
  int expert;
  int slot0;    // first slot (row of act) of the token block
  int m_count;  // tokens of the block that belong to the expert
  int group0;   // first 64-row group
};

// The items a CTA visits, in order (blockIdx.x, + gridDim.x, ...): the producer and the consumers
// each walk the same sequence. A main launch: the tb_prefix blocks of every active expert. A tail
// launch (TAIL, p.tail_of > 0): per row block, the last r = count % tail_of tokens of each of its
// *p.n_tail experts (p.tail_experts), so that its items are as evenly spread over the CTAs as a
// main launch's. (Walking every active expert and skipping the others left the CTAs 1.2-1.6x
// uneven at T=1024-16384.)
template <int NT, bool TAIL>
struct WgmmaItems {
  const StreamGemmArgs& p;
  int n_active;  // a tail launch: its experts (*p.n_tail), once reload() has run
  std::int64_t total;
  int cursor = 0;

  __device__ static std::int64_t count(const StreamGemmArgs& p, int n_active) {
    return static_cast<std::int64_t>(TAIL ? n_active : p.tb_prefix[n_active]) * p.row_blocks;
  }

  __device__ WgmmaItem at(std::int64_t item) {
    constexpr int kTokens = NT * 8;
    const int pb = static_cast<int>(item / p.row_blocks);
    const int rb = static_cast<int>(item % p.row_blocks);
    if constexpr (TAIL) {
      const int expert = p.tail_experts[pb];
      const int end = p.offsets[expert + 1];
      const int r = (end - p.offsets[expert]) % p.tail_of;
      return {expert, end - r, r, rb * WgmmaGemmLayout::kGroups};
    } else {
      while (cursor + 1 < n_active && p.tb_prefix[cursor + 1] <= pb) ++cursor;
      const int expert = p.active[cursor];
      const int slot0 = p.offsets[expert] + (pb - p.tb_prefix[cursor]) * kTokens;
      return {expert, slot0, min(kTokens, p.offsets[expert + 1] - slot0), rb * WgmmaGemmLayout::kGroups};
    }
  }
  // Tail launches read their expert count after setmaxnreg: ptxas spills what lives across it in
  // their producer (40 registers).
  __device__ void reload() {
    if constexpr (TAIL) n_active = *p.n_tail;
  }
};

// An item's weights: `groups` 64-row groups (the last row block may hold fewer than kGroups) from
// `src` on; copy_weights copies chunk c's blocks of them into stage `st`, completing on `bar`.
// (Computing the struct in a shared helper too changed ptxas' schedule of the 32-token GEMM1
// instance's chunk loop, +5 instructions; this way every instance's SASS is as before.)
struct ItemWeights {
  int groups;
  const std::uint8_t* src;
};
__device__ __forceinline__ void copy_weights(const ItemWeights& w, int n_chunks, int c, std::uint32_t st,
                                             std::uint32_t bar) {
#if FP4MOE_WGMMA
  for (int i = 0; i < w.groups; ++i) {
    bulk_copy(st + i * WeightLayout::kBlockBytes,
              w.src + (static_cast<std::int64_t>(i) * n_chunks + c) * WeightLayout::kBlockBytes,
              WeightLayout::kBlockBytes, bar);
  }
#endif
}

// The producer of GEMM1, whose token rows are scattered: act holds each token's k-permuted row
// (act_ld values), and slot s of the token block reads row slot_token[s]. Thread i of the producer
// warpgroup copies 16-byte piece i % 8 of rows i / 8 + 16 j of each chunk's token block into the
// stage, at the place the tensor map's 128-byte swizzle would put it (swizzle128_offset: row & 7 is
// i / 8 & 7 for every j, so each j is one immediate offset); rows past the item's tokens copy its
// first token's row again (their columns are computed and never stored), so no copy is
// predicated. Thread 0 also issues the weights' bulk copies and their expect_tx. Each thread's
// cp.async.mbarrier.arrive.noinc is one of the stage's 1 + kGatherThreads arrivals, so the stage
// completes when every row and weight landed. The chunk loop is unrolled kUnroll times with the
// chunk's offset as an immediate, so the row pointers advance once per kUnroll chunks: the
// producer's instructions share the schedulers with the consumers'.
template <int NT, bool TAIL>
__device__ __forceinline__ void produce_gathered(const StreamGemmArgs& p, WgmmaItems<NT, TAIL>& items,
                                                 std::int64_t total_items, std::uint32_t base,
                                                 int stage_bytes, int stages, std::uint32_t bars,
                                                 int act_off) {
#if FP4MOE_WGMMA
  constexpr int kTokens = NT * 8;
  constexpr int kRows = kTokens / 16;  // rows per thread
  constexpr int kUnroll = 4;
  static_assert(kTokens % 16 == 0);
  const int tid = threadIdx.x;  // 0 .. kGatherThreads - 1
  const int piece = tid & 7;
  const int row0 = tid >> 3;
  const std::uint32_t dst0 =
      static_cast<std::uint32_t>(act_off + swizzle128_offset(row0, piece));  // + 2048 j for row0 + 16 j
  const int expert_groups = (p.rows + WeightLayout::kGroupRows - 1) / WeightLayout::kGroupRows;
  const int n_chunks = p.n_chunks;
  const std::uint8_t* const act = reinterpret_cast<const std::uint8_t*>(p.act) + piece * 16;
  const std::int64_t row_bytes = p.act_ld * 2;
  items.reload();
  int slot = 0;
  std::uint32_t phase = 0;
  for (std::int64_t item = blockIdx.x; item < (TAIL ? items.count(p, items.n_active) : total_items);
       item += gridDim.x) {
    const WgmmaItem it = items.at(item);
    const std::uint8_t* src[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int r = row0 + 16 * j;
      src[j] = act + p.slot_token[it.slot0 + (r < it.m_count ? r : 0)] * row_bytes;
    }
    const ItemWeights w{max(0, min(WgmmaGemmLayout::kGroups, expert_groups - it.group0)),
                        p.weights + static_cast<std::int64_t>(it.expert) * p.expert_stride +
                            static_cast<std::int64_t>(it.group0) * n_chunks * WeightLayout::kBlockBytes};
    for (int c0 = 0; c0 < n_chunks; c0 += kUnroll) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u;
        if (c < n_chunks) {
          const std::uint32_t full = bars + slot * WgmmaGemmLayout::kBarrierBytes;
          mbar_wait(full + 8, phase ^ 1);  // the stage's empty barrier
          const std::uint32_t st = base + slot * stage_bytes;
          if (tid == 0) {
            mbar_arrive_expect_tx(full, w.groups * WeightLayout::kBlockBytes);
            copy_weights(w, n_chunks, c, st, full);
          }
#pragma unroll
          for (int j = 0; j < kRows; ++j)
            cp_async16(st + dst0 + 2048 * j, src[j] + u * WgmmaGemmLayout::kActRowBytes);
          cp_async_arrive_noinc(full);
          if (++slot == stages) {
            slot = 0;
            phase ^= 1;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kRows; ++j) src[j] += kUnroll * WgmmaGemmLayout::kActRowBytes;
    }
  }
#endif
}

// TAIL: a tail launch (StreamGemmArgs::tail_of). It reads what the launch before it read
// (complete: that launch started only after its own wait) and writes other rows, so it does not
// wait at its start, and overlaps that launch's last items; it waits for it before exiting
// instead, so that a kernel after it sees both complete. Its own instance, so that the main
// launches run none of this (a runtime switch made them 8-16% slower, cause not found).
template <int NT, int CW, StreamEpilogue EPI, bool TAIL>
__global__ void __launch_bounds__((4 + CW) * 32, 1)
    fp4moe_wgmma_gemm(const StreamGemmArgs p, const __grid_constant__ CUtensorMap act_map, const int stages) {
#if FP4MOE_WGMMA
  extern __shared__ __align__(128) std::uint8_t smem[];
  constexpr int kTokens = NT * 8;
  constexpr WgmmaGemmConfig kShape{NT, 2, CW};
  constexpr int kMB = 16 / CW;  // m64 blocks per consumer warpgroup: 2 (8 warps) or 1 (16 warps)
  static_assert(CW == 8 || CW == 16);
  constexpr int kProducerRegs = WgmmaGemmLayout::producer_regs(TAIL);
  constexpr int kConsumerRegs = WgmmaGemmLayout::consumer_regs(kShape, TAIL);
  constexpr int kActOff = WgmmaGemmLayout::act_offset(kShape);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int stage_bytes = WgmmaGemmLayout::stage_bytes({NT, stages, CW});
  const std::uint32_t raw = smem_addr(smem);
  const std::uint32_t base =
      (raw + WgmmaGemmLayout::kAlign - 1) & ~static_cast<std::uint32_t>(WgmmaGemmLayout::kAlign - 1);
  const std::uint32_t bars = base + WgmmaGemmLayout::barrier_offset({NT, stages, CW});
  auto full_bar = [&](int s) { return bars + s * WgmmaGemmLayout::kBarrierBytes; };
  auto empty_bar = [&](int s) { return bars + s * WgmmaGemmLayout::kBarrierBytes + 8; };

  // GEMM1 (the SwiGLU instances): the producer warpgroup's 128 threads gather the token block's
  // rows with cp.async (p.slot_token), each thread's copies arriving once per stage besides thread
  // 0's expect_tx. GEMM2 reads its act in slot order through the tensor map.
  constexpr bool kGather = EPI != StreamEpilogue::kStoreBf16;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(full_bar(s), kGather ? 1 + kGatherThreads : 1);
      mbar_init(empty_bar(s), WgmmaGemmLayout::empty_arrivals(kShape));
    }
    mbar_fence_init();
  }
  __syncthreads();  // the last CTA-wide barrier: the warpgroups part here

  if constexpr (!TAIL) pdl_wait();
  pdl_launch_dependents();

  const int n_active = *p.n_active;
  const int expert_groups = (p.rows + WeightLayout::kGroupRows - 1) / WeightLayout::kGroupRows;
  const std::int64_t total_items = WgmmaItems<NT, TAIL>::count(p, n_active);
  const int n_chunks = p.n_chunks;
  WgmmaItems<NT, TAIL> items{p, n_active, total_items};

  if (warp < 4) {
    // Producer warpgroup: for GEMM2 one thread issues every copy and the others have nothing to do.
    setmaxnreg_dec<kProducerRegs>();
    if constexpr (kGather) {
      produce_gathered<NT, TAIL>(p, items, total_items, base, stage_bytes, stages, bars, kActOff);
      if constexpr (TAIL) pdl_wait();
      return;
    }
    if (threadIdx.x != 0) {
      if constexpr (TAIL) pdl_wait();
      return;
    }
    items.reload();
    int slot = 0;
    std::uint32_t phase = 0;
    for (std::int64_t item = blockIdx.x; item < (TAIL ? items.count(p, items.n_active) : total_items);
         item += gridDim.x) {
      const WgmmaItem it = items.at(item);
      const ItemWeights w{max(0, min(WgmmaGemmLayout::kGroups, expert_groups - it.group0)),
                          p.weights + static_cast<std::int64_t>(it.expert) * p.expert_stride +
                              static_cast<std::int64_t>(it.group0) * n_chunks * WeightLayout::kBlockBytes};
      const std::uint32_t bytes =
          w.groups * WeightLayout::kBlockBytes + kTokens * WgmmaGemmLayout::kActRowBytes;
      for (int c = 0; c < n_chunks; ++c) {
        mbar_wait(empty_bar(slot), phase ^ 1);
        const std::uint32_t st = base + slot * stage_bytes;
        mbar_arrive_expect_tx(full_bar(slot), bytes);
        copy_weights(w, n_chunks, c, st, full_bar(slot));
        tma_load_2d(st + kActOff, &act_map, c * WeightLayout::kChunkK, it.slot0, full_bar(slot));
        if (++slot == stages) {
          slot = 0;
          phase ^= 1;
        }
      }
    }
    if constexpr (TAIL) pdl_wait();
    return;
  }

  setmaxnreg_inc<kConsumerRegs>();
  const int cw = warp - 4;  // consumer warp 0 .. CW-1
  const int wg = cw >> 2;   // consumer warpgroup: m64 blocks kMB wg ..
  const int wi = cw & 3;    // warp within the warpgroup
  const int g = lane >> 2;
  const int t = lane & 3;

  // This warp's kMB tiles (rows 64 (kMB wg + i) + 16 wi) of the chunk in stage `st`, decoded for
  // the 4 k-steps. Tile i is tile wi of weight block kMB wg + i: its lane's 16 weight bytes and 2
  // scale bytes lie at fixed offsets from the stage, i blocks apart.
  const std::uint32_t w_off = wg * kMB * WeightLayout::kBlockBytes + wi * WeightLayout::kTileWeightBytes +
                              lane * WeightLayout::kLaneWeightBytes;
  const std::uint32_t s_off = wg * kMB * WeightLayout::kBlockBytes + WeightLayout::kBlockWeightBytes +
                              wi * WeightLayout::kTileScaleBytes + lane * WeightLayout::kLaneScaleBytes;
  auto decode = [&](std::uint32_t st, std::uint32_t(&a)[kMB][4][4]) {
#pragma unroll
    for (int i = 0; i < kMB; ++i) {
      const uint4 wq = lds128(st + w_off + i * WeightLayout::kBlockBytes);
      const std::uint32_t sc = lds16(st + s_off + i * WeightLayout::kBlockBytes);
      const std::uint32_t s_g = scale_pair_from_bytes(__byte_perm(sc, 0, 0x4040));
      const std::uint32_t s_g8 = scale_pair_from_bytes(__byte_perm(sc, 0, 0x4141));
      const std::uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        decode_e2m1x8(words[s], a[i][s]);
        a[i][s][0] = bf16x2_mul(a[i][s][0], s_g);
        a[i][s][1] = bf16x2_mul(a[i][s][1], s_g8);
        a[i][s][2] = bf16x2_mul(a[i][s][2], s_g);
        a[i][s][3] = bf16x2_mul(a[i][s][3], s_g8);
      }
    }
  };

  float acc[kMB][NT * 4];
  // One descriptor per chunk: k-step s reads the token block from 32 s bytes on, 2 s further
  // (see b_descriptor).
  auto mma = [&](std::uint32_t st, const std::uint32_t(&a)[kMB][4][4]) {
    const std::uint64_t desc = b_descriptor(st + kActOff);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int i = 0; i < kMB; ++i) wgmma_rs<NT>(acc[i], a[i][s], desc + 2 * s);
    }
    wgmma_commit();
  };

  int slot = 0;  // the next stage to wait for
  std::uint32_t phase = 0;
  auto next_stage = [&]() {
    mbar_wait(full_bar(slot), phase);
    const int s = slot;
    if (++slot == stages) {
      slot = 0;
      phase ^= 1;
    }
    return s;
  };
  // Every consumer thread arrives: its own shared-memory reads of the stage (the decode) are
  // then ordered before the producer's next TMA write there (racecheck checks exactly this).
  auto release = [&](int s) { mbar_arrive(empty_bar(s)); };

  // GEMM2's stores of an item whose rows all lie in the matrix: per m64 block and 32 tokens, the
  // warp writes its 16 rows x 32 tokens to its buffer transposed (stmatrix .trans: each token's
  // 16 results become 32 contiguous bytes, the two 8-row halves swapped on every other group of
  // four tokens so that each matrix's eight 16-byte rows fall in distinct banks), then each lane
  // stores 16 bytes of a token (two lanes per token, 16 tokens per instruction: whole 32-byte
  // sectors). The values and their rounding are those of store_token's. Needs 16-byte aligned
  // rows, which launch_wgmma_gemm requires of GEMM2's output.
  const std::uint32_t ebuf =
      base + WgmmaGemmLayout::epilogue_offset({NT, stages, CW}) + cw * WgmmaGemmLayout::kEpilogueWarpBytes;
  // stmatrix: lane l gives row l % 8 of matrix l / 8 = (token block l / 16, half (l / 8) % 2).
  const std::uint32_t st_addr =
      ebuf + (8 * (lane >> 4) + (lane & 7)) * 32 + ((((lane >> 3) & 1) ^ ((lane >> 2) & 1)) << 4);
  // Read back: lane l takes half l % 2 of token l / 2 (+ 16).
  const int rtk = lane >> 1;
  const int rhh = lane & 1;
  const std::uint32_t ld_addr = ebuf + rtk * 32 + ((rhh ^ ((rtk >> 2) & 1)) << 4);
  auto store_staged = [&](const WgmmaItem& it, const TileOut(&o)[kMB]) {
    static_assert(NT % 4 == 0 && WgmmaGemmLayout::kEpilogueTokens == 32);
#pragma unroll
    for (int i = 0; i < kMB; ++i) {
      std::uint16_t* out = out_row_ptr(p, it.slot0 + rtk) + (o[i].col[0] - g) + 8 * rhh;
      const std::int64_t step = 16 * static_cast<std::int64_t>(p.out_ld);  // 16 tokens
#pragma unroll
      for (int pass = 0; pass < NT / 4; ++pass) {
        std::uint32_t r[8];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int j = 4 * pass + jj;
          r[2 * jj] = bf16x2_from_f32(acc[i][4 * j] * o[i].scale[0] + o[i].bias[0],
                                      acc[i][4 * j + 1] * o[i].scale[0] + o[i].bias[0]);
          r[2 * jj + 1] = bf16x2_from_f32(acc[i][4 * j + 2] * o[i].scale[1] + o[i].bias[1],
                                          acc[i][4 * j + 3] * o[i].scale[1] + o[i].bias[1]);
        }
        stmatrix_x4_trans(st_addr, r[0], r[1], r[2], r[3]);
        stmatrix_x4_trans(st_addr + 16 * 32, r[4], r[5], r[6], r[7]);
        __syncwarp();
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const uint4 v = lds128_ordered(ld_addr + u * 16 * 32);
          if (32 * pass + 16 * u + rtk < it.m_count) stg128(out, v);
          out += step;
        }
        __syncwarp();
      }
    }
  };

  items.reload();
  for (std::int64_t item = blockIdx.x; item < (TAIL ? items.count(p, items.n_active) : total_items);
       item += gridDim.x) {
    const WgmmaItem it = items.at(item);
#pragma unroll
    for (int i = 0; i < kMB; ++i)
#pragma unroll
      for (int q = 0; q < NT * 4; ++q) acc[i][q] = 0.0f;

    // Chunk c's wgmmas run on the tensor cores while the warp waits for, and decodes, chunk c + 1
    // into the other A set; chunk c - 1's stage is freed once its wgmmas are done (wait_group 1).
    std::uint32_t a0[kMB][4][4], a1[kMB][4][4];
    int cur = next_stage();
    std::uint32_t st = base + cur * stage_bytes;
    decode(st, a0);
    int prev = 0;  // chunk c - 1's stage, for c > 0
    // Chunk c: its wgmmas on A set `a`; chunk c - 1's stage freed; the next chunk, if there is one
    // (the result), decoded into `next`. The loop runs two chunks per trip so that even chunks use
    // a0 and odd ones a1 with no branch on c.
    auto step = [&](int c, const std::uint32_t(&a)[kMB][4][4], std::uint32_t(&next)[kMB][4][4]) {
      mma(st, a);
      wgmma_wait_one();
      if (c > 0) release(prev);
      prev = cur;
      if (c + 1 >= n_chunks) return false;
      cur = next_stage();
      st = base + cur * stage_bytes;
      decode(st, next);
      return true;
    };
    for (int c = 0; step(c, a0, a1) && step(c + 1, a1, a0); c += 2) {
    }
    wgmma_wait_all();
    release(prev);
#pragma unroll
    for (int i = 0; i < kMB; ++i) keep_in_registers(acc[i]);

    // Epilogue: per m64 block i, this warp holds rows 16 wi + {g, g+8}; per 8-token block j,
    // acc[i][4j + q] is (row g, token 8j + 2t + q) for q < 2 and (row g + 8, ...) for q >= 2.
    // What the rows need (scales, biases, columns) is read before the first store.
    TileOut o[kMB];
#pragma unroll
    for (int i = 0; i < kMB; ++i)
      o[i] = tile_out<EPI>(p, it.expert, it.group0 * 4 + wg * (4 * kMB) + 4 * i + wi, g);
    std::uint16_t* const row0 = out_row_ptr(p, it.slot0 + 2 * t);
    // When every row of the item lies in the matrix (all but the last row block where the rows
    // are not a multiple of 256), GEMM2 stores through the buffer (store_staged) and GEMM1's token
    // columns are o[0]'s plus a fixed distance: intermediate index + 32 (i), which permuted_k maps
    // to + 4 (the item's first index is a multiple of 64, so i = 1 stays in the same 64-chunk). A
    // token's stores then share one address.
    if ((it.group0 + WgmmaGemmLayout::kGroups) * WeightLayout::kGroupRows <= p.rows) {
      if constexpr (EPI == StreamEpilogue::kStoreBf16) {
        store_staged(it, o);
        continue;
      }
      std::uint16_t* const base = row0 + o[0].col[0];
      const int dcol = kMB > 1 ? o[kMB - 1].col[0] - o[0].col[0] : 0;  // GEMM1, i = 1
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          if (8 * j + 2 * t + q >= it.m_count) continue;
          std::uint16_t* const row = base + (8 * j + q) * p.out_ld;
#pragma unroll
          for (int i = 0; i < kMB; ++i) {
            const float v_g = acc[i][4 * j + q] * o[i].scale[0] + o[i].bias[0];
            const float v_g8 = acc[i][4 * j + 2 + q] * o[i].scale[1] + o[i].bias[1];
            row[i * dcol] = f32_to_bf16_bits(gemm_activation(EPI, v_g, v_g8, p.swiglu_alpha, p.swiglu_limit));
          }
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          if (8 * j + 2 * t + q >= it.m_count) continue;
          std::uint16_t* const row = row0 + (8 * j + q) * p.out_ld;
#pragma unroll
          for (int i = 0; i < kMB; ++i)
            store_token<EPI>(p, o[i], row, acc[i][4 * j + q], acc[i][4 * j + 2 + q]);
        }
      }
    }
  }
  if constexpr (TAIL) pdl_wait();
#endif
}

namespace {

using WgmmaKernelFn = void (*)(const StreamGemmArgs, const CUtensorMap, const int);

template <int NT, int CW, bool TAIL>
WgmmaKernelFn wgmma_pick_epilogue(StreamEpilogue epi) {
  switch (epi) {
    case StreamEpilogue::kSwiGLU:
      return fp4moe_wgmma_gemm<NT, CW, StreamEpilogue::kSwiGLU, TAIL>;
    case StreamEpilogue::kSwiGLUClamped:
      return fp4moe_wgmma_gemm<NT, CW, StreamEpilogue::kSwiGLUClamped, TAIL>;
    case StreamEpilogue::kStoreBf16:
      return fp4moe_wgmma_gemm<NT, CW, StreamEpilogue::kStoreBf16, TAIL>;
  }
  return nullptr;
}

// Exactly the instances of kWgmmaShapes; tail instances (tail launches) of the shapes that can be
// a tail (wgmma_tail: 32 and 64 tokens).
template <std::size_t I = 0>
WgmmaKernelFn wgmma_kernel_at(const WgmmaGemmConfig& c, StreamEpilogue epi, bool tail) {
  if constexpr (I == sizeof(kWgmmaShapes) / sizeof(kWgmmaShapes[0])) {
    return nullptr;
  } else {
    constexpr WgmmaShape s = kWgmmaShapes[I];
    if (c.n_tiles == s.n_tiles && c.consumer_warps == s.consumer_warps) {
      if constexpr (s.n_tiles < 16) {
        if (tail) return wgmma_pick_epilogue<s.n_tiles, s.consumer_warps, true>(epi);
      }
      return tail ? nullptr : wgmma_pick_epilogue<s.n_tiles, s.consumer_warps, false>(epi);
    }
    return wgmma_kernel_at<I + 1>(c, epi, tail);
  }
}

WgmmaKernelFn wgmma_kernel_for(const WgmmaGemmConfig& c, StreamEpilogue epi, bool tail = false) {
  return wgmma_kernel_at(c, epi, tail);
}

// k-permuted copy of x in slot order, token-major: token t's row is read once and written to each
// of its slots (pair_slot; -1: a dropped pick), out[slot][permuted_k(kk)] = x[t][kk], zero past k.
// (Slot-major, one CTA per slot, read each row once per pick: at T=4096 x no longer stays in L2
// between an expert's pass and the next, and the rows came from DRAM up to 9 times.) A warp moves
// one span of four 64-chunks: each lane loads 8 consecutive k, the warp reorders them through
// shared memory into mma-k order, and each lane stores one 16-byte piece per slot.
constexpr int kScatterWarps = 4;
constexpr int kScatterSpanK = 256;
constexpr int kScatterChunkWords = 40;  // 32 words of a chunk, padded: the reads hit 32 banks

__global__ void __launch_bounds__(kScatterWarps * 32)
    permute_scatter_kernel(const std::uint16_t* x, const std::int32_t* pair_slot, int pairs, int k,
                           int k_padded, std::uint16_t* out) {
  __shared__ __align__(16) std::uint32_t buf[kScatterWarps][4 * kScatterChunkWords];
  pdl_wait();
  const int t = blockIdx.x;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int k0 = (blockIdx.y * kScatterWarps + warp) * kScatterSpanK;
  if (k0 >= k_padded) return;  // the same for the whole warp
  const int c = lane >> 3;     // chunk of the span: lane loads its k 8 (lane % 8) .. + 7
  const int q = lane & 7;      // and stores its mma-k 8 q .. 8 q + 7
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (k0 + 8 * lane < k)
    v = *reinterpret_cast<const uint4*>(x + static_cast<std::int64_t>(t) * k + k0 + 8 * lane);
  *reinterpret_cast<uint4*>(&buf[warp][c * kScatterChunkWords + 4 * q]) = v;
  __syncwarp();
  // mma-k 8q + 2i + o (i < 4, o < 2) holds real k 16i + 2q + o (permuted_k): word 8i + q.
  const std::uint32_t* w = &buf[warp][c * kScatterChunkWords];
  const uint4 piece = make_uint4(w[q], w[8 + q], w[16 + q], w[24 + q]);
  const bool mine = k0 + 64 * c < k_padded;
  const std::int64_t col = k0 + 64 * c + 8 * q;
  for (int j0 = 0; j0 < pairs; j0 += 32) {
    const int my = j0 + lane >= pairs     ? -1
                   : pair_slot == nullptr ? t
                                          : pair_slot[static_cast<std::int64_t>(t) * pairs + j0 + lane];
    const int n = min(32, pairs - j0);
    for (int j = 0; j < n; ++j) {
      const int slot = __shfl_sync(0xffffffffu, my, j);
      if (slot >= 0 && mine)
        *reinterpret_cast<uint4*>(out + static_cast<std::int64_t>(slot) * k_padded + col) = piece;
    }
  }
}

}  // namespace

bool wgmma_supported() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  cudaFuncAttributes fa{};
  // The kernel has a body only in the sm_90a image; elsewhere it is compiled empty.
  return major == 9 && minor == 0 &&
         cudaFuncGetAttributes(&fa, fp4moe_wgmma_gemm<16, 8, StreamEpilogue::kStoreBf16, false>) ==
             cudaSuccess &&
         fa.numRegs > 16;
}

cudaError_t wgmma_gemm_setup(const WgmmaGemmConfig& config, StreamEpilogue epilogue,
                             KernelAttributes* attributes) {
  const WgmmaKernelFn fn = wgmma_kernel_for(config, epilogue);
  if (fn == nullptr || !WgmmaGemmLayout::valid(config)) return cudaErrorInvalidValue;
  if (!wgmma_supported()) return cudaErrorNotSupported;
  KernelAttributes a{};
  const cudaError_t err = setup_kernel(fn, WgmmaGemmLayout::threads(config),
                                       static_cast<int>(WgmmaGemmLayout::cta_bytes(config)), &a);
  if (err != cudaSuccess) return err;
  // The same shape's tail instance, where there is one (it may run as a tail launch).
  if (const WgmmaKernelFn tail_fn = wgmma_kernel_for(config, epilogue, true); tail_fn != nullptr) {
    KernelAttributes t{};
    const cudaError_t terr = setup_kernel(tail_fn, WgmmaGemmLayout::threads(config),
                                          static_cast<int>(WgmmaGemmLayout::cta_bytes(config)), &t);
    if (terr != cudaSuccess) return terr;
    if (static_cast<std::int64_t>(t.registers) * WgmmaGemmLayout::threads(config) <
        WgmmaGemmLayout::register_demand(config, true)) {
      return cudaErrorInvalidConfiguration;
    }
    a.registers = std::max(a.registers, t.registers);
    a.local_bytes = std::max(a.local_bytes, t.local_bytes);
    a.max_blocks_per_sm = std::min(a.max_blocks_per_sm, t.max_blocks_per_sm);
  }
  // setmaxnreg redistributes the CTA's own registers: a launch count below what the warpgroups
  // ask for would hang the consumers' setmaxnreg.inc, so refuse the config instead.
  if (static_cast<std::int64_t>(a.registers) * WgmmaGemmLayout::threads(config) <
      WgmmaGemmLayout::register_demand(config)) {
    return cudaErrorInvalidConfiguration;
  }
  if (attributes != nullptr) *attributes = a;
  return cudaSuccess;
}

namespace {

// The driver's tensor-map encoder, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The token blocks' tensor map: act as [act_rows][act_ld] bf16, boxes of 64 values x `tokens`
// rows written with the 128-byte swizzle; rows past act_rows read as zeros. Encoding is a host
// computation (no device work), so it is done per launch (and captured by value in graphs).
cudaError_t encode_act_map(const StreamGemmArgs& a, int tokens, CUtensorMap* map) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  if (a.act == nullptr || a.act_rows <= 0 || a.act_ld % 64 != 0 ||
      (reinterpret_cast<std::uintptr_t>(a.act) & 15u) != 0) {
    return cudaErrorInvalidValue;
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(a.act_ld), static_cast<cuuint64_t>(a.act_rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a.act_ld) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(WeightLayout::kChunkK), static_cast<cuuint32_t>(tokens)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<std::uint16_t*>(a.act), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_wgmma_gemm(const StreamGemmArgs& args, const WgmmaGemmConfig& config,
                              StreamEpilogue epilogue, int grid, bool pdl, cudaStream_t stream) {
  const WgmmaKernelFn fn = wgmma_kernel_for(config, epilogue, args.tail_of > 0);
  if (fn == nullptr || !WgmmaGemmLayout::valid(config)) return cudaErrorInvalidValue;
  if ((epilogue != StreamEpilogue::kStoreBf16) != (args.slot_token != nullptr)) return cudaErrorInvalidValue;
  // GEMM2's staged stores write 16 bytes at a time: its output rows must be 16-byte aligned.
  if (epilogue == StreamEpilogue::kStoreBf16 &&
      (args.out_ld % 8 != 0 || (reinterpret_cast<std::uintptr_t>(args.out) & 15u) != 0))
    return cudaErrorInvalidValue;
  CUtensorMap map;
  const cudaError_t err = encode_act_map(args, WgmmaGemmLayout::tokens(config), &map);
  if (err != cudaSuccess) return err;
  return launch_kernel(fn, grid, WgmmaGemmLayout::threads(config),
                       static_cast<std::size_t>(WgmmaGemmLayout::cta_bytes(config)), pdl, stream, args, map,
                       config.stages);
}

cudaError_t launch_permute_gather(const std::uint16_t* x, const std::int32_t* pair_slot, int tokens,
                                  int pairs, int k, int k_padded, std::uint16_t* out, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (pair_slot == nullptr) pairs = 1;
  if (k % 8 != 0 || k_padded % 64 != 0 || k_padded < k) return cudaErrorInvalidValue;
  const int spans = (k_padded + kScatterSpanK - 1) / kScatterSpanK;
  const dim3 grid(static_cast<unsigned>(tokens),
                  static_cast<unsigned>((spans + kScatterWarps - 1) / kScatterWarps));
  permute_scatter_kernel<<<grid, kScatterWarps * 32, 0, stream>>>(x, pair_slot, pairs, k, k_padded, out);
  return cudaGetLastError();
}

}  // namespace fp4moe::kernels
