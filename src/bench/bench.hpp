// `fp4moe bench`: the layer's speed against the hardware's own limits and an in-run baseline.
//
// Protocol (shared/BENCH.md): the two ceilings measured in the same run (device-to-device copy
// bandwidth counting bytes read + written; a dense 8192^3 BF16 cuBLAS GEMM); the floor of a
// shape = max(bytes that must move once / copy bandwidth, FLOPs / BF16 GEMM rate); random data
// of realistic scale; several input sets rotated; warm-up, then each forward timed with CUDA
// events around one CUDA-graph replay; median, min and max of >= 30 runs.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fp4moe/layer.hpp"

namespace fp4moe::bench {

struct BenchOptions {
  LayerDesc desc;
  std::string shape_name;  // preset name or "custom"
  std::vector<std::int64_t> tokens;
  int iterations = 50;
  int warmup = 5;
  int input_sets = 4;               // rotated so caches do not flatter small problems
  bool baseline = true;             // time the BF16 cuBLAS layer beside fp4moe
  bool stages = false;              // also time each stage in place (prefix graphs; GPU only)
  bool l2_prefetch = true;          // MoeLayerOptions::l2_prefetch (off: for A/B runs)
  bool l2_evict_first = true;       // MoeLayerOptions::l2_evict_first (off: for A/B runs)
  bool shared_prefetch = true;      // MoeLayerOptions::shared_prefetch (off: for A/B runs)
  bool small_expert_launch = true;  // MoeLayerOptions::small_expert_launch (off: for A/B runs)
  bool fused_routing = true;        // MoeLayerOptions::fused_routing (off: for A/B runs)
  // Time forward_routed (the engine routes: each set's ids and weights computed once before, by
  // fp4moe's router) instead of forward.
  bool caller_routing = false;
  int small_expert_tokens = -1;  // MoeLayerOptions::small_expert_tokens (-1: the layer's choice)
  // > 0: after timing each token count, replay its forward back to back for this many seconds
  // (an engine's steady load, where the GPU may run at its power cap): the time per forward, and
  // the energy per forward where the GPU's energy counter can be read (GPU only).
  double sustain_s = 0.0;
  // Read the SM clock (NVML) after every timed run of the layer, into the JSON beside each run's
  // time: whether a slow run ran at a lower clock, e.g. once the GPU reached its power cap (GPU
  // only; the read adds a few microseconds of idle between runs).
  bool trace_clock = false;
  // Zero the router's correction bias (sigmoid routers with one) in the random layer, so that each
  // token's top-k is a uniform random set of experts: the routing of ../shared/BENCH.md's anchors
  // (their floors imply ~30 active experts at T=4, ~223 at T=64 and all 256 from T=256 on). By
  // default the layer keeps its random bias, U(-0.05, 0.05), which decides most picks among the
  // near-saturated top sigmoid scores and gives a few experts ~3x the mean load (GLM-5: ~188
  // experts active at T=256). Softmax routers have no bias: the two are the same there.
  bool uniform_routing = false;
  std::uint64_t seed = 1;
  bool cpu = false;  // force the CPU reference backend
};

struct TimeStats {
  double median_us = 0.0;
  double min_us = 0.0;
  double max_us = 0.0;
  int runs = 0;
  std::vector<double> samples_us;  // every run's time, in run order (JSON only)
  std::vector<int>
      sm_clock_mhz;  // with BenchOptions::trace_clock: the SM clock after each run (0: the read failed)
  bool measured() const { return runs > 0; }
};

struct BenchRow {
  std::int64_t tokens = 0;
  double active_experts = 0.0;  // routed experts with >= 1 token, averaged over input sets
  double bytes = 0.0;           // weights of the active experts (+ shared) + x + logits + out
  double flops = 0.0;           // 2 * tokens * (k + shared) * 3 * H * I
  double floor_us = 0.0;
  TimeStats fp4moe;
  TimeStats baseline;
  // With BenchOptions::stages: the median of a graph of one empty kernel (what launching and
  // timing a graph costs by itself), then of the forward stopped after each ForwardStage, in
  // order (the last is the whole forward, timed again beside the others).
  double launch_us = 0.0;
  std::vector<double> prefix_us;
  std::string plan;  // what fp4moe ran
  // With BenchOptions::sustain_s: the forward replayed back to back, the input sets in turn.
  struct Sustained {
    double seconds = 0.0;  // GPU time of the whole run (one event pair around it)
    std::int64_t forwards = 0;
    double joules = -1.0;  // energy the GPU drew over the run; < 0: not measured
    double us_per_forward() const {
      return forwards > 0 ? seconds * 1e6 / static_cast<double>(forwards) : 0.0;
    }
    bool measured_energy() const { return joules >= 0.0; }
    double watts() const { return measured_energy() && seconds > 0.0 ? joules / seconds : -1.0; }
    double mj_per_forward() const {
      return measured_energy() && forwards > 0 ? 1e3 * joules / static_cast<double>(forwards) : -1.0;
    }
  };
  std::optional<Sustained> sustained;
  std::optional<Sustained> baseline_sustained;  // the BF16 layer's, when it was timed
};

struct BenchReport {
  std::string backend;  // "gpu" or "cpu"
  std::string note;     // one line shown first (e.g. why the CPU backend ran)
  std::string device;
  std::string commit;
  std::string version;
  int sm = 0;
  int sm_clock_mhz = 0;
  int memory_clock_mhz = 0;
  double copy_gbps = 0.0;
  double bf16_tflops = 0.0;
  std::string baseline_name;
  LayerDesc desc;
  std::string shape_name;
  std::string date;
  bool caller_routing = false;   // BenchOptions::caller_routing: forward_routed was timed
  bool uniform_routing = false;  // BenchOptions::uniform_routing: the router's correction bias zeroed
  double sustain_s = 0.0;        // BenchOptions::sustain_s
  std::string energy_note;       // with sustain_s: why the energy was not measured ("" when it was)
  bool trace_clock = false;      // BenchOptions::trace_clock
  std::string clock_note;        // with trace_clock: why the clock was not read ("" when it was)
  std::vector<BenchRow> rows;
};

using Progress = std::function<void(const std::string&)>;

// Median, min and max of run times (microseconds); the times themselves kept in run order.
TimeStats summarize(std::vector<double> us);
// A clock trace (TimeStats::sm_clock_mhz) read against the times: the clock's range and the runs
// at the highest clock seen against the others (median times; 0 runs: median 0).
struct ClockSplit {
  int min_mhz = 0, median_mhz = 0, max_mhz = 0;
  int runs_at_max = 0, runs_below = 0;
  double median_us_at_max = 0.0, median_us_below = 0.0;
};
// nullopt unless every run has a clock reading (none 0).
std::optional<ClockSplit> clock_split(const TimeStats& t);
// The benchmark's random layer: random_layer_weights(desc, seed), with the router's correction bias
// zeroed under BenchOptions::uniform_routing.
LayerWeights bench_weights(const BenchOptions& options);
// Today's date, UTC, as YYYY-MM-DD.
std::string utc_date();

// Runs on the GPU when there is one (and options.cpu is false), else on the CPU reference.
BenchReport run_bench(const BenchOptions& options, const Progress& progress);

// The small shape the CPU backend runs when there is no GPU.
LayerDesc cpu_default_desc();

std::string format_table(const BenchReport& report);
nlohmann::json to_json(const BenchReport& report);

// GPU half (bench/gpu_bench.cpp); throws kUnsupported without CUDA.
BenchReport run_gpu_bench(const BenchOptions& options, const Progress& progress);

}  // namespace fp4moe::bench
