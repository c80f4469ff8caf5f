// The GPU layer against the CPU reference, fed the identical quantized weights, on fresh random
// inputs. Outputs are poisoned (0xFFFF, a bf16 NaN) before every run, so an element the GPU
// does not write fails the comparison.
//
// Tolerance: relative L2 error <= 1e-2. Both sides dequantize exactly and accumulate in fp32;
// they differ by summation order (~1e-6) and, through that, by the occasional different bf16
// rounding of the intermediate (2^-9 relative) and of the output: errors of ~1e-3 are expected,
// 1e-2 flags a real defect (a wrong tile, scale or token shows up as O(1)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fp4moe/error.hpp"
#include "fp4moe/layer.hpp"
#include "fp4moe/moe_layer.hpp"
#include "fp4moe/planner.hpp"
#include "fp4moe/reference.hpp"
#include "gpu/gpu_test_util.hpp"
#include "kernels/launch.hpp"
#include "kernels/stream_gemm_layout.hpp"

namespace fp4moe {
namespace {

using test::DeviceArray;

constexpr double kTolerance = 1e-2;

struct GpuRun {
  std::vector<Bf16> out;
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
};

GpuRun run_gpu(const MoeLayer& layer, const std::vector<Bf16>& x, const std::vector<float>& logits,
               std::int64_t tokens) {
  const LayerDesc& d = layer.desc();
  DeviceArray<Bf16> dx(x.size()), dout(static_cast<std::size_t>(tokens * d.hidden));
  DeviceArray<float> dl(logits.size()), dw(static_cast<std::size_t>(tokens * d.top_k));
  DeviceArray<std::int32_t> di(static_cast<std::size_t>(tokens * d.top_k));
  dx.upload(x);
  dl.upload(logits);
  dout.fill_bytes(0xff);
  di.fill_bytes(0xff);
  dw.fill_bytes(0xff);
  layer.forward(nullptr, dx.get(), dl.get(), dout.get(), tokens, {di.get(), dw.get()});
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {dout.download(), di.download(), dw.download()};
}

// forward_routed with the caller's routing, out poisoned first.
std::vector<Bf16> run_gpu_routed(const MoeLayer& layer, const std::vector<Bf16>& x, const Routing& r) {
  DeviceArray<Bf16> dx(x.size()), dout(x.size());
  DeviceArray<std::int32_t> di(r.ids.size());
  DeviceArray<float> dw(r.weights.size());
  dx.upload(x);
  di.upload(r.ids);
  dw.upload(r.weights);
  dout.fill_bytes(0xff);
  layer.forward_routed(nullptr, dx.get(), di.get(), dw.get(), dout.get(), r.tokens);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return dout.download();
}

// forward_routed within the tolerance of the reference's output, and a second run bitwise the same.
void expect_routed_matches(const MoeLayer& layer, const std::vector<Bf16>& x, const Routing& r,
                           const std::vector<Bf16>& ref_out) {
  const auto out = run_gpu_routed(layer, x, r);
  EXPECT_LE(test::relative_l2(out, ref_out), kTolerance);
  const auto again = run_gpu_routed(layer, x, r);
  EXPECT_TRUE(std::equal(again.begin(), again.end(), out.begin())) << "second run differs";
}

// Random logits; `hot` >= 0 makes that expert the first pick of every token.
std::vector<float> make_logits(const LayerDesc& d, std::int64_t tokens, std::uint64_t seed, int hot = -1) {
  auto logits = test::random_f32(static_cast<std::size_t>(tokens * d.experts), seed, 2.0f);
  if (hot >= 0) {
    for (std::int64_t t = 0; t < tokens; ++t) logits[static_cast<std::size_t>(t * d.experts + hot)] = 50.0f;
  }
  return logits;
}

void expect_matches_reference(const LayerWeights& w, const MoeLayer& layer, std::int64_t tokens,
                              std::uint64_t seed, int hot = -1) {
  const LayerDesc& d = w.desc;
  SCOPED_TRACE(d.to_string() + " T=" + std::to_string(tokens));
  const auto x = test::random_bf16(static_cast<std::size_t>(tokens * d.hidden), seed);
  const auto logits = make_logits(d, tokens, seed + 1, hot);
  const ReferenceResult ref = reference_forward(w, x, logits, tokens);
  const GpuRun gpu = run_gpu(layer, x, logits, tokens);
  ASSERT_EQ(gpu.ids, ref.routing.ids) << "routing ids differ";
  for (std::size_t i = 0; i < gpu.weights.size(); ++i) {
    ASSERT_NEAR(gpu.weights[i], ref.routing.weights[i],
                1e-6 * std::max(1.0f, std::fabs(ref.routing.weights[i])))
        << "routing weight " << i;
  }
  const double err = test::relative_l2(gpu.out, ref.out);
  EXPECT_LE(err, kTolerance) << "relative L2 error " << err;
  // Deterministic: a second run gives the same bits.
  const GpuRun again = run_gpu(layer, x, logits, tokens);
  EXPECT_TRUE(std::equal(again.out.begin(), again.out.end(), gpu.out.begin())) << "second run differs";
}

// Runs `check` on a layer with forced kernel configurations, or marks the test skipped where the
// planner refuses them at construction on this device (kUnsupported: a wgmma configuration off
// sm_90, or without the sm_90a image). Callers stop once ::testing::Test::IsSkipped().
template <typename Check>
void on_forced_layer(const LayerWeights& w, const MoeLayerOptions& o, Check&& check) {
  std::optional<MoeLayer> layer;
  try {
    layer.emplace(w, o);
  } catch (const Error& e) {
    if (e.code() == Errc::kUnsupported) GTEST_SKIP() << e.what();
    throw;
  }
  check(*layer);
}

LayerDesc small_desc(RouterKind router) {
  LayerDesc d;
  d.hidden = 256;
  d.intermediate = 128;
  d.experts = 16;
  d.top_k = 4;
  d.router = router;
  if (router == RouterKind::kSigmoidGroupTopK) {
    d.n_group = 4;
    d.topk_group = 2;
    d.routed_scaling_factor = 2.5f;
  }
  return d;
}

TEST(GpuMoeLayer, SoftmaxRouterSeveralTokenCounts) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerWeights w = random_layer_weights(small_desc(RouterKind::kSoftmaxTopK), 1);
  const MoeLayer layer(w);
  for (std::int64_t t : {1, 3, 16, 64, 257, 1000})
    expect_matches_reference(w, layer, t, 100 + static_cast<std::uint64_t>(t));
}

TEST(GpuMoeLayer, SigmoidGroupRouterWithSharedExpert) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSigmoidGroupTopK);
  d.shared_intermediate = 128;
  const LayerWeights w = random_layer_weights(d, 2);
  const MoeLayer layer(w);
  for (std::int64_t t : {1, 3, 16, 64, 257})
    expect_matches_reference(w, layer, t, 200 + static_cast<std::uint64_t>(t));
}

// The one-CTA decode router (kernels/routing.cu: one warp per token, each lane holding PER = 4
// experts' keys up to 128 experts, 8 above) at a few tokens: every router kind, expert counts on
// both sides of that bound and not multiples of 32, against the reference's picks and weights.
TEST(GpuMoeLayer, DecodeRouterWithFewTokensMatchesReference) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (const RouterKind router :
       {RouterKind::kSoftmaxTopK, RouterKind::kSigmoidGroupTopK, RouterKind::kTopKSoftmax}) {
    for (const std::int64_t experts : {64, 128, 129, 200, 256}) {
      LayerDesc d = small_desc(router);
      d.experts = experts;
      d.top_k = 8;
      d.n_group = 1;
      d.topk_group = 1;
      const LayerWeights w = random_layer_weights(d, 5 + static_cast<std::uint64_t>(experts));
      const MoeLayer layer(w);
      for (const std::int64_t t : {1, 2, 4, 5, 8, 9})
        expect_matches_reference(w, layer, t, 500 + static_cast<std::uint64_t>(t + experts));
    }
  }
}

// The fused decode path (MoeLayerOptions::fused_routing): the first GEMM's CTAs route and group
// the tokens themselves, each into its own shared memory, with a deterministic scatter that every
// CTA must agree on. Against the routing kernel's layer (the same configurations, fusion off): the
// same routing and the same output bits; against the reference within the tolerance. Every router
// kind, 16-256 experts (4 and 8 experts per router lane), 0-2 shared pieces, one expert taking
// every token, T = 1-16, and the ring depths and K splits of the fused instances; T = 17 and
// E + P above the CTA's threads fall back to the routing kernel (the plan says which ran). And
// forward_routed's fused grouping of the caller's ids, with a duplicate and an invalid id. The
// fused layer prefetches its shared expert into L2 while it routes (MoeLayerOptions::
// shared_prefetch), the other does not; half the cases also stream without the evict-first hint.
TEST(GpuMoeLayer, FusedRoutingMatchesTheRoutingKernel) {
  FP4MOE_SKIP_WITHOUT_GPU();
  struct Case {
    RouterKind router;
    std::int64_t experts, top_k, shared;
  };
  const std::vector<Case> cases = {
      {RouterKind::kSigmoidGroupTopK, 16, 4, 0},  {RouterKind::kSigmoidGroupTopK, 256, 8, 128},
      {RouterKind::kSoftmaxTopK, 64, 8, 256},     {RouterKind::kSoftmaxTopK, 129, 6, 0},
      {RouterKind::kTopKSoftmax, 128, 2, 0},      {RouterKind::kTopKSoftmax, 200, 8, 128},
      {RouterKind::kSigmoidGroupTopK, 256, 8, 0},
  };
  // The last: the dispatcher's pick for a 4-way split from T=4 since aaee0b8 (one 16-warp CTA).
  const std::vector<GemmChoice> gemm1 = {
      GemmChoice{GemmKernel::kStream, 4, 1, 2, 15, 3}, GemmChoice{GemmKernel::kStream, 4, 1, 3, 16, 1},
      GemmChoice{GemmKernel::kStream, 4, 1, 4, 8, 2}, GemmChoice{GemmKernel::kStream, 4, 1, 3, 16, 4}};
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    LayerDesc d = small_desc(c.router);
    d.experts = c.experts;
    d.top_k = c.top_k;
    d.shared_intermediate = c.shared;
    if (c.router == RouterKind::kSigmoidGroupTopK && c.experts == 256) {
      d.n_group = ci == 1 ? 8 : 1;  // DeepSeek-V3's groups, or GLM-5's none
      d.topk_group = ci == 1 ? 4 : 1;
    }
    const LayerWeights w = random_layer_weights(d, 2100 + ci);
    const std::int64_t threads_needed = d.experts + d.shared_pieces();
    for (std::size_t gi = 0; gi < gemm1.size(); ++gi) {
      MoeLayerOptions o;
      o.max_tokens = 17;
      o.gemm1 = gemm1[gi];
      o.gemm2 = GemmChoice{GemmKernel::kStream, 4, 1, 3, 16, 2};
      MoeLayerOptions off = o;
      off.fused_routing = false;
      // And the L2 hints off there (the shared expert's prefetch needs the fused path anyway): they
      // change no result.
      off.l2_evict_first = ci % 2 == 0;
      off.shared_prefetch = false;
      const MoeLayer fused(w, o), plain(w, off);
      for (const std::int64_t T : {1, 2, 3, 5, 8, 9, 16, 17}) {
        SCOPED_TRACE(d.to_string() + " " + gemm1[gi].to_string() + " T=" + std::to_string(T));
        const bool expect_fused = T <= 16 && threads_needed <= 32 * gemm1[gi].warps;
        EXPECT_EQ(fused.plan_summary(T).find("(fused)") != std::string::npos, expect_fused)
            << fused.plan_summary(T);
        EXPECT_EQ(plain.plan_summary(T).find("(fused)"), std::string::npos);
        for (const int hot : {-1, static_cast<int>(d.experts) - 1}) {
          const std::uint64_t seed = 2200 + 10 * static_cast<std::uint64_t>(T) + ci;
          const auto x = test::random_bf16(static_cast<std::size_t>(T * d.hidden), seed);
          const auto logits = make_logits(d, T, seed + 1, hot);
          const GpuRun a = run_gpu(fused, x, logits, T);
          const GpuRun b = run_gpu(plain, x, logits, T);
          ASSERT_EQ(a.ids, b.ids) << "routing ids differ";
          ASSERT_TRUE(std::equal(a.weights.begin(), a.weights.end(), b.weights.begin(), [](float u, float v) {
            return u == v;
          })) << "routing weights differ";
          EXPECT_TRUE(std::equal(a.out.begin(), a.out.end(), b.out.begin(), [](Bf16 u, Bf16 v) {
            return u.bits == v.bits;
          })) << "output differs from the routing kernel's layer";
          if (hot < 0) expect_matches_reference(w, fused, T, seed);
          // The caller's routing (forward_routed): these picks, with token 0 naming one expert twice
          // and the last pick an id outside [0, E) (dropped).
          Routing r{T, d.top_k, a.ids, a.weights};
          if (d.top_k > 1) r.ids[1] = r.ids[0];
          Routing dropped = r;  // the reference takes only valid ids: weight 0 drops the pick
          dropped.weights.back() = 0.0f;
          r.ids.back() = static_cast<std::int32_t>(d.experts + 5);
          const auto ra = run_gpu_routed(fused, x, r);
          const auto rb = run_gpu_routed(plain, x, r);
          EXPECT_TRUE(std::equal(ra.begin(), ra.end(), rb.begin(), [](Bf16 u, Bf16 v) {
            return u.bits == v.bits;
          })) << "forward_routed differs from the grouping kernel's layer";
          if (hot < 0) {
            EXPECT_LE(test::relative_l2(ra, reference_forward_routed(w, x, dropped).out), kTolerance);
          }
        }
      }
    }
  }
}

// The fused path on one small layer (the sanitizers' case: compute-sanitizer runs it in
// tools/device_check.sh): a shared expert, a K split, T = 1, 5 and 16, one expert taking every token;
// the down GEMM on 64-row items in two 8-warp CTAs, then on 32-row items in one 16-warp CTA (the
// dispatcher's pick at T <= 2 on Hopper).
TEST(GpuMoeLayer, FusedRoutingOnATinyLayer) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSigmoidGroupTopK);
  d.shared_intermediate = 128;
  const LayerWeights w = random_layer_weights(d, 2300);
  for (const GemmChoice gemm2 :
       {GemmChoice{GemmKernel::kStream, 4, 1, 3, 8, 2}, GemmChoice{GemmKernel::kStream, 2, 1, 4, 16, 4}}) {
    SCOPED_TRACE(gemm2.to_string());
    MoeLayerOptions o;
    o.max_tokens = 16;
    o.gemm1 = GemmChoice{GemmKernel::kStream, 4, 1, 2, 15, 3};
    o.gemm2 = gemm2;
    const MoeLayer layer(w, o);
    for (const std::int64_t T : {1, 5, 16}) {
      ASSERT_NE(layer.plan_summary(T).find("(fused)"), std::string::npos) << layer.plan_summary(T);
      expect_matches_reference(w, layer, T, 2400 + static_cast<std::uint64_t>(T));
      expect_matches_reference(w, layer, T, 2500 + static_cast<std::uint64_t>(T), 3);
    }
  }
}

TEST(GpuMoeLayer, SharedExpertLargerThanRoutedIsCutIntoPieces) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSigmoidGroupTopK);
  d.shared_intermediate = 320;  // 2.5 pieces of 128
  const LayerWeights w = random_layer_weights(d, 3);
  const MoeLayer layer(w);
  expect_matches_reference(w, layer, 5, 300);
}

// finalize's batches of picks (kernels/finalize.cu): 10 picks (8 routed + 2 shared pieces) in one
// batch of 16 at T <= 512 and in two of 8 above; 19 picks (16 + 3) in three of 8 at any T. The
// first batch is read before the wait for the down GEMM, the others after it.
TEST(GpuMoeLayer, FinalizeTakesEveryNumberOfPickBatches) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSoftmaxTopK);
  d.experts = 32;
  d.top_k = 8;
  d.shared_intermediate = 256;  // 2 pieces of 128
  const LayerWeights w = random_layer_weights(d, 70);
  MoeLayerOptions o;
  o.max_tokens = 600;
  const MoeLayer layer(w, o);
  for (std::int64_t t : {1, 37, 600})
    expect_matches_reference(w, layer, t, 7000 + static_cast<std::uint64_t>(t));
  d.top_k = 16;
  d.shared_intermediate = 384;  // 3 pieces
  const LayerWeights w16 = random_layer_weights(d, 71);
  const MoeLayer layer16(w16, o);
  for (std::int64_t t : {3, 600})
    expect_matches_reference(w16, layer16, t, 7100 + static_cast<std::uint64_t>(t));
}

// gpt-oss's kind of layer: MXFP4, top-k then softmax over 2 picks, clamped SwiGLU, biases.
LayerDesc gpt_oss_style_desc(std::int64_t hidden, std::int64_t intermediate, std::int64_t experts) {
  LayerDesc d;
  d.hidden = hidden;
  d.intermediate = intermediate;
  d.experts = experts;
  d.top_k = 2;
  d.router = RouterKind::kTopKSoftmax;
  d.activation = Activation::kSwiGLUClamped;
  d.format = WeightFormat::kMxfp4;
  d.expert_bias = true;
  return d;
}

TEST(GpuMoeLayer, GptOssStyleMxfp4ClampedSwigluWithBiases) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerDesc d = gpt_oss_style_desc(256, 192, 8);
  const LayerWeights w = random_layer_weights(d, 4);
  const MoeLayer layer(w);
  for (std::int64_t t : {1, 7, 64})
    expect_matches_reference(w, layer, t, 400 + static_cast<std::uint64_t>(t));
}

TEST(GpuMoeLayer, SmallestLegalShapesAndKTail) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d;
  d.hidden = 16;  // K of the first GEMM: one NVFP4 block (a partial 64-chunk)
  d.intermediate = 16;
  d.experts = 2;
  d.top_k = 1;
  const LayerWeights w = random_layer_weights(d, 5);
  const MoeLayer layer(w);
  for (std::int64_t t : {1, 3, 40})
    expect_matches_reference(w, layer, t, 500 + static_cast<std::uint64_t>(t));
  LayerDesc d2 = d;
  d2.hidden = 80;  // 64 + 16: a full chunk and a tail
  d2.intermediate = 48;
  d2.experts = 3;
  d2.top_k = 2;
  const LayerWeights w2 = random_layer_weights(d2, 6);
  const MoeLayer layer2(w2);
  for (std::int64_t t : {1, 9}) expect_matches_reference(w2, layer2, t, 600 + static_cast<std::uint64_t>(t));
}

TEST(GpuMoeLayer, OneExpertGetsEveryTokenOthersNone) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSoftmaxTopK);
  d.experts = 64;
  d.top_k = 1;
  const LayerWeights w = random_layer_weights(d, 7);
  const MoeLayer layer(w);
  for (std::int64_t t : {1, 100, 300})
    expect_matches_reference(w, layer, t, 700 + static_cast<std::uint64_t>(t), 5);
  LayerDesc d4 = d;
  d4.top_k = 4;
  const LayerWeights w4 = random_layer_weights(d4, 8);
  const MoeLayer layer4(w4);
  expect_matches_reference(w4, layer4, 2, 800);  // 8 picks over 64 experts: most experts get nothing
  expect_matches_reference(w4, layer4, 50, 801, 63);
}

TEST(GpuMoeLayer, ZeroTokensWritesNothing) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerWeights w = random_layer_weights(small_desc(RouterKind::kSoftmaxTopK), 9);
  const MoeLayer layer(w);
  DeviceArray<Bf16> x(256), out(256);
  DeviceArray<float> logits(16);
  out.fill_bytes(0xab);
  layer.forward(nullptr, x.get(), logits.get(), out.get(), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const Bf16 v : out.download()) ASSERT_EQ(v.bits, 0xabab);
}

// Options that force both GEMMs onto one stream-kernel configuration.
MoeLayerOptions forced_stream(int m_tiles, int n_tiles, int stages, int warps, int k_split,
                              std::int64_t max_tokens) {
  MoeLayerOptions o;
  o.max_tokens = max_tokens;
  o.gemm1 = GemmChoice{GemmKernel::kStream, m_tiles, n_tiles, stages, warps, k_split};
  o.gemm2 = o.gemm1;
  return o;
}

TEST(GpuMoeLayer, EveryCompiledConfigIsCorrect) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSoftmaxTopK);
  d.hidden = 320;
  d.intermediate = 192;
  const LayerWeights w = random_layer_weights(d, 10);
  const int shapes[][2] = {{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}, {4, 2}, {1, 4}, {2, 4}};
  // (stages, warps, k_split): k_split 8 exceeds the 5 K chunks of the first GEMM (idle warps);
  // 16 warps (one CTA per SM) where the instance takes them (StreamGemmLayout::max_warps); 15 as
  // five 3-way groups (shares of 1, 2 and 2 of the first GEMM's 5 chunks).
  const int pipes[][3] = {{2, 1, 1}, {5, 8, 1},  {3, 8, 2},  {2, 4, 4},
                          {3, 8, 8}, {3, 16, 1}, {2, 16, 4}, {2, 15, 3}};
  for (const auto& s : shapes) {
    for (const auto& pp : pipes) {
      if (pp[1] > kernels::StreamGemmLayout::max_warps(s[1])) continue;
      const MoeLayerOptions o = forced_stream(s[0], s[1], pp[0], pp[1], pp[2], 128);
      SCOPED_TRACE("m_tiles " + std::to_string(s[0]) + " n_tiles " + std::to_string(s[1]) + " stages " +
                   std::to_string(pp[0]) + " warps " + std::to_string(pp[1]) + " k_split " +
                   std::to_string(pp[2]));
      const MoeLayer layer(w, o);
      expect_matches_reference(w, layer, 37, 1000 + static_cast<std::uint64_t>(s[0] * 10 + s[1]));
    }
  }
}

// The stream kernel with many items per warp: T=1000 makes thousands of items against at most
// 2112 warps on an H200, so each warp's ring runs on across many items (the other stream tests
// give most warps one item or none). Each check runs two forwards, then the next one another token
// count. k_split 2 over the first GEMM's 5 chunks gives the group's warps unequal shares; k_split 8
// leaves warps without K chunks (the down GEMM's K = 256 has 4; the tiny layer's 1).
void expect_stream_items_are_correct(const LayerDesc& d, std::uint64_t seed) {
  const LayerWeights w = random_layer_weights(d, seed);
  // (m_tiles, n_tiles, stages, warps, k_split)
  const int configs[][5] = {{1, 1, 2, 8, 1},  {4, 1, 5, 8, 1}, {2, 2, 2, 1, 1},  {4, 1, 3, 4, 4},
                            {1, 2, 3, 8, 2},  {2, 1, 2, 8, 8}, {4, 1, 4, 16, 1}, {2, 2, 3, 16, 2},
                            {4, 1, 4, 15, 3}, {1, 2, 2, 15, 3}};
  for (const auto& c : configs) {
    const MoeLayerOptions o = forced_stream(c[0], c[1], c[2], c[3], c[4], 1000);
    SCOPED_TRACE(gemm_choice_label(*o.gemm1));
    const MoeLayer layer(w, o);
    expect_matches_reference(w, layer, 1000, seed + 1);
    expect_matches_reference(w, layer, 3, seed + 2);
    expect_matches_reference(w, layer, 1000, seed + 3, 5);
  }
}

TEST(GpuMoeLayer, StreamKernelWithManyItemsPerWarp) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSoftmaxTopK);
  d.hidden = 320;  // 5 chunks
  d.intermediate = 256;
  expect_stream_items_are_correct(d, 12);
}

// The same on a layer small enough for compute-sanitizer (tools/device_check.sh): K = 64, one chunk.
TEST(GpuMoeLayer, StreamKernelWithManyItemsPerWarpOnATinyLayer) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSoftmaxTopK);
  d.hidden = 64;
  d.intermediate = 64;
  expect_stream_items_are_correct(d, 22);
}

// GEMM2's L2 prefetch (MoeLayerOptions::l2_prefetch; sm_90+ with PDL) reads routing's outputs
// before its PDL wait and only to name addresses: the results are bitwise those without it. Row
// blocks of 16, 32 and 64 rows (one warp prefetches a row group's blocks for all of them), 3- and
// 2-way K splits, and token counts that give warps no item, one, or many.
TEST(GpuMoeLayer, L2PrefetchChangesNoResult) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSigmoidGroupTopK);
  d.hidden = 320;
  d.intermediate = 256;
  d.shared_intermediate = 256;
  const LayerWeights w = random_layer_weights(d, 30);
  const int configs[][5] = {{4, 1, 4, 15, 3}, {1, 1, 3, 16, 2}, {2, 2, 2, 8, 1}};
  for (const auto& c : configs) {
    const MoeLayerOptions on = forced_stream(c[0], c[1], c[2], c[3], c[4], 1000);
    MoeLayerOptions off = on;
    off.l2_prefetch = false;
    SCOPED_TRACE(gemm_choice_label(*on.gemm1));
    const MoeLayer with(w, on), without(w, off);
    for (std::int64_t t : {1, 37, 1000}) {
      expect_matches_reference(w, with, t, 3000 + static_cast<std::uint64_t>(t));
      const auto x =
          test::random_bf16(static_cast<std::size_t>(t * d.hidden), 3100 + static_cast<std::uint64_t>(t));
      const auto logits = make_logits(d, t, 3200 + static_cast<std::uint64_t>(t));
      const GpuRun a = run_gpu(with, x, logits, t), b = run_gpu(without, x, logits, t);
      EXPECT_TRUE(std::equal(a.out.begin(), a.out.end(), b.out.begin())) << "T=" << t << ": outputs differ";
    }
  }
}

TEST(GpuMoeLayer, EveryCompiledTileConfigIsCorrect) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSoftmaxTopK);
  d.hidden = 400;  // 6 chunks of 64 and a 16-wide tail
  d.intermediate = 192;
  d.experts = 4;
  d.top_k = 2;
  const LayerWeights w = random_layer_weights(d, 14);
  // (m_tiles, n_tiles, warps, stages): 8 warps x 2 tiles = 256 rows (rows past 2I = 384 and
  // past H = 400 are padding, never read nor stored).
  const int configs[][4] = {{2, 8, 8, 4}, {2, 4, 8, 3}, {2, 8, 8, 2}, {2, 4, 8, 6}};
  for (const auto& c : configs) {
    MoeLayerOptions o;
    o.max_tokens = 512;
    o.gemm1 = GemmChoice{GemmKernel::kTile, c[0], c[1], c[3], c[2], 1};
    o.gemm2 = o.gemm1;
    SCOPED_TRACE(o.gemm1->to_string());
    const MoeLayer layer(w, o);
    for (std::int64_t t : {1, 70, 300})
      expect_matches_reference(w, layer, t, 1400 + static_cast<std::uint64_t>(t));
  }
}

TEST(GpuMoeLayer, EveryWgmmaConfigIsCorrect) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSigmoidGroupTopK);
  d.hidden = 400;        // 6 chunks of 64 and a 16-wide tail
  d.intermediate = 208;  // 3 chunks plus 16: h is read k-permuted with a zero tail
  d.experts = 4;
  d.top_k = 2;
  d.n_group = 2;
  d.topk_group = 1;
  d.shared_intermediate = 208;
  const LayerWeights w = random_layer_weights(d, 16);
  const GemmChoice stream{GemmKernel::kStream, 4, 1, 3, 8, 1};
  // (n_tiles, stages, consumer warps), and mixed with the stream kernel: GEMM1 then writes h
  // k-permuted for the wgmma GEMM2, or GEMM2 reads it in natural order. 400 and 2 x 208 rows are
  // not multiples of the 256-row item: the last item is partial.
  const int configs[][3] = {{16, 4, 8}, {8, 3, 8}, {16, 5, 8}, {4, 6, 8}, {4, 5, 16}, {8, 3, 16}};
  for (const auto& c : configs) {
    const GemmChoice wg{GemmKernel::kWgmma, 2, c[0], c[1], c[2], 1};
    for (int mix = 0; mix < 3; ++mix) {
      MoeLayerOptions o;
      o.max_tokens = 512;
      o.gemm1 = mix == 2 ? stream : wg;
      o.gemm2 = mix == 1 ? stream : wg;
      SCOPED_TRACE(o.gemm1->to_string() + " / " + o.gemm2->to_string());
      on_forced_layer(w, o, [&](const MoeLayer& layer) {
        for (std::int64_t t : {1, 70, 300})
          expect_matches_reference(w, layer, t, 1600 + static_cast<std::uint64_t>(t));
      });
      if (IsSkipped()) return;
    }
  }
}

// The wgmma consumers run two chunks per loop trip, one A register set each, and leave the loop on
// either: K of 1 to 7 chunks (both parities, a single chunk, several trips), in both GEMMs, at
// every token-block width.
TEST(GpuMoeLayer, WgmmaEveryChunkCountIsCorrect) {
  FP4MOE_SKIP_WITHOUT_GPU();
  // (hidden, intermediate): K chunks of 64 for gate/up and down.
  const int shapes[][2] = {{64, 128}, {128, 192}, {192, 64}, {256, 320}, {320, 384}, {448, 256}};
  for (const auto& sh : shapes) {
    LayerDesc d = small_desc(RouterKind::kSoftmaxTopK);
    d.hidden = sh[0];
    d.intermediate = sh[1];
    d.experts = 4;
    d.top_k = 2;
    const LayerWeights w = random_layer_weights(d, 19);
    for (const int nt : {16, 8, 4}) {
      MoeLayerOptions o;
      o.max_tokens = 256;
      o.gemm1 = o.gemm2 = GemmChoice{GemmKernel::kWgmma, 2, nt, 4, 8, 1};
      SCOPED_TRACE(std::to_string(sh[0]) + " x " + std::to_string(sh[1]) + ", " + o.gemm1->to_string());
      on_forced_layer(w, o, [&](const MoeLayer& layer) {
        for (std::int64_t t : {1, 150})
          expect_matches_reference(w, layer, t, 1900 + static_cast<std::uint64_t>(t));
      });
      if (IsSkipped()) return;
    }
  }
}

// The wgmma epilogue with biases and gpt-oss's clamped SwiGLU (MXFP4), on items whose rows all
// lie in the matrix (its fast path) and on the partial last row block (416 and 2 x 224 rows).
TEST(GpuMoeLayer, WgmmaEpilogueWithBiasesAndClampedSwiglu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerDesc d = gpt_oss_style_desc(416, 224, 4);  // MXFP4: multiples of 32; 6.5 chunks of 64
  const LayerWeights w = random_layer_weights(d, 17);
  for (const int nt : {16, 8, 4}) {
    MoeLayerOptions o;
    o.max_tokens = 512;
    o.gemm1 = o.gemm2 = GemmChoice{GemmKernel::kWgmma, 2, nt, 4, 8, 1};
    SCOPED_TRACE(o.gemm1->to_string());
    on_forced_layer(w, o, [&](const MoeLayer& layer) {
      for (std::int64_t t : {5, 300})
        expect_matches_reference(w, layer, t, 1700 + static_cast<std::uint64_t>(t));
    });
    if (IsSkipped()) return;
  }
}

// A 12-expert top-1 layer whose routing the caller gives as tokens per expert (the wgmma tail and
// small-expert tests): H = 400 (6 chunks of 64 and a 16-wide tail), I = 208.
LayerDesc twelve_expert_desc() {
  LayerDesc d = small_desc(RouterKind::kSoftmaxTopK);
  d.hidden = 400;
  d.intermediate = 208;
  d.experts = 12;
  d.top_k = 1;
  return d;
}

// Top-1 routing with counts[e] tokens for expert e, the experts' tokens interleaved (a fixed
// shuffle) so that slots are not in token order.
Routing routing_from_counts(const std::vector<int>& counts) {
  Routing r;
  for (int c : counts) r.tokens += c;
  r.top_k = 1;
  for (std::size_t e = 0; e < counts.size(); ++e) {
    for (int i = 0; i < counts[e]; ++i) r.ids.push_back(static_cast<std::int32_t>(e));
  }
  for (std::size_t i = 0; i < r.ids.size(); ++i) std::swap(r.ids[i], r.ids[(i * 7919) % r.ids.size()]);
  r.weights.assign(r.ids.size(), 1.0f);
  return r;
}

// The wgmma down GEMM stores 16 bytes at a time (its staged epilogue): launch_wgmma_gemm refuses
// output rows that are not 16-byte aligned, by their stride or their start, before any CUDA call
// (so this runs without a GPU too). MoeLayer's workspace always passes.
TEST(GpuMoeLayer, WgmmaDownGemmRefusesUnalignedOutput) {
  alignas(16) static std::uint16_t out[64];
  kernels::StreamGemmArgs a;
  a.out = out;
  const kernels::WgmmaGemmConfig c{16, 4, 8};
  a.out_ld = 6148;  // rows 8 bytes apart from 16-byte alignment
  EXPECT_EQ(kernels::launch_wgmma_gemm(a, c, kernels::StreamEpilogue::kStoreBf16, 1, false, nullptr),
            cudaErrorInvalidValue);
  a.out_ld = 6144;
  a.out = out + 1;  // a start 2 bytes past it
  EXPECT_EQ(kernels::launch_wgmma_gemm(a, c, kernels::StreamEpilogue::kStoreBf16, 1, false, nullptr),
            cudaErrorInvalidValue);
}

// Each expert's last, short token block runs on narrower wgmma instances (tail launches): counts
// chosen so that last blocks fall on every boundary of the 128-token and 64-token main blocks.
TEST(GpuMoeLayer, WgmmaTailBlocksOfEverySizeAreCorrect) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerDesc d = twelve_expert_desc();
  const LayerWeights w = random_layer_weights(d, 18);
  // Tokens per expert: r = count % 128 = 0, 1, 32, 33, 64, 65 and 127 (and one expert with none);
  // modulo 64: 0, 1, 32, 33, 0, 1, 63.
  const Routing r = routing_from_counts({128, 1, 32, 33, 64, 65, 127, 0, 129, 160, 161, 192});
  const std::int64_t T = r.tokens;
  const auto x = test::random_bf16(static_cast<std::size_t>(T * d.hidden), 1800);
  const ReferenceResult ref = reference_forward_routed(w, x, r);
  for (const int nt : {16, 8}) {
    MoeLayerOptions o;
    o.max_tokens = T;
    o.gemm1 = o.gemm2 = GemmChoice{GemmKernel::kWgmma, 2, nt, 4, 8, 1};
    SCOPED_TRACE(o.gemm1->to_string());
    on_forced_layer(w, o, [&](const MoeLayer& layer) {
      const std::string plan = layer.plan_summary(T);
      EXPECT_NE(plan.find("last 1-32 tokens: wgmma n4"), std::string::npos) << plan;
      expect_routed_matches(layer, x, r, ref.out);
    });
    if (IsSkipped()) return;
  }
}

// Experts of at most 8 (or 16) tokens run whole on the stream kernel after each wgmma GEMM's
// launches (the small-expert launch): counts on both sides of 8 and 16, with and without main
// blocks beside them, every expert small, and none; on both GEMMs, on the first only (a stream
// second GEMM), and off; with one token tile per item (8) and two (16, whose experts of at most 8
// tokens skip the second).
TEST(GpuMoeLayer, WgmmaSmallExpertLaunchIsCorrect) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerDesc d = twelve_expert_desc();
  const LayerWeights w = random_layer_weights(d, 19);
  const std::vector<std::vector<int>> cases = {
      {1, 8, 9, 0, 7, 33, 40, 65, 136, 2, 8, 129},   // small and large experts side by side
      {1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 8, 3},          // every expert small: the wgmma launches have no item
      {9, 10, 40, 0, 65, 0, 32, 33, 64, 9, 12, 16},  // none small: the small-expert launch has no item
      {16, 15, 9, 1, 12, 17, 0, 8, 10, 14, 13, 11},  // 1-17 tokens: one or two tiles under 16
  };
  const GemmChoice stream{GemmKernel::kStream, 4, 1, 3, 8, 1};
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const Routing r = routing_from_counts(cases[ci]);
    const std::int64_t T = r.tokens;
    const auto x = test::random_bf16(static_cast<std::size_t>(T * d.hidden), 1900 + ci);
    const ReferenceResult ref = reference_forward_routed(w, x, r);
    for (const int nt : {16, 4}) {
      // mode % 4: 0 both GEMMs wgmma; 1 GEMM2 stream; 2 launch off; 3 fewer small experts than it
      // needs (it runs empty, the wgmma launches take them). Modes 4-7: the same with bound 16.
      for (int mode = 0; mode < 8; ++mode) {
        const int bound = mode < 4 ? 8 : 16;
        MoeLayerOptions o;
        o.small_expert_tokens = bound;
        o.max_tokens = T;
        o.gemm1 = o.gemm2 = GemmChoice{GemmKernel::kWgmma, 2, nt, 4, 8, 1};
        if (mode % 4 == 1) o.gemm2 = stream;
        o.small_expert_launch = mode % 4 != 2;
        o.small_expert_min = mode % 4 == 3 ? 13 : 1;  // the layer's estimate is in the thousands here
        SCOPED_TRACE("case " + std::to_string(ci) + ", " + o.gemm1->to_string() + " / " +
                     o.gemm2->to_string() + ", mode " + std::to_string(mode));
        on_forced_layer(w, o, [&](const MoeLayer& layer) {
          const std::string plan = layer.plan_summary(T);
          const std::string line = "experts of 1-" + std::to_string(bound) + " tokens";
          const auto small_launches = [&] {
            std::size_t n = 0;
            for (std::size_t at = plan.find(line); at != std::string::npos; at = plan.find(line, at + 1)) ++n;
            return n;
          }();
          EXPECT_EQ(small_launches, mode % 4 == 0 || mode % 4 == 3 ? 2u : (mode % 4 == 1 ? 1u : 0u)) << plan;
          expect_routed_matches(layer, x, r, ref.out);
        });
        if (IsSkipped()) return;
      }
    }
  }
}

// Without a K split the small-expert launch's warps claim their items from a counter that each
// launch leaves zero for the next (StreamGemmArgs::small_claims): enough small experts for a 1-way
// split on both GEMMs, beside wgmma launches of 32-token blocks and of 128-token blocks with both
// tail launches, and two forwards of different inputs (a counter left nonzero would leave the
// second forward's small experts unwritten), each against the reference.
TEST(GpuMoeLayer, WgmmaSmallExpertLaunchClaimsItsItems) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = twelve_expert_desc();
  d.hidden = 512;
  d.intermediate = 512;
  d.experts = 256;
  const LayerWeights w = random_layer_weights(d, 23);
  std::vector<int> counts(static_cast<std::size_t>(d.experts));
  for (int e = 0; e < d.experts; ++e) {
    int& c = counts[static_cast<std::size_t>(e)];
    c = e % 29 == 0 ? 40 + e % 3 : (e % 31 == 5 ? 20 + e % 11 : e * 37 % 17);
  }
  counts[7] = 300;  // two 128-token blocks and a 44-token tail
  const Routing r = routing_from_counts(counts);
  const std::int64_t T = r.tokens;
  for (const int nt : {4, 16}) {
    MoeLayerOptions o;
    o.max_tokens = T;
    o.gemm1 = o.gemm2 = GemmChoice{GemmKernel::kWgmma, 2, nt, 4, 8, 1};
    o.small_expert_min = 1;
    SCOPED_TRACE(o.gemm1->to_string());
    on_forced_layer(w, o, [&](const MoeLayer& layer) {
      for (std::uint64_t seed : {2300u, 2301u}) {
        SCOPED_TRACE("input seed " + std::to_string(seed));
        const auto x = test::random_bf16(static_cast<std::size_t>(T * d.hidden), seed);
        const ReferenceResult ref = reference_forward_routed(w, x, r);
        expect_routed_matches(layer, x, r, ref.out);
      }
    });
    if (IsSkipped()) return;
  }
}

TEST(GpuMoeLayer, LargeTokenCountsUseTheTiledKernel) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSigmoidGroupTopK);
  d.hidden = 512;
  d.intermediate = 256;
  d.shared_intermediate = 256;
  const LayerWeights w = random_layer_weights(d, 15);
  MoeLayerOptions o;
  o.max_tokens = 4096;
  const MoeLayer layer(w, o);
  const std::string plan = layer.plan_summary(4096);
  EXPECT_TRUE(plan.find("tile") != std::string::npos || plan.find("wgmma") != std::string::npos) << plan;
  expect_matches_reference(w, layer, 4096, 1500);
}

TEST(GpuMoeLayer, PrefillAt16384Tokens) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d = small_desc(RouterKind::kSigmoidGroupTopK);
  d.hidden = 512;
  d.intermediate = 256;
  d.experts = 32;
  d.n_group = 4;
  d.topk_group = 2;
  d.shared_intermediate = 256;
  const LayerWeights w = random_layer_weights(d, 17);
  MoeLayerOptions o;
  o.max_tokens = 16384;
  const MoeLayer layer(w, o);
  expect_matches_reference(w, layer, 16384, 1700);
}

TEST(GpuMoeLayer, RoutedByCallerDropsInvalidIds) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerDesc d = small_desc(RouterKind::kSoftmaxTopK);
  const LayerWeights w = random_layer_weights(d, 11);
  MoeLayerOptions o;
  o.max_tokens = 1500;
  const MoeLayer layer(w, o);
  // T=6: the one-CTA grouping; 300 and 1500: the scatter kernel (1500 spans two of its CTAs).
  for (const std::int64_t T : {6, 300, 1500}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const auto x = test::random_bf16(static_cast<std::size_t>(T * d.hidden), 1100);
    Routing r = route(d, make_logits(d, T, 1101), T);
    // The reference with the bad picks removed (weight 0 gives the same sum as dropping it).
    Routing dropped = r;
    for (const std::size_t i : {std::size_t{5}, std::size_t{9}, r.ids.size() - 1, r.ids.size() / 2}) {
      r.ids[i] = i % 2 == 0 ? 99 : -1;
      dropped.weights[i] = 0.0f;
    }
    const ReferenceResult ref = reference_forward_routed(w, x, dropped);
    EXPECT_LE(test::relative_l2(run_gpu_routed(layer, x, r), ref.out), kTolerance);
  }
}

// Captured into a graph and replayed, on the layer's own choices and with the wgmma kernel forced
// (its forward has one more kernel, the k-permuted copy of x). Each graph is replayed twice with
// new inputs in the same buffers, after an eager forward of other inputs on the legacy stream, so
// that a replay that read a previous forward's intermediate results shows in the output.
TEST(GpuMoeLayer, ForwardCapturesIntoACudaGraph) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerDesc d = small_desc(RouterKind::kSigmoidGroupTopK);
  const LayerWeights w = random_layer_weights(d, 12);
  MoeLayerOptions forced;
  forced.max_tokens = 512;
  forced.gemm1 = forced.gemm2 = GemmChoice{GemmKernel::kWgmma, 2, 8, 4, 8, 1};
  for (const MoeLayerOptions& o : {MoeLayerOptions{}, forced}) {
    SCOPED_TRACE(o.gemm1 ? o.gemm1->to_string() : std::string("the layer's choice"));
    on_forced_layer(w, o, [&](const MoeLayer& layer) {
      for (std::int64_t T : {4, 300}) {
        SCOPED_TRACE("T=" + std::to_string(T));
        const std::size_t n = static_cast<std::size_t>(T * d.hidden);
        DeviceArray<Bf16> dx(n), dout(n);
        DeviceArray<float> dl(static_cast<std::size_t>(T * d.experts));
        cudaStream_t s, other;
        FP4MOE_TEST_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        FP4MOE_TEST_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
        cudaGraph_t graph;
        FP4MOE_TEST_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        layer.forward(s, dx.get(), dl.get(), dout.get(), T);
        FP4MOE_TEST_CUDA(cudaStreamEndCapture(s, &graph));
        cudaGraphExec_t exec;
        FP4MOE_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        for (std::uint64_t seed : {1200, 1210}) {
          // An eager forward of other inputs first (its intermediate results are in the workspace).
          run_gpu(layer, test::random_bf16(n, seed + 5), make_logits(d, T, seed + 6), T);
          const auto x = test::random_bf16(n, seed);
          const auto logits = make_logits(d, T, seed + 1);
          dx.upload(x);
          dl.upload(logits);
          dout.fill_bytes(0xff);
          FP4MOE_TEST_CUDA(cudaDeviceSynchronize());  // (the fill runs on the legacy stream)
          FP4MOE_TEST_CUDA(cudaGraphLaunch(exec, s));
          FP4MOE_TEST_CUDA(cudaStreamSynchronize(s));
          const ReferenceResult ref = reference_forward(w, x, logits, T);
          EXPECT_LE(test::relative_l2(dout.download(), ref.out), kTolerance) << "seed " << seed;
        }
        // Eager forwards on a stream the layer has not seen, back to back with the graph's stream.
        const auto x = test::random_bf16(n, 1220);
        const auto logits = make_logits(d, T, 1221);
        dx.upload(x);
        dl.upload(logits);
        dout.fill_bytes(0xff);
        FP4MOE_TEST_CUDA(cudaDeviceSynchronize());
        layer.forward(other, dx.get(), dl.get(), dout.get(), T);
        FP4MOE_TEST_CUDA(cudaStreamSynchronize(other));
        EXPECT_LE(test::relative_l2(dout.download(), reference_forward(w, x, logits, T).out), kTolerance);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(other);
        cudaStreamDestroy(s);
      }
    });
    if (IsSkipped()) return;
  }
}

TEST(GpuMoeLayer, ForwardUntilStopsAfterTheStage) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerDesc d = small_desc(RouterKind::kSigmoidGroupTopK);
  const LayerWeights w = random_layer_weights(d, 13);
  const MoeLayer layer(w);
  for (std::int64_t T : {1, 300}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const auto x = test::random_bf16(static_cast<std::size_t>(T * d.hidden), 1300);
    const auto logits = make_logits(d, T, 1301);
    DeviceArray<Bf16> dx(x.size()), dout(x.size());
    DeviceArray<float> dl(logits.size());
    dx.upload(x);
    dl.upload(logits);
    const GpuRun full = run_gpu(layer, x, logits, T);
    for (const ForwardStage stage : kForwardStages) {
      SCOPED_TRACE(forward_stage_name(stage));
      dout.fill_bytes(0xff);
      layer.forward_until(nullptr, dx.get(), dl.get(), dout.get(), T, stage);
      FP4MOE_TEST_CUDA(cudaDeviceSynchronize());
      const auto out = dout.download();
      if (stage == ForwardStage::kFinalize) {
        EXPECT_TRUE(std::equal(out.begin(), out.end(), full.out.begin())) << "differs from forward()";
      } else {
        EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](Bf16 v) { return v.bits == 0xffff; }))
            << "out was written before finalize";
      }
    }
  }
}

TEST(GpuMoeLayer, RejectsTooManyTokens) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerWeights w = random_layer_weights(small_desc(RouterKind::kSoftmaxTopK), 13);
  MoeLayerOptions o;
  o.max_tokens = 8;
  const MoeLayer layer(w, o);
  DeviceArray<Bf16> x(9 * 256), out(9 * 256);
  DeviceArray<float> logits(9 * 16);
  try {
    layer.forward(nullptr, x.get(), logits.get(), out.get(), 9);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_tokens = 8"), std::string::npos) << e.what();
  }
}

// The small-expert launch's options out of range: a small_expert_min below -1, and a
// small_expert_tokens bound with no kernels compiled for it. The message names the value and what
// is accepted.
TEST(GpuMoeLayer, RejectsBadSmallExpertOptions) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerWeights w = random_layer_weights(small_desc(RouterKind::kSoftmaxTopK), 13);
  MoeLayerOptions min_bad;
  min_bad.small_expert_min = -2;
  MoeLayerOptions tokens_bad;
  tokens_bad.small_expert_tokens = 12;
  const std::pair<MoeLayerOptions, std::vector<std::string>> cases[] = {
      {min_bad, {"small_expert_min = -2"}},
      {tokens_bad, {"small_expert_tokens = 12", "8, 16"}},
  };
  for (const auto& [o, needles] : cases) {
    try {
      const MoeLayer layer(w, o);
      ADD_FAILURE() << "no error for " << needles.front();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
      for (const std::string& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  }
}

// Random layers against the reference: shapes (every multiple of the format's block up to 1024),
// expert counts, top-k, the three routers, NVFP4 and MXFP4 (with gpt-oss's clamped SwiGLU and
// biases), shared experts, token counts from 0 to 600, one expert hot or not, the forward's
// options, and each GEMM left to the dispatcher or forced onto a kernel family with random
// parameters (configurations the planner refuses on this GPU are skipped and counted). The seed
// is FP4MOE_TEST_SEED when set, else fresh each run; it is printed, so a failure can be replayed.
TEST(GpuMoeLayer, RandomLayersMatchTheReference) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const char* env = std::getenv("FP4MOE_TEST_SEED");
  const std::uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::cout << "RandomLayersMatchTheReference: FP4MOE_TEST_SEED=" << seed << "\n";
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto pick = [&](std::int64_t lo, std::int64_t hi) {  // uniform in [lo, hi]
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  // A random configuration of one family (the planner judges it when the layer is built).
  const auto random_choice = [&]() -> std::optional<GemmChoice> {
    switch (pick(0, 3)) {
      case 1: {
        const auto& shape = kernels::kStreamTileShapes[pick(0, std::size(kernels::kStreamTileShapes) - 1)];
        const int max_warps = kernels::StreamGemmLayout::max_warps(shape[1]);
        const int warps = std::min<int>(max_warps, static_cast<int>(4 << pick(0, 2)));
        const int splits[] = {1, 2, 4};
        const int k_split = std::min(warps, splits[pick(0, 2)]);
        const int stages = static_cast<int>(pick(2, 4));
        return GemmChoice{GemmKernel::kStream, shape[0], shape[1], stages, warps, k_split};
      }
      case 2:
        return GemmChoice{GemmKernel::kTile, 2, chance(0.5) ? 4 : 8, static_cast<int>(pick(2, 4)), 8, 1};
      case 3: {
        const int n_tiles[] = {4, 8, 16};
        return GemmChoice{GemmKernel::kWgmma, 2, n_tiles[pick(0, 2)], static_cast<int>(pick(3, 8)), 8, 1};
      }
      default:
        return std::nullopt;  // the dispatcher's (or the tune cache's) pick
    }
  };
  const std::int64_t token_menu[] = {0, 1, 2, 3, 4, 7, 8, 9, 16, 17, 31, 64, 65, 100, 128, 257, 513};
  int built = 0, skipped = 0;
  for (int layer_i = 0; layer_i < 30; ++layer_i) {
    LayerDesc d;
    for (int draw = 0;; ++draw) {  // a consistent layer comes within a few draws
      ASSERT_LT(draw, 1000) << "no valid layer drawn";
      d = LayerDesc{};
      d.format = chance(0.3) ? WeightFormat::kMxfp4 : WeightFormat::kNvfp4;
      const std::int64_t block = d.format == WeightFormat::kMxfp4 ? 32 : 16;
      d.hidden = block * pick(1, 1024 / block);
      d.intermediate = block * pick(1, 768 / block);
      d.experts = pick(1, 80);
      d.top_k = pick(1, std::min<std::int64_t>(8, d.experts));
      const RouterKind routers[] = {RouterKind::kSoftmaxTopK, RouterKind::kSigmoidGroupTopK,
                                    RouterKind::kTopKSoftmax};
      d.router = routers[pick(0, 2)];
      d.renormalize = chance(0.8);
      if (d.router == RouterKind::kSigmoidGroupTopK) {
        d.n_group = pick(1, 8);
        d.topk_group = pick(1, d.n_group);
        d.routed_scaling_factor = chance(0.5) ? 2.5f : 1.0f;
      }
      if (d.format == WeightFormat::kMxfp4 && chance(0.5)) {
        d.activation = Activation::kSwiGLUClamped;
        d.expert_bias = true;
      }
      if (chance(0.4)) d.shared_intermediate = block * pick(1, 1024 / block);
      try {
        d.validate();
        break;
      } catch (const Error&) {
        // an inconsistent draw (e.g. n_group not dividing the experts): draw again
      }
    }
    const LayerWeights w = random_layer_weights(d, seed + static_cast<std::uint64_t>(layer_i));
    const std::int64_t tokens[] = {
        chance(0.5) ? token_menu[pick(0, std::size(token_menu) - 1)] : pick(1, 600),
        token_menu[pick(0, std::size(token_menu) - 1)]};
    MoeLayerOptions o;
    o.max_tokens = std::max<std::int64_t>(1, std::max(tokens[0], tokens[1]));
    o.programmatic_launch = chance(0.8);
    o.fused_routing = chance(0.8);
    o.small_expert_launch = chance(0.8);
    o.l2_prefetch = chance(0.8);
    o.l2_evict_first = chance(0.8);
    o.shared_prefetch = chance(0.8);
    o.use_tune_cache = false;
    o.gemm1 = random_choice();
    o.gemm2 = random_choice();
    const int hot = chance(0.2) ? static_cast<int>(pick(0, d.experts - 1)) : -1;
    SCOPED_TRACE("seed " + std::to_string(seed) + ", layer " + std::to_string(layer_i) + ": " +
                 d.to_string() + ", gemm1 " + (o.gemm1 ? o.gemm1->to_string() : std::string("auto")) +
                 ", gemm2 " + (o.gemm2 ? o.gemm2->to_string() : std::string("auto")) + ", hot " +
                 std::to_string(hot));
    std::optional<MoeLayer> layer;
    try {
      layer.emplace(w, o);
    } catch (const Error& e) {
      // Only a forced configuration the planner refuses on this GPU (or that the build lacks) is
      // skipped; any other failure to build the layer fails the test.
      const std::string what = e.what();
      ASSERT_TRUE((o.gemm1 || o.gemm2) && e.code() != Errc::kInternal && e.code() != Errc::kCuda &&
                  what.find("rejected by the planner") != std::string::npos)
          << what;
      std::cout << "RandomLayersMatchTheReference: layer " << layer_i << " skipped: " << what << "\n";
      ++skipped;
      continue;
    }
    ++built;
    for (const std::int64_t t : tokens) {
      expect_matches_reference(w, *layer, t, seed * 31 + static_cast<std::uint64_t>(layer_i * 7 + t), hot);
      if (HasFatalFailure()) return;
    }
  }
  std::cout << "RandomLayersMatchTheReference: " << built << " layers run, " << skipped
            << " with a forced configuration the planner refused\n";
  EXPECT_GE(built, 15);
}

// Real model shapes of FORMATS.md at small T (full-size weights: a few GB each), with the
// dispatcher's picks.
class GpuRealShapes : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuRealShapes, MatchesReference) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerDesc d = layer_preset(GetParam());
  const LayerWeights w = random_layer_weights(d, 20);
  const MoeLayer layer(w);
  for (std::int64_t t : {1, 2, 3})
    expect_matches_reference(w, layer, t, 2000 + static_cast<std::uint64_t>(t));
}

INSTANTIATE_TEST_SUITE_P(Models, GpuRealShapes,
                         ::testing::Values("glm5", "glm45", "deepseek-v3", "kimi-k2", "qwen3-235b",
                                           "qwen3-30b", "gpt-oss-120b", "mixtral-8x7b"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           std::string s = p.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace fp4moe
