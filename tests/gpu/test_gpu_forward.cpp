// gpu_forward (host in, host out), as `fp4moe run` uses it, against the CPU reference.
#include <gtest/gtest.h>

#include "fp4moe/moe_layer.hpp"
#include "fp4moe/reference.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4moe {
namespace {

TEST(GpuForward, HostToHostMatchesReference) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d;
  d.hidden = 128;
  d.intermediate = 64;
  d.experts = 8;
  d.top_k = 2;
  const LayerWeights w = random_layer_weights(d, 31);
  const std::int64_t T = 5;
  const auto x = test::random_bf16(static_cast<std::size_t>(T * d.hidden), 32);
  const auto logits = test::random_f32(static_cast<std::size_t>(T * d.experts), 33, 2.0f);
  const ReferenceResult gpu = gpu_forward(w, x, logits, T);
  const ReferenceResult ref = reference_forward(w, x, logits, T);
  EXPECT_EQ(gpu.routing.ids, ref.routing.ids);
  EXPECT_LE(test::relative_l2(gpu.out, ref.out), 1e-2);
  EXPECT_TRUE(gpu_forward(w, {}, {}, 0).out.empty());
}

}  // namespace
}  // namespace fp4moe
