// The tune cache: token buckets, the key's layer shape, JSON round trip, the atomic write, the
// path's precedence, what a layer does with a mismatched, corrupt or missing cache, and which
// candidates the tuner times (never one the planner rejects).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "fp4moe/error.hpp"
#include "fp4moe/tune.hpp"
#include "fp4moe/version.hpp"
#include "io/io_test_util.hpp"
#include "test_util/run_command.hpp"
#include "test_util/shared.hpp"

namespace fp4moe {
namespace {

using test_util::error_of;
using test_util::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

LayerDesc small_layer() {
  LayerDesc d;
  d.hidden = 256;
  d.intermediate = 128;
  d.experts = 16;
  d.top_k = 4;
  return d;
}

TuneMetadata h200() {
  return {"NVIDIA H200", 90, "13.0", "0.1.0"};
}

TuneCache sample_cache() {
  TuneCache c;
  c.metadata = h200();
  TuneEntry e;
  e.shape = tune_shape_of(layer_preset("glm5"));
  e.bucket = 16;
  e.gate_up = {{GemmKernel::kStream, 4, 2, 3, 8, 2}, 12.5};
  e.down = {{GemmKernel::kStream, 2, 2, 4, 4, 1}, 7.25};
  c.entries.push_back(e);
  e.shape = tune_shape_of(small_layer());
  e.bucket = 4096;
  e.gate_up = {{GemmKernel::kTile, 2, 8, 6, 8, 1}, 2800.0};
  e.down = {{GemmKernel::kTile, 2, 4, 3, 8, 1}, 1400.5};
  c.entries.push_back(e);
  e.bucket = 8192;
  e.gate_up = {{GemmKernel::kWgmma, 2, 16, 4, 8, 1}, 5000.0};
  e.down = {{GemmKernel::kWgmma, 2, 8, 3, 8, 1}, 2500.0};
  c.entries.push_back(e);
  return c;
}

void expect_same(const TuneCache& a, const TuneCache& b) {
  EXPECT_EQ(a.metadata, b.metadata);
  ASSERT_EQ(a.entries.size(), b.entries.size());
  for (std::size_t i = 0; i < a.entries.size(); ++i) {
    EXPECT_EQ(a.entries[i].shape, b.entries[i].shape) << i;
    EXPECT_EQ(a.entries[i].bucket, b.entries[i].bucket) << i;
    EXPECT_EQ(a.entries[i].gate_up.choice, b.entries[i].gate_up.choice) << i;
    EXPECT_EQ(a.entries[i].gate_up.us, b.entries[i].gate_up.us) << i;
    EXPECT_EQ(a.entries[i].down.choice, b.entries[i].down.choice) << i;
    EXPECT_EQ(a.entries[i].down.us, b.entries[i].down.us) << i;
  }
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Sets an environment variable for the scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

TEST(TokenBucket, LargestPowerOfTwoAtMostT) {
  const std::pair<std::int64_t, std::int64_t> cases[] = {{1, 1},
                                                         {2, 2},
                                                         {3, 2},
                                                         {4, 4},
                                                         {7, 4},
                                                         {8, 8},
                                                         {1000, 512},
                                                         {1023, 512},
                                                         {1024, 1024},
                                                         {4095, 2048},
                                                         {4096, 4096},
                                                         {16383, 8192},
                                                         {(std::int64_t{1} << 40) + 5, std::int64_t{1} << 40},
                                                         {INT64_MAX, std::int64_t{1} << 62}};
  for (const auto& [t, b] : cases) EXPECT_EQ(token_bucket(t), b) << t;
  Errc code{};
  EXPECT_THAT(error_of([] { token_bucket(0); }, &code),
              HasSubstr("tokens = 0: a token bucket needs at least 1"));
  EXPECT_EQ(code, Errc::kInvalidArgument);
  EXPECT_THAT(error_of([] { token_bucket(-3); }), HasSubstr("tokens = -3"));
}

TEST(TuneCache, JsonRoundTripKeepsEveryField) {
  const TuneCache c = sample_cache();
  const std::string text = c.to_json();
  expect_same(TuneCache::from_json(text, "mem"), c);
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j.at("format"), "fp4moe-tune-cache");
  EXPECT_EQ(j.at("format_version"), 1);
  EXPECT_EQ(j.at("metadata").at("compute_capability"), "9.0");
  EXPECT_EQ(j.at("entries")[0].at("shape").at("router"), "sigmoid-group");
  EXPECT_EQ(j.at("entries")[0].at("tokens_bucket"), 16);
  EXPECT_EQ(j.at("entries")[0].at("gate_up").at("label"), "m4 n2 k2 s3 w8");
  EXPECT_EQ(j.at("entries")[1].at("down").at("kernel"), "tile");
  EXPECT_EQ(j.at("entries")[2].at("gate_up").at("kernel"), "wgmma");
  EXPECT_EQ(j.at("entries")[2].at("gate_up").at("label"), "n16 s4 w8");
}

TEST(TuneCache, WriteThenReadThroughANewDirectory) {
  TempDir dir;
  const auto path = (dir / "nested" / "deeper" / "tune.json").string();
  write_tune_cache(sample_cache(), path);
  expect_same(read_tune_cache(path), sample_cache());
}

TEST(TuneCache, FindsByShapeAndBucket) {
  const TuneCache c = sample_cache();
  LayerDesc glm5 = layer_preset("glm5");
  for (const std::int64_t t : {16, 17, 31}) {
    const TuneEntry* e = c.find(glm5, t);
    ASSERT_NE(e, nullptr) << t;
    EXPECT_EQ(e->bucket, 16);
  }
  EXPECT_EQ(c.find(glm5, 15), nullptr);
  EXPECT_EQ(c.find(glm5, 32), nullptr);
  // Fields outside the key do not matter; a keyed field does.
  glm5.routed_scaling_factor = 1.0f;
  glm5.n_group = 8;
  EXPECT_NE(c.find(glm5, 16), nullptr);
  glm5.shared_intermediate = 0;
  EXPECT_EQ(c.find(glm5, 16), nullptr);
  LayerDesc other = small_layer();
  other.activation = Activation::kSwiGLUClamped;
  EXPECT_EQ(c.find(other, 4096), nullptr);
  EXPECT_NE(c.find(small_layer(), 5000), nullptr);
  EXPECT_EQ(tune_shape_of(layer_preset("glm5")).to_string(),
            "H=6144 I=2048 E=256 k=8 sigmoid-group nvfp4 swiglu shared=2048");
}

TEST(TuneCache, PutReplacesTheSameShapeAndBucket) {
  TuneCache c = sample_cache();
  TuneEntry e = c.entries[0];
  e.gate_up.us = 1.0;
  c.put(e);
  ASSERT_EQ(c.entries.size(), 3u);
  EXPECT_EQ(c.entries[0].gate_up.us, 1.0);
  e.bucket = 32;
  c.put(e);
  EXPECT_EQ(c.entries.size(), 4u);
}

TEST(TuneCache, PreferenceNamesTheCacheAndTheBucket) {
  const TuneCache c = sample_cache();
  const auto p = tuned_preference(c, "/x/tune.json", small_layer(), 5000, GemmKind::kDown);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->source, PickSource::kTuned);
  EXPECT_EQ(p->choice, c.entries[1].down.choice);
  EXPECT_EQ(p->origin, "tune cache /x/tune.json, bucket 4096");
  EXPECT_FALSE(tuned_preference(c, "/x/tune.json", small_layer(), 100, GemmKind::kDown).has_value());
}

TEST(TuneCache, WriteIsATemporaryFileRenamedOverTheOld) {
  TempDir dir;
  const auto path = dir / "tune.json";
  TuneCache first = sample_cache();
  first.entries.resize(1);
  write_tune_cache(first, path.string());
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  // A reader that opened the old cache keeps reading the old bytes: the new cache is another file.
  std::ifstream old_reader(path);
  write_tune_cache(sample_cache(), path.string());
  struct stat after {};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_NE(before.st_ino, after.st_ino) << "rewritten in place, not renamed";
  const std::string old_text(std::istreambuf_iterator<char>(old_reader), {});
  EXPECT_EQ(old_text, first.to_json());
  EXPECT_EQ(read_text(path), sample_cache().to_json());
  // No temporary file is left behind.
  int files = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(f.path().filename(), "tune.json");
  }
  EXPECT_EQ(files, 1);
}

TEST(TuneCache, AFailedWriteLeavesTheOldCache) {
  TempDir dir;
  const auto path = dir / "tune.json";
  write_tune_cache(sample_cache(), path.string());
  Errc code{};
  // The directory is a file: nothing can be created in it.
  const auto blocked = (dir / "tune.json" / "tune.json").string();
  EXPECT_THAT(error_of([&] { write_tune_cache(sample_cache(), blocked); }, &code), HasSubstr("tune"));
  EXPECT_EQ(code, Errc::kIo);
  if (geteuid() != 0) {  // root writes into read-only directories
    std::filesystem::permissions(dir.path(),
                                 std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    EXPECT_THAT(error_of([&] { write_tune_cache(TuneCache{}, path.string()); }, &code),
                HasSubstr("cannot create"));
    EXPECT_EQ(code, Errc::kIo);
    std::filesystem::permissions(dir.path(), std::filesystem::perms::owner_all);
  }
  EXPECT_EQ(read_text(path), sample_cache().to_json());
}

TEST(TuneCache, MismatchedMetadataIsIgnoredWithOneLine) {
  TempDir dir;
  const auto path = (dir / "tune.json").string();
  write_tune_cache(sample_cache(), path);
  TuneMetadata here = h200();
  const auto same = load_tune_cache(path, here);
  ASSERT_TRUE(same.cache.has_value());
  EXPECT_TRUE(same.message.empty());
  here.gpu = "NVIDIA H100 80GB HBM3";
  here.cuda = "12.8";
  const auto load = load_tune_cache(path, here);
  EXPECT_FALSE(load.cache.has_value());
  EXPECT_EQ(load.message,
            "tune cache " + path +
                " ignored: it was made with GPU NVIDIA H200, CUDA 13.0, this is GPU NVIDIA H100 80GB "
                "HBM3, CUDA 12.8 (until it is remade with fp4moe tune, the planner and dispatcher "
                "decide)");
  here = h200();
  here.fp4moe = "0.3.0";
  EXPECT_THAT(load_tune_cache(path, here).message, HasSubstr("made with fp4moe 0.1.0, this is fp4moe 0.3.0"));
  here = h200();
  here.sm = 100;
  EXPECT_THAT(load_tune_cache(path, here).message,
              HasSubstr("made with compute capability 9.0, this is compute capability 10.0"));
}

TEST(TuneCache, MissingFileIsSilent) {
  TempDir dir;
  const auto path = (dir / "none.json").string();
  const auto load = load_tune_cache(path, h200());
  EXPECT_FALSE(load.cache.has_value());
  EXPECT_TRUE(load.message.empty());
  Errc code{};
  EXPECT_THAT(error_of([&] { read_tune_cache(path); }, &code), HasSubstr("cannot open"));
  EXPECT_EQ(code, Errc::kIo);
}

TEST(TuneCache, CorruptFilesAreRejectedWithTheReason) {
  TempDir dir;
  const auto path = dir / "tune.json";
  test_util::write_text(path, "{\"format\": \"fp4moe-tune-cache\", ");
  const auto load = load_tune_cache(path.string(), h200());
  EXPECT_FALSE(load.cache.has_value());
  EXPECT_THAT(load.message, HasSubstr("tune cache ignored: " + path.string() + ": not JSON ("));
  EXPECT_EQ(load.message.find('\n'), std::string::npos);
  Errc code{};
  error_of([&] { read_tune_cache(path.string()); }, &code);
  EXPECT_EQ(code, Errc::kBadFile);

  const std::string good = sample_cache().to_json();
  const auto bad = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    return error_of([&] { TuneCache::from_json(text, "t.json"); });
  };
  EXPECT_THAT(error_of([] { TuneCache::from_json("[1, 2]", "t.json"); }),
              HasSubstr("t.json: not an fp4moe tune cache"));
  EXPECT_THAT(bad("\"format_version\": 1", "\"format_version\": 2"),
              HasSubstr("t.json: format_version 2 (this fp4moe reads version 1)"));
  EXPECT_THAT(bad("\"stages\": 3", "\"stages\": \"x\""),
              HasSubstr("t.json: entries[0].gate_up.stages is not an integer >= 1 (\"x\")"));
  EXPECT_THAT(bad("\"stages\": 3", "\"stages\": 0"),
              HasSubstr("entries[0].gate_up.stages is not an integer >= 1"));
  EXPECT_THAT(bad("\"tokens_bucket\": 16", "\"tokens_bucket\": 24"),
              HasSubstr("entries[0].tokens_bucket = 24 is not a power of two"));
  EXPECT_THAT(bad("\"router\": \"sigmoid-group\"", "\"router\": \"argmax\""),
              HasSubstr("entries[0].shape.router: unknown router 'argmax'"));
  EXPECT_THAT(bad("\"kernel\": \"stream\"", "\"kernel\": \"cutlass\""),
              HasSubstr("entries[0].down.kernel 'cutlass' is not stream, tile or wgmma"));  // keys are sorted
  EXPECT_THAT(bad("\"compute_capability\": \"9.0\"", "\"compute_capability\": \"sm90\""),
              HasSubstr("metadata.compute_capability 'sm90' is not <major>.<minor>"));
  EXPECT_THAT(bad("\"us\": 12.5", "\"us\": -1"),
              HasSubstr("entries[0].gate_up.us is not a non-negative number"));
  EXPECT_THAT(bad("\"metadata\"", "\"meta\""), HasSubstr("t.json: the file has no \"metadata\""));
}

TEST(TuneCachePath, OptionThenEnvironmentThenXdgThenHome) {
  const ScopedEnv a("FP4MOE_TUNE_CACHE", "/env/tune.json");
  const ScopedEnv b("XDG_CACHE_HOME", "/xdg");
  const ScopedEnv c("HOME", "/home/u");
  EXPECT_EQ(tune_cache_path("/option.json"), "/option.json");
  EXPECT_EQ(tune_cache_path(), "/env/tune.json");
  {
    const ScopedEnv none("FP4MOE_TUNE_CACHE", "");
    EXPECT_EQ(tune_cache_path(), "/xdg/fp4moe/tune.json");
    const ScopedEnv relative("XDG_CACHE_HOME", "relative/dir");  // ignored, as the XDG spec says
    EXPECT_EQ(tune_cache_path(), "/home/u/.cache/fp4moe/tune.json");
    const ScopedEnv no_home("HOME", nullptr);
    EXPECT_EQ(tune_cache_path(), "");
  }
}

TEST(TuneMetadata, PrintsAndComesFromTheDeviceAndTheBuild) {
  EXPECT_EQ(h200().to_string(), "NVIDIA H200, compute capability 9.0, CUDA 13.0, fp4moe 0.1.0");
  GpuInfo g;
  g.name = "NVIDIA GeForce RTX 5090";
  g.cc_major = 12;
  g.cc_minor = 0;
  const TuneMetadata m = tune_metadata_of(g);
  EXPECT_EQ(m.gpu, "NVIDIA GeForce RTX 5090");
  EXPECT_EQ(m.sm, 120);
  EXPECT_EQ(m.cuda, cuda_runtime_version());
  EXPECT_EQ(m.fp4moe, version());
}

// ---- which candidates the tuner times -----------------------------------------------------------

TEST(TuneCandidates, ThePickFirstThenItsNeighboursAndNeverARejectedConfig) {
  for (const char* arch : {"sm_90", "sm_120"}) {
    for (const std::int64_t t : {1, 64, 4096}) {
      const auto plan = plan_layer_gemm(layer_preset("glm5"), t, GemmKind::kGateUp, arch_by_name(arch));
      ASSERT_TRUE(plan.ok);
      std::size_t feasible = 0;
      for (const auto& p : plan.plans) {
        for (const auto& c : p.candidates) feasible += c.feasible;
      }
      const auto all = tune_candidates(plan, 0);
      EXPECT_EQ(all.size(), feasible) << arch << " T=" << t;
      std::set<std::string> seen;
      for (const auto& c : all) {
        EXPECT_TRUE(c.feasible) << c.label;
        EXPECT_TRUE(seen.insert(c.family + " " + c.label).second) << "twice: " << c.label;
      }
      const auto quick = tune_candidates(plan, 6);
      ASSERT_EQ(quick.size(), 6u);
      EXPECT_EQ(quick[0].family, plan.pick.verdict.family);
      EXPECT_EQ(quick[0].label, plan.pick.verdict.label);
      // The rest: the pick's own family, one parameter away where possible.
      for (std::size_t i = 1; i < quick.size(); ++i) EXPECT_EQ(quick[i].family, plan.pick.verdict.family);
    }
  }
}

TEST(TuneCandidates, NamedOnesFollowThePickOnceEachWithOrWithoutTheirFamily) {
  const auto plan = plan_layer_gemm(layer_preset("glm5"), 256, GemmKind::kGateUp, arch_by_name("sm_90"));
  ASSERT_TRUE(plan.ok);
  const CandidateVerdict& pick = plan.pick.verdict;
  // Two other feasible candidates of the pick's family, one named with its family, one without.
  std::vector<std::string> others;
  for (const auto& p : plan.plans) {
    for (const auto& c : p.candidates) {
      if (c.feasible && c.family == pick.family && c.label != pick.label && others.size() < 2) {
        others.push_back(c.label);
      }
    }
  }
  ASSERT_EQ(others.size(), 2u);
  const auto got = tune_candidates_named(
      plan, {pick.family + " " + others[0], others[1], others[1], pick.label, "no such config"});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].label, pick.label);  // the reference, once although named too
  std::set<std::string> rest{got[1].label, got[2].label};
  EXPECT_EQ(rest, (std::set<std::string>{others[0], others[1]}));
  for (const auto& c : got) EXPECT_TRUE(c.feasible) << c.label;
  // Nothing named: the pick alone.
  EXPECT_EQ(tune_candidates_named(plan, {}).size(), 1u);
}

TEST(TuneCandidates, ARejectedConfigIsNeverNamedIn) {
  ArchInfo small = arch_by_name("sm_90");
  small.smem_per_block_optin = 64 * 1024;  // the 8-stage wgmma configurations no longer fit
  const auto plan = plan_layer_gemm(layer_preset("glm5"), 256, GemmKind::kGateUp, small);
  ASSERT_TRUE(plan.ok);
  std::vector<std::string> rejected;
  for (const auto& p : plan.plans) {
    for (const auto& c : p.candidates) {
      if (!c.feasible) rejected.push_back(c.family + " " + c.label);
    }
  }
  ASSERT_FALSE(rejected.empty());
  const auto got = tune_candidates_named(plan, rejected);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].feasible);
}

TEST(Tune, AnEmptyConfigLabelIsRejectedBeforeAnythingRuns) {
  TuneOptions o;
  o.layer = small_layer();
  o.tokens = {1};
  o.configs = {"n4 s8 w8", "  "};
  try {
    tune_layer(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("empty configuration label"));
  }
}

// A label of no configuration at all (a typo, or an instance this build does not compile) is an
// error before anything is built, GPU or not; a real one that this GPU may reject is checked
// later, against the layer's measured registers.
TEST(Tune, AConfigLabelThatNamesNoConfigurationIsRejectedBeforeAnythingRuns) {
  for (const char* bad : {"n5 s8 w8", "n4 s8 w12", "wgmma-gemm m4 n1 k1 s4 w8", "tile n8"}) {
    TuneOptions o;
    o.layer = small_layer();
    o.tokens = {1, 4096};
    o.configs = {"n4 s8 w8", " wgmma-gemm n16 s8 w8", "m4 n1 k1 s4 w8", bad};
    try {
      tune_layer(o);
      FAIL() << bad << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument) << bad;
      EXPECT_THAT(e.what(), ::testing::HasSubstr(std::string("'") + bad + "'"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("fp4moe plan"));
    }
  }
}

TEST(TuneCandidates, NothingFeasibleNothingTimed) {
  ArchInfo tiny = arch_by_name("sm_120");
  tiny.smem_per_block_optin = 1024;
  tiny.smem_per_sm = 2048;
  const auto plan = plan_layer_gemm(small_layer(), 1, GemmKind::kDown, tiny);
  ASSERT_FALSE(plan.ok);
  EXPECT_TRUE(tune_candidates(plan, 0).empty());
}

// The report ends with one line per bucket: the layer's pick -> the tuned one per GEMM, and the
// whole forward with the layer's picks (gate/up's pick row) against the cache's (down's fastest).
TEST(TuneReport, EndsWithAPerBucketSummary) {
  const GemmChoice a{GemmKernel::kStream, 4, 1, 3, 4, 4}, b{GemmKernel::kStream, 4, 1, 2, 16, 4};
  const GemmChoice c{GemmKernel::kStream, 4, 1, 3, 8, 8}, d{GemmKernel::kStream, 2, 1, 4, 16, 4};
  TuneReport r;
  r.metadata = h200();
  r.cache_path = "/tmp/tune.json";
  const auto timing = [](GemmKind g, GemmChoice ch, const char* label, double us, bool pick) {
    TuneTiming t;
    t.bucket = 1;
    t.gemm = g;
    t.choice = ch;
    t.label = label;
    t.median_us = us;
    t.layer_pick = pick;
    return t;
  };
  r.timings = {timing(GemmKind::kGateUp, a, "stream-gemm m4 n1 k4 s3 w4", 34.0, true),
               timing(GemmKind::kGateUp, b, "stream-gemm m4 n1 k4 s2 w16", 33.0, false),
               timing(GemmKind::kDown, c, "stream-gemm m4 n1 k8 s3 w8", 33.2, true),
               timing(GemmKind::kDown, d, "stream-gemm m2 n1 k4 s4 w16", 32.0, false)};
  TuneEntry e;
  e.bucket = 1;
  e.gate_up = {b, 33.0};
  e.down = {d, 32.0};
  r.entries = {e};
  const std::string text = r.to_string();
  EXPECT_THAT(
      text,
      HasSubstr("T=1      gate/up stream-gemm m4 n1 k4 s3 w4 -> stream-gemm m4 n1 k4 s2 w16; down "
                "stream-gemm m4 n1 k8 s3 w8 -> stream-gemm m2 n1 k4 s4 w16; a forward 34.00 -> 32.00 us "
                "(1.06x)"))
      << text;
  // A pick that stays is marked so.
  r.entries[0].gate_up = {a, 34.0};
  EXPECT_THAT(r.to_string(), HasSubstr("gate/up stream-gemm m4 n1 k4 s3 w4 (kept); down")) << r.to_string();
}

TEST(Tune, WithoutAGpuSaysSo) {
  std::string why;
  if (!list_gpus(&why).empty()) GTEST_SKIP() << "a GPU is present (tests/gpu/test_tune.cpp tunes on it)";
  TuneOptions o;
  o.layer = small_layer();
  o.tokens = {1};
  Errc code{};
  EXPECT_THAT(error_of([&] { tune_layer(o); }, &code), HasSubstr("tuning needs a GPU: " + why));
  EXPECT_EQ(code, Errc::kUnsupported);
  const auto r = test_util::run_cli("tune --shape qwen3-30b --tokens 1,16 --quick");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("tuning needs a GPU"));
}

TEST(Tune, BadOptionsAreNamed) {
  TuneOptions o;
  o.layer = small_layer();
  EXPECT_THAT(error_of([&] { tune_layer(o); }), HasSubstr("tune needs at least one token count"));
  o.tokens = {4};
  o.max_configs = -1;
  EXPECT_THAT(error_of([&] { tune_layer(o); }), HasSubstr("max_configs = -1 must be >= 0"));
  auto r = test_util::run_cli("tune --shape qwen3-30b --tokens 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--tokens: 0 is not a positive token count"));
  r = test_util::run_cli("tune --shape nope --tokens 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, Not(HasSubstr("tuning needs a GPU")));
}

}  // namespace
}  // namespace fp4moe
