// fp4moe: a Mixture-of-Experts layer on the GPU.
//
//   fp4moe::MoeLayer layer(weights);                  // uploads and repacks the weights once
//   layer.forward(stream, x, router_logits, out, T);  // x, logits, out: device pointers
//
// forward() neither allocates device memory nor synchronizes with the host: its workspace is
// sized at construction for options.max_tokens, so a forward can be captured in a CUDA graph and
// replayed. The first forward of each token count decides its kernel configurations on the host
// (planner::pick_layer_gemm, remembered per token count). The same inputs give bitwise the same output on
// every run (no float atomics). Forwards of one layer share its workspace: run them on one stream,
// or order them.
//
// Pointers: x is bf16 [T, H], router_logits fp32 [T, E], out bf16 [T, H], all row-major, on the
// layer's device, 16-byte aligned. This header needs no CUDA headers; `Stream` is cudaStream_t.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <span>

#include "fp4moe/bf16.hpp"
#include "fp4moe/layer.hpp"
#include "fp4moe/reference.hpp"

struct CUstream_st;

namespace fp4moe {

namespace gpu {
class LayerTuning;  // src/gpu/layer_tuning.hpp: times one GEMM of a layer for the autotuner
}

using Stream = CUstream_st*;  // the same type as cudaStream_t

// The two expert-GEMM kernels and their configurations:
//   kStream (decode, kernels/stream_gemm_layout.hpp): one warp (or k_split warps) per item of
//     16*m_tiles weight rows x 8*n_tiles tokens, each warp with a `stages`-deep private ring;
//   kTile (prefill, kernels/tile_gemm_layout.hpp): one CTA of `warps` warps per item of
//     warps*m_tiles*16 rows x 8*n_tiles tokens sharing the tokens in shared memory;
//   kWgmma (prefill on sm_90, kernels/wgmma_gemm_layout.hpp): two warpgroups per item of 256 rows
//     x 8*n_tiles tokens (64 or 128), wgmma with the weights in registers (m_tiles, warps and
//     k_split are fixed: 2, 8, 1).
enum class GemmKernel : std::uint8_t { kStream, kTile, kWgmma };

struct GemmChoice {
  GemmKernel kernel = GemmKernel::kStream;
  int m_tiles = 4;
  int n_tiles = 1;
  int stages = 3;
  int warps = 8;
  int k_split = 1;  // kStream only

  bool operator==(const GemmChoice&) const = default;
  int token_block() const { return 8 * n_tiles; }
  // Weight rows one work item covers: stream m_tiles x 16; tile warps x m_tiles x 16; wgmma always
  // 256 (its warps are consumer warps: 8 cover 128 rows each two m64 blocks, 16 one each).
  int rows_per_item() const {
    if (kernel == GemmKernel::kStream) return m_tiles * 16;
    return kernel == GemmKernel::kWgmma ? 256 : warps * m_tiles * 16;
  }
  std::string to_string() const;
};

struct MoeLayerOptions {
  std::int64_t max_tokens = 4096;   // the largest T a forward accepts (sizes the workspace)
  int device = -1;                  // CUDA device; -1: the current one
  bool programmatic_launch = true;  // overlap kernel launches with PDL on sm_90+
  // With PDL on sm_90+: a decode-path (stream kernel) GEMM2 prefetches the first weights of its
  // warps into L2 (half the L2 in all) while GEMM1's last items still run (docs/KERNELS.md).
  bool l2_prefetch = true;
  // The weight-streaming kernel's weight copies carry an evict-first L2 policy (sm_80+): at decode
  // sizes a forward reads each expert's weights once, and lines fetched into L2 for a later read
  // (the prefetches here and below) then outlive the stream's own (docs/KERNELS.md).
  bool l2_evict_first = true;
  // Where the first GEMM routes the tokens itself (fused_routing, sm_90+) and the layer has a shared
  // expert: its CTAs prefetch the shared expert's first-GEMM weights into L2 while they route, so
  // that memory works while the routing chain runs (docs/KERNELS.md).
  bool shared_prefetch = true;
  // At decode sizes (T <= 16 with the stream kernel for both GEMMs), the first GEMM's CTAs route and
  // group the tokens themselves (forward_routed: the caller's ids), each into its own shared memory,
  // instead of a routing kernel before it: one launch and one handoff fewer (docs/KERNELS.md).
  bool fused_routing = true;
  // Where the first GEMM runs on the wgmma kernel (sm_90): the experts with few tokens (at most
  // small_expert_tokens) run whole on the weight-streaming kernel instead, one more launch per GEMM
  // (docs/KERNELS.md).
  bool small_expert_launch = true;
  // The most tokens of such an expert: 8 or 16 (two token tiles per item; an expert of at most 8
  // tokens then skips the second); -1: the layer's choice (16).
  int small_expert_tokens = -1;
  // The fewest such experts for which they do (a forward with fewer runs them on wgmma too); -1:
  // the layer's estimate of where the extra launch pays (about 224 MB of their weights).
  int small_expert_min = -1;
  // Force a kernel configuration for every forward (tests, tuning); unset: the layer decides
  // (planner::pick_layer_gemm: the tune cache, else the dispatcher's heuristics, each only if the
  // planner accepts it). A forced configuration the planner rejects makes the constructor throw.
  std::optional<GemmChoice> gemm1;
  std::optional<GemmChoice> gemm2;
  // The autotuner's cache (docs/TUNING.md), read once at construction: a forward of T tokens runs
  // the configurations tuned for T's bucket (the largest power of two <= T) when the cache has
  // them. A cache made on another GPU, CUDA or fp4moe version is ignored with a one-line notice.
  bool use_tune_cache = true;
  // Empty: $FP4MOE_TUNE_CACHE, else $XDG_CACHE_HOME/fp4moe/tune.json, else ~/.cache/fp4moe/tune.json.
  std::string tune_cache_path;
  // Where the layer's one-line notices go (e.g. why a tune cache was ignored); unset: stderr.
  std::function<void(const std::string&)> log;
};

// Where forward() also writes its routing decision (device pointers, [T, k]); optional.
struct RoutingOutput {
  std::int32_t* ids = nullptr;
  float* weights = nullptr;
};

// The kernels of a forward, in launch order. kGather (the k-permuted copy of x) runs only where
// the first GEMM is the wgmma kernel.
enum class ForwardStage { kRouting, kGather, kGateUp, kDown, kFinalize };
inline constexpr ForwardStage kForwardStages[] = {ForwardStage::kRouting, ForwardStage::kGather,
                                                  ForwardStage::kGateUp, ForwardStage::kDown,
                                                  ForwardStage::kFinalize};
const char* forward_stage_name(ForwardStage stage);  // "routing", "gather", "gate/up", "down", "finalize"

class MoeLayer {
 public:
  // Validates the weights, repacks them into the kernels' layout and uploads them. Throws
  // fp4moe::Error (kUnsupported without CUDA or for a layer the GPU path cannot run, with the
  // reason; kInvalidArgument for inconsistent weights; kCuda for device failures).
  explicit MoeLayer(const LayerWeights& weights, const MoeLayerOptions& options = {});
  ~MoeLayer();
  MoeLayer(MoeLayer&&) noexcept;
  MoeLayer& operator=(MoeLayer&&) noexcept;
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // The whole layer: routing, grouping, both expert GEMMs, the weighted reduction (plus the
  // shared expert). T = 0 does nothing. Throws for T > max_tokens or misaligned pointers.
  void forward(Stream stream, const Bf16* x, const float* router_logits, Bf16* out, std::int64_t tokens,
               RoutingOutput routing = {}) const;

  // The same with routing done by the caller: topk_ids int32 [T, k], topk_weights fp32 [T, k].
  // An id outside [0, E) is dropped (that pick contributes nothing).
  void forward_routed(Stream stream, const Bf16* x, const std::int32_t* topk_ids, const float* topk_weights,
                      Bf16* out, std::int64_t tokens) const;

  // For profiling (`fp4moe bench --stages`): forward() that stops after stage `last`; what later
  // stages write (out included) is left as it was. Timing the prefixes in place, with the launch
  // overlap of a whole forward, gives each stage's share as the difference of two of them. Where
  // the first GEMM routes (MoeLayerOptions::fused_routing), stopping after routing (or the gather)
  // runs the routing kernel instead, and later stops the fused first GEMM.
  void forward_until(Stream stream, const Bf16* x, const float* router_logits, Bf16* out, std::int64_t tokens,
                     ForwardStage last) const;

  const LayerDesc& desc() const;
  std::int64_t weight_bytes() const;     // device bytes of the repacked expert weights
  std::int64_t workspace_bytes() const;  // device bytes of the forward workspace
  int device() const;
  // What a forward of T tokens runs: kernels, configurations (and who picked them), grid sizes.
  std::string plan_summary(std::int64_t tokens) const;

 private:
  friend class gpu::LayerTuning;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One forward from host memory to host memory on the current GPU (uploads the weights each
// call: for tools such as `fp4moe run`, not for serving). Returns the output and the routing
// decision in the CPU reference's form. Throws like MoeLayer.
ReferenceResult gpu_forward(const LayerWeights& weights, std::span<const Bf16> x,
                            std::span<const float> router_logits, std::int64_t tokens,
                            const MoeLayerOptions& options = {});

}  // namespace fp4moe
