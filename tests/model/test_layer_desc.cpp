// LayerDesc: every validation rule (with its message), printing, names and presets.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <limits>

#include "fp4moe/error.hpp"
#include "fp4moe/layer.hpp"

namespace fp4moe {
namespace {

using ::testing::HasSubstr;

LayerDesc small_sigmoid() {
  LayerDesc d;
  d.hidden = 64;
  d.intermediate = 32;
  d.experts = 8;
  d.top_k = 2;
  d.router = RouterKind::kSigmoidGroupTopK;
  d.n_group = 4;
  d.topk_group = 2;
  d.routed_scaling_factor = 2.5f;
  d.shared_intermediate = 32;
  return d;
}

std::string validate_error(const LayerDesc& d) {
  try {
    d.validate();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    return e.what();
  }
  return "(no error)";
}

struct Case {
  const char* name;
  std::function<void(LayerDesc&)> change;
  const char* message;
};

TEST(LayerDesc, EveryRuleRejectsWithItsFieldValueAndExpectation) {
  ASSERT_NO_THROW(small_sigmoid().validate());
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::vector<Case> cases = {
      {"hidden zero", [](LayerDesc& d) { d.hidden = 0; }, "hidden=0 must be positive"},
      {"hidden negative", [](LayerDesc& d) { d.hidden = -16; }, "hidden=-16 must be positive"},
      {"hidden block", [](LayerDesc& d) { d.hidden = 6143; },
       "hidden=6143 is not a multiple of 16 (the NVFP4 block size)"},
      {"hidden mxfp4 block",
       [](LayerDesc& d) {
         d.format = WeightFormat::kMxfp4;
         d.hidden = 48;
       },
       "hidden=48 is not a multiple of 32 (the MXFP4 block size)"},
      {"hidden huge", [](LayerDesc& d) { d.hidden = std::int64_t{1} << 40; },
       "hidden=1099511627776 is too large"},
      {"intermediate zero", [](LayerDesc& d) { d.intermediate = 0; }, "intermediate=0 must be positive"},
      {"intermediate block", [](LayerDesc& d) { d.intermediate = 40; },
       "intermediate=40 is not a multiple of 16"},
      {"experts zero", [](LayerDesc& d) { d.experts = 0; }, "experts=0 must be between 1 and 2147483647"},
      {"top_k zero", [](LayerDesc& d) { d.top_k = 0; }, "top_k=0 must be between 1 and experts=8"},
      {"top_k above experts", [](LayerDesc& d) { d.top_k = 9; }, "top_k=9 must be between 1 and experts=8"},
      {"n_group zero", [](LayerDesc& d) { d.n_group = 0; }, "n_group=0 must be at least 1"},
      {"n_group divides", [](LayerDesc& d) { d.n_group = 3; }, "n_group=3 does not divide experts=8"},
      {"topk_group zero", [](LayerDesc& d) { d.topk_group = 0; },
       "topk_group=0 must be between 1 and n_group=4"},
      {"topk_group above", [](LayerDesc& d) { d.topk_group = 5; },
       "topk_group=5 must be between 1 and n_group=4"},
      {"groups too few",
       [](LayerDesc& d) {
         d.topk_group = 1;
         d.top_k = 4;
       },
       "topk_group=1 groups of 2 experts hold 2 experts, fewer than top_k=4"},
      {"shared negative", [](LayerDesc& d) { d.shared_intermediate = -16; },
       "shared_intermediate=-16 must be at least 0"},
      {"shared block", [](LayerDesc& d) { d.shared_intermediate = 24; },
       "shared_intermediate=24 is not a multiple of 16"},
      {"scale zero", [](LayerDesc& d) { d.routed_scaling_factor = 0.0f; },
       "routed_scaling_factor=0 must be finite and positive"},
      {"scale negative", [](LayerDesc& d) { d.routed_scaling_factor = -1.0f; },
       "routed_scaling_factor=-1 must be"},
      {"scale inf", [](LayerDesc& d) { d.routed_scaling_factor = kInf; },
       "routed_scaling_factor=inf must be"},
      {"scale nan", [](LayerDesc& d) { d.routed_scaling_factor = kNan; },
       "routed_scaling_factor=nan must be"},
      {"alpha nan",
       [=](LayerDesc& d) {
         d.activation = Activation::kSwiGLUClamped;
         d.swiglu_alpha = kNan;
       },
       "swiglu_alpha=nan must be finite"},
      {"limit zero",
       [](LayerDesc& d) {
         d.activation = Activation::kSwiGLUClamped;
         d.swiglu_limit = 0.0f;
       },
       "swiglu_limit=0 must be finite and positive"},
      {"limit inf",
       [=](LayerDesc& d) {
         d.activation = Activation::kSwiGLUClamped;
         d.swiglu_limit = kInf;
       },
       "swiglu_limit=inf must be finite and positive"},
      {"router enum", [](LayerDesc& d) { d.router = static_cast<RouterKind>(9); },
       "router=9 is not a known router kind"},
      {"activation enum", [](LayerDesc& d) { d.activation = static_cast<Activation>(9); },
       "activation=9 is not a known activation"},
      {"format enum", [](LayerDesc& d) { d.format = static_cast<WeightFormat>(9); },
       "format=9 is not a known weight format"},
  };
  for (const auto& c : cases) {
    LayerDesc d = small_sigmoid();
    c.change(d);
    EXPECT_THAT(validate_error(d), HasSubstr(c.message)) << c.name;
  }
}

TEST(LayerDesc, GroupRulesApplyOnlyToTheSigmoidRouter) {
  LayerDesc d = small_sigmoid();
  d.router = RouterKind::kSoftmaxTopK;
  d.n_group = 3;
  d.topk_group = 7;
  EXPECT_NO_THROW(d.validate());
  // The unused clamp parameters of plain SwiGLU are not checked either.
  d.swiglu_limit = -1.0f;
  EXPECT_NO_THROW(d.validate());
}

TEST(LayerDesc, SmallestLegalShapes) {
  LayerDesc d;
  d.hidden = 16;
  d.intermediate = 16;
  d.experts = 1;
  d.top_k = 1;
  EXPECT_NO_THROW(d.validate());
  d.format = WeightFormat::kMxfp4;
  EXPECT_THAT(validate_error(d), HasSubstr("hidden=16 is not a multiple of 32"));
  d.hidden = 32;
  d.intermediate = 32;
  EXPECT_NO_THROW(d.validate());
}

TEST(LayerDesc, ToString) {
  EXPECT_EQ(layer_preset("glm5").to_string(),
            "H=6144 I=2048 E=256 top-8 sigmoid-group(groups 1/1, scale 2.5) swiglu nvfp4 shared I=2048");
  EXPECT_EQ(layer_preset("deepseek-v3").to_string(),
            "H=7168 I=2048 E=256 top-8 sigmoid-group(groups 4/8, scale 2.5) swiglu nvfp4 shared I=2048");
  EXPECT_EQ(layer_preset("gpt-oss-120b").to_string(),
            "H=2880 I=2880 E=128 top-4 topk-softmax swiglu-clamped(alpha 1.702, limit 7) mxfp4 bias");
  EXPECT_EQ(layer_preset("mixtral-8x7b").to_string(), "H=4096 I=14336 E=8 top-2 softmax swiglu nvfp4");
  LayerDesc d = layer_preset("qwen3-30b");
  d.renormalize = false;
  EXPECT_EQ(d.to_string(), "H=2048 I=768 E=128 top-8 softmax(no renorm) swiglu nvfp4");
  d = layer_preset("kimi-k2");
  d.renormalize = false;
  EXPECT_EQ(d.to_string(),
            "H=7168 I=2048 E=384 top-8 sigmoid-group(groups 1/1, scale 2.827, no renorm) swiglu nvfp4 shared "
            "I=2048");
}

TEST(LayerPresets, MatchTheModelTable) {
  struct Row {
    const char* name;
    std::int64_t h, i, e, k;
    RouterKind router;
    std::int64_t n_group, topk_group;
    float scale;
    std::int64_t shared;
  };
  // FORMATS.md "Model shapes".
  const std::vector<Row> rows = {
      {"glm5", 6144, 2048, 256, 8, RouterKind::kSigmoidGroupTopK, 1, 1, 2.5f, 2048},
      {"glm45", 5120, 1536, 160, 8, RouterKind::kSigmoidGroupTopK, 1, 1, 2.5f, 1536},
      {"deepseek-v3", 7168, 2048, 256, 8, RouterKind::kSigmoidGroupTopK, 8, 4, 2.5f, 2048},
      {"kimi-k2", 7168, 2048, 384, 8, RouterKind::kSigmoidGroupTopK, 1, 1, 2.827f, 2048},
      {"qwen3-235b", 4096, 1536, 128, 8, RouterKind::kSoftmaxTopK, 1, 1, 1.0f, 0},
      {"qwen3-30b", 2048, 768, 128, 8, RouterKind::kSoftmaxTopK, 1, 1, 1.0f, 0},
      {"gpt-oss-120b", 2880, 2880, 128, 4, RouterKind::kTopKSoftmax, 1, 1, 1.0f, 0},
      {"mixtral-8x7b", 4096, 14336, 8, 2, RouterKind::kSoftmaxTopK, 1, 1, 1.0f, 0},
  };
  std::vector<std::string> names;
  for (const auto& r : rows) {
    const LayerDesc d = layer_preset(r.name);
    EXPECT_NO_THROW(d.validate()) << r.name;
    EXPECT_EQ(d.hidden, r.h) << r.name;
    EXPECT_EQ(d.intermediate, r.i) << r.name;
    EXPECT_EQ(d.experts, r.e) << r.name;
    EXPECT_EQ(d.top_k, r.k) << r.name;
    EXPECT_EQ(d.router, r.router) << r.name;
    EXPECT_EQ(d.n_group, r.n_group) << r.name;
    EXPECT_EQ(d.topk_group, r.topk_group) << r.name;
    EXPECT_EQ(d.routed_scaling_factor, r.scale) << r.name;
    EXPECT_EQ(d.shared_intermediate, r.shared) << r.name;
    EXPECT_TRUE(d.renormalize || d.router == RouterKind::kTopKSoftmax) << r.name;
    names.emplace_back(r.name);
  }
  EXPECT_EQ(layer_preset_names(), names);
  const LayerDesc g = layer_preset("gpt-oss-120b");
  EXPECT_EQ(g.format, WeightFormat::kMxfp4);
  EXPECT_EQ(g.activation, Activation::kSwiGLUClamped);
  EXPECT_EQ(g.swiglu_alpha, 1.702f);
  EXPECT_EQ(g.swiglu_limit, 7.0f);
  EXPECT_TRUE(g.expert_bias);
  EXPECT_EQ(layer_preset("glm5").format, WeightFormat::kNvfp4);
}

TEST(LayerPresets, UnknownNameListsTheKnownOnes) {
  try {
    layer_preset("llama");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown layer preset 'llama'"));
    EXPECT_THAT(
        e.what(),
        HasSubstr("glm5, glm45, deepseek-v3, kimi-k2, qwen3-235b, qwen3-30b, gpt-oss-120b, mixtral-8x7b"));
  }
}

TEST(Names, RoutersAndActivationsRoundTripAndReject) {
  for (auto k : {RouterKind::kSoftmaxTopK, RouterKind::kSigmoidGroupTopK, RouterKind::kTopKSoftmax}) {
    EXPECT_EQ(parse_router_kind(router_name(k)), k);
  }
  for (auto a : {Activation::kSwiGLU, Activation::kSwiGLUClamped})
    EXPECT_EQ(parse_activation(activation_name(a)), a);
  EXPECT_EQ(router_name(RouterKind::kSigmoidGroupTopK), "sigmoid-group");
  EXPECT_EQ(activation_name(Activation::kSwiGLUClamped), "swiglu-clamped");
  try {
    parse_router_kind("sigmoid");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("unknown router 'sigmoid': expected softmax, sigmoid-group or topk-softmax"));
  }
  try {
    parse_activation("gelu");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown activation 'gelu': expected swiglu or swiglu-clamped"));
  }
}

// E (1 - (1 - k/E)^T): one token activates its k experts, many tokens all E, never fewer than 1.
TEST(LayerDesc, ExpectedActiveExperts) {
  const LayerDesc d = layer_preset("glm5");  // 256 experts, top-8
  EXPECT_DOUBLE_EQ(d.expected_active_experts(1), 8.0);
  EXPECT_NEAR(d.expected_active_experts(2), 256.0 * (1.0 - (248.0 / 256.0) * (248.0 / 256.0)), 1e-9);
  EXPECT_GT(d.expected_active_experts(16384), 255.999);
  EXPECT_LE(d.expected_active_experts(16384), 256.0);
  EXPECT_DOUBLE_EQ(d.expected_active_experts(0), 1.0);  // no token: the floor of one expert
}

}  // namespace
}  // namespace fp4moe
