// Routing and grouping device code shared by the routing kernels (kernels/routing.cu) and the
// first stream GEMM's fused routing (kernels/stream_gemm.cu, route_group_cta): one warp routes a
// token, one CTA scans the experts. See routing.cu for the whole pipeline.
#pragma once

#include "fp4moe/detail/portable_math.hpp"
#include "kernels/common.cuh"
#include "kernels/launch.hpp"
#include "kernels/wgmma_gemm_layout.hpp"

namespace fp4moe::kernels::routing {

using detail::pm_add;
using detail::pm_div;
using detail::pm_mul;
using detail::portable_exp;
using detail::portable_sigmoid;

// Order-preserving key of (score, id): larger key = ranks first (detail::ranks_before).
__device__ __forceinline__ unsigned long long rank_key(float score, int id) {
  std::uint32_t hi = 0;  // NaN: below every number
  if (score == score) {
    const std::uint32_t u = score == 0.0f ? 0u : __float_as_uint(score);  // -0 ranks as +0
    hi = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
  return (static_cast<unsigned long long>(hi) << 32) | (0xffffffffu - static_cast<std::uint32_t>(id));
}
// The score a key was made from (-0 comes back as +0; NaN as NaN).
__device__ __forceinline__ float key_score(unsigned long long key) {
  const std::uint32_t hi = static_cast<std::uint32_t>(key >> 32);
  if (hi == 0) return __int_as_float(0x7fc00000);
  return __uint_as_float((hi & 0x80000000u) ? (hi & 0x7fffffffu) : ~hi);
}
__device__ __forceinline__ int key_id(unsigned long long key) {
  return static_cast<int>(0xffffffffu - static_cast<std::uint32_t>(key));
}

// The largest key over the warp.
__device__ __forceinline__ unsigned long long warp_max_key(unsigned long long key) {
  const std::uint32_t hi = static_cast<std::uint32_t>(key >> 32);
  const std::uint32_t max_hi = __reduce_max_sync(0xffffffffu, hi);
  const std::uint32_t lo = hi == max_hi ? static_cast<std::uint32_t>(key) : 0u;
  const std::uint32_t max_lo = __reduce_max_sync(0xffffffffu, lo);
  return (static_cast<unsigned long long>(max_hi) << 32) | max_lo;
}

// Sorts v into descending order in place: a bitonic network over compile-time indices, so that v
// stays in registers.
template <int N>
__device__ __forceinline__ void sort_keys_descending(unsigned long long (&v)[N]) {
  static_assert(N >= 1 && (N & (N - 1)) == 0, "a power of two");
#pragma unroll
  for (int size = 2; size <= N; size <<= 1) {
#pragma unroll
    for (int stride = size / 2; stride > 0; stride >>= 1) {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const int j = i ^ stride;
        if (j > i) {
          // Runs of `size` alternate descending / ascending, so that each pair of them is bitonic;
          // the last merge (size == N) is descending throughout.
          const bool descending = (i & size) == 0;
          const unsigned long long a = v[i], b = v[j];
          const bool swap = descending ? a < b : a > b;
          v[i] = swap ? b : a;
          v[j] = swap ? a : b;
        }
      }
    }
  }
}

// A token's pick of one rank: its expert and weight (lanes < k; id -1 in the others).
struct RoutePick {
  int id;
  float weight;
};

// Routes token t with one warp; PER = experts per lane (expert e = lane + 32 i). Returns the pick
// of rank `lane` (the caller stores it).
template <int PER>
__device__ __forceinline__ RoutePick route_token(const RouteArgs& a, int t, int lane) {
  const int E = a.experts;
  const float* logits = a.logits + static_cast<std::int64_t>(t) * E;
  const bool sigmoid = a.router == RouterId::kSigmoidGroupTopK;
  // The lane's logits and biases first, all loads in flight at once: the sigmoid's division has a
  // call (its slow path), past which the compiler keeps every later load, and with loads inside
  // the loop the 8 bias loads of a lane went out one after another, each a trip to memory (~5 us
  // of the one-token forward on the H200).
  float lg[PER], bias[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + 32 * i;
    lg[i] = e < E ? logits[e] : 0.0f;
    bias[i] = sigmoid && a.correction_bias != nullptr && e < E ? a.correction_bias[e] : 0.0f;
  }
  // Only the keys stay in registers past this loop; a pick's value (sigmoid or logit) is
  // recomputed from its logit afterwards, which keeps PER = 16 (E <= 512) within the 1024-thread
  // CTA's registers.
  unsigned long long key[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + 32 * i;
    key[i] = 0;
    if (e < E) {
      const float l = lg[i];
      if (sigmoid) {
        const float s = portable_sigmoid(l);
        key[i] = rank_key(pm_add(s, bias[i]), e);
      } else {
        key[i] = rank_key(l, e);  // softmax is monotonic: rank by logits (no ties made by rounding)
      }
    }
  }

  if (sigmoid && a.n_group > 1) {
    // Group score = best + second selection score of each group of E / n_group experts, by
    // two warp-wide maxima per group; lane g keeps group g's key.
    const int gsize = E / a.n_group;
    unsigned long long gkey = 0;
    for (int grp = 0; grp < a.n_group; ++grp) {
      unsigned long long k1 = 0, k2 = 0;
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int e = lane + 32 * i;
        if (e < E && e / gsize == grp) {
          if (key[i] > k1) {
            k2 = k1;
            k1 = key[i];
          } else if (key[i] > k2) {
            k2 = key[i];
          }
        }
      }
      const unsigned long long best = warp_max_key(k1);
      const unsigned long long second = warp_max_key(k1 == best ? k2 : k1);
      const float score = gsize >= 2 ? pm_add(key_score(best), key_score(second)) : key_score(best);
      if (lane == grp) gkey = rank_key(score, grp);
    }
    std::uint32_t kept = 0;
    for (int r = 0; r < a.topk_group; ++r) {
      const unsigned long long best = warp_max_key(((kept >> lane) & 1u) ? 0ull : gkey);
      kept |= 1u << key_id(best);
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !((kept >> (e / gsize)) & 1u)) key[i] = 0;
    }
  }

  // Each lane's keys in descending order, so that the lane whose best key a round takes moves its
  // next one up (constant-index moves, no search): the rounds' chain is the warp maxima alone. (A
  // search of the lane's remaining keys after each take was a serial chain of PER compares in
  // one lane while the warp waited, every round.)
  sort_keys_descending(key);
  int my_pick = -1;
  for (int r = 0; r < a.top_k; ++r) {
    const unsigned long long best = warp_max_key(key[0]);
    const int id = key_id(best);
    if (lane == r) my_pick = id;
    const bool taken = (id & 31) == lane;  // expert id is lane id + 32 i: its key was this lane's key[0]
#pragma unroll
    for (int i = 0; i + 1 < PER; ++i) key[i] = taken ? key[i + 1] : key[i];
    key[PER - 1] = taken ? 0ull : key[PER - 1];
  }
  // The pick's value: sigmoid router s, otherwise the logit.
  const float pick_logit = my_pick >= 0 ? logits[my_pick] : 0.0f;
  const float my_val = sigmoid ? portable_sigmoid(pick_logit) : pick_logit;

  // Weights, in the reference's operation order where it is cheap to keep (see docs/NUMERICS.md).
  const int k = a.top_k;
  float w = 0.0f;
  if (a.router == RouterId::kSigmoidGroupTopK) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum = pm_add(sum, __shfl_sync(0xffffffffu, my_val, j));
    w = my_val;
    if (a.renormalize) w = pm_div(w, pm_add(sum, 1e-20f));
    w = pm_mul(w, a.scaling);
  } else if (a.router == RouterId::kSoftmaxTopK) {
    // Softmax over all E (the max is pick 0's logit); the sum is a tree over the warp, so the
    // weights agree with the reference's index-order sum to rounding (ids are exact).
    const float m = __shfl_sync(0xffffffffu, my_val, 0);
    float v[PER];  // (loaded before the first exp's call, as above)
#pragma unroll
    for (int i = 0; i < PER; ++i) v[i] = lane + 32 * i < E ? logits[lane + 32 * i] : 0.0f;
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      if (lane + 32 * i < E) part = pm_add(part, portable_exp(pm_add(v[i], -m)));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) part = pm_add(part, __shfl_xor_sync(0xffffffffu, part, off));
    const float p = pm_div(portable_exp(pm_add(my_val, -m)), part);
    float psum = 0.0f;
    for (int j = 0; j < k; ++j) psum = pm_add(psum, __shfl_sync(0xffffffffu, p, j));
    w = a.renormalize ? pm_div(p, psum) : p;
  } else {  // top-k, then softmax over the k
    const float m = __shfl_sync(0xffffffffu, my_val, 0);
    const float ex = portable_exp(pm_add(my_val, -m));
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum = pm_add(sum, __shfl_sync(0xffffffffu, ex, j));
    w = pm_div(ex, sum);
  }
  return RoutePick{lane < k ? my_pick : -1, w};
}

// Exclusive prefix sums of kScanValues values per thread over the CTA's threads (WARPS warps; 0:
// blockDim.x / 32, read at run time), in one pass: each warp scans its lanes' values with shuffles (the value
// chains interleave), warp 0 scans the warps' totals, two barriers in all. v becomes the exclusive prefixes,
// total the sums. Why not CUB's BlockScan: it scans one value (or one struct) per call, and six calls one
// after another, two barriers each, were a chain the one-token router waited on (T=1 1.020x
// without them, docs/PERF.md history); its warp-scans algorithm, which one call over a struct
// would want, adds the warps' totals serially in every thread and measured 1.2 us slower than its
// raking one here, and the raking one spilled with 64-bit values (7228316).
constexpr int kScanValues = kRouteScanValues;
constexpr int kScanWarps = kRouteScanWarps;  // at most
using ScanSums = std::int32_t[kScanWarps + 1][kScanValues];

// Inclusive prefix sums of each of the kScanValues values over the warp's lanes (shuffles; the
// values' chains interleave).
__device__ __forceinline__ void warp_inclusive_scan(int (&x)[kScanValues], int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
#pragma unroll
    for (int i = 0; i < kScanValues; ++i) {
      const int y = __shfl_up_sync(0xffffffffu, x[i], off);
      if (lane >= off) x[i] += y;
    }
  }
}

template <int WARPS>
__device__ __forceinline__ void block_exclusive_scan(int (&v)[kScanValues], int (&total)[kScanValues],
                                                     ScanSums& sums) {
  static_assert(WARPS >= 0 && WARPS <= kScanWarps);
  const int warps = WARPS > 0 ? WARPS : static_cast<int>(blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  int incl[kScanValues];
#pragma unroll
  for (int i = 0; i < kScanValues; ++i) incl[i] = v[i];
  warp_inclusive_scan(incl, lane);
  if (lane == 31) {
#pragma unroll
    for (int i = 0; i < kScanValues; ++i) sums[warp][i] = incl[i];
  }
  __syncthreads();
  if (warp == 0) {
    int w[kScanValues], wi[kScanValues];
#pragma unroll
    for (int i = 0; i < kScanValues; ++i)
      wi[i] = w[i] = WARPS == kScanWarps || lane < warps ? sums[lane][i] : 0;
    warp_inclusive_scan(wi, lane);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kScanValues; ++i) {
      sums[lane][i] = wi[i] - w[i];
      if (lane == 31) sums[kScanWarps][i] = wi[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kScanValues; ++i) {
    total[i] = sums[kScanWarps][i];
    v[i] = sums[warp][i] + incl[i] - v[i];
  }
}

// Offsets, active list and per-GEMM token-block prefixes from `counts` (n experts). One CTA of
// WARPS warps (0: read at run time), one expert per thread (n <= its threads); writes the results
// where g points and the offsets also to `offsets_smem` when given.
template <int WARPS>
__device__ __forceinline__ void scan_experts(const int* counts, int n, const GroupArgs& g, ScanSums& sums,
                                             int* offsets_smem) {
  const int e = threadIdx.x;
  const int cnt = e < n ? counts[e] : 0;
  const int flag = cnt > 0 ? 1 : 0;
  // The small-expert launch takes the experts of at most tb_small tokens only when there are at
  // least small_min of them (GroupArgs::small_min); else the GEMMs' other launches take them.
  const int small_max = max(g.tb_small[0], g.tb_small[1]);
  const int small_candidate = flag != 0 && cnt <= small_max ? 1 : 0;
  const bool take_small = small_max > 0 && __syncthreads_count(small_candidate) >= g.small_min;
  const int small = take_small ? small_candidate : 0;
  // Each tail launch's experts (GroupArgs::tail_experts): per GEMM that has tail launches, its two
  // lists' positions packed in 16-bit halves (n <= 1024).
  static_assert(kMaxWgmmaTails == 2, "the scan packs one 16-bit position per tail launch");
  int cls[2];
#pragma unroll
  for (int gi = 0; gi < 2; ++gi) {
    cls[gi] = g.tb_tail[gi] == 0
                  ? -1
                  : wgmma_tail_class(cnt, g.tb_tokens[gi], g.tb_tail[gi], take_small ? g.tb_small[gi] : 0);
  }
  int v[kScanValues] = {cnt,
                        flag | small << 16,
                        main_token_blocks(cnt, g.tb_tokens[0], g.tb_tail[0], take_small ? g.tb_small[0] : 0),
                        main_token_blocks(cnt, g.tb_tokens[1], g.tb_tail[1], take_small ? g.tb_small[1] : 0),
                        cls[0] < 0 ? 0 : 1 << (16 * cls[0]),
                        cls[1] < 0 ? 0 : 1 << (16 * cls[1])};
  int total[kScanValues];
  block_exclusive_scan<WARPS>(v, total, sums);
  const int off = v[0], pos = v[1] & 0xffff, n_active = total[1] & 0xffff;
  if (small) g.small_experts[v[1] >> 16] = e;
  if (small_max > 0 && e == 0) *g.small_count = total[1] >> 16;
  if (e < n) {
    g.offsets[e] = off;
    g.cursors[e] = 0;
    if (offsets_smem != nullptr) offsets_smem[e] = off;
    if (flag) {
      g.active[pos] = e;
      g.tb_prefix[0][pos] = v[2];
      g.tb_prefix[1][pos] = v[3];
    }
  }
  if (e == 0) {
    g.offsets[n] = total[0];
    if (offsets_smem != nullptr) offsets_smem[n] = total[0];
    *g.n_active = n_active;
    g.tb_prefix[0][n_active] = total[2];
    g.tb_prefix[1][n_active] = total[3];
  }
#pragma unroll
  for (int gi = 0; gi < 2; ++gi) {
    if (g.tb_tail[gi] == 0) continue;  // the same for every thread
    if (cls[gi] >= 0)
      g.tail_experts[gi][GroupArgs::tail_list_offset(cls[gi], n) + ((v[4 + gi] >> (16 * cls[gi])) & 0xffff)] =
          e;
    if (e == 0) {
      g.tail_count[gi][0] = total[4 + gi] & 0xffff;
      g.tail_count[gi][1] = total[4 + gi] >> 16;
    }
  }
}

// Routing and grouping of a forward's T <= kFusedRouteTokens tokens inside each CTA of the first
// stream GEMM (the fused decode path, StreamGemmConfig launches of launch_stream_gemm_routed):
// every CTA routes every token (warp t token t; or takes the caller's ids when ra.logits is null),
// counts, scans and scatters into its own shared
// tables `rt`, which its items are then looked up in; CTA 0 (`publish`) also writes everything
// the later kernels and the caller read (ga's and ra's global outputs). So the slot order within
// an expert must be the same in every CTA: the scatter here is deterministic (slots in (token,
// pick) order), unlike the routing kernels' atomic one. Requires E + P <= blockDim.x (one expert
// per thread in the scan), T * k <= kFusedRouteTokens * kMaxTopK, T * (k + P) <= kFusedRouteSlots,
// and neither tail launches nor a small-expert launch (ga.tb_tail and ga.tb_small zero).
// warm / warm_bytes: this CTA's share of bytes to prefetch into L2 while it routes (the fused first
// GEMM's StreamGemmArgs::l2_warm); the CTA's last warp issues it once the routing's first input
// word has come back, so that the routing's own loads are not queued behind it.
template <int PER>
__device__ __forceinline__ void route_group_cta(const RouteArgs& ra, const GroupArgs& ga,
                                                FusedRouteTables& rt, bool publish, const std::uint8_t* warm,
                                                std::int64_t warm_bytes) {
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int n = ga.experts + ga.shared_pieces;
  const int k = ga.top_k;
  const int picks = k + ga.shared_pieces;
  const int pairs = ga.tokens * k;

  static_assert(kFusedRouteTokens <= 32, "a token's bit in a 32-bit mask");
  for (int e = tid; e < n; e += nthreads) rt.token_mask[e] = 0;
  __syncthreads();
  if (warm_bytes > 0 && warp == (nthreads >> 5) - 1) {
    // Wait for the routing's first input word (the routing warps asked for its line too), then
    // prefetch: each lane an equal, 16-byte aligned part. Only a hint: a word that reads as all
    // ones skips it (the branch is what keeps the prefetch after the load).
    std::uint32_t first = 0;
    if (lane == 0) {
      first =
          ra.logits != nullptr ? __float_as_uint(ra.logits[0]) : static_cast<std::uint32_t>(ga.topk_ids[0]);
    }
    first = __shfl_sync(0xffffffffu, first, 0);
    const ByteRange r = aligned_share(warm_bytes, 32, lane, 16);
    if (first != 0xffffffffu && r.end > r.begin) {
      prefetch_l2(warm + r.begin, static_cast<std::uint32_t>(r.end - r.begin));
    }
  }
  if (ra.logits != nullptr) {
    for (int t = warp; t < ra.tokens; t += nthreads >> 5) {
      const RoutePick pick = route_token<PER>(ra, t, lane);
      if (lane < k) {
        rt.ids[t * k + lane] = pick.id;
        if (pick.id >= 0) atomicOr(&rt.token_mask[pick.id], 1u << t);
        if (publish) {
          ra.topk_ids[static_cast<std::int64_t>(t) * k + lane] = pick.id;
          ra.topk_weights[static_cast<std::int64_t>(t) * k + lane] = pick.weight;
        }
      }
    }
  } else {
    // Routed by the caller (ga.topk_ids; finalize reads the caller's weights): an id outside
    // [0, E) is dropped. A token that names an expert twice gets one slot, which both picks then
    // read (the same sum as two slots of the same row).
    for (int idx = tid; idx < pairs; idx += nthreads) {
      int e = ga.topk_ids[idx];
      if (e < 0 || e >= ga.experts) e = -1;
      rt.ids[idx] = e;
      if (e >= 0) atomicOr(&rt.token_mask[e], 1u << (idx / k));
    }
  }
  __syncthreads();
  // (Thread e writes counts[e], and in the scan only thread e reads it: no barrier.)
  if (tid < n) rt.counts[tid] = tid < ga.experts ? __popc(rt.token_mask[tid]) : ga.tokens;

  GroupArgs gs = ga;  // the scan's outputs: this CTA's tables
  gs.offsets = rt.offsets;
  gs.active = rt.active;
  gs.n_active = &rt.n_active;
  gs.tb_prefix[0] = rt.tb_prefix[0];
  gs.tb_prefix[1] = rt.tb_prefix[1];
  gs.cursors = rt.counts;  // thread e reads counts[e] before it zeroes it, and no other thread does
  scan_experts<0>(rt.counts, n, gs, rt.scan_sums, nullptr);
  __syncthreads();

  // An expert's slots in token order (a token picks an expert at most once): the slot of token t's
  // pick of e is e's offset plus the number of earlier tokens that picked e. The shared expert's
  // pieces: offset + token.
  for (int idx = tid; idx < pairs; idx += nthreads) {
    const int e = rt.ids[idx];
    if (e < 0) continue;
    const int t = idx / k;
    const int slot = rt.offsets[e] + __popc(rt.token_mask[e] & ((1u << t) - 1u));
    rt.slot_token[slot] = t;
    if (publish) {
      ga.slot_token[slot] = t;
      ga.pair_slot[static_cast<std::int64_t>(t) * picks + idx % k] = slot;
    }
  }
  if (publish) {  // no pick (only where E < k): dropped, as in the routing kernels
    for (int idx = tid; idx < pairs; idx += nthreads) {
      if (rt.ids[idx] < 0) ga.pair_slot[static_cast<std::int64_t>(idx / k) * picks + idx % k] = -1;
    }
  }
  for (int idx = tid; idx < ga.tokens * ga.shared_pieces; idx += nthreads) {
    const int t = idx / ga.shared_pieces;
    const int p = idx % ga.shared_pieces;
    const int slot = rt.offsets[ga.experts + p] + t;
    rt.slot_token[slot] = t;
    if (publish) {
      ga.slot_token[slot] = t;
      ga.pair_slot[static_cast<std::int64_t>(t) * picks + k + p] = slot;
    }
  }
  if (publish) {
    const int n_active = rt.n_active;
    for (int i = tid; i <= n; i += nthreads) {
      ga.offsets[i] = rt.offsets[i];
      if (i < n_active) ga.active[i] = rt.active[i];
      if (i <= n_active) {
        ga.tb_prefix[0][i] = rt.tb_prefix[0][i];
        ga.tb_prefix[1][i] = rt.tb_prefix[1][i];
      }
    }
    if (tid == 0) *ga.n_active = n_active;
  }
  __syncthreads();
}

}  // namespace fp4moe::kernels::routing
