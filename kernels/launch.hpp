// Host-callable launchers of fp4moe's kernels. Plain structs of pointers and sizes (no CUDA
// types but cudaStream_t / cudaError_t), so host .cpp files include this without nvcc. Each
// launcher checks nothing but launches; callers validate and check the returned error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/stream_gemm_layout.hpp"
#include "kernels/tile_gemm_layout.hpp"
#include "kernels/wgmma_gemm_layout.hpp"

namespace fp4moe::kernels {

inline constexpr int kMaxRoutedExperts = 512;  // routing keeps 16 experts per lane in registers
inline constexpr int kMaxTotalExperts = 1024;  // routed + shared pieces (one-CTA scan)
inline constexpr int kMaxTopK = 32;
inline constexpr int kMaxGroups = 32;  // sigmoid router: one lane per group
// Token counts and experts up to which routing and grouping run in one CTA (one launch, for
// decode); above 256 experts a 1024-thread CTA has too few registers per lane for the keys.
inline constexpr int kSmallRouteTokens = 128;
inline constexpr int kSmallRouteExperts = 256;

// The fused decode path (launch_stream_gemm_routed): the first stream GEMM routes and groups up
// to kFusedRouteTokens tokens in each of its CTAs, into these shared-memory tables (static shared
// memory beside the configuration's StreamGemmLayout::cta_bytes: kFusedRouteTableBytes). E + P
// must not exceed the CTA's threads, T * (k + P) kFusedRouteSlots.
// Part `index` of `parts` equal shares of `total` bytes, each `align`-byte aligned (total a multiple
// of align): [begin, end), empty past the end, and the shares cover all of total. How the fused
// first GEMM splits its L2 warm-up (StreamGemmArgs::l2_warm) over its CTAs, then over lanes.
struct ByteRange {
  std::int64_t begin, end;
};
constexpr ByteRange aligned_share(std::int64_t total, std::int64_t parts, std::int64_t index,
                                  std::int64_t align) {
  const std::int64_t share = ((total + parts - 1) / parts + align - 1) / align * align;
  const std::int64_t begin = share * index < total ? share * index : total;
  return {begin, begin + share < total ? begin + share : total};
}
static_assert(aligned_share(14155776, 132, 131, 16).end == 14155776);  // GLM-5's shared expert
static_assert(aligned_share(96, 4, 1, 16).begin == 32 && aligned_share(96, 4, 1, 16).end == 64);
static_assert(aligned_share(96, 4, 3, 16).begin == 96 && aligned_share(96, 4, 3, 16).end == 96);
static_assert(aligned_share(16 * 133, 132, 131, 16).end == 16 * 133);  // floor(total / parts) would miss 16

inline constexpr int kFusedRouteTokens = 16;  // (at most 32: a bit per token in a mask)
inline constexpr int kFusedRouteExperts = 512;
inline constexpr int kFusedRouteSlots = 512;
inline constexpr int kRouteScanValues = 6;  // values the routing's one-pass scan carries
inline constexpr int kRouteScanWarps = 32;  // the most warps of a scanning CTA
struct alignas(128) FusedRouteTables {      // (the dynamic shared memory after it stays 128-byte aligned)
  std::uint32_t token_mask[kFusedRouteExperts];  // bit t: token t picked the expert
  std::int32_t counts[kFusedRouteExperts];       // tokens per expert, then zero (the scan's cursors)
  std::int32_t offsets[kFusedRouteExperts + 1];
  std::int32_t active[kFusedRouteExperts];
  std::int32_t tb_prefix[2][kFusedRouteExperts + 1];
  std::int32_t n_active;
  std::int32_t ids[kFusedRouteTokens * kMaxTopK];  // [T, k] picks
  std::int32_t slot_token[kFusedRouteSlots];
  std::int32_t scan_sums[kRouteScanWarps + 1][kRouteScanValues];
};
inline constexpr int kFusedRouteTableBytes = static_cast<int>(sizeof(FusedRouteTables));

enum class RouterId : int { kSoftmaxTopK = 0, kSigmoidGroupTopK = 1, kTopKSoftmax = 2 };

struct RouteArgs {
  const float* logits = nullptr;           // [T, E] fp32
  const float* correction_bias = nullptr;  // [E] (sigmoid router) or nullptr
  int tokens = 0;
  int experts = 0;
  int top_k = 0;
  RouterId router = RouterId::kSoftmaxTopK;
  int renormalize = 1;
  int n_group = 1;
  int topk_group = 1;
  float scaling = 1.0f;
  std::int32_t* topk_ids = nullptr;  // [T, k]
  float* topk_weights = nullptr;     // [T, k]
};

// Grouping of (token, pick) pairs by expert. Pseudo-experts E .. E+P-1 are the pieces of the
// shared expert, visited by every token with weight 1. Slots of one expert are contiguous;
// their order inside the expert is not fixed (integer atomics), which does not change any
// result: every output column of a GEMM is computed independently of the others.
struct GroupArgs {
  const std::int32_t* topk_ids = nullptr;  // [T, k]
  int tokens = 0;
  int top_k = 0;
  int experts = 0;            // routed experts E
  int shared_pieces = 0;      // P
  int tb_tokens[2] = {8, 8};  // token-block size of each GEMM (8 * n_tiles)
  // Per GEMM: an expert's last block counts in tb_prefix only when it holds more than this many
  // tokens; a shorter one is left to the narrower tail launches (StreamGemmArgs::tail_of). 0: every
  // block counts (no tail launches).
  int tb_tail[2] = {0, 0};
  // Per GEMM: an expert with at most this many tokens has no block in this GEMM's main and tail
  // launches: the small-expert launch (the stream kernel, StreamGemmArgs::small_launch) takes it
  // whole. 0: none. Where both are nonzero they are equal (one list serves both GEMMs).
  int tb_small[2] = {0, 0};
  // The fewest such experts for which the small-expert launch takes them: with fewer, its launch
  // runs empty and the GEMMs' other launches take them (the scan decides for both GEMMs at once).
  int small_min = 0;
  std::int32_t* counts = nullptr;                   // [E+P]; zero before route_scatter_large
  std::int32_t* cursors = nullptr;                  // [E+P]
  std::int32_t* offsets = nullptr;                  // [E+P+1]
  std::int32_t* active = nullptr;                   // [E+P] ids of experts with tokens, ascending
  std::int32_t* n_active = nullptr;                 // [1]
  std::int32_t* tb_prefix[2] = {nullptr, nullptr};  // [E+P+1] token blocks before active expert a
  // Per GEMM with tail launches (tb_tail > 0; may be null otherwise): [2][E+P] the experts whose last
  // block tail launch i takes (wgmma_tail_class), ascending, list i from i * (E+P) on; and [2] the
  // length of each list. A tail launch walks only its own experts, spread evenly over its CTAs.
  // tail_list_offset(i, E+P) is where list i starts: the scan that writes the lists and the launches that
  // read them both take it from here.
  std::int32_t* tail_experts[2] = {nullptr, nullptr};
  std::int32_t* tail_count[2] = {nullptr, nullptr};
  static constexpr std::int64_t tail_list_offset(int i, int experts_total) {
    return static_cast<std::int64_t>(i) * experts_total;
  }
  // With a nonzero tb_small: the experts with 1 .. tb_small tokens, ascending, and their number
  // (the small-expert launch's `active` and `n_active`; 0 below small_min).
  std::int32_t* small_experts = nullptr;  // [E+P]
  std::int32_t* small_count = nullptr;    // [1]
  std::int32_t* slot_token = nullptr;     // [slots] token of each slot
  std::int32_t* pair_slot = nullptr;      // [T, k+P] slot of each pick (then of each shared piece)
};

// Decode sizes (T <= kSmallRouteTokens): route, count, scan and scatter in one CTA. With
// route.logits == nullptr the ids in group.topk_ids (given by the caller) are grouped instead;
// ids outside [0, E) are dropped (pair_slot -1).
cudaError_t launch_route_group_small(const RouteArgs& route, const GroupArgs& group, cudaStream_t stream);
// Larger T: route (one warp per token, counting) or count caller-given ids, then scan (one
// CTA), then scatter. `counts` must be zero before.
cudaError_t launch_route_count(const RouteArgs& route, const GroupArgs& group, cudaStream_t stream);
cudaError_t launch_group_count(const GroupArgs& group, cudaStream_t stream);
cudaError_t launch_group_scan(const GroupArgs& group, cudaStream_t stream);
cudaError_t launch_group_scatter(const GroupArgs& group, cudaStream_t stream);

enum class StreamEpilogue : int {
  kSwiGLU = 0,         // GEMM1: h = silu(gate) * up, bf16
  kSwiGLUClamped = 1,  // GEMM1, gpt-oss activation
  kStoreBf16 = 2,      // GEMM2: y = acc, bf16
};

struct StreamGemmArgs {
  const std::uint8_t* weights = nullptr;  // fragment layout (weight_layout.hpp), all experts
  std::int64_t expert_stride = 0;         // bytes per expert
  int n_chunks = 0;                       // K / 64, rounded up
  int k = 0;                              // K
  int rows = 0;                           // logical rows: 2I (gate/up interleaved) or H
  int row_blocks = 0;                     // per expert: 16-row tiles (padded to 4) / m_tiles
  const float* post_scale = nullptr;      // [E+P, 2]: gate/up (GEMM1) or both the same (GEMM2)
  const float* bias = nullptr;            // GEMM1 [E+P, 2, I] (gate, up); GEMM2 [E+P, H]; or null
  const std::uint16_t* act = nullptr;     // bf16 activations, rows of act_ld elements
  std::int64_t act_ld = 0;
  std::int64_t act_rows = 0;                 // rows the act buffer holds (the wgmma GEMM's tensor map)
  const std::int32_t* slot_token = nullptr;  // GEMM1: activation row = slot_token[slot]; GEMM2: null
  const std::int32_t* offsets = nullptr;
  const std::int32_t* active = nullptr;
  const std::int32_t* n_active = nullptr;
  const std::int32_t* tb_prefix = nullptr;
  // wgmma only. 0: the launch covers the tb_prefix blocks. > 0: a tail launch; for each of the
  // *n_tail experts in tail_experts (one of GroupArgs::tail_experts' lists), it covers the one
  // block of the expert's last r = count % tail_of tokens (the block the main launch, of tail_of
  // tokens, left out: see GroupArgs::tb_tail). It starts without waiting for the launch before it
  // (whose own wait saw its inputs complete) and waits for it before exiting, so whatever follows
  // sees both done.
  int tail_of = 0;
  const std::int32_t* tail_experts = nullptr;
  const std::int32_t* n_tail = nullptr;
  // Stream kernel only. > 0: before waiting for the previous kernel, each warp prefetches into L2
  // the weights of up to this many of its first item's K chunks (cp.async.bulk.prefetch, sm_90+).
  // Set only for a launch whose routing and grouping inputs are complete when it starts: GEMM2,
  // launched (PDL) after GEMM1, which starts only once routing has completed. On the H200 its CTAs
  // become resident while GEMM1's last items run and the memory system has bandwidth to spare.
  int l2_prefetch_chunks = 0;
  // Stream kernel only. 1: the weight copies carry an evict-first L2 policy (a forward reads each
  // expert's weights once at decode sizes), so that lines prefetched into L2 for a later read (the
  // fields above and below) are not the ones the stream evicts. 0: an evict-normal policy, which
  // measured 5-7% slower than no hint at all on the H200 (docs/KERNELS.md): not the old behaviour.
  int l2_evict_first = 0;
  // The fused first GEMM only (launch_stream_gemm_routed, sm_90+): bytes from l2_warm that its
  // CTAs, an equal share each, prefetch into L2 at their start, while they route: the shared
  // expert's weights, which need no routing, so that memory is busy while the routing chain runs.
  const std::uint8_t* l2_warm = nullptr;
  std::int64_t l2_warm_bytes = 0;
  // Stream kernel only. 1: the small-expert launch that follows a wgmma GEMM's launches (its
  // `active` / `n_active` the GroupArgs::small_experts list, its tb_prefix 0, 1, 2, ...: one
  // block per expert). Like a wgmma tail launch it starts without waiting for the launch before
  // it (whose own wait saw routing and the activations complete; it writes other rows) and waits
  // for it before exiting, so the next kernel sees all of the GEMM done. Its kernels are compiled
  // for 64-row items of one or two 8-token tiles at ring depths of 2-4 (launch_stream_gemm refuses
  // others); it chooses its K split itself (small_launch_k_split), the configuration's only sizes
  // the reduction area.
  int small_launch = 0;
  // The small-expert launch's item counter and count of finished warps ([2], zero before the
  // launch; the launch leaves them zero). Without a K split its warps claim items from it rather
  // than taking every W-th: its CTAs start as the wgmma launches' CTAs retire, over a whole item's
  // time, and a fixed share left the late ones finishing last.
  std::int32_t* small_claims = nullptr;
  void* out = nullptr;  // GEMM1: bf16 [slots, I]; GEMM2: bf16 [slots, H]
  std::int64_t out_ld = 0;
  int out_permuted = 0;  // GEMM1: store h in mma-k order (permuted_k) for a wgmma GEMM2
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
};

// Sets the kernel's dynamic shared memory limit for `config` and reports what the compiled
// kernel needs: registers per thread and resident CTAs per SM at this config.
struct KernelAttributes {
  int registers = 0;
  int local_bytes = 0;
  int max_blocks_per_sm = 0;
};
cudaError_t stream_gemm_setup(const StreamGemmConfig& config, StreamEpilogue epilogue,
                              KernelAttributes* attributes);
cudaError_t launch_stream_gemm(const StreamGemmArgs& args, const StreamGemmConfig& config,
                               StreamEpilogue epilogue, int grid, bool pdl, cudaStream_t stream);

// The fused decode path's first GEMM: each CTA routes `route.tokens` tokens (or, with route.logits
// null, takes the caller's ids in group.topk_ids, dropping those outside [0, E)) and groups them
// (`group`: tables and outputs as for launch_route_group_small, the token blocks of both GEMMs)
// into its shared memory before running as launch_stream_gemm over them; CTA 0 writes routing's
// outputs (ids, weights, offsets, active list, prefixes, slots) for the kernels after it. It is a
// forward's first kernel: launched without PDL, it replaces the routing launch. Compiled for
// m_tiles 4, n_tiles 1, ring depths 2-4, the SwiGLU epilogues and E <= 256
// (stream_gemm_routed_compiled); cudaErrorInvalidValue for any other, or where fused_route_fits
// is false. Its shared memory is the configuration's cta_bytes plus kFusedRouteTableBytes
// (static); the setup refuses a configuration where both exceed the device's opt-in maximum.
bool stream_gemm_routed_compiled(const StreamGemmConfig& config, StreamEpilogue epilogue, int experts);
cudaError_t stream_gemm_routed_setup(const StreamGemmConfig& config, StreamEpilogue epilogue, int experts,
                                     KernelAttributes* attributes);
cudaError_t launch_stream_gemm_routed(const StreamGemmArgs& args, const StreamGemmConfig& config,
                                      StreamEpilogue epilogue, int grid, const RouteArgs& route,
                                      const GroupArgs& group, cudaStream_t stream);
// Whether a forward's routing fits the fused path's tables and CTA (FusedRouteTables' limits); the
// launch needs route.logits or group.topk_ids too.
constexpr bool fused_route_fits(const RouteArgs& route, const GroupArgs& group,
                                const StreamGemmConfig& config) {
  const int pieces = group.shared_pieces;
  return route.tokens >= 1 && route.tokens <= kFusedRouteTokens && route.top_k >= 1 &&
         route.top_k <= kMaxTopK && route.experts + pieces <= kFusedRouteExperts &&
         route.experts + pieces <= StreamGemmLayout::threads(config) &&
         route.tokens * (route.top_k + pieces) <= kFusedRouteSlots && group.tb_tail[0] == 0 &&
         group.tb_tail[1] == 0 && group.tb_small[0] == 0 && group.tb_small[1] == 0;
}

// The tiled (prefill) GEMM: same arguments; row_blocks counts row blocks of
// TileGemmLayout::rows(config) rows and tb_prefix token blocks of TileGemmLayout::tokens(config).
cudaError_t tile_gemm_setup(const TileGemmConfig& config, StreamEpilogue epilogue,
                            KernelAttributes* attributes);
cudaError_t launch_tile_gemm(const StreamGemmArgs& args, const TileGemmConfig& config,
                             StreamEpilogue epilogue, int grid, bool pdl, cudaStream_t stream);

// The SM90 wgmma GEMM: same arguments, with act k-permuted (permuted_k), rows of n_chunks * 64
// values, 16-byte aligned, act_rows of them. With a SwiGLU epilogue (GEMM1) act holds a row per
// token and slot s reads row slot_token[s] (required); with kStoreBf16 (GEMM2) act is in slot order,
// slot_token is unused and out's rows must be 16-byte aligned (out and out_ld * 2 bytes: its
// stores are 16 bytes wide); cudaErrorInvalidValue otherwise. row_blocks counts 256-row blocks and
// tb_prefix blocks of WgmmaGemmLayout::tokens(config). wgmma_supported() is false off sm_90 (the
// kernel has no body there) and the setup then returns cudaErrorNotSupported.
bool wgmma_supported();
cudaError_t wgmma_gemm_setup(const WgmmaGemmConfig& config, StreamEpilogue epilogue,
                             KernelAttributes* attributes);
cudaError_t launch_wgmma_gemm(const StreamGemmArgs& args, const WgmmaGemmConfig& config,
                              StreamEpilogue epilogue, int grid, bool pdl, cudaStream_t stream);
// out[pair_slot[t][j]][permuted_k(kk)] = x[t][kk] for each token t < tokens and each of its
// `pairs` (k+P) slots that is not -1, zero for k <= kk < k_padded; with pair_slot null, out[t]
// instead (one row per token: the wgmma GEMM1's act). k must be a multiple of 8 and k_padded of
// 64 (cudaErrorInvalidValue otherwise).
cudaError_t launch_permute_gather(const std::uint16_t* x, const std::int32_t* pair_slot, int tokens,
                                  int pairs, int k, int k_padded, std::uint16_t* out, cudaStream_t stream);

struct FinalizeArgs {
  const std::uint16_t* y = nullptr;         // [slots, hidden] bf16
  const std::int32_t* pair_slot = nullptr;  // [T, k+P]; -1: a dropped pick
  const float* topk_weights = nullptr;      // [T, k]
  int tokens = 0;
  int top_k = 0;
  int shared_pieces = 0;
  int hidden = 0;
  std::uint16_t* out = nullptr;  // bf16 [T, hidden]
};
cudaError_t launch_finalize(const FinalizeArgs& args, bool pdl, cudaStream_t stream);

}  // namespace fp4moe::kernels
