#include "fp4moe/moe_layer.hpp"

#include <fmt/format.h>

#include "common/fail.hpp"
#include "fp4moe/device.hpp"

#if FP4MOE_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "gpu/cuda_check.hpp"
#include "gpu/dispatch.hpp"
#include "gpu/repack.hpp"
#include "kernels/launch.hpp"
#include "kernels/weight_layout.hpp"
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
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
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
  const std::int64_t workers = std::max<std::int64_t>(1, std::min<std::int64_t>(n, std::thread::hardware_concurrency()));
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

std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

}  // namespace

struct MoeLayer::Impl {
  LayerDesc desc;
  MoeLayerOptions options;
  int device = 0;
  int sm = 0;
  gpu::DeviceLimits limits;
  int pieces = 0;   // shared-expert pieces (pseudo-experts E .. E+P-1)
  int experts_total = 0;
  std::int64_t stride1 = 0, stride2 = 0;
  DeviceBuffer w1, w2, ps1, ps2, bias1, bias2, correction_bias;

  // Workspace.
  std::int64_t max_slots = 0;
  DeviceBuffer workspace;
  std::int32_t* topk_ids = nullptr;
  float* topk_weights = nullptr;
  std::int32_t *counts = nullptr, *cursors = nullptr, *offsets = nullptr, *active = nullptr, *n_active = nullptr;
  std::int32_t* tb_prefix[2] = {nullptr, nullptr};
  std::int32_t *slot_token = nullptr, *pair_slot = nullptr;
  std::uint16_t* h = nullptr;
  float* y = nullptr;
  std::uint16_t* x_perm = nullptr;
  std::int64_t h_padded = 0;  // H rounded up to whole 64-chunks
  std::int64_t i_padded = 0;  // I likewise

  mutable std::mutex mu;
  mutable std::map<std::tuple<int, int, int, int, int, int, int>, int> grid_cache;

  GemmChoice config(std::int64_t tokens, gpu::Gemm which) const {
    const auto& forced = which == gpu::Gemm::kGateUp ? options.gemm1 : options.gemm2;
    if (forced) return *forced;
    return gpu::choose_gemm(desc, tokens, which, limits);
  }

  kernels::StreamEpilogue epilogue(gpu::Gemm which) const {
    if (which == gpu::Gemm::kDown) return kernels::StreamEpilogue::kStoreF32;
    return desc.activation == Activation::kSwiGLU ? kernels::StreamEpilogue::kSwiGLU
                                                  : kernels::StreamEpilogue::kSwiGLUClamped;
  }

  // Persistent grid: every SM filled with as many CTAs as fit (the occupancy of this config).
  int grid(const GemmChoice& c, kernels::StreamEpilogue epi) const {
    const auto key = std::make_tuple(static_cast<int>(c.kernel), c.m_tiles, c.n_tiles, c.stages, c.warps, c.k_split,
                                     static_cast<int>(epi));
    std::lock_guard<std::mutex> lock(mu);
    auto it = grid_cache.find(key);
    if (it != grid_cache.end()) return it->second;
    if (!gpu::valid(c)) {
      fail(Errc::kInvalidArgument, "GEMM config {} is not a valid shape (stream: stages 2..16, warps 1..8, k_split 1, "
           "2, 4 or 8 dividing warps; tile: stages 2..8, warps * m_tiles a multiple of 4, k_split 1)", c.to_string());
    }
    if (gpu::smem_bytes(c) > limits.smem_per_block_optin) {
      fail(Errc::kDoesNotFit, "GEMM config {} needs {} B of shared memory per block; this GPU allows {} B",
           c.to_string(), gpu::smem_bytes(c), limits.smem_per_block_optin);
    }
    kernels::KernelAttributes attr;
    cudaError_t err = cudaSuccess;
    switch (c.kernel) {
      case GemmKernel::kTile: err = kernels::tile_gemm_setup(gpu::tile_config(c), epi, &attr); break;
      case GemmKernel::kWgmma: err = kernels::wgmma_gemm_setup(gpu::wgmma_config(c), epi, &attr); break;
      case GemmKernel::kStream: err = kernels::stream_gemm_setup(gpu::stream_config(c), epi, &attr); break;
    }
    if (err == cudaErrorNotSupported) {
      fail(Errc::kUnsupported, "GEMM config {} needs sm_90 (wgmma) and a build with the sm_90a image", c.to_string());
    }
    if (err == cudaErrorInvalidValue) {
      fail(Errc::kUnsupported, "GEMM config {} is not compiled into this build (tile shapes m x n: stream 1x1 2x1 4x1 "
           "1x2 2x2 4x2 1x4 2x4; tile 2x8 2x4)", c.to_string());
    }
    FP4MOE_CUDA_CHECK(err);
    if (attr.max_blocks_per_sm < 1) {
      fail(Errc::kDoesNotFit, "GEMM config {} cannot be resident on this GPU ({} registers per thread)", c.to_string(),
           attr.registers);
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

  std::int64_t max_slots_for(std::int64_t tokens) const { return tokens * (desc.top_k + pieces); }

  void run(Stream stream, const Bf16* x, const float* logits, const std::int32_t* ids_in, const float* w_in,
           Bf16* out, std::int64_t tokens, RoutingOutput routing) const;
};

MoeLayer::MoeLayer(const LayerWeights& weights, const MoeLayerOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  weights.validate();
  m.desc = weights.desc;
  m.options = options;
  const LayerDesc& d = m.desc;
  require(options.max_tokens >= 1, "max_tokens = {} must be at least 1", options.max_tokens);
  require(d.experts <= kernels::kMaxRoutedExperts, "experts = {}: the GPU router handles at most {}", d.experts,
          kernels::kMaxRoutedExperts);
  require(d.top_k <= kernels::kMaxTopK, "top_k = {}: the GPU router handles at most {}", d.top_k, kernels::kMaxTopK);
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
    fail(Errc::kUnsupported, "{} is sm_{}; fp4moe's kernels need sm_80 or newer (bf16 mma.sync)", gi.name, gi.sm());
  }
  m.device = dev;
  m.sm = gi.sm();
  m.limits = {gi.sm_count, gi.smem_per_block_optin, gi.smem_per_sm, kernels::wgmma_supported()};

  const std::int64_t H = d.hidden, I = d.intermediate, E = d.experts;
  m.pieces = d.shared_intermediate > 0 ? static_cast<int>((d.shared_intermediate + I - 1) / I) : 0;
  m.experts_total = static_cast<int>(E) + m.pieces;
  require(m.experts_total <= kernels::kMaxTotalExperts, "experts + shared pieces = {} exceeds {}", m.experts_total,
          kernels::kMaxTotalExperts);

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
        *mm.gate, *mm.up, std::span<std::uint8_t>(host1.data() + e * m.stride1, static_cast<std::size_t>(m.stride1)));
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
    std::vector<float> b1(static_cast<std::size_t>(ne * 2 * I), 0.0f), b2(static_cast<std::size_t>(ne * H), 0.0f);
    auto put = [&](std::int64_t e, const ExpertWeights& ex, std::int64_t j0, bool with_down) {
      for (std::int64_t j = 0; j < I && j0 + j < static_cast<std::int64_t>(ex.gate_bias.size()); ++j) {
        b1[static_cast<std::size_t>((e * 2 + 0) * I + j)] = ex.gate_bias[static_cast<std::size_t>(j0 + j)];
        b1[static_cast<std::size_t>((e * 2 + 1) * I + j)] = ex.up_bias[static_cast<std::size_t>(j0 + j)];
      }
      if (with_down) {
        for (std::int64_t r = 0; r < H; ++r) b2[static_cast<std::size_t>(e * H + r)] = ex.down_bias[static_cast<std::size_t>(r)];
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
  const std::size_t o_slot_token = carve(static_cast<std::size_t>(m.max_slots) * 4);
  const std::size_t o_pair_slot = carve(static_cast<std::size_t>(T * (k + m.pieces)) * 4);
  // h rows are padded to whole 64-chunks (the wgmma GEMM2 reads them k-permuted); the padding
  // stays zero. x_perm (the k-permuted, slot-ordered copy of x) exists only where wgmma runs.
  const std::size_t o_h = carve(static_cast<std::size_t>(m.max_slots * m.i_padded) * 2);
  const std::size_t o_y = carve(static_cast<std::size_t>(m.max_slots * H) * 4);
  const std::size_t o_x_perm = carve(m.limits.wgmma ? static_cast<std::size_t>(m.max_slots * m.h_padded) * 2 : 0);
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
  m.slot_token = reinterpret_cast<std::int32_t*>(base + o_slot_token);
  m.pair_slot = reinterpret_cast<std::int32_t*>(base + o_pair_slot);
  m.h = reinterpret_cast<std::uint16_t*>(base + o_h);
  m.y = reinterpret_cast<float*>(base + o_y);
  m.x_perm = m.limits.wgmma ? reinterpret_cast<std::uint16_t*>(base + o_x_perm) : nullptr;
  FP4MOE_CUDA_CHECK(cudaMemset(m.h, 0, static_cast<std::size_t>(m.max_slots * m.i_padded) * 2));
}

void MoeLayer::Impl::run(Stream stream, const Bf16* x, const float* logits, const std::int32_t* ids_in,
                         const float* w_in, Bf16* out, std::int64_t tokens, RoutingOutput routing) const {
  require(tokens >= 0 && tokens <= options.max_tokens,
          "tokens = {} is outside [0, max_tokens = {}] (MoeLayerOptions::max_tokens sizes the workspace)", tokens,
          options.max_tokens);
  if (tokens == 0) return;
  auto aligned = [](const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; };
  require(x != nullptr && aligned(x), "x must be a 16-byte aligned device pointer");
  require(out != nullptr && aligned(out), "out must be a 16-byte aligned device pointer");
  FP4MOE_CUDA_CHECK(cudaSetDevice(device));
  const LayerDesc& d = desc;
  const int T = static_cast<int>(tokens);
  const bool pdl = options.programmatic_launch && sm >= 90;

  const GemmChoice c1 = config(tokens, gpu::Gemm::kGateUp);
  const GemmChoice c2 = config(tokens, gpu::Gemm::kDown);
  const kernels::StreamEpilogue e1 = epilogue(gpu::Gemm::kGateUp);
  const kernels::StreamEpilogue e2 = epilogue(gpu::Gemm::kDown);
  grid(c1, e1);  // validates both configs (and sets the kernels up) before anything is launched
  grid(c2, e2);

  kernels::RouteArgs ra;
  ra.logits = logits;
  ra.correction_bias = correction_bias.as<float>();
  ra.tokens = T;
  ra.experts = static_cast<int>(d.experts);
  ra.top_k = static_cast<int>(d.top_k);
  ra.router = d.router == RouterKind::kSoftmaxTopK       ? kernels::RouterId::kSoftmaxTopK
              : d.router == RouterKind::kSigmoidGroupTopK ? kernels::RouterId::kSigmoidGroupTopK
                                                          : kernels::RouterId::kTopKSoftmax;
  ra.renormalize = d.renormalize ? 1 : 0;
  ra.n_group = static_cast<int>(d.n_group);
  ra.topk_group = static_cast<int>(d.topk_group);
  ra.scaling = d.routed_scaling_factor;
  ra.topk_ids = topk_ids;
  ra.topk_weights = topk_weights;

  kernels::GroupArgs ga;
  ga.topk_ids = ids_in != nullptr ? ids_in : topk_ids;
  ga.tokens = T;
  ga.top_k = ra.top_k;
  ga.experts = ra.experts;
  ga.shared_pieces = pieces;
  ga.tb_tokens[0] = c1.token_block();
  ga.tb_tokens[1] = c2.token_block();
  ga.counts = counts;
  ga.cursors = cursors;
  ga.offsets = offsets;
  ga.active = active;
  ga.n_active = n_active;
  ga.tb_prefix[0] = tb_prefix[0];
  ga.tb_prefix[1] = tb_prefix[1];
  ga.slot_token = slot_token;
  ga.pair_slot = pair_slot;

  if (T <= kernels::kSmallRouteTokens && ra.experts <= kernels::kSmallRouteExperts) {
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

  const std::int64_t H = d.hidden, I = d.intermediate;
  kernels::StreamGemmArgs g1;
  g1.weights = w1.as<std::uint8_t>();
  g1.expert_stride = stride1;
  g1.n_chunks = static_cast<int>(WeightLayout::chunks(H));
  g1.k = static_cast<int>(H);
  g1.rows = static_cast<int>(2 * I);
  g1.row_blocks = row_blocks(c1, 2 * I);
  g1.post_scale = ps1.as<float>();
  g1.bias = bias1.as<float>();
  g1.act = reinterpret_cast<const std::uint16_t*>(x);
  g1.act_ld = H;
  g1.slot_token = slot_token;
  if (c1.kernel == GemmKernel::kWgmma) {
    FP4MOE_CUDA_CHECK(kernels::launch_permute_gather(reinterpret_cast<const std::uint16_t*>(x), slot_token,
                                                     offsets + experts_total, static_cast<int>(max_slots_for(tokens)),
                                                     static_cast<int>(H), static_cast<int>(h_padded), x_perm, stream));
    g1.act = x_perm;
    g1.act_ld = h_padded;
    g1.slot_token = nullptr;
  }
  g1.offsets = offsets;
  g1.active = active;
  g1.n_active = n_active;
  g1.tb_prefix = tb_prefix[0];
  g1.out = h;
  g1.out_ld = i_padded;
  g1.out_permuted = c2.kernel == GemmKernel::kWgmma ? 1 : 0;
  g1.swiglu_alpha = d.swiglu_alpha;
  g1.swiglu_limit = d.swiglu_limit;
  launch(g1, c1, e1, pdl, stream);

  kernels::StreamGemmArgs g2 = g1;
  g2.weights = w2.as<std::uint8_t>();
  g2.expert_stride = stride2;
  g2.n_chunks = static_cast<int>(WeightLayout::chunks(I));
  g2.k = static_cast<int>(I);
  g2.rows = static_cast<int>(H);
  g2.row_blocks = row_blocks(c2, H);
  g2.post_scale = ps2.as<float>();
  g2.bias = bias2.as<float>();
  g2.act = h;
  g2.act_ld = i_padded;
  g2.slot_token = nullptr;
  g2.out_permuted = 0;
  g2.tb_prefix = tb_prefix[1];
  g2.out = y;
  g2.out_ld = H;
  launch(g2, c2, e2, pdl, stream);

  kernels::FinalizeArgs fa;
  fa.y = y;
  fa.pair_slot = pair_slot;
  fa.topk_weights = w_in != nullptr ? w_in : topk_weights;
  fa.tokens = T;
  fa.top_k = ra.top_k;
  fa.shared_pieces = pieces;
  fa.hidden = static_cast<int>(H);
  fa.out = reinterpret_cast<std::uint16_t*>(out);
  FP4MOE_CUDA_CHECK(kernels::launch_finalize(fa, pdl, stream));

  const std::size_t pick_bytes = static_cast<std::size_t>(tokens * d.top_k) * 4;
  if (routing.ids != nullptr) {
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(routing.ids, topk_ids, pick_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  if (routing.weights != nullptr) {
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(routing.weights, topk_weights, pick_bytes, cudaMemcpyDeviceToDevice, stream));
  }
}

void MoeLayer::forward(Stream stream, const Bf16* x, const float* router_logits, Bf16* out, std::int64_t tokens,
                       RoutingOutput routing) const {
  require(tokens == 0 || router_logits != nullptr, "router_logits must be a device pointer");
  impl_->run(stream, x, router_logits, nullptr, nullptr, out, tokens, routing);
}

void MoeLayer::forward_routed(Stream stream, const Bf16* x, const std::int32_t* topk_ids, const float* topk_weights,
                              Bf16* out, std::int64_t tokens) const {
  require(tokens == 0 || (topk_ids != nullptr && topk_weights != nullptr),
          "topk_ids and topk_weights must be device pointers");
  impl_->run(stream, x, nullptr, topk_ids, topk_weights, out, tokens, {});
}

std::int64_t MoeLayer::weight_bytes() const {
  return static_cast<std::int64_t>(impl_->w1.bytes() + impl_->w2.bytes());
}
std::int64_t MoeLayer::workspace_bytes() const { return static_cast<std::int64_t>(impl_->workspace.bytes()); }
int MoeLayer::device() const { return impl_->device; }

std::string MoeLayer::plan_summary(std::int64_t tokens) const {
  const Impl& m = *impl_;
  const GemmChoice c1 = m.config(tokens, gpu::Gemm::kGateUp);
  const GemmChoice c2 = m.config(tokens, gpu::Gemm::kDown);
  const bool small = tokens <= kernels::kSmallRouteTokens && m.desc.experts <= kernels::kSmallRouteExperts;
  return fmt::format("T={}: {}; gate/up GEMM: {}, grid {}; down GEMM: {}, grid {}; finalize", tokens,
                     small ? "route+group (1 CTA)" : "route, scan, scatter", c1.to_string(),
                     m.grid(c1, m.epilogue(gpu::Gemm::kGateUp)), c2.to_string(), m.grid(c2, m.epilogue(gpu::Gemm::kDown)));
}

#else  // no CUDA in this build

struct MoeLayer::Impl {
  LayerDesc desc;
};

MoeLayer::MoeLayer(const LayerWeights&, const MoeLayerOptions&) {
  fail(Errc::kUnsupported, "MoeLayer needs the CUDA kernels; this build has none (nvcc was not found when it was "
       "configured)");
}
void MoeLayer::forward(Stream, const Bf16*, const float*, Bf16*, std::int64_t, RoutingOutput) const {}
void MoeLayer::forward_routed(Stream, const Bf16*, const std::int32_t*, const float*, Bf16*, std::int64_t) const {}
std::int64_t MoeLayer::weight_bytes() const { return 0; }
std::int64_t MoeLayer::workspace_bytes() const { return 0; }
int MoeLayer::device() const { return -1; }
std::string MoeLayer::plan_summary(std::int64_t) const { return "built without CUDA"; }

#endif

MoeLayer::~MoeLayer() = default;
MoeLayer::MoeLayer(MoeLayer&&) noexcept = default;
MoeLayer& MoeLayer::operator=(MoeLayer&&) noexcept = default;
const LayerDesc& MoeLayer::desc() const { return impl_->desc; }

}  // namespace fp4moe
