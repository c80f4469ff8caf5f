// Routing and grouping: router logits -> top-k ids and weights -> tokens grouped by expert.
//
//   route:   one warp per token. Selection scores live in the warp's shared scratch; each of
//            k rounds takes the warp-wide best (score, id) under detail::ranks_before (larger
//            first, NaN last, ties to the lower id), so picks equal the CPU reference's bit for
//            bit (same portable sigmoid/exp, same operation order for the weights).
//   count:   per-expert token counts (integer atomics).
//   scan:    one CTA: slot offsets per expert, the ascending list of active experts, and for
//            each GEMM the number of token blocks before each active expert (its work list).
//   scatter: each (token, pick) takes a slot in its expert's range; the shared expert's pieces
//            take slot offset + token.
// For decode sizes all four run in one CTA and one launch (launch_route_group_small).
#include <cub/block/block_scan.cuh>

#include <climits>

#include "fp4moe/detail/portable_math.hpp"
#include "kernels/common.cuh"
#include "kernels/launch.hpp"

namespace fp4moe::kernels {
namespace {

using detail::pm_add;
using detail::pm_div;
using detail::pm_mul;
using detail::portable_exp;
using detail::portable_sigmoid;
using detail::ranks_before;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = kMaxRoutedExperts / 32;
constexpr int kScanItems = kMaxTotalExperts / kThreads;
static_assert(kPerLane <= 32, "the per-lane 'taken' mask is 32 bits");

// Keeps the better of (score, idx) and (os, oi) under ranks_before, across the whole warp.
__device__ __forceinline__ void warp_best(float& score, int& idx) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float os = __shfl_xor_sync(0xffffffffu, score, off);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
    if (ranks_before(os, oi, score, idx)) {
      score = os;
      idx = oi;
    }
  }
}

__device__ __forceinline__ float nan_f() { return __int_as_float(0x7fc00000); }

// Routes token t with one warp. scratch: 2 * kMaxRoutedExperts floats owned by this warp.
// Returns the pick of rank `lane` in every lane < k (INT_MAX elsewhere).
__device__ int route_token(const RouteArgs& a, int t, float* scratch, int lane) {
  const int E = a.experts;
  const float* logits = a.logits + static_cast<std::int64_t>(t) * E;
  float* sel = scratch;                      // selection score of each expert
  float* val = scratch + kMaxRoutedExperts;  // sigmoid (sigmoid router) or exp (softmax)
  const bool sigmoid = a.router == RouterId::kSigmoidGroupTopK;

  for (int e = lane; e < E; e += 32) {
    const float l = logits[e];
    if (sigmoid) {
      const float s = portable_sigmoid(l);
      val[e] = s;
      sel[e] = pm_add(s, a.correction_bias != nullptr ? a.correction_bias[e] : 0.0f);
    } else {
      sel[e] = l;  // softmax is monotonic: rank by logits (no ties made by rounding)
    }
  }
  __syncwarp();

  std::uint32_t taken = 0;  // bit i: expert lane + 32 i is excluded or already picked
  if (sigmoid && a.n_group > 1) {
    const int gsize = E / a.n_group;
    float gscore = nan_f();
    int gidx = INT_MAX;
    if (lane < a.n_group) {
      float b1 = 0.0f, b2 = 0.0f;
      int i1 = -1, i2 = -1;
      for (int m = 0; m < gsize; ++m) {
        const int e = lane * gsize + m;
        const float c = sel[e];
        if (i1 < 0 || ranks_before(c, e, b1, i1)) {
          b2 = b1;
          i2 = i1;
          b1 = c;
          i1 = e;
        } else if (i2 < 0 || ranks_before(c, e, b2, i2)) {
          b2 = c;
          i2 = e;
        }
      }
      gscore = gsize >= 2 ? pm_add(b1, b2) : b1;
      gidx = lane;
    }
    std::uint32_t kept = 0;
    for (int r = 0; r < a.topk_group; ++r) {
      const bool mine_kept = lane < 32 && ((kept >> lane) & 1u);
      float s = mine_kept ? nan_f() : gscore;
      int i = mine_kept ? INT_MAX : gidx;
      warp_best(s, i);
      kept |= 1u << i;
    }
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !((kept >> (e / gsize)) & 1u)) taken |= 1u << i;
    }
  }

  int my_pick = INT_MAX;
  for (int r = 0; r < a.top_k; ++r) {
    float bs = nan_f();
    int bi = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !((taken >> i) & 1u) && ranks_before(sel[e], e, bs, bi)) {
        bs = sel[e];
        bi = e;
      }
    }
    warp_best(bs, bi);
    if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
    if (lane == r) my_pick = bi;
  }

  // Weights, by lane 0, in the reference's operation order.
  int* picks = reinterpret_cast<int*>(sel);  // the selection scores are no longer needed
  const float pick0_logit = __shfl_sync(0xffffffffu, my_pick, 0) < E ? logits[__shfl_sync(0xffffffffu, my_pick, 0)] : 0.0f;
  __syncwarp();
  if (lane < a.top_k) picks[lane] = my_pick;
  if (a.router == RouterId::kSoftmaxTopK) {
    for (int e = lane; e < E; e += 32) val[e] = portable_exp(pm_add(logits[e], -pick0_logit));
  }
  __syncwarp();
  if (lane == 0) {
    const int k = a.top_k;
    float* w = a.topk_weights + static_cast<std::int64_t>(t) * k;
    if (a.router == RouterId::kSigmoidGroupTopK) {
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum = pm_add(sum, val[picks[j]]);
      const float denom = pm_add(sum, 1e-20f);
      for (int j = 0; j < k; ++j) {
        float wj = val[picks[j]];
        if (a.renormalize) wj = pm_div(wj, denom);
        w[j] = pm_mul(wj, a.scaling);
      }
    } else if (a.router == RouterId::kSoftmaxTopK) {
      float sum = 0.0f;
      for (int e = 0; e < E; ++e) sum = pm_add(sum, val[e]);
      float psum = 0.0f;
      for (int j = 0; j < k; ++j) psum = pm_add(psum, pm_div(val[picks[j]], sum));
      for (int j = 0; j < k; ++j) {
        const float p = pm_div(val[picks[j]], sum);
        w[j] = a.renormalize ? pm_div(p, psum) : p;
      }
    } else {  // top-k, then softmax over the k
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum = pm_add(sum, portable_exp(pm_add(logits[picks[j]], -pick0_logit)));
      for (int j = 0; j < k; ++j) w[j] = pm_div(portable_exp(pm_add(logits[picks[j]], -pick0_logit)), sum);
    }
  }
  if (lane < a.top_k) a.topk_ids[static_cast<std::int64_t>(t) * a.top_k + lane] = my_pick;
  __syncwarp();
  return my_pick;
}

using BlockScan = cub::BlockScan<int, kThreads>;

// Offsets, active list and per-GEMM token-block prefixes from `counts` (n experts, in smem or
// global). Runs in one CTA of kThreads threads; writes the results to global memory and the
// offsets also to `offsets_smem` when given.
__device__ void scan_experts(const int* counts, int n, const GroupArgs& g, BlockScan::TempStorage& temp,
                             int* offsets_smem) {
  const int tid = threadIdx.x;
  int cnt[kScanItems], flag[kScanItems], tb0[kScanItems], tb1[kScanItems];
#pragma unroll
  for (int i = 0; i < kScanItems; ++i) {
    const int e = tid * kScanItems + i;
    cnt[i] = e < n ? counts[e] : 0;
    flag[i] = cnt[i] > 0 ? 1 : 0;
    tb0[i] = (cnt[i] + g.tb_tokens[0] - 1) / g.tb_tokens[0];
    tb1[i] = (cnt[i] + g.tb_tokens[1] - 1) / g.tb_tokens[1];
  }
  int off[kScanItems], pos[kScanItems], p0[kScanItems], p1[kScanItems];
  int total = 0, n_active = 0, total0 = 0, total1 = 0;
  BlockScan(temp).ExclusiveSum(cnt, off, total);
  __syncthreads();
  BlockScan(temp).ExclusiveSum(flag, pos, n_active);
  __syncthreads();
  BlockScan(temp).ExclusiveSum(tb0, p0, total0);
  __syncthreads();
  BlockScan(temp).ExclusiveSum(tb1, p1, total1);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kScanItems; ++i) {
    const int e = tid * kScanItems + i;
    if (e < n) {
      g.offsets[e] = off[i];
      g.cursors[e] = 0;
      if (offsets_smem != nullptr) offsets_smem[e] = off[i];
      if (flag[i]) {
        g.active[pos[i]] = e;
        g.tb_prefix[0][pos[i]] = p0[i];
        g.tb_prefix[1][pos[i]] = p1[i];
      }
    }
  }
  if (tid == 0) {
    g.offsets[n] = total;
    if (offsets_smem != nullptr) offsets_smem[n] = total;
    *g.n_active = n_active;
    g.tb_prefix[0][n_active] = total0;
    g.tb_prefix[1][n_active] = total1;
  }
}

__device__ __forceinline__ bool valid_expert(const GroupArgs& g, int e) { return e >= 0 && e < g.experts; }

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

__global__ void __launch_bounds__(kThreads) route_group_small_kernel(const RouteArgs ra, const GroupArgs ga) {
  __shared__ float scratch[kWarps][2 * kMaxRoutedExperts];
  __shared__ int counts[kMaxTotalExperts];
  __shared__ int offsets[kMaxTotalExperts + 1];
  __shared__ BlockScan::TempStorage temp;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int n = ga.experts + ga.shared_pieces;

  for (int e = threadIdx.x; e < n; e += kThreads) counts[e] = e < ga.experts ? 0 : ga.tokens;
  __syncthreads();
  if (ra.logits != nullptr) {
    for (int t = warp; t < ra.tokens; t += kWarps) {
      const int pick = route_token(ra, t, scratch[warp], lane);
      if (lane < ra.top_k) atomicAdd(&counts[pick], 1);
    }
  } else {  // routed by the caller: count the given ids
    for (int idx = threadIdx.x; idx < ga.tokens * ga.top_k; idx += kThreads) {
      const int e = ga.topk_ids[idx];
      if (valid_expert(ga, e)) atomicAdd(&counts[e], 1);
    }
  }
  __syncthreads();
  scan_experts(counts, n, ga, temp, offsets);
  __syncthreads();
  // Reuse counts as the cursors.
  for (int e = threadIdx.x; e < n; e += kThreads) counts[e] = 0;
  __syncthreads();
  for (int idx = threadIdx.x; idx < ra.tokens * ra.top_k; idx += kThreads) scatter_pair(ga, idx, offsets, counts);
  for (int idx = threadIdx.x; idx < ra.tokens * ga.shared_pieces; idx += kThreads) scatter_shared(ga, idx, offsets);
}

__global__ void __launch_bounds__(kThreads) route_count_kernel(const RouteArgs ra, const GroupArgs ga) {
  __shared__ float scratch[kWarps][2 * kMaxRoutedExperts];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int t = blockIdx.x * kWarps + warp;
  if (t >= ra.tokens) return;
  const int pick = route_token(ra, t, scratch[warp], lane);
  if (lane < ra.top_k) atomicAdd(&ga.counts[pick], 1);
}

__global__ void __launch_bounds__(kThreads) group_count_kernel(const GroupArgs ga) {
  const int idx = blockIdx.x * kThreads + threadIdx.x;
  if (idx >= ga.tokens * ga.top_k) return;
  const int e = ga.topk_ids[idx];
  if (valid_expert(ga, e)) atomicAdd(&ga.counts[e], 1);
}

__global__ void __launch_bounds__(kThreads) group_scan_kernel(const GroupArgs ga) {
  __shared__ int counts[kMaxTotalExperts];
  __shared__ BlockScan::TempStorage temp;
  const int n = ga.experts + ga.shared_pieces;
  for (int e = threadIdx.x; e < n; e += kThreads) counts[e] = e < ga.experts ? ga.counts[e] : ga.tokens;
  __syncthreads();
  scan_experts(counts, n, ga, temp, nullptr);
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
  route_group_small_kernel<<<1, kThreads, 0, stream>>>(route, group);
  return cudaGetLastError();
}

cudaError_t launch_route_count(const RouteArgs& route, const GroupArgs& group, cudaStream_t stream) {
  route_count_kernel<<<(route.tokens + kWarps - 1) / kWarps, kThreads, 0, stream>>>(route, group);
  return cudaGetLastError();
}

cudaError_t launch_group_count(const GroupArgs& group, cudaStream_t stream) {
  const int pairs = group.tokens * group.top_k;
  group_count_kernel<<<(pairs + kThreads - 1) / kThreads, kThreads, 0, stream>>>(group);
  return cudaGetLastError();
}

cudaError_t launch_group_scan(const GroupArgs& group, cudaStream_t stream) {
  group_scan_kernel<<<1, kThreads, 0, stream>>>(group);
  return cudaGetLastError();
}

cudaError_t launch_group_scatter(const GroupArgs& group, cudaStream_t stream) {
  const std::int64_t work = static_cast<std::int64_t>(group.tokens) * (group.top_k + group.shared_pieces);
  group_scatter_kernel<<<static_cast<unsigned>((work + kThreads - 1) / kThreads), kThreads, 0, stream>>>(group);
  return cudaGetLastError();
}

}  // namespace fp4moe::kernels
