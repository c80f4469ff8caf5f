#include "bench/bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <iterator>
#include <random>
#include <set>

#include "fp4moe/device.hpp"
#include "fp4moe/moe_layer.hpp"
#include "fp4moe/reference.hpp"
#include "fp4moe/version.hpp"

namespace fp4moe::bench {

TimeStats summarize(std::vector<double> us) {
  TimeStats s;
  if (us.empty()) return s;
  s.samples_us = us;
  std::sort(us.begin(), us.end());
  s.runs = static_cast<int>(us.size());
  s.min_us = us.front();
  s.max_us = us.back();
  s.median_us = us.size() % 2 ? us[us.size() / 2] : 0.5 * (us[us.size() / 2 - 1] + us[us.size() / 2]);
  return s;
}

std::optional<ClockSplit> clock_split(const TimeStats& t) {
  if (t.samples_us.empty() || t.sm_clock_mhz.size() != t.samples_us.size()) return std::nullopt;
  ClockSplit c;
  std::vector<int> mhz = t.sm_clock_mhz;
  if (std::find(mhz.begin(), mhz.end(), 0) != mhz.end()) return std::nullopt;  // a read failed
  std::sort(mhz.begin(), mhz.end());
  c.min_mhz = mhz.front();
  c.max_mhz = mhz.back();
  c.median_mhz = mhz[mhz.size() / 2];
  std::vector<double> top, below;
  for (std::size_t i = 0; i < t.samples_us.size(); ++i)
    (t.sm_clock_mhz[i] == c.max_mhz ? top : below).push_back(t.samples_us[i]);
  c.runs_at_max = static_cast<int>(top.size());
  c.runs_below = static_cast<int>(below.size());
  c.median_us_at_max = summarize(top).median_us;
  c.median_us_below = summarize(below).median_us;
  return c;
}

std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

namespace {

// The CPU backend: the reference forward on a small shape, wall-clock medians.
BenchReport run_cpu_bench(const BenchOptions& options, const std::string& why, const Progress& progress) {
  BenchReport r;
  r.backend = "cpu";
  r.desc = options.desc;
  r.shape_name = options.shape_name;
  r.note = why;
  r.device = "CPU (reference backend)";
  r.commit = build_commit();
  r.version = version();
  r.date = utc_date();
  r.uniform_routing = options.uniform_routing;
  const LayerDesc& d = options.desc;
  progress("generating random weights");
  const LayerWeights w = bench_weights(options);
  for (const std::int64_t t : options.tokens) {
    progress(fmt::format("T={}", t));
    std::mt19937_64 rng(options.seed + static_cast<std::uint64_t>(t));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<Bf16> x(static_cast<std::size_t>(t * d.hidden));
    for (auto& v : x) v = Bf16::from_float(dist(rng));
    std::vector<float> logits(static_cast<std::size_t>(t * d.experts));
    for (auto& v : logits) v = 2.0f * dist(rng);
    std::vector<double> times;
    ReferenceResult res;
    const int runs = std::max(3, std::min(options.iterations, 10));
    for (int i = 0; i < runs; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      res = reference_forward(w, x, logits, t);
      const auto t1 = std::chrono::steady_clock::now();
      times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    BenchRow row;
    row.tokens = t;
    row.active_experts =
        static_cast<double>(std::set<std::int32_t>(res.routing.ids.begin(), res.routing.ids.end()).size());
    row.fp4moe = summarize(times);
    row.flops = 2.0 * static_cast<double>(t) *
                (static_cast<double>(d.top_k) * 3.0 * d.hidden * d.intermediate +
                 3.0 * d.hidden * d.shared_intermediate);
    row.plan = "reference_forward";
    r.rows.push_back(row);
  }
  return r;
}

}  // namespace

LayerWeights bench_weights(const BenchOptions& options) {
  LayerWeights w = random_layer_weights(options.desc, options.seed);
  if (options.uniform_routing) std::fill(w.correction_bias.begin(), w.correction_bias.end(), 0.0f);
  return w;
}

LayerDesc cpu_default_desc() {
  LayerDesc d;
  d.hidden = 1024;
  d.intermediate = 512;
  d.experts = 32;
  d.top_k = 4;
  d.router = RouterKind::kSigmoidGroupTopK;
  d.routed_scaling_factor = 2.5f;
  d.shared_intermediate = 512;
  return d;
}

BenchReport run_bench(const BenchOptions& options, const Progress& progress) {
  std::string why;
  const bool gpu = !options.cpu && !list_gpus(&why).empty();
  if (gpu) return run_gpu_bench(options, progress);
  if (options.cpu) why = "--cpu given";
  return run_cpu_bench(options, why, progress);
}

// Said above the table under BenchOptions::uniform_routing.
constexpr const char* kUniformRoutingLine =
    "routing: the router's correction bias zeroed (--uniform-routing): each token's top-k is a uniform "
    "random set of experts\n";

std::string format_table(const BenchReport& r) {
  std::string s;
  if (r.backend == "gpu") {
    s += fmt::format("fp4moe bench: {} ({}), {} on {} (sm_{}), commit {}, {}\n", r.shape_name,
                     r.desc.to_string(), r.backend, r.device, r.sm, r.commit, r.date);
    s += fmt::format(
        "ceilings measured in this run: copy {:.0f} GB/s (read + write), dense BF16 GEMM {:.0f} TFLOP/s\n",
        r.copy_gbps, r.bf16_tflops);
    if (r.caller_routing) s += "fp4moe timed through forward_routed: ids and weights given, no routing\n";
    if (r.uniform_routing) s += kUniformRoutingLine;
    s += fmt::format("{:>6} {:>7} {:>10} {:>10} {:>10} {:>8} {:>8} {:>10} {:>7} {:>11} {:>8}\n", "tokens",
                     "active", "time us", "min us", "max us", "GB/s", "TFLOP/s", "floor us", "%floor",
                     "bf16 us", "speedup");
    for (const auto& row : r.rows) {
      const double t = row.fp4moe.median_us;
      s += fmt::format(
          "{:>6} {:>7.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>8.0f} {:>8.1f} {:>10.1f} {:>6.0f}% {:>11} {:>8}\n",
          row.tokens, row.active_experts, t, row.fp4moe.min_us, row.fp4moe.max_us, row.bytes / t * 1e-3,
          row.flops / t * 1e-6, row.floor_us, 100.0 * row.floor_us / t,
          row.baseline.measured() ? fmt::format("{:.1f}", row.baseline.median_us) : "-",
          row.baseline.measured() ? fmt::format("{:.2f}x", row.baseline.median_us / t) : "-");
    }
    if (!r.baseline_name.empty()) s += fmt::format("baseline: {}\n", r.baseline_name);
    if (r.trace_clock && !r.clock_note.empty()) s += fmt::format("clock not traced: {}\n", r.clock_note);
    if (r.trace_clock && r.clock_note.empty()) {
      s += "SM clock after each timed run of fp4moe (MHz), and the runs' median at the highest clock "
           "seen and below it:\n";
      s += fmt::format("{:>6} {:>7} {:>7} {:>7} {:>10} {:>10} {:>10} {:>10}\n", "tokens", "min", "median",
                       "max", "runs @max", "us @max", "runs below", "us below");
      for (const auto& row : r.rows) {
        const std::optional<ClockSplit> c = clock_split(row.fp4moe);
        if (!c) continue;
        s += fmt::format("{:>6} {:>7} {:>7} {:>7} {:>10} {:>10.1f} {:>10} {:>10}\n", row.tokens, c->min_mhz,
                         c->median_mhz, c->max_mhz, c->runs_at_max, c->median_us_at_max, c->runs_below,
                         c->runs_below > 0 ? fmt::format("{:.1f}", c->median_us_below) : "-");
      }
    }
    const bool sustained = std::any_of(r.rows.begin(), r.rows.end(),
                                       [](const BenchRow& row) { return row.sustained.has_value(); });
    if (sustained) {
      s += fmt::format(
          "sustained: each forward replayed back to back for {:g} s (an engine's steady load; "
          "the GPU may run at its power cap):\n",
          r.sustain_s);
      const bool base = std::any_of(r.rows.begin(), r.rows.end(),
                                    [](const BenchRow& row) { return row.baseline_sustained.has_value(); });
      s += fmt::format("{:>6} {:>10} {:>9} {:>7} {:>8} {:>8} {:>10}", "tokens", "time us", "forwards",
                       "%floor", "vs burst", "watts", "mJ/forward");
      s += base ? fmt::format(" {:>11} {:>8} {:>13}\n", "bf16 us", "speedup", "bf16 mJ/fwd") : "\n";
      const auto mj = [](const BenchRow::Sustained& x) {
        return x.measured_energy() ? fmt::format("{:.2f}", x.mj_per_forward()) : "-";
      };
      for (const auto& row : r.rows) {
        if (!row.sustained) continue;
        const BenchRow::Sustained& u = *row.sustained;
        const double t = u.us_per_forward();
        s += fmt::format("{:>6} {:>10.1f} {:>9} {:>6.0f}% {:>7.2f}x {:>8} {:>10}", row.tokens, t, u.forwards,
                         100.0 * row.floor_us / t, row.fp4moe.median_us / t,
                         u.measured_energy() ? fmt::format("{:.0f}", u.watts()) : "-", mj(u));
        if (row.baseline_sustained) {
          const BenchRow::Sustained& b = *row.baseline_sustained;
          s +=
              fmt::format(" {:>11.1f} {:>7.2f}x {:>13}\n", b.us_per_forward(), b.us_per_forward() / t, mj(b));
        } else {
          s += base ? fmt::format(" {:>11} {:>8} {:>13}\n", "-", "-", "-") : "\n";
        }
      }
      if (!r.energy_note.empty()) s += fmt::format("energy not measured: {}\n", r.energy_note);
    }
    const bool stages = std::any_of(r.rows.begin(), r.rows.end(), [](const BenchRow& row) {
      return row.prefix_us.size() == std::size(kForwardStages);
    });
    if (stages) {
      s += "stages in place (us: the difference of the medians of two prefix graphs, each a forward stopped "
           "after the stage; launch: a graph of one empty kernel; gather runs only before a wgmma first "
           "GEMM):\n";
      s += fmt::format("{:>6} {:>9}", "tokens", "launch");
      for (const ForwardStage st : kForwardStages) s += fmt::format(" {:>9}", forward_stage_name(st));
      s += fmt::format(" {:>9}\n", "sum");
      for (const auto& row : r.rows) {
        if (row.prefix_us.size() != std::size(kForwardStages)) continue;
        s += fmt::format("{:>6} {:>9.1f}", row.tokens, row.launch_us);
        double prev = row.launch_us;
        for (const double p : row.prefix_us) {
          s += fmt::format(" {:>9.1f}", p - prev);
          prev = p;
        }
        s += fmt::format(" {:>9.1f}\n", prev);
      }
    }
  } else {
    s += fmt::format("fp4moe bench: no GPU ({}): running the CPU reference backend on a smaller shape ({})\n",
                     r.note, r.desc.to_string());
    if (r.uniform_routing) s += kUniformRoutingLine;
    s += fmt::format("{:>6} {:>7} {:>12} {:>12} {:>12} {:>9}\n", "tokens", "active", "time us", "min us",
                     "max us", "GFLOP/s");
    for (const auto& row : r.rows) {
      s += fmt::format("{:>6} {:>7.0f} {:>12.0f} {:>12.0f} {:>12.0f} {:>9.2f}\n", row.tokens,
                       row.active_experts, row.fp4moe.median_us, row.fp4moe.min_us, row.fp4moe.max_us,
                       row.flops / row.fp4moe.median_us * 1e-3);
    }
  }
  return s;
}

nlohmann::json to_json(const BenchReport& r) {
  nlohmann::json j;
  j["backend"] = r.backend;
  j["note"] = r.note;
  j["device"] = r.device;
  j["sm"] = r.sm;
  j["sm_clock_mhz"] = r.sm_clock_mhz;
  j["memory_clock_mhz"] = r.memory_clock_mhz;
  j["commit"] = r.commit;
  j["version"] = r.version;
  j["date"] = r.date;
  j["shape"] = r.shape_name;
  j["layer"] = r.desc.to_string();
  j["caller_routing"] = r.caller_routing;
  j["uniform_routing"] = r.uniform_routing;
  j["sustain_s"] = r.sustain_s;
  if (r.sustain_s > 0.0) j["energy_note"] = r.energy_note;
  j["trace_clock"] = r.trace_clock;
  if (r.trace_clock) j["clock_note"] = r.clock_note;
  j["ceilings"] = {{"copy_gbps", r.copy_gbps}, {"bf16_gemm_tflops", r.bf16_tflops}};
  j["baseline"] = r.baseline_name;
  // Energy figures are null where the counter was not read.
  auto sustained_json = [](const BenchRow::Sustained& u) {
    const auto or_null = [&](double v) {
      return u.measured_energy() ? nlohmann::json(v) : nlohmann::json(nullptr);
    };
    return nlohmann::json{{"seconds", u.seconds},
                          {"forwards", u.forwards},
                          {"us_per_forward", u.us_per_forward()},
                          {"joules", or_null(u.joules)},
                          {"watts", or_null(u.watts())},
                          {"mj_per_forward", or_null(u.mj_per_forward())}};
  };
  auto stats_json = [](const TimeStats& s) {
    nlohmann::json x{{"median_us", s.median_us},
                     {"min_us", s.min_us},
                     {"max_us", s.max_us},
                     {"runs", s.runs},
                     {"samples_us", s.samples_us}};
    if (!s.sm_clock_mhz.empty()) x["sm_clock_mhz"] = s.sm_clock_mhz;
    return x;
  };
  for (const auto& row : r.rows) {
    nlohmann::json x{{"tokens", row.tokens},     {"active_experts", row.active_experts},
                     {"bytes", row.bytes},       {"flops", row.flops},
                     {"floor_us", row.floor_us}, {"fp4moe", stats_json(row.fp4moe)},
                     {"plan", row.plan}};
    if (row.fp4moe.measured() && row.floor_us > 0.0) {
      x["fraction_of_floor"] = row.floor_us / row.fp4moe.median_us;
      x["gbps"] = row.bytes / row.fp4moe.median_us * 1e-3;
      x["tflops"] = row.flops / row.fp4moe.median_us * 1e-6;
    }
    if (row.prefix_us.size() == std::size(kForwardStages)) {
      x["stages_us"]["launch"] = row.launch_us;
      double prev = row.launch_us;
      for (std::size_t i = 0; i < row.prefix_us.size(); ++i) {
        x["stages_us"][forward_stage_name(kForwardStages[i])] = row.prefix_us[i] - prev;
        prev = row.prefix_us[i];
      }
    }
    if (row.sustained) x["sustained"] = sustained_json(*row.sustained);
    if (row.baseline_sustained) x["baseline_sustained"] = sustained_json(*row.baseline_sustained);
    if (row.baseline.measured()) {
      x["baseline"] = stats_json(row.baseline);
      x["speedup_over_baseline"] = row.baseline.median_us / row.fp4moe.median_us;
    }
    j["rows"].push_back(x);
  }
  return j;
}

}  // namespace fp4moe::bench
