// The autotuner on the GPU: a quick tune of a small layer for one bucket writes a cache that a
// new layer then runs (and still matches the CPU reference); a cache made elsewhere is ignored
// with one line; a configuration the planner rejects is never timed nor launched.
//
// Tolerance: as test_moe_layer.cpp (relative L2 error <= 1e-2: summation order and bf16
// rounding of the intermediate give ~1e-3; a wrong tile, scale or token gives O(1)).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <utility>
#include <vector>

#include "fp4moe/error.hpp"
#include "fp4moe/layer.hpp"
#include "fp4moe/moe_layer.hpp"
#include "fp4moe/reference.hpp"
#include "fp4moe/tune.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/layer_tuning.hpp"

namespace fp4moe {
namespace {

using test::DeviceArray;
using ::testing::HasSubstr;
using ::testing::Not;

LayerDesc small_desc() {
  LayerDesc d;
  d.hidden = 256;
  d.intermediate = 128;
  d.experts = 16;
  d.top_k = 4;
  return d;
}

// A directory of its own under the system temp dir, removed at scope exit.
class ScratchDir {
 public:
  ScratchDir()
      : path_(std::filesystem::temp_directory_path() / ("fp4moe-gpu-tune-" + std::to_string(getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

double error_against_reference(const LayerWeights& w, const MoeLayer& layer, std::int64_t tokens,
                               std::uint64_t seed) {
  const LayerDesc& d = w.desc;
  const auto x = test::random_bf16(static_cast<std::size_t>(tokens * d.hidden), seed);
  const auto logits = test::random_f32(static_cast<std::size_t>(tokens * d.experts), seed + 1, 2.0f);
  DeviceArray<Bf16> dx(x.size()), dout(x.size());
  DeviceArray<float> dl(logits.size());
  dx.upload(x);
  dl.upload(logits);
  dout.fill_bytes(0xff);  // a bf16 NaN: an element the layer does not write fails the comparison
  layer.forward(nullptr, dx.get(), dl.get(), dout.get(), tokens);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return test::relative_l2(dout.download(), reference_forward(w, x, logits, tokens).out);
}

TEST(GpuTune, QuickTuneOfOneBucketIsWhatTheLayerThenRuns) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const ScratchDir dir;
  const std::string path = dir.file("sub/tune.json");
  const LayerDesc d = small_desc();
  TuneOptions o;
  o.layer = d;
  o.tokens = {20};  // bucket 16
  o.quick = true;
  o.max_configs = 3;
  o.cache_path = path;
  int last_done = -1, last_total = -1;
  const TuneReport r = tune_layer(o, [&](int done, int total, const std::string&) {
    last_done = done;
    last_total = total;
  });
  EXPECT_EQ(last_done, 6);
  EXPECT_EQ(last_total, 6);
  ASSERT_EQ(r.entries.size(), 1u);
  const TuneEntry& e = r.entries[0];
  EXPECT_EQ(e.bucket, 16);
  ASSERT_EQ(r.timings.size(), 6u);  // 3 candidates x 2 GEMMs
  int picks = 0;
  for (const auto& t : r.timings) {
    EXPECT_GT(t.median_us, 0.0) << t.label;
    EXPECT_EQ(t.bucket, 16);
    picks += t.layer_pick;
    const TunedGemm& best = t.gemm == GemmKind::kGateUp ? e.gate_up : e.down;
    EXPECT_LE(best.us, t.median_us) << t.label;
  }
  EXPECT_EQ(picks, 2);
  EXPECT_THAT(r.to_string(), HasSubstr("bucket T=16 (16 to 31 tokens), gate_up: 3 candidate(s) timed"));

  // On disk, with this device's metadata.
  const TuneCache cache = read_tune_cache(path);
  EXPECT_EQ(cache.metadata, r.metadata);
  ASSERT_NE(cache.find(d, 31), nullptr);
  EXPECT_EQ(cache.find(d, 31)->gate_up.choice, e.gate_up.choice);
  EXPECT_EQ(cache.find(d, 32), nullptr);

  // A layer reading the cache runs the tuned configs for T in [16, 32), the planner's otherwise.
  const LayerWeights w = random_layer_weights(d, 5);
  std::vector<std::string> notices;
  MoeLayerOptions lo;
  lo.max_tokens = 64;
  lo.tune_cache_path = path;
  lo.log = [&](const std::string& m) { notices.push_back(m); };
  const MoeLayer layer(w, lo);
  EXPECT_TRUE(notices.empty());
  const std::string summary = layer.plan_summary(20);
  EXPECT_THAT(summary, HasSubstr(e.gate_up.choice.to_string() + " [tuned on this GPU (tune cache " + path +
                                 ", bucket 16)]"));
  EXPECT_THAT(summary, HasSubstr(e.down.choice.to_string() + " [tuned on this GPU (tune cache " + path +
                                 ", bucket 16)]"));
  EXPECT_THAT(layer.plan_summary(40), Not(HasSubstr("tuned on this GPU")));
  const double err = error_against_reference(w, layer, 20, 77);
  EXPECT_LE(err, 1e-2) << summary;

  // use_tune_cache = false: the dispatcher decides.
  lo.use_tune_cache = false;
  const MoeLayer plain(w, lo);
  EXPECT_THAT(plain.plan_summary(20), Not(HasSubstr("tuned on this GPU")));
}

TEST(GpuTune, NamedConfigsAreTimedBesideThePickAndAnUnknownOneIsAnError) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const ScratchDir dir;
  TuneOptions o;
  o.layer = small_desc();
  o.tokens = {16};
  o.quick = true;
  o.max_configs = 2;
  o.cache_path = dir.file("tune.json");
  const TuneReport first = tune_layer(o);
  std::string other;  // gate_up's candidate next to the pick, "family label"
  for (const auto& t : first.timings) {
    if (t.gemm == GemmKind::kGateUp && !t.layer_pick) other = t.label;
  }
  ASSERT_FALSE(other.empty());

  o.max_configs = 0;
  o.configs = {" " + other + " "};  // surrounding spaces, as after a comma on a command line
  const TuneReport named = tune_layer(o);
  std::set<std::string> gate_up;
  for (const auto& t : named.timings) {
    if (t.gemm == GemmKind::kGateUp) gate_up.insert(t.label);
  }
  EXPECT_EQ(gate_up.size(), 2u);
  EXPECT_EQ(gate_up.count(other), 1u);

  o.configs = {"no such config"};
  try {
    tune_layer(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("'no such config'"));
    EXPECT_THAT(e.what(), HasSubstr("fp4moe plan"));
  }
}

TEST(GpuTune, ACacheMadeElsewhereIsIgnoredWithOneLine) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const ScratchDir dir;
  const LayerDesc d = small_desc();
  const auto gpus = list_gpus();
  TuneCache cache;
  cache.metadata = tune_metadata_of(gpus.front());
  cache.metadata.gpu = "Some Other GPU";
  TuneEntry e;
  e.shape = tune_shape_of(d);
  e.bucket = 16;
  e.gate_up = {{GemmKernel::kStream, 1, 1, 2, 4, 1}, 1.0};
  e.down = e.gate_up;
  cache.entries.push_back(e);
  const std::string path = dir.file("other.json");
  write_tune_cache(cache, path);
  std::vector<std::string> notices;
  MoeLayerOptions lo;
  lo.max_tokens = 32;
  lo.device = gpus.front().index;
  lo.tune_cache_path = path;
  lo.log = [&](const std::string& m) { notices.push_back(m); };
  const MoeLayer layer(random_layer_weights(d, 6), lo);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_THAT(notices[0], HasSubstr("tune cache " + path + " ignored: it was made with GPU Some Other GPU"));
  EXPECT_EQ(notices[0].find('\n'), std::string::npos);
  EXPECT_THAT(layer.plan_summary(16), HasSubstr("picked by the dispatcher"));
}

TEST(GpuTune, AConfigThePlannerRejectsIsNeverTimedNorLaunched) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const LayerDesc d = small_desc();
  const LayerWeights w = random_layer_weights(d, 7);
  // 8 warps x 16 stages x 4352 B = 557056 B: more shared memory than any GPU has.
  const GemmChoice too_big{GemmKernel::kStream, 4, 2, 16, 8, 1};
  MoeLayerOptions lo;
  lo.max_tokens = 16;
  lo.use_tune_cache = false;
  const MoeLayer layer(w, lo);
  gpu::LayerTuning timer(layer, 8, 1);
  try {
    timer.time_gemm(GemmKind::kDown, too_big, 1, 1);
    FAIL() << "timed a config the planner rejects";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kDoesNotFit);
    EXPECT_THAT(e.what(), HasSubstr("is rejected by the planner"));
  }
  // A good one times.
  const GemmChoice good{GemmKernel::kStream, 1, 1, 2, 4, 1};
  const gpu::GemmTiming t = timer.time_gemm(GemmKind::kDown, good, 1, 3);
  EXPECT_EQ(t.us.size(), 3u);
  EXPECT_GT(t.median(), 0.0);
  // Interleaved: a rejected choice among good ones throws before any is run (no progress call).
  int calls = 0;
  const auto count = [&](int, int) { ++calls; };
  try {
    timer.time_gemms(GemmKind::kDown, {good, too_big}, 1, 2, count);
    FAIL() << "timed a list with a config the planner rejects";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kDoesNotFit);
  }
  EXPECT_EQ(calls, 0);
  // Every choice gets its samples, one per round, in order.
  std::vector<std::pair<int, int>> order;
  const auto record = [&](int round, int i) { order.emplace_back(round, i); };
  const GemmChoice other{GemmKernel::kStream, 4, 1, 3, 8, 2};
  const auto both = timer.time_gemms(GemmKind::kDown, {good, other}, 0, 3, record);
  ASSERT_EQ(both.size(), 2u);
  for (const auto& b : both) {
    EXPECT_EQ(b.us.size(), 3u);
    EXPECT_GT(b.median(), 0.0);
  }
  const std::vector<std::pair<int, int>> expected = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}};
  EXPECT_EQ(order, expected);
  // Forced through the options: the constructor refuses it with the planner's numbers.
  lo.gemm2 = too_big;
  try {
    const MoeLayer forced(w, lo);
    FAIL() << "a layer with a config the planner rejects";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kDoesNotFit);
    EXPECT_THAT(e.what(), HasSubstr("MoeLayerOptions::gemm2, forced by the caller"));
    EXPECT_THAT(e.what(), HasSubstr("557056 B"));
  }
}

}  // namespace
}  // namespace fp4moe
