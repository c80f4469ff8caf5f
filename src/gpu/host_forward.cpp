// A forward pass from host memory to host memory (fp4moe run, tools): copies in, runs a MoeLayer
// on the current device, copies the output and the routing decision back.
#include <fmt/format.h>

#include "common/fail.hpp"
#include "fp4moe/moe_layer.hpp"

#if FP4MOE_WITH_CUDA
#include <cuda_runtime.h>

#include "gpu/cuda_check.hpp"
#endif

namespace fp4moe {

#if FP4MOE_WITH_CUDA

namespace {

// One device allocation, freed on scope exit.
struct DeviceBytes {
  void* p = nullptr;
  explicit DeviceBytes(std::size_t bytes) {
    if (bytes > 0) FP4MOE_CUDA_CHECK(cudaMalloc(&p, bytes));
  }
  ~DeviceBytes() { cudaFree(p); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

}  // namespace

ReferenceResult gpu_forward(const LayerWeights& weights, std::span<const Bf16> x,
                            std::span<const float> router_logits, std::int64_t tokens,
                            const MoeLayerOptions& options) {
  const LayerDesc& d = weights.desc;
  require(tokens >= 0, "tokens = {} must not be negative", tokens);
  require(static_cast<std::int64_t>(x.size()) == tokens * d.hidden,
          "x has {} values, expected tokens * hidden = {}", x.size(), tokens * d.hidden);
  require(static_cast<std::int64_t>(router_logits.size()) == tokens * d.experts,
          "router_logits has {} values, expected tokens * experts = {}", router_logits.size(),
          tokens * d.experts);
  ReferenceResult r;
  r.routing.tokens = tokens;
  r.routing.top_k = d.top_k;
  if (tokens == 0) return r;
  MoeLayerOptions o = options;
  o.max_tokens = std::max(o.max_tokens, tokens);
  const MoeLayer layer(weights, o);
  DeviceBytes dx(x.size_bytes()), dl(router_logits.size_bytes()), dout(x.size_bytes());
  DeviceBytes dids(static_cast<std::size_t>(tokens * d.top_k) * 4),
      dw(static_cast<std::size_t>(tokens * d.top_k) * 4);
  FP4MOE_CUDA_CHECK(cudaMemcpy(dx.p, x.data(), x.size_bytes(), cudaMemcpyHostToDevice));
  FP4MOE_CUDA_CHECK(
      cudaMemcpy(dl.p, router_logits.data(), router_logits.size_bytes(), cudaMemcpyHostToDevice));
  layer.forward(nullptr, static_cast<const Bf16*>(dx.p), static_cast<const float*>(dl.p),
                static_cast<Bf16*>(dout.p), tokens,
                {static_cast<std::int32_t*>(dids.p), static_cast<float*>(dw.p)});
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  r.out.resize(x.size());
  r.routing.ids.resize(static_cast<std::size_t>(tokens * d.top_k));
  r.routing.weights.resize(r.routing.ids.size());
  FP4MOE_CUDA_CHECK(cudaMemcpy(r.out.data(), dout.p, x.size_bytes(), cudaMemcpyDeviceToHost));
  FP4MOE_CUDA_CHECK(
      cudaMemcpy(r.routing.ids.data(), dids.p, r.routing.ids.size() * 4, cudaMemcpyDeviceToHost));
  FP4MOE_CUDA_CHECK(
      cudaMemcpy(r.routing.weights.data(), dw.p, r.routing.weights.size() * 4, cudaMemcpyDeviceToHost));
  return r;
}

#else

ReferenceResult gpu_forward(const LayerWeights&, std::span<const Bf16>, std::span<const float>, std::int64_t,
                            const MoeLayerOptions&) {
  fail(Errc::kUnsupported, "the GPU forward needs the CUDA kernels; this build has none");
}

#endif

}  // namespace fp4moe
