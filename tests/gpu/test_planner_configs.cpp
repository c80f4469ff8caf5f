// The planner's promise, on the GPU at hand: every configuration it accepts for this GPU (every
// family, both expert GEMMs) launches and computes the layer correctly on a small problem.
#include <gtest/gtest.h>

#include "fp4moe/arch.hpp"
#include "fp4moe/moe_layer.hpp"
#include "fp4moe/planner.hpp"
#include "fp4moe/reference.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4moe {
namespace {

using test::DeviceArray;

TEST(GpuPlanner, EveryConfigThePlannerAcceptsLaunchesAndIsCorrect) {
  FP4MOE_SKIP_WITHOUT_GPU();
  LayerDesc d;
  d.hidden = 320;  // 5 chunks of 64: every K split up to 4 has work
  d.intermediate = 192;
  d.experts = 8;
  d.top_k = 2;
  const LayerWeights w = random_layer_weights(d, 40);
  const std::int64_t T = 37;
  const auto x = test::random_bf16(static_cast<std::size_t>(T * d.hidden), 41);
  const auto logits = test::random_f32(static_cast<std::size_t>(T * d.experts), 42, 2.0f);
  const ReferenceResult ref = reference_forward(w, x, logits, T);
  DeviceArray<Bf16> dx(x.size()), dout(x.size());
  DeviceArray<float> dl(logits.size());
  dx.upload(x);
  dl.upload(logits);

  const ArchInfo arch = arch_for_this_build(arch_from_gpu(list_gpus().at(0)));
  int checked = 0;
  for (const GemmKind kind : {GemmKind::kGateUp, GemmKind::kDown}) {
    const GemmProblem problem = make_gemm_problem(d, T, kind);
    for (const auto& family : kernel_family_names()) {
      const Plan plan = plan_kernels(family, problem, arch);
      for (const CandidateVerdict& c : plan.candidates) {
        if (!c.feasible) continue;
        SCOPED_TRACE(family + " " + c.label + " for " + std::string(gemm_kind_name(kind)));
        MoeLayerOptions o;
        o.max_tokens = 64;
        o.use_tune_cache = false;
        (kind == GemmKind::kGateUp ? o.gemm1 : o.gemm2) = choice_of_candidate(c);
        const MoeLayer layer(w, o);
        dout.fill_bytes(0xff);  // bf16 NaN: an element not written fails the comparison
        layer.forward(nullptr, dx.get(), dl.get(), dout.get(), T);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const double err = test::relative_l2(dout.download(), ref.out);
        ASSERT_LE(err, 1e-2) << "relative L2 error " << err;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100) << "the planner accepted only " << checked << " configurations";
}

}  // namespace
}  // namespace fp4moe
