#include "fp4moe/moe_layer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <vector>

#include "common/fail.hpp"
#include "fp4moe/device.hpp"
#include "gpu/layer_tuning.hpp"

#if FP4MOE_WITH_CUDA
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "fp4moe/arch.hpp"
#include "fp4moe/planner.hpp"
#include "fp4moe/tune.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/dispatch.hpp"
#include "gpu/repack.hpp"
#include "gpu/routing_choice.hpp"
#include "kernels/bench_launch.hpp"
#include "kernels/launch.hpp"
#include "kernels/weight_layout.hpp"
#include "planner/stream_gemm_plan.hpp"
#include "planner/tile_gemm_plan.hpp"
#include "planner/wgmma_gemm_plan.hpp"
#endif

namespace fp4moe {

#if FP4MOE_WITH_CUDA

namespace {

using kernels::WeightLayout;

// Owns one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) FP4MOE_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* src, std::size_t bytes) {
    if (bytes > 0) FP4MOE_CUDA_CHECK(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice));
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Runs f(i) for i in [0, n) on all cores.
template <typename F>
void parallel_for(std::int64_t n, F f) {
  const std::int64_t workers =
      std::max<std::int64_t>(1, std::min<std::int64_t>(n, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(workers));
  for (std::int64_t w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      try {
        for (std::int64_t i = w; i < n; i += workers) f(i);
      } catch (...) {
        errors[static_cast<std::size_t>(w)] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

std::size_t align_up(std::size_t v, std::size_t a) {
  return (v + a - 1) / a * a;
}

GemmKind gemm_kind(gpu::Gemm which) {
  return which == gpu::Gemm::kGateUp ? GemmKind::kGateUp : GemmKind::kDown;
}

}  // namespace

struct MoeLayer::Impl {
  LayerDesc desc;
  MoeLayerOptions options;
  int device = 0;
  int sm = 0;
  gpu::DeviceLimits limits;
  ArchInfo arch;             // the device's figures: what the planner judges configurations on
  KernelResources measured;  // registers of every compiled GEMM instance this layer may launch
  std::optional<TuneCache> tuned;
  std::string tune_path;
  int pieces = 0;  // shared-expert pieces (pseudo-experts E .. E+P-1)
  int experts_total = 0;
  std::int64_t stride1 = 0, stride2 = 0;
  // Whether launches overlap the kernel before them with PDL: the forward's rule, which the tuner
  // follows too so that it times the launches a forward makes.
  bool use_pdl() const { return options.programmatic_launch && sm >= 90; }
  std::int64_t l2_bytes = 0;
  // K chunks of its first item whose weights each warp of a stream-kernel GEMM2 prefetches into L2
  // before its PDL wait (StreamGemmArgs::l2_prefetch_chunks): half the L2 over the grid's warps,
  // so that what is fetched while GEMM1 finishes is still there when GEMM2 reads it. 0: none (off,
  // no PDL, another kernel, or GEMM1, whose routing inputs are not complete when it starts).
  int l2_prefetch_chunks(gpu::Gemm which, const GemmChoice& c) const {
    if (!options.l2_prefetch || !use_pdl() || which != gpu::Gemm::kDown || c.kernel != GemmKernel::kStream) {
      return 0;
    }
    const std::int64_t warps = static_cast<std::int64_t>(grid(c, epilogue(which))) * c.warps;
    const std::int64_t chunks = (l2_bytes / 2) / (warps * WeightLayout::kBlockBytes);
    return static_cast<int>(std::min<std::int64_t>(chunks, WeightLayout::chunks(desc.intermediate)));
  }
  DeviceBuffer w1, w2, ps1, ps2, bias1, bias2, correction_bias;

  // Workspace.
  std::int64_t max_slots = 0;
  DeviceBuffer workspace;
  std::int32_t* topk_ids = nullptr;
  float* topk_weights = nullptr;
  std::int32_t *counts = nullptr, *cursors = nullptr, *offsets = nullptr, *active = nullptr,
               *n_active = nullptr;
  std::int32_t* tb_prefix[2] = {nullptr, nullptr};
  std::int32_t* tail_experts[2] = {nullptr, nullptr};  // per GEMM [kMaxWgmmaTails][E+P] (GroupArgs)
  std::int32_t* tail_count[2] = {nullptr, nullptr};    // per GEMM [kMaxWgmmaTails]
  // The small-expert launch's experts and their number (GroupArgs::small_experts), and its
  // token-block prefix: 0, 1, 2, ... (one block per expert), written once at construction.
  std::int32_t *small_experts = nullptr, *small_count = nullptr, *small_prefix = nullptr;
  // Per GEMM, the small-expert launch's item counter and finished-warp count
  // (StreamGemmArgs::small_claims): zeroed here, and each launch leaves them zero.
  std::int32_t* small_claims = nullptr;
  std::int32_t *slot_token = nullptr, *pair_slot = nullptr;
  std::uint16_t* h = nullptr;
  std::uint16_t* y = nullptr;  // bf16 [slots, H]: the down GEMM's output per (token, pick)
  std::uint16_t* x_perm = nullptr;
  std::int64_t h_padded = 0;  // H rounded up to whole 64-chunks
  std::int64_t i_padded = 0;  // I likewise

  mutable std::mutex mu;
  mutable std::map<std::tuple<int, int, int, int, int, int, int>, int> grid_cache;
  // The decision for each token count seen (the first forward of a T decides; later ones look it up).
  struct Decision {
    GemmChoice choice[2];
    std::vector<gpu::TailLaunch> tails[2];  // the tail launches of each GEMM (wgmma only)
    int small_max = 0;                      // gpu::small_expert_max; 0: no small-expert launch
    // The first GEMM routes (or takes the caller's ids) and groups the tokens itself
    // (launch_stream_gemm_routed): fused_routing(...).
    bool fused_routing = false;
  };
  mutable std::mutex decisions_mu;
  mutable std::map<std::int64_t, Decision> decisions;

  // The layer's decision for GEMM `which` at T tokens (planner::pick_layer_gemm): the forced
  // option, else the tune cache's entry for T's bucket, else the dispatcher, each only if the
  // planner accepts it with this device's limits and measured registers.
  LayerGemmPick pick(std::int64_t tokens, gpu::Gemm which) const {
    const auto& forced = which == gpu::Gemm::kGateUp ? options.gemm1 : options.gemm2;
    std::optional<GemmPreference> preference;
    if (forced) {
      preference =
          GemmPreference{*forced, PickSource::kForced,
                         which == gpu::Gemm::kGateUp ? "MoeLayerOptions::gemm1" : "MoeLayerOptions::gemm2"};
    } else if (tuned) {
      preference = tuned_preference(*tuned, tune_path, desc, tokens, gemm_kind(which));
    }
    return pick_layer_gemm(desc, tokens, gemm_kind(which), arch, &measured, preference);
  }

  const Decision& decide(std::int64_t tokens) const {
    std::lock_guard<std::mutex> lock(decisions_mu);
    const auto it = decisions.find(tokens);
    if (it != decisions.end()) return it->second;
    return decisions
        .emplace(tokens, decision_with(tokens, gpu::Gemm::kGateUp, pick(tokens, gpu::Gemm::kGateUp).choice))
        .first->second;
  }

  // Whether a forward of T tokens under these choices runs the fused decode path: the stream
  // kernel's m4 n1 first GEMM routes and groups in each CTA (MoeLayerOptions::fused_routing),
  // where that kernel is compiled for the configuration, the tables fit (kernels::fused_route_fits)
  // and the driver fits a CTA of it with its static shared memory on an SM.
  bool fused_routing(std::int64_t tokens, const GemmChoice& c1, const GemmChoice& c2,
                     const std::vector<gpu::TailLaunch> (&t)[2], int small) const {
    if (!options.fused_routing || tokens < 1 || tokens > kernels::kFusedRouteTokens) return false;
    if (c1.kernel != GemmKernel::kStream || c2.kernel != GemmKernel::kStream || !t[0].empty() ||
        !t[1].empty() || tb_small(c1, small) != 0 || tb_small(c2, small) != 0) {
      return false;
    }
    const kernels::StreamEpilogue e1 = epilogue(gpu::Gemm::kGateUp);
    const kernels::StreamGemmConfig cfg = gpu::stream_config(c1);
    if (!kernels::stream_gemm_routed_compiled(cfg, e1, static_cast<int>(desc.experts))) return false;
    if (kernels::StreamGemmLayout::cta_bytes(cfg) + kernels::kFusedRouteTableBytes >
        limits.smem_per_block_optin)
      return false;
    const kernels::RouteArgs ra = route_args(nullptr, static_cast<int>(tokens));
    const kernels::GroupArgs ga = group_args(nullptr, static_cast<int>(tokens), c1, c2, small);
    return kernels::fused_route_fits(ra, ga, cfg) && routed_grid(c1, e1) > 0;
  }

  // The fused first GEMM's persistent grid (routed_grid > 0: it was set up and fits), or 0 where the
  // driver fits no CTA of it (its tables add static shared memory to the configuration's).
  int routed_grid(const GemmChoice& c, kernels::StreamEpilogue epi) const {
    const auto key =
        std::make_tuple(-1, c.m_tiles, c.n_tiles, c.stages, c.warps, c.k_split, static_cast<int>(epi));
    std::lock_guard<std::mutex> lock(mu);
    auto it = grid_cache.find(key);
    if (it != grid_cache.end()) return it->second;
    kernels::KernelAttributes attr;
    const cudaError_t err =
        kernels::stream_gemm_routed_setup(gpu::stream_config(c), epi, static_cast<int>(desc.experts), &attr);
    int g = 0;
    if (err == cudaSuccess) {
      g = std::max(attr.max_blocks_per_sm, 0) * limits.sm_count;
    } else if (err != cudaErrorInvalidValue) {
      FP4MOE_CUDA_CHECK(err);
    } else {
      (void)cudaGetLastError();  // the setup's refusal, not a sticky error
    }
    grid_cache.emplace(key, g);
    return g;
  }

  // The most tokens of an expert that the small-expert launch takes under the first GEMM's choice
  // c1 (0: none), its configuration judged by the planner for both GEMMs (it throws, naming the
  // reason, if rejected: never launched).
  int small_max(std::int64_t tokens, const GemmChoice& c1) const {
    const int s = gpu::small_expert_max(c1, options.small_expert_launch, small_tokens());
    if (s > 0) {
      for (const gpu::Gemm which : {gpu::Gemm::kGateUp, gpu::Gemm::kDown}) {
        pick_layer_gemm(
            desc, tokens, gemm_kind(which), arch, &measured,
            GemmPreference{gpu::small_expert_choice(s), PickSource::kForced, "the small-expert launch"});
      }
    }
    return s;
  }
  int small_tokens() const {
    return options.small_expert_tokens >= 0 ? options.small_expert_tokens : gpu::kSmallExpertTokens;
  }
  int small_min() const {
    return options.small_expert_min >= 0 ? options.small_expert_min : gpu::small_expert_min(desc);
  }
  // GroupArgs::tb_small of a GEMM under choice c: only a wgmma GEMM leaves the small experts out.
  static int tb_small(const GemmChoice& c, int small_max) {
    return c.kernel == GemmKernel::kWgmma ? small_max : 0;
  }

  // The tail launches of GEMM `which` under choice c, each judged by the planner like c itself
  // (it throws, naming the reason, for one it rejects: never launched).
  std::vector<gpu::TailLaunch> tails(std::int64_t tokens, gpu::Gemm which, const GemmChoice& c) const {
    std::vector<gpu::TailLaunch> t = gpu::tail_launches(c, limits.smem_per_block_optin);
    for (const gpu::TailLaunch& tl : t) {
      pick_layer_gemm(desc, tokens, gemm_kind(which), arch, &measured,
                      GemmPreference{tl.choice, PickSource::kForced, "the tail blocks of " + c.to_string()});
    }
    return t;
  }

  kernels::StreamEpilogue epilogue(gpu::Gemm which) const {
    if (which == gpu::Gemm::kDown) return kernels::StreamEpilogue::kStoreBf16;
    return desc.activation == Activation::kSwiGLU ? kernels::StreamEpilogue::kSwiGLU
                                                  : kernels::StreamEpilogue::kSwiGLUClamped;
  }

  // Registers of every compiled instance of both kernels with this layer's two epilogues, named
  // with the planner's keys, so the planner's occupancy is the device's.
  void measure_resources() {
    measured.source = ResourceSource::kMeasured;
    measured.origin = fmt::format("cudaFuncGetAttributes on device {}", device);
    for (const auto epi : {epilogue(gpu::Gemm::kGateUp), epilogue(gpu::Gemm::kDown)}) {
      const int e = static_cast<int>(epi);
      kernels::KernelAttributes attr;
      for (const auto& shape : kernels::kStreamTileShapes) {
        // The smallest launch of the instance: registers do not depend on the launch parameters.
        FP4MOE_CUDA_CHECK(kernels::stream_gemm_setup({shape[0], shape[1], 2, 1, 1}, epi, &attr));
        measured.kernels.push_back(
            {planner::stream_gemm_kernel_key(shape[0], shape[1], e), sm, attr.registers, 0, 0});
      }
      for (const auto& shape : kernels::kTileShapes) {
        FP4MOE_CUDA_CHECK(
            kernels::tile_gemm_setup({shape[0], shape[1], kernels::TileGemmLayout::kWarps, 2}, epi, &attr));
        measured.kernels.push_back(
            {planner::tile_gemm_kernel_key(shape[0], shape[1], e), sm, attr.registers, 0, 0});
      }
      if (!limits.wgmma) continue;  // not on this device or not in this build: the planner refuses it
      for (const auto& shape : kernels::kWgmmaShapes) {
        FP4MOE_CUDA_CHECK(kernels::wgmma_gemm_setup({shape.n_tiles, 3, shape.consumer_warps}, epi, &attr));
        measured.kernels.push_back({planner::wgmma_gemm_kernel_key(shape.n_tiles, shape.consumer_warps, e),
                                    sm, attr.registers, 0, 0});
      }
    }
  }

  void load_tune_cache_file() {
    if (!options.use_tune_cache) return;
    tune_path = tune_cache_path(options.tune_cache_path);
    if (tune_path.empty()) return;
    const auto gpus = list_gpus();
    TuneCacheLoad load =
        load_tune_cache(tune_path, tune_metadata_of(gpus.at(static_cast<std::size_t>(device))));
    if (!load.message.empty()) {
      if (options.log) {
        options.log(load.message);
      } else {
        fmt::print(stderr, "fp4moe: {}\n", load.message);
      }
    }
    tuned = std::move(load.cache);
  }

  // Persistent grid: every SM filled with as many CTAs as fit (the occupancy of this config).
  // Only configurations the planner accepted get here.
  int grid(const GemmChoice& c, kernels::StreamEpilogue epi) const {
    const auto key = std::make_tuple(static_cast<int>(c.kernel), c.m_tiles, c.n_tiles, c.stages, c.warps,
                                     c.k_split, static_cast<int>(epi));
    std::lock_guard<std::mutex> lock(mu);
    auto it = grid_cache.find(key);
    if (it != grid_cache.end()) return it->second;
    kernels::KernelAttributes attr;
    cudaError_t err = cudaSuccess;
    switch (c.kernel) {
      case GemmKernel::kTile:
        err = kernels::tile_gemm_setup(gpu::tile_config(c), epi, &attr);
        break;
      case GemmKernel::kWgmma:
        err = kernels::wgmma_gemm_setup(gpu::wgmma_config(c), epi, &attr);
        break;
      case GemmKernel::kStream:
        err = kernels::stream_gemm_setup(gpu::stream_config(c), epi, &attr);
        break;
    }
    // The planner refuses both cases before a config gets here; a driver that disagrees is a bug.
    if (err == cudaErrorNotSupported) {
      fail(Errc::kInternal,
           "GEMM config {} was accepted by the planner, but needs sm_90 (wgmma) and a build with the "
           "sm_90a image",
           c.to_string());
    }
    if (err == cudaErrorInvalidValue) {
      fail(Errc::kInternal, "GEMM config {} was accepted by the planner, but is not compiled into this build",
           c.to_string());
    }
    if (err == cudaErrorInvalidConfiguration && c.kernel == GemmKernel::kWgmma) {
      const auto w = gpu::wgmma_config(c);
      fail(Errc::kInternal,
           "GEMM config {} was accepted by the planner, but its warpgroups' register split (setmaxnreg: {} "
           "registers) exceeds what the compiled kernel is launched with ({} threads); launching it would "
           "hang",
           c.to_string(), kernels::WgmmaGemmLayout::register_demand(w), kernels::WgmmaGemmLayout::threads(w));
    }
    FP4MOE_CUDA_CHECK(err);
    if (attr.max_blocks_per_sm < 1) {
      fail(Errc::kInternal,
           "GEMM config {} was accepted by the planner, but the driver fits no block of it on an SM "
           "({} registers per thread)",
           c.to_string(), attr.registers);
    }
    const int g = attr.max_blocks_per_sm * limits.sm_count;
    grid_cache.emplace(key, g);
    return g;
  }

  // Row blocks per expert of a GEMM with `rows` rows under config c.
  static int row_blocks(const GemmChoice& c, std::int64_t rows) {
    const std::int64_t tiles = WeightLayout::groups(rows) * WeightLayout::kTilesPerGroup;
    const std::int64_t per_item = c.rows_per_item() / 16;
    return static_cast<int>((tiles + per_item - 1) / per_item);
  }

  // GEMM `which` under choice c, then its tail launches (each over the expert's last blocks c left
  // out: tail launch i walks the experts the routing's scan listed for it).
  void launch_with_tails(gpu::Gemm which, const kernels::StreamGemmArgs& args, const GemmChoice& c,
                         const std::vector<gpu::TailLaunch>& tails, kernels::StreamEpilogue epi, bool pdl,
                         Stream stream) const {
    launch(args, c, epi, pdl, stream);
    const int gi = which == gpu::Gemm::kGateUp ? 0 : 1;
    for (std::size_t i = 0; i < tails.size(); ++i) {
      kernels::StreamGemmArgs a = args;
      a.tail_of = c.token_block();
      a.tail_experts =
          tail_experts[gi] + kernels::GroupArgs::tail_list_offset(static_cast<int>(i), experts_total);
      a.n_tail = tail_count[gi] + i;
      launch(a, tails[i].choice, epi, pdl, stream);
    }
  }

  void launch(const kernels::StreamGemmArgs& args, const GemmChoice& c, kernels::StreamEpilogue epi, bool pdl,
              Stream stream) const {
    const int g = grid(c, epi);
    switch (c.kernel) {
      case GemmKernel::kTile:
        FP4MOE_CUDA_CHECK(kernels::launch_tile_gemm(args, gpu::tile_config(c), epi, g, pdl, stream));
        break;
      case GemmKernel::kWgmma:
        FP4MOE_CUDA_CHECK(kernels::launch_wgmma_gemm(args, gpu::wgmma_config(c), epi, g, pdl, stream));
        break;
      case GemmKernel::kStream:
        FP4MOE_CUDA_CHECK(kernels::launch_stream_gemm(args, gpu::stream_config(c), epi, g, pdl, stream));
        break;
    }
  }

  // The small-expert launch of GEMM `which` (after its wgmma launches): the stream kernel over the
  // experts of at most the decision's small_max tokens, reading x (GEMM1) or h in natural k order.
  void launch_small(gpu::Gemm which, const Bf16* x, int small_max, kernels::StreamEpilogue epi, bool pdl,
                    Stream stream) const {
    const GemmChoice c = gpu::small_expert_choice(small_max);
    kernels::StreamGemmArgs a = gemm_args(which, c, x, false);
    a.active = small_experts;
    a.n_active = small_count;
    a.tb_prefix = small_prefix;
    a.l2_prefetch_chunks = 0;
    a.small_launch = 1;
    a.small_claims = small_claims + (which == gpu::Gemm::kGateUp ? 0 : 2);
    launch(a, c, epi, pdl, stream);
  }

  // Routes (from logits, or groups the caller's ids when logits is null) and groups the T*k picks
  // by expert, with the token blocks of the first GEMM's choice c1 and the second's c2 (whose tail
  // launches take the last blocks of at most gpu::tail_max tokens; a wgmma GEMM leaves experts of
  // at most small_max tokens to the small-expert launch).
  void route_and_group(Stream stream, const float* logits, const std::int32_t* ids_in, int tokens,
                       const GemmChoice& c1, const GemmChoice& c2, int small_max) const;
  // Their arguments: routing from logits (into the workspace's ids and weights), and grouping of
  // those (or the caller's ids_in) into the workspace's tables.
  kernels::RouteArgs route_args(const float* logits, int tokens) const;
  kernels::GroupArgs group_args(const std::int32_t* ids_in, int tokens, const GemmChoice& c1,
                                const GemmChoice& c2, int small_max) const;
  // The k-permuted copy of x (a row per token) that a wgmma first GEMM gathers its rows from.
  void permute_gather(Stream stream, const Bf16* x, std::int64_t tokens) const;
  // The arguments of GEMM `which` under config c (x: the forward's input, read by the first GEMM;
  // h_permuted: the first GEMM stores h in mma-k order for a wgmma second GEMM).
  kernels::StreamGemmArgs gemm_args(gpu::Gemm which, const GemmChoice& c, const Bf16* x,
                                    bool h_permuted) const;

  // A forward. `decision`: the one to run instead of the layer's own for `tokens` (the tuner's,
  // with a candidate configuration; built by decision_with).
  void run(Stream stream, const Bf16* x, const float* logits, const std::int32_t* ids_in, const float* w_in,
           Bf16* out, std::int64_t tokens, RoutingOutput routing, ForwardStage last = ForwardStage::kFinalize,
           const Decision* decision = nullptr) const;

  // The layer's decision at T tokens with GEMM `which` run as `choice` and the other GEMM as
  // `other` (null: as the layer picks it), and what follows from both: tail launches, the
  // small-expert launch, fused routing.
  Decision decision_with(std::int64_t tokens, gpu::Gemm which, const GemmChoice& choice,
                         const GemmChoice* other = nullptr) const {
    Decision d;
    const int w = which == gpu::Gemm::kGateUp ? 0 : 1;
    d.choice[w] = choice;
    d.choice[1 - w] =
        other != nullptr ? *other : pick(tokens, w == 0 ? gpu::Gemm::kDown : gpu::Gemm::kGateUp).choice;
    d.tails[0] = tails(tokens, gpu::Gemm::kGateUp, d.choice[0]);
    d.tails[1] = tails(tokens, gpu::Gemm::kDown, d.choice[1]);
    d.small_max = small_max(tokens, d.choice[0]);
    d.fused_routing = fused_routing(tokens, d.choice[0], d.choice[1], d.tails, d.small_max);
    return d;
  }
};

MoeLayer::MoeLayer(const LayerWeights& weights, const MoeLayerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  weights.validate();
  m.desc = weights.desc;
  m.options = options;
  const LayerDesc& d = m.desc;
  require(options.max_tokens >= 1, "max_tokens = {} must be at least 1", options.max_tokens);
  require(options.small_expert_min >= -1,
          "small_expert_min = {} must be -1 (the layer's estimate) or a number of experts (0 or more)",
          options.small_expert_min);
  require(options.small_expert_tokens == -1 || gpu::valid_small_expert_tokens(options.small_expert_tokens),
          "small_expert_tokens = {} must be -1 (the layer's choice, {}) or one of {}",
          options.small_expert_tokens, gpu::kSmallExpertTokens,
          fmt::join(gpu::kSmallExpertTokenBounds, ", "));
  require(d.experts <= kernels::kMaxRoutedExperts, "experts = {}: the GPU router handles at most {}",
          d.experts, kernels::kMaxRoutedExperts);
  require(d.top_k <= kernels::kMaxTopK, "top_k = {}: the GPU router handles at most {}", d.top_k,
          kernels::kMaxTopK);
  require(d.router != RouterKind::kSigmoidGroupTopK || d.n_group <= kernels::kMaxGroups,
          "n_group = {}: the GPU router handles at most {} groups", d.n_group, kernels::kMaxGroups);

  std::string why;
  const auto gpus = list_gpus(&why);
  if (gpus.empty()) fail(Errc::kUnsupported, "MoeLayer needs a GPU: {}", why);
  int dev = options.device;
  if (dev < 0) FP4MOE_CUDA_CHECK(cudaGetDevice(&dev));
  require(dev < static_cast<int>(gpus.size()), "device {} does not exist ({} GPUs found)", dev, gpus.size());
  FP4MOE_CUDA_CHECK(cudaSetDevice(dev));
  const GpuInfo& gi = gpus[static_cast<std::size_t>(dev)];
  if (gi.sm() < 80) {
    fail(Errc::kUnsupported, "{} is sm_{}; fp4moe's kernels need sm_80 or newer (bf16 mma.sync)", gi.name,
         gi.sm());
  }
  m.device = dev;
  m.sm = gi.sm();
  m.l2_bytes = gi.l2_bytes;
  m.limits = {gi.sm_count, gi.smem_per_block_optin, gi.smem_per_sm, kernels::wgmma_supported()};
  m.arch = arch_from_gpu(gi);
  if (m.arch.wgmma && !m.limits.wgmma) {
    m.arch.wgmma = false;
    m.arch.notes.push_back("wgmma: this build has no sm_90a image of the wgmma GEMM (not compiled)");
  }
  m.measure_resources();
  m.load_tune_cache_file();
  const std::int64_t H = d.hidden, I = d.intermediate, E = d.experts;
  m.pieces = static_cast<int>(d.shared_pieces());
  m.experts_total = static_cast<int>(E) + m.pieces;
  require(m.experts_total <= kernels::kMaxTotalExperts, "experts + shared pieces = {} exceeds {}",
          m.experts_total, kernels::kMaxTotalExperts);
  // A forced configuration's verdict does not depend on T: judge it now, before any upload (after
  // the pieces: whether a decision fuses routing depends on them).
  if (options.gemm1 || options.gemm2) m.decide(1);

  // Per (pseudo-)expert matrices: routed experts, then the shared expert cut into pieces of I.
  struct Mats {
    const QuantizedMatrix* gate;
    const QuantizedMatrix* up;
    const QuantizedMatrix* down;
  };
  std::vector<QuantizedMatrix> piece_storage;
  piece_storage.reserve(static_cast<std::size_t>(3 * m.pieces));
  std::vector<Mats> mats;
  for (const auto& ex : weights.experts) mats.push_back({&ex.gate, &ex.up, &ex.down});
  for (int p = 0; p < m.pieces; ++p) {
    const ExpertWeights& sh = *weights.shared;
    piece_storage.push_back(gpu::slice_rows(sh.gate, p * I, I));
    piece_storage.push_back(gpu::slice_rows(sh.up, p * I, I));
    piece_storage.push_back(gpu::slice_cols(sh.down, p * I, I));
    const std::size_t b = piece_storage.size() - 3;
    mats.push_back({&piece_storage[b], &piece_storage[b + 1], &piece_storage[b + 2]});
  }

  m.stride1 = WeightLayout::matrix_bytes(2 * I, H);
  m.stride2 = WeightLayout::matrix_bytes(H, I);
  const std::int64_t ne = m.experts_total;
  std::vector<std::uint8_t> host1(static_cast<std::size_t>(ne * m.stride1));
  std::vector<std::uint8_t> host2(static_cast<std::size_t>(ne * m.stride2));
  std::vector<float> ps1(static_cast<std::size_t>(2 * ne)), ps2(static_cast<std::size_t>(2 * ne));
  parallel_for(ne, [&](std::int64_t e) {
    const Mats& mm = mats[static_cast<std::size_t>(e)];
    const gpu::GateUpScales s = gpu::repack_gate_up(
        *mm.gate, *mm.up,
        std::span<std::uint8_t>(host1.data() + e * m.stride1, static_cast<std::size_t>(m.stride1)));
    ps1[static_cast<std::size_t>(2 * e)] = s.gate;
    ps1[static_cast<std::size_t>(2 * e + 1)] = s.up;
    const float s2 = gpu::repack_matrix(
        *mm.down, std::span<std::uint8_t>(host2.data() + e * m.stride2, static_cast<std::size_t>(m.stride2)));
    ps2[static_cast<std::size_t>(2 * e)] = ps2[static_cast<std::size_t>(2 * e + 1)] = s2;
  });
  m.w1 = DeviceBuffer(host1.size());
  m.w1.upload(host1.data(), host1.size());
  m.w2 = DeviceBuffer(host2.size());
  m.w2.upload(host2.data(), host2.size());
  m.ps1 = DeviceBuffer(ps1.size() * sizeof(float));
  m.ps1.upload(ps1.data(), ps1.size() * sizeof(float));
  m.ps2 = DeviceBuffer(ps2.size() * sizeof(float));
  m.ps2.upload(ps2.data(), ps2.size() * sizeof(float));

  if (d.expert_bias) {
    std::vector<float> b1(static_cast<std::size_t>(ne * 2 * I), 0.0f),
        b2(static_cast<std::size_t>(ne * H), 0.0f);
    auto put = [&](std::int64_t e, const ExpertWeights& ex, std::int64_t j0, bool with_down) {
      for (std::int64_t j = 0; j < I && j0 + j < static_cast<std::int64_t>(ex.gate_bias.size()); ++j) {
        b1[static_cast<std::size_t>((e * 2 + 0) * I + j)] = ex.gate_bias[static_cast<std::size_t>(j0 + j)];
        b1[static_cast<std::size_t>((e * 2 + 1) * I + j)] = ex.up_bias[static_cast<std::size_t>(j0 + j)];
      }
      if (with_down) {
        for (std::int64_t r = 0; r < H; ++r)
          b2[static_cast<std::size_t>(e * H + r)] = ex.down_bias[static_cast<std::size_t>(r)];
      }
    };
    for (std::int64_t e = 0; e < E; ++e) put(e, weights.experts[static_cast<std::size_t>(e)], 0, true);
    for (int p = 0; p < m.pieces; ++p) put(E + p, *weights.shared, p * I, p == 0);
    m.bias1 = DeviceBuffer(b1.size() * sizeof(float));
    m.bias1.upload(b1.data(), b1.size() * sizeof(float));
    m.bias2 = DeviceBuffer(b2.size() * sizeof(float));
    m.bias2.upload(b2.data(), b2.size() * sizeof(float));
  }
  if (d.router == RouterKind::kSigmoidGroupTopK && !weights.correction_bias.empty()) {
    m.correction_bias = DeviceBuffer(weights.correction_bias.size() * sizeof(float));
    m.correction_bias.upload(weights.correction_bias.data(), weights.correction_bias.size() * sizeof(float));
  }

  // Workspace, carved from one allocation.
  const std::int64_t T = options.max_tokens, k = d.top_k;
  m.max_slots = T * (k + m.pieces);
  m.h_padded = WeightLayout::chunks(H) * WeightLayout::kChunkK;
  m.i_padded = WeightLayout::chunks(I) * WeightLayout::kChunkK;
  std::size_t off = 0;
  auto carve = [&](std::size_t bytes) {
    const std::size_t at = off;
    off = align_up(off + bytes, 256);
    return at;
  };
  const std::size_t o_ids = carve(static_cast<std::size_t>(T * k) * 4);
  const std::size_t o_w = carve(static_cast<std::size_t>(T * k) * 4);
  const std::size_t o_counts = carve(static_cast<std::size_t>(ne) * 4);
  const std::size_t o_cursors = carve(static_cast<std::size_t>(ne) * 4);
  const std::size_t o_offsets = carve(static_cast<std::size_t>(ne + 1) * 4);
  const std::size_t o_active = carve(static_cast<std::size_t>(ne) * 4);
  const std::size_t o_nactive = carve(4);
  const std::size_t o_tb0 = carve(static_cast<std::size_t>(ne + 1) * 4);
  const std::size_t o_tb1 = carve(static_cast<std::size_t>(ne + 1) * 4);
  const auto tail_list_bytes = static_cast<std::size_t>(
      kernels::GroupArgs::tail_list_offset(kernels::kMaxWgmmaTails, static_cast<int>(ne)) * 4);
  const std::size_t o_tail0 = carve(tail_list_bytes);
  const std::size_t o_tail1 = carve(tail_list_bytes);
  const std::size_t o_tail_count = carve(2 * kernels::kMaxWgmmaTails * 4);
  const std::size_t o_small = carve(static_cast<std::size_t>(ne) * 4);
  const std::size_t o_small_count = carve(4);
  const std::size_t o_small_prefix = carve(static_cast<std::size_t>(ne + 1) * 4);
  const std::size_t o_small_claims = carve(4 * 4);
  const std::size_t o_slot_token = carve(static_cast<std::size_t>(m.max_slots) * 4);
  const std::size_t o_pair_slot = carve(static_cast<std::size_t>(T * (k + m.pieces)) * 4);
  // h rows are padded to whole 64-chunks (the wgmma GEMM2 reads them k-permuted); the padding
  // stays zero. x_perm (the k-permuted copy of x, a row per token) exists only where wgmma runs.
  const std::size_t o_h = carve(static_cast<std::size_t>(m.max_slots * m.i_padded) * 2);
  const std::size_t o_y = carve(static_cast<std::size_t>(m.max_slots * H) * 2);
  const std::size_t o_x_perm = carve(m.limits.wgmma ? static_cast<std::size_t>(T * m.h_padded) * 2 : 0);
  m.workspace = DeviceBuffer(off);
  auto* base = m.workspace.as<std::uint8_t>();
  m.topk_ids = reinterpret_cast<std::int32_t*>(base + o_ids);
  m.topk_weights = reinterpret_cast<float*>(base + o_w);
  m.counts = reinterpret_cast<std::int32_t*>(base + o_counts);
  m.cursors = reinterpret_cast<std::int32_t*>(base + o_cursors);
  m.offsets = reinterpret_cast<std::int32_t*>(base + o_offsets);
  m.active = reinterpret_cast<std::int32_t*>(base + o_active);
  m.n_active = reinterpret_cast<std::int32_t*>(base + o_nactive);
  m.tb_prefix[0] = reinterpret_cast<std::int32_t*>(base + o_tb0);
  m.tb_prefix[1] = reinterpret_cast<std::int32_t*>(base + o_tb1);
  m.tail_experts[0] = reinterpret_cast<std::int32_t*>(base + o_tail0);
  m.tail_experts[1] = reinterpret_cast<std::int32_t*>(base + o_tail1);
  m.tail_count[0] = reinterpret_cast<std::int32_t*>(base + o_tail_count);
  m.tail_count[1] = m.tail_count[0] + kernels::kMaxWgmmaTails;
  m.small_experts = reinterpret_cast<std::int32_t*>(base + o_small);
  m.small_count = reinterpret_cast<std::int32_t*>(base + o_small_count);
  m.small_prefix = reinterpret_cast<std::int32_t*>(base + o_small_prefix);
  m.small_claims = reinterpret_cast<std::int32_t*>(base + o_small_claims);
  FP4MOE_CUDA_CHECK(cudaMemset(m.small_claims, 0, 4 * 4));
  m.slot_token = reinterpret_cast<std::int32_t*>(base + o_slot_token);
  m.pair_slot = reinterpret_cast<std::int32_t*>(base + o_pair_slot);
  m.h = reinterpret_cast<std::uint16_t*>(base + o_h);
  m.y = reinterpret_cast<std::uint16_t*>(base + o_y);
  m.x_perm = m.limits.wgmma ? reinterpret_cast<std::uint16_t*>(base + o_x_perm) : nullptr;
  FP4MOE_CUDA_CHECK(cudaMemset(m.h, 0, static_cast<std::size_t>(m.max_slots * m.i_padded) * 2));
  std::vector<std::int32_t> iota(static_cast<std::size_t>(ne + 1));
  for (std::size_t i = 0; i < iota.size(); ++i) iota[i] = static_cast<std::int32_t>(i);
  FP4MOE_CUDA_CHECK(cudaMemcpy(m.small_prefix, iota.data(), iota.size() * 4, cudaMemcpyHostToDevice));
  // The uploads and the memset ran on the legacy default stream, and a copy from pageable memory
  // may return before its DMA ends: wait for them, so that a forward on any stream (a non-blocking
  // one does not order itself after the legacy stream) reads complete weights and a zeroed h.
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
}

kernels::RouteArgs MoeLayer::Impl::route_args(const float* logits, int tokens) const {
  const LayerDesc& d = desc;
  kernels::RouteArgs ra;
  ra.logits = logits;
  ra.correction_bias = correction_bias.as<float>();
  ra.tokens = tokens;
  ra.experts = static_cast<int>(d.experts);
  ra.top_k = static_cast<int>(d.top_k);
  ra.router = d.router == RouterKind::kSoftmaxTopK        ? kernels::RouterId::kSoftmaxTopK
              : d.router == RouterKind::kSigmoidGroupTopK ? kernels::RouterId::kSigmoidGroupTopK
                                                          : kernels::RouterId::kTopKSoftmax;
  ra.renormalize = d.renormalize ? 1 : 0;
  ra.n_group = static_cast<int>(d.n_group);
  ra.topk_group = static_cast<int>(d.topk_group);
  ra.scaling = d.routed_scaling_factor;
  ra.topk_ids = topk_ids;
  ra.topk_weights = topk_weights;
  return ra;
}

kernels::GroupArgs MoeLayer::Impl::group_args(const std::int32_t* ids_in, int tokens, const GemmChoice& c1,
                                              const GemmChoice& c2, int small_max) const {
  kernels::GroupArgs ga;
  ga.topk_ids = ids_in != nullptr ? ids_in : topk_ids;
  ga.tokens = tokens;
  ga.top_k = static_cast<int>(desc.top_k);
  ga.experts = static_cast<int>(desc.experts);
  ga.shared_pieces = pieces;
  ga.tb_tokens[0] = c1.token_block();
  ga.tb_tokens[1] = c2.token_block();
  ga.tb_tail[0] = gpu::tail_max(c1);
  ga.tb_tail[1] = gpu::tail_max(c2);
  ga.tb_small[0] = tb_small(c1, small_max);
  ga.tb_small[1] = tb_small(c2, small_max);
  ga.small_min = small_min();
  ga.small_experts = small_experts;
  ga.small_count = small_count;
  ga.counts = counts;
  ga.cursors = cursors;
  ga.offsets = offsets;
  ga.active = active;
  ga.n_active = n_active;
  ga.tb_prefix[0] = tb_prefix[0];
  ga.tb_prefix[1] = tb_prefix[1];
  ga.tail_experts[0] = tail_experts[0];
  ga.tail_experts[1] = tail_experts[1];
  ga.tail_count[0] = tail_count[0];
  ga.tail_count[1] = tail_count[1];
  ga.slot_token = slot_token;
  ga.pair_slot = pair_slot;
  return ga;
}

void MoeLayer::Impl::route_and_group(Stream stream, const float* logits, const std::int32_t* ids_in,
                                     int tokens, const GemmChoice& c1, const GemmChoice& c2,
                                     int small_max) const {
  const kernels::RouteArgs ra = route_args(logits, tokens);
  const kernels::GroupArgs ga = group_args(ids_in, tokens, c1, c2, small_max);
  if (gpu::one_cta_routing(tokens, ra.experts)) {
    FP4MOE_CUDA_CHECK(kernels::launch_route_group_small(ra, ga, stream));
  } else {
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<std::size_t>(experts_total) * 4, stream));
    if (logits != nullptr) {
      FP4MOE_CUDA_CHECK(kernels::launch_route_count(ra, ga, stream));
    } else {
      FP4MOE_CUDA_CHECK(kernels::launch_group_count(ga, stream));
    }
    FP4MOE_CUDA_CHECK(kernels::launch_group_scan(ga, stream));
    FP4MOE_CUDA_CHECK(kernels::launch_group_scatter(ga, stream));
  }
}

void MoeLayer::Impl::permute_gather(Stream stream, const Bf16* x, std::int64_t tokens) const {
  // One k-permuted row per token (pair_slot null); the wgmma GEMM1 gathers each slot's row itself.
  FP4MOE_CUDA_CHECK(kernels::launch_permute_gather(reinterpret_cast<const std::uint16_t*>(x), nullptr,
                                                   static_cast<int>(tokens), 1, static_cast<int>(desc.hidden),
                                                   static_cast<int>(h_padded), x_perm, stream));
}

kernels::StreamGemmArgs MoeLayer::Impl::gemm_args(gpu::Gemm which, const GemmChoice& c, const Bf16* x,
                                                  bool h_permuted) const {
  const std::int64_t H = desc.hidden, I = desc.intermediate;
  kernels::StreamGemmArgs g;
  g.offsets = offsets;
  g.active = active;
  g.n_active = n_active;
  g.swiglu_alpha = desc.swiglu_alpha;
  g.swiglu_limit = desc.swiglu_limit;
  if (which == gpu::Gemm::kGateUp) {
    g.weights = w1.as<std::uint8_t>();
    g.expert_stride = stride1;
    g.n_chunks = static_cast<int>(WeightLayout::chunks(H));
    g.k = static_cast<int>(H);
    g.rows = static_cast<int>(2 * I);
    g.row_blocks = row_blocks(c, 2 * I);
    g.post_scale = ps1.as<float>();
    g.bias = bias1.as<float>();
    if (c.kernel == GemmKernel::kWgmma) {  // gathers its rows from permute_gather's copy, by token
      g.act = x_perm;
      g.act_ld = h_padded;
      g.act_rows = options.max_tokens;
      g.slot_token = slot_token;
    } else {
      g.act = reinterpret_cast<const std::uint16_t*>(x);
      g.act_ld = H;
      g.slot_token = slot_token;
    }
    g.tb_prefix = tb_prefix[0];
    g.out = h;
    g.out_ld = i_padded;
    g.out_permuted = h_permuted ? 1 : 0;
  } else {
    g.weights = w2.as<std::uint8_t>();
    g.expert_stride = stride2;
    g.n_chunks = static_cast<int>(WeightLayout::chunks(I));
    g.k = static_cast<int>(I);
    g.rows = static_cast<int>(H);
    g.row_blocks = row_blocks(c, H);
    g.post_scale = ps2.as<float>();
    g.bias = bias2.as<float>();
    g.act = h;
    g.act_ld = i_padded;
    g.act_rows = max_slots;
    g.slot_token = nullptr;
    g.out_permuted = 0;
    g.tb_prefix = tb_prefix[1];
    g.out = y;
    g.out_ld = H;
  }
  g.l2_prefetch_chunks = l2_prefetch_chunks(which, c);
  g.l2_evict_first = options.l2_evict_first ? 1 : 0;
  return g;
}

void MoeLayer::Impl::run(Stream stream, const Bf16* x, const float* logits, const std::int32_t* ids_in,
                         const float* w_in, Bf16* out, std::int64_t tokens, RoutingOutput routing,
                         ForwardStage last, const Decision* given) const {
  require(tokens >= 0 && tokens <= options.max_tokens,
          "tokens = {} is outside [0, max_tokens = {}] (MoeLayerOptions::max_tokens sizes the workspace)",
          tokens, options.max_tokens);
  if (tokens == 0) return;
  auto aligned = [](const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; };
  require(x != nullptr && aligned(x), "x must be a 16-byte aligned device pointer");
  require(out != nullptr && aligned(out), "out must be a 16-byte aligned device pointer");
  FP4MOE_CUDA_CHECK(cudaSetDevice(device));
  const LayerDesc& d = desc;
  const int T = static_cast<int>(tokens);
  const bool pdl = use_pdl();

  const Decision& decision = given != nullptr ? *given : decide(tokens);
  const GemmChoice& c1 = decision.choice[0];
  const GemmChoice& c2 = decision.choice[1];
  const kernels::StreamEpilogue e1 = epilogue(gpu::Gemm::kGateUp);
  const kernels::StreamEpilogue e2 = epilogue(gpu::Gemm::kDown);
  // Sets every kernel up before anything is launched.
  grid(c1, e1);
  grid(c2, e2);
  for (const gpu::TailLaunch& t : decision.tails[0]) grid(t.choice, e1);
  for (const gpu::TailLaunch& t : decision.tails[1]) grid(t.choice, e2);
  const bool small1 = tb_small(c1, decision.small_max) > 0;
  const bool small2 = tb_small(c2, decision.small_max) > 0;
  if (small1) grid(gpu::small_expert_choice(decision.small_max), e1);
  if (small2) grid(gpu::small_expert_choice(decision.small_max), e2);

  // The fused decode path: the first GEMM routes (or takes the caller's ids) and groups: no routing
  // launch. forward_until's routing (and gather) stages run the routing kernel instead.
  const bool fused = decision.fused_routing && (logits != nullptr || ids_in != nullptr) &&
                     last != ForwardStage::kRouting && last != ForwardStage::kGather;
  if (fused) {
    kernels::StreamGemmArgs a = gemm_args(gpu::Gemm::kGateUp, c1, x, false);
    if (options.shared_prefetch && pieces > 0 && sm >= 90) {  // the shared expert: pseudo-experts E ..
      a.l2_warm = a.weights + static_cast<std::int64_t>(d.experts) * stride1;
      a.l2_warm_bytes = static_cast<std::int64_t>(pieces) * stride1;
    }
    FP4MOE_CUDA_CHECK(kernels::launch_stream_gemm_routed(
        a, gpu::stream_config(c1), e1, routed_grid(c1, e1), route_args(logits, T),
        group_args(ids_in, T, c1, c2, decision.small_max), stream));
  } else {
    route_and_group(stream, logits, ids_in, T, c1, c2, decision.small_max);
    if (last == ForwardStage::kRouting) return;
    if (c1.kernel == GemmKernel::kWgmma) permute_gather(stream, x, tokens);
    if (last == ForwardStage::kGather) return;
    launch_with_tails(gpu::Gemm::kGateUp,
                      gemm_args(gpu::Gemm::kGateUp, c1, x, c2.kernel == GemmKernel::kWgmma), c1,
                      decision.tails[0], e1, pdl, stream);
  }
  if (small1) launch_small(gpu::Gemm::kGateUp, x, decision.small_max, e1, pdl, stream);
  if (last == ForwardStage::kGateUp) return;
  launch_with_tails(gpu::Gemm::kDown, gemm_args(gpu::Gemm::kDown, c2, x, false), c2, decision.tails[1], e2,
                    pdl, stream);
  if (small2) launch_small(gpu::Gemm::kDown, x, decision.small_max, e2, pdl, stream);
  if (last == ForwardStage::kDown) return;

  kernels::FinalizeArgs fa;
  fa.y = y;
  fa.pair_slot = pair_slot;
  fa.topk_weights = w_in != nullptr ? w_in : topk_weights;
  fa.tokens = T;
  fa.top_k = static_cast<int>(d.top_k);
  fa.shared_pieces = pieces;
  fa.hidden = static_cast<int>(d.hidden);
  fa.out = reinterpret_cast<std::uint16_t*>(out);
  FP4MOE_CUDA_CHECK(kernels::launch_finalize(fa, pdl, stream));

  const std::size_t pick_bytes = static_cast<std::size_t>(tokens * d.top_k) * 4;
  if (routing.ids != nullptr) {
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(routing.ids, topk_ids, pick_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  if (routing.weights != nullptr) {
    FP4MOE_CUDA_CHECK(
        cudaMemcpyAsync(routing.weights, topk_weights, pick_bytes, cudaMemcpyDeviceToDevice, stream));
  }
}

void MoeLayer::forward(Stream stream, const Bf16* x, const float* router_logits, Bf16* out,
                       std::int64_t tokens, RoutingOutput routing) const {
  require(tokens == 0 || router_logits != nullptr, "router_logits must be a device pointer");
  impl_->run(stream, x, router_logits, nullptr, nullptr, out, tokens, routing);
}

void MoeLayer::forward_until(Stream stream, const Bf16* x, const float* router_logits, Bf16* out,
                             std::int64_t tokens, ForwardStage last) const {
  require(tokens == 0 || router_logits != nullptr, "router_logits must be a device pointer");
  impl_->run(stream, x, router_logits, nullptr, nullptr, out, tokens, {}, last);
}

void MoeLayer::forward_routed(Stream stream, const Bf16* x, const std::int32_t* topk_ids,
                              const float* topk_weights, Bf16* out, std::int64_t tokens) const {
  require(tokens == 0 || (topk_ids != nullptr && topk_weights != nullptr),
          "topk_ids and topk_weights must be device pointers");
  impl_->run(stream, x, nullptr, topk_ids, topk_weights, out, tokens, {});
}

std::int64_t MoeLayer::weight_bytes() const {
  return static_cast<std::int64_t>(impl_->w1.bytes() + impl_->w2.bytes());
}
std::int64_t MoeLayer::workspace_bytes() const {
  return static_cast<std::int64_t>(impl_->workspace.bytes());
}
int MoeLayer::device() const {
  return impl_->device;
}

std::string MoeLayer::plan_summary(std::int64_t tokens) const {
  const Impl& m = *impl_;
  const LayerGemmPick p1 = m.pick(tokens, gpu::Gemm::kGateUp);
  const LayerGemmPick p2 = m.pick(tokens, gpu::Gemm::kDown);
  const bool small = gpu::one_cta_routing(tokens, m.desc.experts);
  const bool fused = tokens >= 1 && m.decide(tokens).fused_routing;  // (with router logits)
  const auto tails = [&](gpu::Gemm which, const GemmChoice& c) {
    std::string s;
    for (const gpu::TailLaunch& t : m.tails(tokens, which, c)) {
      s += fmt::format("; then each expert's last {}-{} tokens: wgmma n{} s{}", t.lo + 1, t.hi,
                       t.choice.n_tiles, t.choice.stages);
    }
    return s;
  };
  const int small_max = m.small_max(tokens, p1.choice);
  const auto small_launch = [&](gpu::Gemm which, const GemmChoice& c) {
    if (Impl::tb_small(c, small_max) == 0) return std::string();
    const GemmChoice sc = gpu::small_expert_choice(small_max);
    return fmt::format(
        "; then the experts of 1-{} tokens, when at least {}: {} (K split chosen on the GPU), grid {}",
        small_max, m.small_min(), sc.to_string(), m.grid(sc, m.epilogue(which)));
  };
  const int prefetch = m.l2_prefetch_chunks(gpu::Gemm::kDown, p2.choice);
  const std::string l2 =
      prefetch > 0 ? fmt::format(", {} K chunks per warp prefetched into L2 during gate/up", prefetch) : "";
  return fmt::format(
      "T={}: {}; gate/up GEMM: {} [{}], grid {}{}{}; down GEMM: {} [{}], grid {}{}{}{}; finalize", tokens,
      fused ? "route+group in every gate/up CTA (fused)"
            : (small ? "route+group (1 CTA)" : "route, scan, scatter"),
      p1.choice.to_string(), p1.why,
      fused ? m.routed_grid(p1.choice, m.epilogue(gpu::Gemm::kGateUp))
            : m.grid(p1.choice, m.epilogue(gpu::Gemm::kGateUp)),
      tails(gpu::Gemm::kGateUp, p1.choice), small_launch(gpu::Gemm::kGateUp, p1.choice),
      p2.choice.to_string(), p2.why, m.grid(p2.choice, m.epilogue(gpu::Gemm::kDown)), l2,
      tails(gpu::Gemm::kDown, p2.choice), small_launch(gpu::Gemm::kDown, p2.choice));
}

namespace gpu {

struct LayerTuning::Impl {
  // Input sets rotated over the timed forwards, as `fp4moe bench` does: at decode sizes each set
  // routes to other experts, so a forward finds its weights in memory, not in L2.
  static constexpr int kSets = 4;
  const MoeLayer* layer = nullptr;
  std::int64_t tokens = 0;
  DeviceBuffer x[kSets], logits[kSets], out;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;

  // One forward per input set with a given decision, captured as CUDA graphs (what `fp4moe bench`
  // replays, and what an engine runs).
  struct Forwards {
    cudaGraph_t graph[kSets] = {};
    cudaGraphExec_t exec[kSets] = {};
    int next = 0;
    Forwards() = default;
    Forwards(const Forwards&) = delete;
    Forwards& operator=(const Forwards&) = delete;
    ~Forwards() {
      for (int i = 0; i < kSets; ++i) {
        if (exec[i] != nullptr) cudaGraphExecDestroy(exec[i]);
        if (graph[i] != nullptr) cudaGraphDestroy(graph[i]);
      }
    }
    void launch(cudaStream_t s) {
      FP4MOE_CUDA_CHECK(cudaGraphLaunch(exec[next], s));
      next = (next + 1) % kSets;
    }
  };

  ~Impl() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // Microseconds of `launches` back-to-back launches.
  template <typename F>
  double time(F launch_once, int launches) {
    FP4MOE_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < launches; ++i) launch_once();
    FP4MOE_CUDA_CHECK(cudaEventRecord(stop, stream));
    FP4MOE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return 1000.0 * static_cast<double>(ms);
  }
};

const ArchInfo& LayerTuning::arch(const MoeLayer& layer) {
  return layer.impl_->arch;
}
const KernelResources& LayerTuning::resources(const MoeLayer& layer) {
  return layer.impl_->measured;
}

LayerTuning::LayerTuning(const MoeLayer& layer, std::int64_t tokens, std::uint64_t seed)
    : impl_(std::make_unique<Impl>()) {
  const MoeLayer::Impl& m = *layer.impl_;
  require(tokens >= 1 && tokens <= m.options.max_tokens,
          "tuning at {} tokens: the layer takes 1..{} (max_tokens)", tokens, m.options.max_tokens);
  FP4MOE_CUDA_CHECK(cudaSetDevice(m.device));
  Impl& t = *impl_;
  t.layer = &layer;
  t.tokens = tokens;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&t.stream, cudaStreamNonBlocking));
  FP4MOE_CUDA_CHECK(cudaEventCreate(&t.start));
  FP4MOE_CUDA_CHECK(cudaEventCreate(&t.stop));
  const std::int64_t x_values = tokens * m.desc.hidden;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> host(static_cast<std::size_t>(tokens * m.desc.experts));
  for (int i = 0; i < Impl::kSets; ++i) {
    t.x[i] = DeviceBuffer(static_cast<std::size_t>(x_values) * 2);
    FP4MOE_CUDA_CHECK(kernels::launch_fill_random_bf16(t.x[i].as<std::uint16_t>(), x_values,
                                                       seed + static_cast<std::uint64_t>(i), 1.0f, t.stream));
    for (auto& v : host) v = dist(rng);
    t.logits[i] = DeviceBuffer(host.size() * sizeof(float));
    t.logits[i].upload(host.data(), host.size() * sizeof(float));
  }
  t.out = DeviceBuffer(static_cast<std::size_t>(x_values) * 2);
  // x was filled on t.stream, the logits copied on the legacy stream (which t.stream, non-blocking,
  // does not wait for): wait for both.
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
}

LayerTuning::~LayerTuning() = default;

GemmTiming LayerTuning::time_gemm(GemmKind which, const GemmChoice& choice, int warmup, int samples) {
  return time_gemms(which, {choice}, warmup, samples).front();
}

std::vector<GemmTiming> LayerTuning::time_gemms(GemmKind which, const std::vector<GemmChoice>& choices,
                                                int warmup, int samples,
                                                const std::function<void(int, int)>& progress,
                                                const std::optional<GemmChoice>& other) {
  Impl& t = *impl_;
  const MoeLayer::Impl& m = *t.layer->impl_;
  require(samples >= 1, "samples = {} must be at least 1", samples);
  require(warmup >= 0, "warmup = {} must be at least 0", warmup);
  // The layer's own decision with each choice forced (and the other GEMM's): throws with the
  // planner's reason if one is rejected, before anything is launched.
  for (const GemmChoice& choice : choices) {
    pick_layer_gemm(m.desc, t.tokens, which, m.arch, &m.measured,
                    GemmPreference{choice, PickSource::kForced, "the tuner"});
  }
  const GemmKind other_kind = which == GemmKind::kGateUp ? GemmKind::kDown : GemmKind::kGateUp;
  if (other) {
    pick_layer_gemm(m.desc, t.tokens, other_kind, m.arch, &m.measured,
                    GemmPreference{*other, PickSource::kForced, "the tuner"});
  }
  FP4MOE_CUDA_CHECK(cudaSetDevice(m.device));
  const Gemm g = which == GemmKind::kGateUp ? Gemm::kGateUp : Gemm::kDown;
  Bf16* out = reinterpret_cast<Bf16*>(t.out.as<std::uint16_t>());
  std::vector<GemmTiming> timings(choices.size());
  std::vector<std::unique_ptr<Impl::Forwards>> forwards(choices.size());
  // Round r times sample r of every choice in turn, so that what drifts over a run (on an H200 at
  // prefill sizes the clock under the power cap, PERF.md) reaches every choice alike; timed one
  // after another, the first choice of a run measured up to 14% off (TUNING.md).
  for (int r = 0; r < samples; ++r) {
    for (std::size_t i = 0; i < choices.size(); ++i) {
      if (progress) progress(r, static_cast<int>(i));
      GemmTiming& timing = timings[i];
      if (r == 0) {
        // Whole forwards with the choice in place of the layer's pick for this GEMM (the other GEMM
        // as the layer picks it, or as `other`): the routing, the tail and small-expert launches,
        // PDL and finalize a forward runs with it. (Timed alone, a GEMM missed what the forward overlaps, and
        // small layers' weights stayed in L2 between launches: gpt-oss-120b's tuned picks made its layer
        // 3-10% slower, PERF.md.)
        const MoeLayer::Impl::Decision decision =
            m.decision_with(t.tokens, g, choices[i], other ? &*other : nullptr);
        auto f = std::make_unique<Impl::Forwards>();
        for (int set = 0; set < Impl::kSets; ++set) {
          const Bf16* x = reinterpret_cast<const Bf16*>(t.x[set].as<std::uint16_t>());
          const float* logits = t.logits[set].as<float>();
          // The first set once eagerly (sets the kernels up outside the capture: the same kernels
          // for every set), then each set captured.
          if (set == 0) {
            m.run(t.stream, x, logits, nullptr, nullptr, out, t.tokens, {}, ForwardStage::kFinalize,
                  &decision);
          }
          FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(t.stream, cudaStreamCaptureModeThreadLocal));
          m.run(t.stream, x, logits, nullptr, nullptr, out, t.tokens, {}, ForwardStage::kFinalize, &decision);
          FP4MOE_CUDA_CHECK(cudaStreamEndCapture(t.stream, &f->graph[set]));
          FP4MOE_CUDA_CHECK(cudaGraphInstantiate(&f->exec[set], f->graph[set], 0));
        }
        forwards[i] = std::move(f);
        for (int w = 0; w < warmup; ++w) forwards[i]->launch(t.stream);
        // One forward sets how many make a sample of about 200 us (event timing resolves ~1 us).
        const double one = t.time([&] { forwards[i]->launch(t.stream); }, 1);
        timing.launches_per_sample =
            static_cast<int>(std::clamp(std::ceil(200.0 / std::max(one, 1e-3)), 1.0, 100.0));
      } else {
        forwards[i]->launch(t.stream);  // after the other choices' forwards: one to settle
      }
      timing.us.push_back(t.time([&] { forwards[i]->launch(t.stream); }, timing.launches_per_sample) /
                          timing.launches_per_sample);
    }
  }
  return timings;
}

}  // namespace gpu

#else  // no CUDA in this build

struct MoeLayer::Impl {
  LayerDesc desc;
};

MoeLayer::MoeLayer(const LayerWeights&, const MoeLayerOptions&) {
  fail(Errc::kUnsupported,
       "MoeLayer needs the CUDA kernels; this build has none (nvcc was not found when it was "
       "configured)");
}
void MoeLayer::forward(Stream, const Bf16*, const float*, Bf16*, std::int64_t, RoutingOutput) const {}
void MoeLayer::forward_until(Stream, const Bf16*, const float*, Bf16*, std::int64_t, ForwardStage) const {}
void MoeLayer::forward_routed(Stream, const Bf16*, const std::int32_t*, const float*, Bf16*,
                              std::int64_t) const {}
std::int64_t MoeLayer::weight_bytes() const {
  return 0;
}
std::int64_t MoeLayer::workspace_bytes() const {
  return 0;
}
int MoeLayer::device() const {
  return -1;
}
std::string MoeLayer::plan_summary(std::int64_t) const {
  return "built without CUDA";
}

namespace gpu {

struct LayerTuning::Impl {};

const ArchInfo& LayerTuning::arch(const MoeLayer&) {
  fail(Errc::kUnsupported, "tuning needs the CUDA kernels; this build has none");
}
const KernelResources& LayerTuning::resources(const MoeLayer&) {
  fail(Errc::kUnsupported, "tuning needs the CUDA kernels; this build has none");
}
LayerTuning::LayerTuning(const MoeLayer&, std::int64_t, std::uint64_t) {
  fail(Errc::kUnsupported, "tuning needs the CUDA kernels; this build has none");
}
LayerTuning::~LayerTuning() = default;
GemmTiming LayerTuning::time_gemm(GemmKind, const GemmChoice&, int, int) {
  fail(Errc::kUnsupported, "tuning needs the CUDA kernels; this build has none");
}
std::vector<GemmTiming> LayerTuning::time_gemms(GemmKind, const std::vector<GemmChoice>&, int, int,
                                                const std::function<void(int, int)>&,
                                                const std::optional<GemmChoice>&) {
  fail(Errc::kUnsupported, "tuning needs the CUDA kernels; this build has none");
}

}  // namespace gpu

#endif

double gpu::GemmTiming::median() const {
  if (us.empty()) return 0.0;
  std::vector<double> v = us;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char* forward_stage_name(ForwardStage stage) {
  switch (stage) {
    case ForwardStage::kRouting:
      return "routing";
    case ForwardStage::kGather:
      return "gather";
    case ForwardStage::kGateUp:
      return "gate/up";
    case ForwardStage::kDown:
      return "down";
    case ForwardStage::kFinalize:
      return "finalize";
  }
  return "?";
}

MoeLayer::~MoeLayer() = default;
MoeLayer::MoeLayer(MoeLayer&&) noexcept = default;
MoeLayer& MoeLayer::operator=(MoeLayer&&) noexcept = default;
const LayerDesc& MoeLayer::desc() const {
  return impl_->desc;
}

}  // namespace fp4moe
