// fp4moe tune: times the planner's feasible kernel configurations of a layer's expert GEMMs per
// token bucket on the local GPU and writes the fastest to the tune cache the layer reads.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/layer_options.hpp"
#include "common/fail.hpp"
#include "fp4moe/tune.hpp"

namespace fp4moe::cli {
namespace {

// "[#########           ] 12/40 T=16 gate_up stream-gemm m4 n1 k2 s3 w8", rewritten in place.
void draw_progress(int done, int total, const std::string& what) {
  if (total == 0) {
    fmt::print(stderr, "tune: {}\n", what);
    return;
  }
  constexpr int kWidth = 30;
  const int filled = done * kWidth / total;
  fmt::print(stderr, "\r[{}{}] {}/{} {:<56.56}", std::string(static_cast<std::size_t>(filled), '#'),
             std::string(static_cast<std::size_t>(kWidth - filled), ' '), done, total, what);
  if (done == total) fmt::print(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace

void register_tune(CLI::App& app) {
  auto* cmd = app.add_subcommand("tune",
                                 "Time every kernel configuration the planner accepts for a layer's expert "
                                 "GEMMs per token bucket on the "
                                 "local GPU, and write the fastest to the tune cache the layer reads");
  struct Opts {
    LayerShapeOptions layer;
    std::vector<std::int64_t> tokens;
    TuneOptions tune;
  };
  auto o = std::make_shared<Opts>();
  o->layer.add_to(*cmd);
  cmd->add_option("--tokens", o->tokens,
                  "Token counts, e.g. 1,16,4096: each is tuned at its bucket, the largest power of two <= it")
      ->required()
      ->expected(1, -1)
      ->delimiter(',');
  cmd->add_flag(
      "--quick", o->tune.quick,
      "Time only a handful of candidates around the layer's own pick (6 unless --max-configs), with "
      "fewer runs");
  auto* max_configs =
      cmd->add_option("--max-configs", o->tune.max_configs,
                      "Candidates timed per GEMM and bucket, nearest to the layer's pick first "
                      "(0: all)")
          ->capture_default_str();
  cmd->add_option("--configs", o->tune.configs,
                  "Time only these configurations (and the layer's pick, as the reference), by the labels "
                  "`fp4moe plan` prints, comma-separated: e.g. --configs 'n4 s8 w16,wgmma-gemm n4 s6 w8'")
      ->delimiter(',')
      ->excludes(max_configs);
  cmd->add_option("--warmup", o->tune.warmup, "Warm-up forwards per candidate")->capture_default_str();
  cmd->add_option("--samples", o->tune.samples, "Timed samples per candidate (the median counts)")
      ->capture_default_str();
  cmd->add_option("--cache", o->tune.cache_path,
                  "The cache file (default: $FP4MOE_TUNE_CACHE, else $XDG_CACHE_HOME/fp4moe/tune.json, else "
                  "~/.cache/fp4moe/tune.json)");
  cmd->add_option("--device", o->tune.device, "CUDA device (-1: the current one)")->capture_default_str();
  cmd->add_option("--seed", o->tune.seed, "Seed of the random weights and inputs")->capture_default_str();
  cmd->callback([o] {
    LayerDesc d = layer_preset(o->layer.shape);
    o->layer.apply(d);
    d.validate();
    for (const auto t : o->tokens) require(t >= 1, "--tokens: {} is not a positive token count", t);
    TuneOptions t = o->tune;
    t.layer = d;
    t.tokens = o->tokens;
    const TuneReport r = tune_layer(t, draw_progress);
    fmt::print("{}", r.to_string());
  });
}

}  // namespace fp4moe::cli
