// The GPU half of `fp4moe bench`: ceilings, the fp4moe layer, and the BF16 cuBLAS layer.
#include <fmt/format.h>

#include "bench/bench.hpp"
#include "bench/energy.hpp"
#include "common/fail.hpp"

#if FP4MOE_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <random>
#include <set>

#include "fp4moe/device.hpp"
#include "fp4moe/moe_layer.hpp"
#include "fp4moe/version.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/repack.hpp"
#include "gpu/routing_choice.hpp"
#include "kernels/bench_launch.hpp"
#include "kernels/launch.hpp"
#endif

namespace fp4moe::bench {

#if FP4MOE_WITH_CUDA

namespace {

#define FP4MOE_CUBLAS_CHECK(expr)                                                                      \
  do {                                                                                                 \
    const cublasStatus_t st_ = (expr);                                                                 \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                \
      ::fp4moe::fail(::fp4moe::Errc::kCuda, "{} failed: {} at {}:{}", #expr, cublasGetStatusName(st_), \
                     __FILE__, __LINE__);                                                              \
    }                                                                                                  \
  } while (0)

template <typename T>
class Buf {
 public:
  Buf() = default;
  explicit Buf(std::size_t n) : n_(n) {
    if (n > 0) FP4MOE_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
  }
  ~Buf() { cudaFree(p_); }
  Buf(Buf&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  Buf& operator=(Buf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

class Events {
 public:
  Events() {
    FP4MOE_CUDA_CHECK(cudaEventCreate(&a_));
    FP4MOE_CUDA_CHECK(cudaEventCreate(&b_));
  }
  ~Events() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  // Microseconds taken by f() on the stream.
  template <typename F>
  double time(cudaStream_t s, F f) {
    FP4MOE_CUDA_CHECK(cudaEventRecord(a_, s));
    f();
    FP4MOE_CUDA_CHECK(cudaEventRecord(b_, s));
    FP4MOE_CUDA_CHECK(cudaEventSynchronize(b_));
    float ms = 0.0f;
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, a_, b_));
    return 1000.0 * ms;
  }

 private:
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

class Graph {
 public:
  Graph() = default;
  ~Graph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  Graph(Graph&& o) noexcept : graph_(o.graph_), exec_(o.exec_) {
    o.graph_ = nullptr;
    o.exec_ = nullptr;
  }
  Graph(const Graph&) = delete;
  template <typename F>
  void capture(cudaStream_t s, F f) {
    FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    f();
    FP4MOE_CUDA_CHECK(cudaStreamEndCapture(s, &graph_));
    FP4MOE_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  void launch(cudaStream_t s) const { FP4MOE_CUDA_CHECK(cudaGraphLaunch(exec_, s)); }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Times replays of graphs[i % n]: warm-up, then one event pair around each replay.
// With `clock`, the SM clock is read after each timed run (the run has ended: Events::time waits
// for it).
TimeStats time_graphs(const std::vector<Graph>& graphs, cudaStream_t s, int warmup, int iterations,
                      const EnergyCounter* clock = nullptr) {
  Events ev;
  for (int i = 0; i < warmup * static_cast<int>(graphs.size()); ++i) graphs[i % graphs.size()].launch(s);
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> us;
  std::vector<int> mhz;
  for (int i = 0; i < iterations; ++i) {
    us.push_back(ev.time(s, [&] { graphs[i % graphs.size()].launch(s); }));
    if (clock != nullptr) mhz.push_back(static_cast<int>(clock->sm_clock_mhz().value_or(0)));
  }
  TimeStats t = summarize(us);
  t.sm_clock_mhz = std::move(mhz);
  return t;
}

// Replays graphs[i % n] back to back for about `seconds` (the count from the burst median
// `median_us`), one event pair around the whole run, the energy counter read before and after.
BenchRow::Sustained sustain(const std::vector<Graph>& graphs, cudaStream_t s, double seconds,
                            double median_us, const EnergyCounter* energy) {
  BenchRow::Sustained r;
  r.forwards = std::max<std::int64_t>(static_cast<std::int64_t>(graphs.size()),
                                      static_cast<std::int64_t>(std::ceil(seconds * 1e6 / median_us)));
  Events ev;
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
  // Millijoules from the counter, or -1.
  const auto read_mj = [energy]() -> std::int64_t {
    if (energy == nullptr) return -1;
    const std::optional<std::uint64_t> mj = energy->millijoules();
    return mj ? static_cast<std::int64_t>(*mj) : -1;
  };
  const std::int64_t mj0 = read_mj();
  r.seconds = ev.time(s, [&] {
    for (std::int64_t i = 0; i < r.forwards; ++i)
      graphs[static_cast<std::size_t>(i) % graphs.size()].launch(s);
  }) * 1e-6;
  const std::int64_t mj1 = read_mj();
  if (mj0 >= 0 && mj1 >= mj0) r.joules = static_cast<double>(mj1 - mj0) * 1e-3;
  return r;
}

double measure_copy_gbps(cudaStream_t s) {
  const std::size_t bytes = std::size_t{1} << 30;
  Buf<std::uint8_t> a(bytes), b(bytes);
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(a.get(), 1, bytes, s));
  Events ev;
  for (int i = 0; i < 3; ++i)
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s));
  std::vector<double> us;
  for (int i = 0; i < 20; ++i) {
    us.push_back(ev.time(s, [&] {
      FP4MOE_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s));
    }));
  }
  return 2.0 * static_cast<double>(bytes) / summarize(us).median_us * 1e-3;
}

double measure_bf16_tflops(cublasHandle_t h, cudaStream_t s) {
  const int n = 8192;
  const std::size_t elems = static_cast<std::size_t>(n) * n;
  Buf<std::uint16_t> a(elems), b(elems), c(elems);
  FP4MOE_CUDA_CHECK(kernels::launch_fill_random_bf16(a.get(), static_cast<std::int64_t>(elems), 11, 1.0f, s));
  FP4MOE_CUDA_CHECK(kernels::launch_fill_random_bf16(b.get(), static_cast<std::int64_t>(elems), 12, 1.0f, s));
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    FP4MOE_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n,
                                     b.get(), CUDA_R_16BF, n, &beta, c.get(), CUDA_R_16BF, n,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  Events ev;
  for (int i = 0; i < 3; ++i) gemm();
  std::vector<double> us;
  for (int i = 0; i < 20; ++i) us.push_back(ev.time(s, gemm));
  return 2.0 * n * static_cast<double>(n) * n / summarize(us).median_us * 1e-6;
}

// The same layer in BF16 through cuBLAS: fp4moe's routing and grouping kernels, a row gather,
// one cublasGemmEx per active expert for each GEMM (TN; fp32 gate/up out, bf16 down out as
// fp4moe's y), SwiGLU, and fp4moe's finalize. Per-expert token counts are read once per input set
// before timing, so the timed part needs no host synchronisation and is captured in a CUDA graph
// like fp4moe's.
class Bf16Layer {
 public:
  Bf16Layer(const LayerWeights& w, std::int64_t max_tokens, cudaStream_t s) : d_(w.desc) {
    const std::int64_t H = d_.hidden, I = d_.intermediate;
    pieces_ = static_cast<int>(d_.shared_pieces());
    ne_ = static_cast<int>(d_.experts) + pieces_;
    w1_ = Buf<std::uint16_t>(static_cast<std::size_t>(ne_ * 2 * I * H));
    w2_ = Buf<std::uint16_t>(static_cast<std::size_t>(ne_ * H * I));
    for (int e = 0; e < ne_; ++e) {
      if (e < d_.experts) {
        const ExpertWeights& ex = w.experts[static_cast<std::size_t>(e)];
        upload(ex.gate, w1_.get() + e * 2 * I * H, s);
        upload(ex.up, w1_.get() + e * 2 * I * H + I * H, s);
        upload(ex.down, w2_.get() + e * H * I, s);
      } else {
        const int p = e - static_cast<int>(d_.experts);
        upload(gpu::slice_rows(w.shared->gate, p * I, I), w1_.get() + e * 2 * I * H, s);
        upload(gpu::slice_rows(w.shared->up, p * I, I), w1_.get() + e * 2 * I * H + I * H, s);
        upload(gpu::slice_cols(w.shared->down, p * I, I), w2_.get() + e * H * I, s);
      }
    }
    if (!w.correction_bias.empty()) {
      bias_ = Buf<float>(w.correction_bias.size());
      FP4MOE_CUDA_CHECK(cudaMemcpyAsync(bias_.get(), w.correction_bias.data(), w.correction_bias.size() * 4,
                                        cudaMemcpyHostToDevice, s));
    }
    const std::int64_t slots = max_tokens * (d_.top_k + pieces_);
    ids_ = Buf<std::int32_t>(static_cast<std::size_t>(max_tokens * d_.top_k));
    wts_ = Buf<float>(static_cast<std::size_t>(max_tokens * d_.top_k));
    ints_ = Buf<std::int32_t>(static_cast<std::size_t>(8 * (ne_ + 1)));
    slot_token_ = Buf<std::int32_t>(static_cast<std::size_t>(slots));
    pair_slot_ = Buf<std::int32_t>(static_cast<std::size_t>(slots));
    xp_ = Buf<std::uint16_t>(static_cast<std::size_t>(slots * H));
    y1_ = Buf<float>(static_cast<std::size_t>(slots * 2 * I));
    h_ = Buf<std::uint16_t>(static_cast<std::size_t>(slots * I));
    y2_ = Buf<std::uint16_t>(static_cast<std::size_t>(slots * H));  // bf16, as fp4moe's y
    FP4MOE_CUBLAS_CHECK(cublasCreate(&handle_));
    workspace_ = Buf<std::uint8_t>(std::size_t{64} << 20);
    FP4MOE_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.get(), workspace_.size()));
  }
  ~Bf16Layer() { cublasDestroy(handle_); }

  static std::int64_t weight_bytes(const LayerDesc& d) {
    return (d.experts + d.shared_pieces()) * 3 * d.hidden * d.intermediate * 2;
  }

  // Routes once (synchronously) to learn the per-expert counts, then captures the forward.
  Graph capture(const std::uint16_t* x, const float* logits, std::uint16_t* out, std::int64_t tokens,
                cudaStream_t s) {
    const int T = static_cast<int>(tokens);
    kernels::RouteArgs ra = route_args(logits, T);
    kernels::GroupArgs ga = group_args(T);
    route(ra, ga, T, s);
    std::vector<std::int32_t> offsets(static_cast<std::size_t>(ne_ + 1));
    FP4MOE_CUDA_CHECK(
        cudaMemcpyAsync(offsets.data(), ga.offsets, offsets.size() * 4, cudaMemcpyDeviceToHost, s));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
    FP4MOE_CUBLAS_CHECK(cublasSetStream(handle_, s));
    Graph g;
    g.capture(s, [&] {
      route(ra, ga, T, s);
      const int slots = offsets[static_cast<std::size_t>(ne_)];
      const std::int64_t H = d_.hidden, I = d_.intermediate;
      FP4MOE_CUDA_CHECK(
          kernels::launch_gather_rows(x, slot_token_.get(), slots, static_cast<int>(H), xp_.get(), s));
      const float one = 1.0f, zero = 0.0f;
      for (int e = 0; e < ne_; ++e) {
        const int m = offsets[static_cast<std::size_t>(e + 1)] - offsets[static_cast<std::size_t>(e)];
        if (m == 0) continue;
        const std::int64_t s0 = offsets[static_cast<std::size_t>(e)];
        FP4MOE_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(2 * I), m,
                                         static_cast<int>(H), &one, w1_.get() + e * 2 * I * H, CUDA_R_16BF,
                                         static_cast<int>(H), xp_.get() + s0 * H, CUDA_R_16BF,
                                         static_cast<int>(H), &zero, y1_.get() + s0 * 2 * I, CUDA_R_32F,
                                         static_cast<int>(2 * I), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
      kernels::ActArgs aa;
      aa.gate_up = y1_.get();
      aa.slots = slots;
      aa.inter = static_cast<int>(I);
      aa.clamped = d_.activation == Activation::kSwiGLUClamped ? 1 : 0;
      aa.alpha = d_.swiglu_alpha;
      aa.limit = d_.swiglu_limit;
      aa.out = h_.get();
      FP4MOE_CUDA_CHECK(kernels::launch_swiglu_rows(aa, s));
      for (int e = 0; e < ne_; ++e) {
        const int m = offsets[static_cast<std::size_t>(e + 1)] - offsets[static_cast<std::size_t>(e)];
        if (m == 0) continue;
        const std::int64_t s0 = offsets[static_cast<std::size_t>(e)];
        FP4MOE_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(H), m,
                                         static_cast<int>(I), &one, w2_.get() + e * H * I, CUDA_R_16BF,
                                         static_cast<int>(I), h_.get() + s0 * I, CUDA_R_16BF,
                                         static_cast<int>(I), &zero, y2_.get() + s0 * H, CUDA_R_16BF,
                                         static_cast<int>(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
      kernels::FinalizeArgs fa;
      fa.y = y2_.get();
      fa.pair_slot = pair_slot_.get();
      fa.topk_weights = wts_.get();
      fa.tokens = T;
      fa.top_k = static_cast<int>(d_.top_k);
      fa.shared_pieces = pieces_;
      fa.hidden = static_cast<int>(H);
      fa.out = out;
      FP4MOE_CUDA_CHECK(kernels::launch_finalize(fa, false, s));
    });
    return g;
  }

 private:
  void upload(const QuantizedMatrix& m, std::uint16_t* dst, cudaStream_t s) {
    Buf<std::uint8_t> packed(m.packed.size()), scales(m.scales.size());
    // On s, like the kernel that reads them (s does not wait for the legacy stream).
    FP4MOE_CUDA_CHECK(
        cudaMemcpyAsync(packed.get(), m.packed.data(), m.packed.size(), cudaMemcpyHostToDevice, s));
    FP4MOE_CUDA_CHECK(
        cudaMemcpyAsync(scales.get(), m.scales.data(), m.scales.size(), cudaMemcpyHostToDevice, s));
    kernels::DequantArgs a;
    a.packed = packed.get();
    a.scales = scales.get();
    a.global_scale = m.global_scale;
    a.rows = m.rows;
    a.cols = m.cols;
    a.block = block_size(m.format);
    a.mxfp4 = m.format == WeightFormat::kMxfp4 ? 1 : 0;
    a.out = dst;
    FP4MOE_CUDA_CHECK(kernels::launch_dequantize_bf16(a, s));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  kernels::RouteArgs route_args(const float* logits, int T) const {
    kernels::RouteArgs ra;
    ra.logits = logits;
    ra.correction_bias = bias_.get();
    ra.tokens = T;
    ra.experts = static_cast<int>(d_.experts);
    ra.top_k = static_cast<int>(d_.top_k);
    ra.router = d_.router == RouterKind::kSoftmaxTopK        ? kernels::RouterId::kSoftmaxTopK
                : d_.router == RouterKind::kSigmoidGroupTopK ? kernels::RouterId::kSigmoidGroupTopK
                                                             : kernels::RouterId::kTopKSoftmax;
    ra.renormalize = d_.renormalize ? 1 : 0;
    ra.n_group = static_cast<int>(d_.n_group);
    ra.topk_group = static_cast<int>(d_.topk_group);
    ra.scaling = d_.routed_scaling_factor;
    ra.topk_ids = ids_.get();
    ra.topk_weights = wts_.get();
    return ra;
  }

  kernels::GroupArgs group_args(int T) const {
    kernels::GroupArgs ga;
    ga.topk_ids = ids_.get();
    ga.tokens = T;
    ga.top_k = static_cast<int>(d_.top_k);
    ga.experts = static_cast<int>(d_.experts);
    ga.shared_pieces = pieces_;
    std::int32_t* p = ints_.get();
    ga.counts = p;
    ga.cursors = p + (ne_ + 1);
    ga.offsets = p + 2 * (ne_ + 1);
    ga.active = p + 3 * (ne_ + 1);
    ga.n_active = p + 4 * (ne_ + 1);
    ga.tb_prefix[0] = p + 5 * (ne_ + 1);
    ga.tb_prefix[1] = p + 6 * (ne_ + 1);
    ga.slot_token = slot_token_.get();
    ga.pair_slot = pair_slot_.get();
    return ga;
  }

  void route(const kernels::RouteArgs& ra, const kernels::GroupArgs& ga, int T, cudaStream_t s) {
    if (gpu::one_cta_routing(T, ra.experts)) {
      FP4MOE_CUDA_CHECK(kernels::launch_route_group_small(ra, ga, s));
    } else {
      FP4MOE_CUDA_CHECK(cudaMemsetAsync(ga.counts, 0, static_cast<std::size_t>(ne_) * 4, s));
      FP4MOE_CUDA_CHECK(kernels::launch_route_count(ra, ga, s));
      FP4MOE_CUDA_CHECK(kernels::launch_group_scan(ga, s));
      FP4MOE_CUDA_CHECK(kernels::launch_group_scatter(ga, s));
    }
  }

  LayerDesc d_;
  int pieces_ = 0;
  int ne_ = 0;
  Buf<std::uint16_t> w1_, w2_, xp_, h_, y2_;
  Buf<float> bias_, wts_, y1_;
  Buf<std::int32_t> ids_, ints_, slot_token_, pair_slot_;
  Buf<std::uint8_t> workspace_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace

BenchReport run_gpu_bench(const BenchOptions& options, const Progress& progress) {
  const LayerDesc& d = options.desc;
  BenchReport r;
  r.backend = "gpu";
  r.desc = d;
  r.shape_name = options.shape_name;
  r.caller_routing = options.caller_routing;
  r.uniform_routing = options.uniform_routing;
  r.commit = build_commit();
  r.version = version();
  r.date = utc_date();
  const auto gpus = list_gpus();
  int dev = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&dev));
  const GpuInfo& gi = gpus.at(static_cast<std::size_t>(dev));
  r.device = gi.name;
  r.sm = gi.sm();
  r.sm_clock_mhz = gi.sm_clock_khz / 1000;
  r.memory_clock_mhz = gi.memory_clock_khz / 1000;

  cudaStream_t s;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t handle;
  FP4MOE_CUBLAS_CHECK(cublasCreate(&handle));
  FP4MOE_CUBLAS_CHECK(cublasSetStream(handle, s));
  progress("measuring the ceilings (copy bandwidth, dense BF16 GEMM)");
  r.copy_gbps = measure_copy_gbps(s);
  r.bf16_tflops = measure_bf16_tflops(handle, s);
  cublasDestroy(handle);
  r.sustain_s = options.sustain_s;
  r.trace_clock = options.trace_clock;
  std::unique_ptr<EnergyCounter> energy;
  if (options.sustain_s > 0.0 || options.trace_clock) {
    char bus[64] = {};
    FP4MOE_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, dev));
    std::string why;
    energy = EnergyCounter::open(bus, &why);
    if (options.sustain_s > 0.0) r.energy_note = why;
    if (options.trace_clock) {
      r.clock_note = why;
      if (energy != nullptr && !energy->sm_clock_mhz()) {
        r.clock_note = "NVML's SM clock (nvmlDeviceGetClockInfo) cannot be read";
      }
    }
  }
  // The clock is read after the layer's timed runs only where it can be.
  const EnergyCounter* clock = options.trace_clock && r.clock_note.empty() ? energy.get() : nullptr;

  progress("generating random weights");
  const LayerWeights w = bench_weights(options);
  const std::int64_t max_t = *std::max_element(options.tokens.begin(), options.tokens.end());
  progress("uploading fp4moe weights");
  MoeLayerOptions lo;
  lo.max_tokens = max_t;
  lo.l2_prefetch = options.l2_prefetch;
  lo.l2_evict_first = options.l2_evict_first;
  lo.shared_prefetch = options.shared_prefetch;
  lo.small_expert_launch = options.small_expert_launch;
  lo.fused_routing = options.fused_routing;
  lo.small_expert_tokens = options.small_expert_tokens;
  const MoeLayer layer(w, lo);

  std::unique_ptr<Bf16Layer> bf16;
  if (options.baseline) {
    std::size_t free_b = 0, total_b = 0;
    FP4MOE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double need = static_cast<double>(Bf16Layer::weight_bytes(d)) * 1.3;
    if (need < 0.9 * static_cast<double>(free_b)) {
      progress("uploading BF16 weights for the cuBLAS baseline");
      bf16 = std::make_unique<Bf16Layer>(w, max_t, s);
      r.baseline_name =
          "BF16 layer: fp4moe routing + cublasGemmEx per active expert (TN; gate/up fp32 out, down bf16 "
          "out) + SwiGLU + finalize, CUDA graph";
    } else {
      r.baseline_name = fmt::format("skipped: BF16 weights need {:.1f} GB, {:.1f} GB free", need * 1e-9,
                                    static_cast<double>(free_b) * 1e-9);
    }
  }

  const double weight_bytes_per_expert = 3.0 * static_cast<double>(d.hidden * d.intermediate) *
                                         (d.format == WeightFormat::kNvfp4 ? 0.5625 : 0.53125);
  const double shared_bytes = 3.0 * static_cast<double>(d.hidden * d.shared_intermediate) *
                              (d.format == WeightFormat::kNvfp4 ? 0.5625 : 0.53125);
  for (const std::int64_t T : options.tokens) {
    progress(fmt::format("T={}", T));
    const int sets = std::max(1, options.input_sets);
    std::vector<Buf<std::uint16_t>> xs, outs;
    std::vector<Buf<float>> logits, pick_weights;
    std::vector<Buf<std::int32_t>> pick_ids;
    double active_sum = 0.0;
    for (int i = 0; i < sets; ++i) {
      xs.emplace_back(static_cast<std::size_t>(T * d.hidden));
      outs.emplace_back(static_cast<std::size_t>(T * d.hidden));
      logits.emplace_back(static_cast<std::size_t>(T * d.experts));
      FP4MOE_CUDA_CHECK(kernels::launch_fill_random_bf16(
          xs.back().get(), T * d.hidden, options.seed * 1000 + static_cast<std::uint64_t>(i), 1.0f, s));
      std::mt19937_64 rng(options.seed * 7 + static_cast<std::uint64_t>(T * 31 + i));
      std::normal_distribution<float> dist(0.0f, 2.0f);
      std::vector<float> hl(static_cast<std::size_t>(T * d.experts));
      for (auto& v : hl) v = dist(rng);
      // On s, before the forward that reads them: a copy on the legacy stream from pageable memory
      // may return before its DMA ends, and s does not wait for the legacy stream.
      FP4MOE_CUDA_CHECK(
          cudaMemcpyAsync(logits.back().get(), hl.data(), hl.size() * 4, cudaMemcpyHostToDevice, s));
      // Active experts of this set, from the layer's own routing.
      // (Kept for BenchOptions::caller_routing: the picks the timed forward_routed is given.)
      pick_ids.emplace_back(static_cast<std::size_t>(T * d.top_k));
      pick_weights.emplace_back(static_cast<std::size_t>(T * d.top_k));
      layer.forward(s, reinterpret_cast<const Bf16*>(xs.back().get()), logits.back().get(),
                    reinterpret_cast<Bf16*>(outs.back().get()), T,
                    {pick_ids.back().get(), pick_weights.back().get()});
      std::vector<std::int32_t> hids(static_cast<std::size_t>(T * d.top_k));
      FP4MOE_CUDA_CHECK(
          cudaMemcpyAsync(hids.data(), pick_ids.back().get(), hids.size() * 4, cudaMemcpyDeviceToHost, s));
      FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
      active_sum += static_cast<double>(std::set<std::int32_t>(hids.begin(), hids.end()).size());
    }
    BenchRow row;
    row.tokens = T;
    row.active_experts = active_sum / sets;
    row.bytes = row.active_experts * weight_bytes_per_expert + shared_bytes +
                static_cast<double>(T) * static_cast<double>(d.hidden) * 4.0 +
                static_cast<double>(T * d.experts) * 4.0;
    row.flops = 2.0 * static_cast<double>(T) *
                (static_cast<double>(d.top_k) * 3.0 * d.hidden * d.intermediate +
                 3.0 * d.hidden * d.shared_intermediate);
    row.floor_us = std::max(row.bytes / (r.copy_gbps * 1e3), row.flops / (r.bf16_tflops * 1e6));
    row.plan = layer.plan_summary(T);

    // The forward (through stage `last`), one graph per input set.
    const auto forward_graphs = [&](ForwardStage last) {
      std::vector<Graph> graphs;
      for (int i = 0; i < sets; ++i) {
        const auto k = static_cast<std::size_t>(i);
        graphs.emplace_back();
        graphs.back().capture(s, [&] {
          if (options.caller_routing) {  // (no stages: options checked)
            layer.forward_routed(s, reinterpret_cast<const Bf16*>(xs[k].get()), pick_ids[k].get(),
                                 pick_weights[k].get(), reinterpret_cast<Bf16*>(outs[k].get()), T);
          } else {
            layer.forward_until(s, reinterpret_cast<const Bf16*>(xs[k].get()), logits[k].get(),
                                reinterpret_cast<Bf16*>(outs[k].get()), T, last);
          }
        });
      }
      return graphs;
    };
    // Median of the forward (through stage `last`) replayed over the input sets.
    const auto time_forward = [&](ForwardStage last, const EnergyCounter* trace = nullptr) {
      return time_graphs(forward_graphs(last), s, options.warmup, options.iterations, trace);
    };
    row.fp4moe = time_forward(ForwardStage::kFinalize, clock);
    if (options.sustain_s > 0.0) {
      progress(fmt::format("T={}: {} s of back-to-back forwards", T, options.sustain_s));
      row.sustained = sustain(forward_graphs(ForwardStage::kFinalize), s, options.sustain_s,
                              row.fp4moe.median_us, energy.get());
    }
    if (options.stages) {
      std::vector<Graph> empty(1);
      empty[0].capture(s, [&] { FP4MOE_CUDA_CHECK(kernels::launch_empty(s)); });
      row.launch_us = time_graphs(empty, s, options.warmup, options.iterations).median_us;
      for (const ForwardStage stage : kForwardStages) row.prefix_us.push_back(time_forward(stage).median_us);
    }
    if (bf16) {
      std::vector<Graph> bgraphs;
      for (int i = 0; i < sets; ++i) {
        bgraphs.push_back(bf16->capture(xs[static_cast<std::size_t>(i)].get(),
                                        logits[static_cast<std::size_t>(i)].get(),
                                        outs[static_cast<std::size_t>(i)].get(), T, s));
      }
      row.baseline = time_graphs(bgraphs, s, options.warmup, options.iterations, clock);
      if (options.sustain_s > 0.0) {
        progress(fmt::format("T={}: {} s of back-to-back BF16 layers", T, options.sustain_s));
        row.baseline_sustained = sustain(bgraphs, s, options.sustain_s, row.baseline.median_us, energy.get());
      }
    }
    r.rows.push_back(row);
  }
  FP4MOE_CUDA_CHECK(cudaStreamDestroy(s));
  return r;
}

#else

BenchReport run_gpu_bench(const BenchOptions&, const Progress&) {
  fail(Errc::kUnsupported, "the GPU benchmark needs the CUDA kernels; this build has none");
}

#endif

}  // namespace fp4moe::bench
