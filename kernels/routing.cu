// Routing and grouping: router logits -> top-k ids and weights -> tokens grouped by expert.
//
//   route:   one warp per token. Every expert's selection score becomes a 64-bit key that
//            orders like detail::ranks_before (score order-preserving in the high word, NaN
//            lowest, ~id in the low word so equal scores go to the lower id); each lane keeps
//            its experts' keys in registers, and each of the k rounds is a warp-wide maximum
//            (two REDUX) of the lanes' best keys. Picks therefore equal the CPU reference's bit
//            for bit (same portable sigmoid/exp); the sigmoid and top-k-softmax weights too.
//   count:   per-expert token counts (integer atomics).
//   scan:    one CTA: slot offsets per expert, the ascending list of active experts, and for
//            each GEMM the number of token blocks before each active expert (its work list).
//   scatter: each (token, pick) takes a slot in its expert's range; the shared expert's pieces
//            take slot offset + token.
// For decode sizes all four run in one CTA of 1024 threads and one launch.
#include <climits>

#include "fp4moe/detail/portable_math.hpp"
#include "kernels/common.cuh"
#include "kernels/launch.hpp"
#include "kernels/wgmma_gemm_layout.hpp"

namespace fp4moe::kernels {
namespace {

using detail::pm_add;
using detail::pm_div;
using detail::pm_mul;
using detail::portable_exp;
using detail::portable_sigmoid;

constexpr int kSmallThreads = 1024;  // the one-CTA decode kernel: one warp per token
constexpr int kThreads = 256;        // the multi-CTA kernels
static_assert(kMaxTotalExperts == kSmallThreads, "the scan gives each thread one expert");
static_assert(kSmallRouteTokens % (kSmallThreads / 32) == 0);

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

// Routes token t with one warp; PER = experts per lane (expert e = lane + 32 i). Writes the
// picks and weights of token t and returns the pick of rank `lane` in lanes < k (else -1).
template <int PER>
__device__ __forceinline__ int route_token(const RouteArgs& a, int t, int lane) {
  const int E = a.experts;
  const float* logits = a.logits + static_cast<std::int64_t>(t) * E;
  const bool sigmoid = a.router == RouterId::kSigmoidGroupTopK;
  // Only the keys stay in registers; a pick's value (sigmoid or logit) is recomputed from its
  // logit afterwards, which keeps PER = 16 (E <= 512) within the 1024-thread CTA's registers.
  unsigned long long key[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + 32 * i;
    key[i] = 0;
    if (e < E) {
      const float l = logits[e];
      if (sigmoid) {
        const float s = portable_sigmoid(l);
        key[i] = rank_key(pm_add(s, a.correction_bias != nullptr ? a.correction_bias[e] : 0.0f), e);
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

  // The lane's best key, kept current as picks are taken.
  unsigned long long lk = 0;
#pragma unroll
  for (int i = 0; i < PER; ++i) lk = key[i] > lk ? key[i] : lk;
  int my_pick = -1;
  std::uint32_t taken = 0;
  for (int r = 0; r < a.top_k; ++r) {
    const unsigned long long best = warp_max_key(lk);
    const int id = key_id(best);
    if (lane == r) my_pick = id;
    if ((id & 31) == lane) {
      // A taken mask, not a store into key[]: an indexed store would move key[] to local memory.
      taken |= 1u << (id >> 5);
      lk = 0;
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        if (!((taken >> i) & 1u) && key[i] > lk) lk = key[i];
      }
    }
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
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      if (lane + 32 * i < E) part = pm_add(part, portable_exp(pm_add(logits[lane + 32 * i], -m)));
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
  if (lane < k) {
    a.topk_ids[static_cast<std::int64_t>(t) * k + lane] = my_pick;
    a.topk_weights[static_cast<std::int64_t>(t) * k + lane] = w;
  }
  return lane < k ? my_pick : -1;
}

// Exclusive prefix sums of kScanValues values per thread over the kSmallThreads threads of the
// CTA, in one pass: each warp scans its lanes' values with shuffles (the value chains interleave),
// warp 0 scans the warps' totals, two barriers in all. v becomes the exclusive prefixes, total the
// sums. Why not CUB's BlockScan: it scans one value (or one struct) per call, and six calls one
// after another, two barriers each, were a chain the one-token router waited on (T=1 1.020x
// without them, docs/PERF.md history); its warp-scans algorithm, which one call over a struct
// would want, adds the warps' totals serially in every thread and measured 1.2 us slower than its
// raking one here, and the raking one spilled with 64-bit values (7228316).
constexpr int kScanValues = 6;
constexpr int kScanWarps = kSmallThreads / 32;
using ScanSums = int[kScanWarps + 1][kScanValues];

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

__device__ __forceinline__ void block_exclusive_scan(int (&v)[kScanValues], int (&total)[kScanValues],
                                                     ScanSums& sums) {
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
    for (int i = 0; i < kScanValues; ++i) wi[i] = w[i] = sums[lane][i];
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
// kSmallThreads threads, one expert each; writes the results to global memory and the offsets
// also to `offsets_smem` when given.
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
  // lists' positions packed in 16-bit halves (n <= kSmallThreads).
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
  block_exclusive_scan(v, total, sums);
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

__device__ __forceinline__ bool valid_expert(const GroupArgs& g, int e) {
  return e >= 0 && e < g.experts;
}

__device__ __forceinline__ void scatter_pair(const GroupArgs& g, int idx, const int* offsets, int* cursors) {
  const int t = idx / g.top_k;
  const int j = idx % g.top_k;
  const int e = g.topk_ids[idx];
  std::int32_t* pair = g.pair_slot + static_cast<std::int64_t>(t) * (g.top_k + g.shared_pieces) + j;
  if (!valid_expert(g, e)) {  // caller-given ids only: the pick is dropped
    *pair = -1;
    return;
  }
  const int slot = offsets[e] + atomicAdd(&cursors[e], 1);
  g.slot_token[slot] = t;
  *pair = slot;
}

__device__ __forceinline__ void scatter_shared(const GroupArgs& g, int idx, const int* offsets) {
  const int t = idx / g.shared_pieces;
  const int p = idx % g.shared_pieces;
  const int slot = offsets[g.experts + p] + t;
  g.slot_token[slot] = t;
  g.pair_slot[static_cast<std::int64_t>(t) * (g.top_k + g.shared_pieces) + g.top_k + p] = slot;
}

template <int PER>
__global__ void __launch_bounds__(kSmallThreads, 1)
    route_group_small_kernel(const RouteArgs ra, const GroupArgs ga) {
  constexpr int kWarps = kSmallThreads / 32;
  __shared__ int counts[kMaxTotalExperts];
  __shared__ int offsets[kMaxTotalExperts + 1];
  __shared__ ScanSums scan_sums;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int n = ga.experts + ga.shared_pieces;

  if (threadIdx.x < n) counts[threadIdx.x] = threadIdx.x < ga.experts ? 0 : ga.tokens;
  __syncthreads();
  if (ra.logits != nullptr) {
    for (int t = warp; t < ra.tokens; t += kWarps) {
      const int pick = route_token<PER>(ra, t, lane);
      if (pick >= 0) atomicAdd(&counts[pick], 1);
    }
  } else {  // routed by the caller: count the given ids
    for (int idx = threadIdx.x; idx < ga.tokens * ga.top_k; idx += kSmallThreads) {
      const int e = ga.topk_ids[idx];
      if (valid_expert(ga, e)) atomicAdd(&counts[e], 1);
    }
  }
  __syncthreads();
  scan_experts(counts, n, ga, scan_sums, offsets);
  __syncthreads();
  if (threadIdx.x < n) counts[threadIdx.x] = 0;  // reused as the cursors
  __syncthreads();
  for (int idx = threadIdx.x; idx < ga.tokens * ga.top_k; idx += kSmallThreads)
    scatter_pair(ga, idx, offsets, counts);
  for (int idx = threadIdx.x; idx < ga.tokens * ga.shared_pieces; idx += kSmallThreads)
    scatter_shared(ga, idx, offsets);
}

template <int PER>
__global__ void __launch_bounds__(kThreads) route_count_kernel(const RouteArgs ra, const GroupArgs ga) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int t = blockIdx.x * kWarps + warp;
  if (t >= ra.tokens) return;
  const int pick = route_token<PER>(ra, t, lane);
  if (pick >= 0) atomicAdd(&ga.counts[pick], 1);
}

__global__ void __launch_bounds__(kThreads) group_count_kernel(const GroupArgs ga) {
  const int idx = blockIdx.x * kThreads + threadIdx.x;
  if (idx >= ga.tokens * ga.top_k) return;
  const int e = ga.topk_ids[idx];
  if (valid_expert(ga, e)) atomicAdd(&ga.counts[e], 1);
}

__global__ void __launch_bounds__(kSmallThreads) group_scan_kernel(const GroupArgs ga) {
  __shared__ int counts[kMaxTotalExperts];
  __shared__ ScanSums scan_sums;
  const int n = ga.experts + ga.shared_pieces;
  if (threadIdx.x < n) counts[threadIdx.x] = threadIdx.x < ga.experts ? ga.counts[threadIdx.x] : ga.tokens;
  __syncthreads();
  scan_experts(counts, n, ga, scan_sums, nullptr);
}

__global__ void __launch_bounds__(kThreads) group_scatter_kernel(const GroupArgs ga) {
  const int idx = blockIdx.x * kThreads + threadIdx.x;
  const int pairs = ga.tokens * ga.top_k;
  if (idx < pairs) {
    scatter_pair(ga, idx, ga.offsets, ga.cursors);
  } else if (idx < pairs + ga.tokens * ga.shared_pieces) {
    scatter_shared(ga, idx - pairs, ga.offsets);
  }
}

}  // namespace

cudaError_t launch_route_group_small(const RouteArgs& route, const GroupArgs& group, cudaStream_t stream) {
  if (route.experts > kSmallRouteExperts) return cudaErrorInvalidValue;
  if (route.experts <= 128) {
    route_group_small_kernel<4><<<1, kSmallThreads, 0, stream>>>(route, group);
  } else {
    route_group_small_kernel<8><<<1, kSmallThreads, 0, stream>>>(route, group);
  }
  return cudaGetLastError();
}

cudaError_t launch_route_count(const RouteArgs& route, const GroupArgs& group, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((route.tokens + kThreads / 32 - 1) / (kThreads / 32));
  if (route.experts <= 128) {
    route_count_kernel<4><<<blocks, kThreads, 0, stream>>>(route, group);
  } else if (route.experts <= 256) {
    route_count_kernel<8><<<blocks, kThreads, 0, stream>>>(route, group);
  } else {
    route_count_kernel<16><<<blocks, kThreads, 0, stream>>>(route, group);
  }
  return cudaGetLastError();
}

cudaError_t launch_group_count(const GroupArgs& group, cudaStream_t stream) {
  const int pairs = group.tokens * group.top_k;
  group_count_kernel<<<(pairs + kThreads - 1) / kThreads, kThreads, 0, stream>>>(group);
  return cudaGetLastError();
}

cudaError_t launch_group_scan(const GroupArgs& group, cudaStream_t stream) {
  group_scan_kernel<<<1, kSmallThreads, 0, stream>>>(group);
  return cudaGetLastError();
}

cudaError_t launch_group_scatter(const GroupArgs& group, cudaStream_t stream) {
  const std::int64_t work = static_cast<std::int64_t>(group.tokens) * (group.top_k + group.shared_pieces);
  group_scatter_kernel<<<static_cast<unsigned>((work + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      group);
  return cudaGetLastError();
}

}  // namespace fp4moe::kernels
