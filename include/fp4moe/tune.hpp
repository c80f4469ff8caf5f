// fp4moe: the autotuner and its persistent cache (docs/TUNING.md).
//
//   fp4moe tune --shape glm5 --tokens 1,16,4096      # or fp4moe::tune_layer(options)
//
// times every configuration the planner accepts (or a handful around the layer's own pick) for
// each expert GEMM of a layer and each token bucket on the local GPU, and writes the fastest to a
// JSON cache. MoeLayer reads the cache at construction and runs the tuned configurations; a
// forward whose bucket is not in the cache runs what the planner and dispatcher pick.
//
// The cache is keyed by what its timings depend on: the GPU (name and compute capability), the
// CUDA runtime and fp4moe versions (the file's metadata: a file made elsewhere is ignored as a
// whole), and per entry the layer shape and the token bucket.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp4moe/device.hpp"
#include "fp4moe/layer.hpp"
#include "fp4moe/moe_layer.hpp"
#include "fp4moe/planner.hpp"

namespace fp4moe {

// What a cache was measured with; a cache is used only where all four agree.
struct TuneMetadata {
  std::string gpu;     // "NVIDIA H200"
  int sm = 0;          // compute capability, major * 10 + minor (90)
  std::string cuda;    // CUDA runtime, "13.0"
  std::string fp4moe;  // fp4moe version, "0.3.0"

  bool operator==(const TuneMetadata&) const = default;
  // "NVIDIA H200, compute capability 9.0, CUDA 13.0, fp4moe 0.1.0"
  std::string to_string() const;
};
// The metadata of a cache made on `gpu` by this build (its CUDA runtime and version).
TuneMetadata tune_metadata_of(const GpuInfo& gpu);

// The bucket of a forward of T tokens: the largest power of two <= T. Bucket b is tuned at T = b
// and serves every T in [b, 2b). Throws Error (kInvalidArgument) for T < 1.
std::int64_t token_bucket(std::int64_t tokens);

// The fields of a layer that change its kernels' work: the cache key's layer shape. Other fields
// (router groups and scaling, SwiGLU constants, biases) do not key the cache.
struct TuneShape {
  std::int64_t hidden = 0;
  std::int64_t intermediate = 0;
  std::int64_t experts = 0;
  std::int64_t top_k = 0;
  RouterKind router = RouterKind::kSoftmaxTopK;
  WeightFormat format = WeightFormat::kNvfp4;
  Activation activation = Activation::kSwiGLU;
  std::int64_t shared_intermediate = 0;

  bool operator==(const TuneShape&) const = default;
  // "H=6144 I=2048 E=256 k=8 sigmoid-group nvfp4 swiglu shared=2048"
  std::string to_string() const;
};
TuneShape tune_shape_of(const LayerDesc& layer);

struct TunedGemm {
  GemmChoice choice;
  double us = 0;  // median time of a forward with it at the bucket's token count (the tuner's)
};

struct TuneEntry {
  TuneShape shape;
  std::int64_t bucket = 0;
  TunedGemm gate_up;
  TunedGemm down;
};

struct TuneCache {
  TuneMetadata metadata;
  std::vector<TuneEntry> entries;

  // The entry for this layer's shape and the bucket of `tokens`; nullptr if there is none.
  const TuneEntry* find(const LayerDesc& layer, std::int64_t tokens) const;
  // Adds the entry, replacing one of the same shape and bucket.
  void put(const TuneEntry& entry);

  std::string to_json() const;
  // Throws Error (kBadFile) naming `origin` and what is wrong: not JSON, not an fp4moe tune
  // cache, a format version this build does not read, a missing or mistyped field.
  static TuneCache from_json(std::string_view text, const std::string& origin);
};

// The cache's path: `option` when non-empty (MoeLayerOptions::tune_cache_path, `--cache`), else
// $FP4MOE_TUNE_CACHE when set and non-empty, else $XDG_CACHE_HOME/fp4moe/tune.json, else
// $HOME/.cache/fp4moe/tune.json; empty when none of these is set.
std::string tune_cache_path(const std::string& option = {});

// Throws Error: kIo when the file cannot be read, kBadFile when it is malformed.
TuneCache read_tune_cache(const std::string& path);
// Atomic: the JSON goes to a temporary file in the same directory, is flushed, then renamed over
// `path`, so a reader sees the old cache or the new one, never part of one. Creates the
// directory. Throws Error (kIo).
void write_tune_cache(const TuneCache& cache, const std::string& path);

// What a layer does at construction: the cache at `path` if it exists, parses and was made with
// `device`'s metadata. Otherwise no cache and, unless the file is simply missing (then the
// planner decides, silently), a one-line `message` saying why it is ignored.
struct TuneCacheLoad {
  std::optional<TuneCache> cache;
  std::string message;
};
TuneCacheLoad load_tune_cache(const std::string& path, const TuneMetadata& device);

// The cache's configuration for GEMM `which` of a forward of `tokens` tokens of `layer` as a
// preference for planner::pick_layer_gemm (origin "tune cache <path>, bucket <b>"); nullopt when
// the cache has no entry for the layer's shape and T's bucket.
std::optional<GemmPreference> tuned_preference(const TuneCache& cache, const std::string& path,
                                               const LayerDesc& layer, std::int64_t tokens, GemmKind which);

// ---- the tuner --------------------------------------------------------------------------------

struct TuneOptions {
  LayerDesc layer;
  std::vector<std::int64_t> tokens;  // each maps to its bucket; duplicates are merged
  int device = -1;                   // CUDA device; -1: the current one
  // Candidates timed per GEMM and bucket: the layer's pick first, then the others nearest to it
  // (fewest differing parameters, then cheapest estimate); 0: every candidate the planner accepts.
  int max_configs = 0;
  // Instead (when not empty): the layer's pick, as the reference, and these configurations, by
  // the labels `fp4moe plan` prints ("n4 s8 w12", or with the family: "wgmma-gemm n4 s8 w12"),
  // wherever the planner accepts them; one that it accepts for no GEMM and bucket is an error.
  // max_configs is then ignored.
  std::vector<std::string> configs;
  bool quick = false;      // max_configs 6 (unless given), 2 warm-up launches and 7 samples
  int warmup = 3;          // launches before timing, per candidate
  int samples = 15;        // CUDA-event samples per candidate (the median counts)
  std::string cache_path;  // empty: tune_cache_path()
  std::uint64_t seed = 1;  // random weights and inputs
};

struct TuneTiming {
  std::int64_t bucket = 0;
  GemmKind gemm = GemmKind::kGateUp;
  GemmChoice choice;
  std::string label;  // "stream-gemm m4 n1 k2 s3 w8"
  double estimated_us = 0;
  double median_us = 0;
  bool layer_pick = false;  // what the layer runs without a cache
};

struct TuneReport {
  TuneMetadata metadata;
  std::string cache_path;
  std::string note;  // why an existing cache was replaced, if it was
  std::vector<TuneTiming> timings;
  std::vector<TuneEntry> entries;  // written to the cache
  // Per bucket and GEMM: the fastest, the layer's own pick and the speed-up over it.
  std::string to_string() const;
};

// Progress: called before each candidate is timed (done = how many have been) and once at the end.
using TuneProgress = std::function<void(int done, int total, const std::string& what)>;

// Times the candidates on the local GPU (random weights and inputs), never one the planner
// rejects, and writes the fastest per GEMM and bucket into the cache (merged with the entries
// already there when its metadata matches). Throws Error (kUnsupported without a GPU or CUDA).
TuneReport tune_layer(const TuneOptions& options, const TuneProgress& progress = {});

// The candidates tune_layer times for one GEMM: the pick, then the planner's other feasible
// candidates of every family ordered by their distance to it (how many parameters differ; another
// family is farthest), then by estimated cost; at most `max_configs` (0: all).
std::vector<CandidateVerdict> tune_candidates(const LayerGemmPlan& plan, int max_configs);

// The candidates tune_layer times with TuneOptions::configs: the pick, then the plan's feasible
// candidates whose label, or family and label ("wgmma-gemm n4 s8 w12"), is in `labels`, in the
// plan's order, each once. Labels the plan does not accept are skipped.
std::vector<CandidateVerdict> tune_candidates_named(const LayerGemmPlan& plan,
                                                    const std::vector<std::string>& labels);

}  // namespace fp4moe
