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
//   scatter: each (token, pick) takes a slot in its expert's range (ranked within its CTA in
//            shared memory, one global atomic per expert and CTA); the shared expert's pieces
//            take slot offset + token.
// For decode sizes all four run in one CTA of 1024 threads and one launch.
#include <climits>

#include "kernels/routing.cuh"

namespace fp4moe::kernels {
namespace {

using routing::kScanWarps;
using routing::route_token;
using routing::RoutePick;
using routing::scan_experts;
using routing::ScanSums;

constexpr int kSmallThreads = 1024;    // the one-CTA decode kernel: one warp per token
constexpr int kThreads = 256;          // the multi-CTA kernels
constexpr int kScatterThreads = 1024;  // the scatter: a CTA's pairs share one global atomic per expert
static_assert(kMaxTotalExperts == kSmallThreads, "the scan gives each thread one expert");
static_assert(kSmallRouteTokens % (kSmallThreads / 32) == 0);

static_assert(kSmallThreads / 32 == kScanWarps);

// Token t's pick of rank `lane` (lanes < k) into the routing outputs.
__device__ __forceinline__ void store_pick(const RouteArgs& ra, int t, int lane, const RoutePick& pick) {
  ra.topk_ids[static_cast<std::int64_t>(t) * ra.top_k + lane] = pick.id;
  ra.topk_weights[static_cast<std::int64_t>(t) * ra.top_k + lane] = pick.weight;
}

__device__ __forceinline__ bool valid_expert(const GroupArgs& g, int e) {
  return e >= 0 && e < g.experts;
}

// Where pick idx (token idx / k, rank idx % k) keeps its slot.
__device__ __forceinline__ std::int32_t* pick_slot(const GroupArgs& g, int idx) {
  return g.pair_slot + static_cast<std::int64_t>(idx / g.top_k) * (g.top_k + g.shared_pieces) + idx % g.top_k;
}

__device__ __forceinline__ void scatter_pair(const GroupArgs& g, int idx, const int* offsets, int* cursors) {
  const int t = idx / g.top_k;
  const int e = g.topk_ids[idx];
  std::int32_t* pair = pick_slot(g, idx);
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
      const RoutePick pick = route_token<PER>(ra, t, lane);
      if (lane < ra.top_k) store_pick(ra, t, lane, pick);
      if (pick.id >= 0) atomicAdd(&counts[pick.id], 1);
    }
  } else {  // routed by the caller: count the given ids
    for (int idx = threadIdx.x; idx < ga.tokens * ga.top_k; idx += kSmallThreads) {
      const int e = ga.topk_ids[idx];
      if (valid_expert(ga, e)) atomicAdd(&counts[e], 1);
    }
  }
  __syncthreads();
  scan_experts<kSmallThreads / 32>(counts, n, ga, scan_sums, offsets);
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
  const RoutePick pick = route_token<PER>(ra, t, lane);
  if (lane < ra.top_k) store_pick(ra, t, lane, pick);
  if (pick.id >= 0) atomicAdd(&ga.counts[pick.id], 1);
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
  scan_experts<kSmallThreads / 32>(counts, n, ga, scan_sums, nullptr);
}

// Each CTA first ranks its pairs per expert in shared memory, then reserves each expert's run of
// slots with one global atomic: at large T the hottest experts' cursors took one global atomic per
// pair, which serialize at their L2 slice (T=16384, GLM-5: 39 us at 0.9% issue in ncu, against
// the routing kernel's 53 us before it). Slots within an expert still come in no fixed order, as
// before (the GEMMs compute each slot's row on its own; finalize reads pair_slot).
__global__ void __launch_bounds__(kScatterThreads) group_scatter_kernel(const GroupArgs ga) {
  __shared__ int cta_count[kMaxRoutedExperts];
  __shared__ int cta_base[kMaxRoutedExperts];
  const int idx = blockIdx.x * kScatterThreads + threadIdx.x;
  const int pairs = ga.tokens * ga.top_k;
  for (int e = threadIdx.x; e < ga.experts; e += kScatterThreads) cta_count[e] = 0;
  __syncthreads();
  int e = -1, rank = 0;
  if (idx < pairs) {
    e = ga.topk_ids[idx];
    if (!valid_expert(ga, e)) {  // caller-given ids only: the pick is dropped
      e = -1;
      *pick_slot(ga, idx) = -1;
    } else {
      rank = atomicAdd(&cta_count[e], 1);
    }
  }
  __syncthreads();
  for (int x = threadIdx.x; x < ga.experts; x += kScatterThreads) {
    const int c = cta_count[x];
    if (c > 0) cta_base[x] = atomicAdd(&ga.cursors[x], c);
  }
  __syncthreads();
  if (e >= 0) {
    const int t = idx / ga.top_k;
    const int slot = ga.offsets[e] + cta_base[e] + rank;
    ga.slot_token[slot] = t;
    *pick_slot(ga, idx) = slot;
  } else if (idx >= pairs && idx < pairs + ga.tokens * ga.shared_pieces) {
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
  if (group.experts > kMaxRoutedExperts) return cudaErrorInvalidValue;  // the CTA's per-expert tables
  const std::int64_t work = static_cast<std::int64_t>(group.tokens) * (group.top_k + group.shared_pieces);
  group_scatter_kernel<<<static_cast<unsigned>((work + kScatterThreads - 1) / kScatterThreads),
                         kScatterThreads, 0, stream>>>(group);
  return cudaGetLastError();
}

}  // namespace fp4moe::kernels
