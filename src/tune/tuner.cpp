// The autotuner: times the planner's feasible configurations of each expert GEMM per token bucket
// on the local GPU and writes the fastest to the tune cache (docs/TUNING.md). Host code: the
// timing itself is gpu::LayerTuning's (the layer's own launchers).
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>

#include "common/fail.hpp"
#include "fp4moe/tune.hpp"
#include "gpu/layer_tuning.hpp"

namespace fp4moe {
namespace {

// How many parameters of b differ from a's (another family: farther than any).
int distance(const CandidateVerdict& a, const CandidateVerdict& b) {
  if (a.family != b.family || a.params.size() != b.params.size()) return 1000;
  int d = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i) d += a.params[i] != b.params[i];
  return d;
}

// Whether `label` names c: its label, or its family and label ("wgmma-gemm n4 s8 w16").
bool named(const CandidateVerdict& c, const std::string& label) {
  return label == c.label || label == c.family + " " + c.label;
}

// Whether `label` names any of `candidates`.
bool names_any(const std::vector<CandidateVerdict>& candidates, const std::string& label) {
  return std::any_of(candidates.begin(), candidates.end(),
                     [&](const CandidateVerdict& c) { return named(c, label); });
}

struct Job {
  std::int64_t bucket = 0;
  GemmKind gemm = GemmKind::kGateUp;
  std::vector<CandidateVerdict> candidates;
  std::string pick_label;
};

}  // namespace

std::vector<CandidateVerdict> tune_candidates(const LayerGemmPlan& plan, int max_configs) {
  std::vector<CandidateVerdict> out;
  if (!plan.ok) return out;
  const CandidateVerdict& pick = plan.pick.verdict;
  out.push_back(pick);
  std::vector<CandidateVerdict> others;
  for (const auto& p : plan.plans) {
    for (const auto& c : p.candidates) {
      if (c.feasible && !(c.family == pick.family && c.label == pick.label)) others.push_back(c);
    }
  }
  std::stable_sort(others.begin(), others.end(), [&](const CandidateVerdict& x, const CandidateVerdict& y) {
    const int dx = distance(pick, x), dy = distance(pick, y);
    return dx != dy ? dx < dy : x.cost_us < y.cost_us;
  });
  out.insert(out.end(), others.begin(), others.end());
  if (max_configs > 0 && out.size() > static_cast<std::size_t>(max_configs)) {
    out.resize(static_cast<std::size_t>(max_configs));
  }
  return out;
}

std::vector<CandidateVerdict> tune_candidates_named(const LayerGemmPlan& plan,
                                                    const std::vector<std::string>& labels) {
  std::vector<CandidateVerdict> out;
  if (!plan.ok) return out;
  const CandidateVerdict& pick = plan.pick.verdict;
  out.push_back(pick);
  for (const auto& p : plan.plans) {
    for (const auto& c : p.candidates) {
      if (!c.feasible || (c.family == pick.family && c.label == pick.label)) continue;
      if (std::any_of(labels.begin(), labels.end(), [&](const std::string& l) { return named(c, l); })) {
        out.push_back(c);
      }
    }
  }
  return out;
}

TuneReport tune_layer(const TuneOptions& options, const TuneProgress& progress) {
  const auto report_progress = [&](int done, int total, const std::string& what) {
    if (progress) progress(done, total, what);
  };
  options.layer.validate();
  require(!options.tokens.empty(), "tune needs at least one token count");
  require(options.max_configs >= 0, "max_configs = {} must be >= 0 (0: every feasible candidate)",
          options.max_configs);
  const int max_configs = options.max_configs > 0 ? options.max_configs : (options.quick ? 6 : 0);
  // Configurations by name, as typed: "n4 s8 w16, n4 s6 w8" splits into labels with spaces.
  std::vector<std::string> configs;
  for (const auto& label : options.configs) {
    const auto first = label.find_first_not_of(' ');
    require(first != std::string::npos, "configs: an empty configuration label (in {} given)",
            options.configs.size());
    configs.push_back(label.substr(first, label.find_last_not_of(' ') - first + 1));
  }
  const int warmup = options.quick ? 2 : options.warmup;
  const int samples = options.quick ? 7 : options.samples;
  require(warmup >= 0 && samples >= 1, "warmup = {} must be >= 0 and samples = {} >= 1", warmup, samples);
  std::set<std::int64_t> bucket_set;
  for (const auto t : options.tokens) bucket_set.insert(token_bucket(t));
  const std::vector<std::int64_t> buckets(bucket_set.begin(), bucket_set.end());
  // A label that names no configuration of any kernel family (sm_90 plans all three; the lists do
  // not depend on T) is a typo: say so now, before the layer is built and uploaded (seconds to
  // minutes), and without a GPU. Whether this GPU accepts it is checked once the layer is there.
  if (!configs.empty()) {
    std::vector<CandidateVerdict> every;
    for (const auto kind : {GemmKind::kGateUp, GemmKind::kDown}) {
      for (const Plan& p :
           plan_layer_gemm(options.layer, buckets.front(), kind, arch_by_name("sm_90")).plans) {
        every.insert(every.end(), p.candidates.begin(), p.candidates.end());
      }
    }
    for (const auto& label : configs) {
      if (!names_any(every, label)) {
        fail(Errc::kInvalidArgument,
             "configuration '{}' names no configuration of fp4moe's GEMM kernels (stream-gemm, tile-gemm, "
             "wgmma-gemm); `fp4moe plan --arch sm_90` lists every family's candidates and their labels",
             label);
      }
    }
  }

  std::string why;
  const auto gpus = list_gpus(&why);
  if (gpus.empty()) fail(Errc::kUnsupported, "tuning needs a GPU: {}", why);
  TuneReport report;
  report.cache_path = tune_cache_path(options.cache_path);
  require(!report.cache_path.empty(),
          "no tune cache path: give one (--cache), or set FP4MOE_TUNE_CACHE, XDG_CACHE_HOME or HOME");

  report_progress(0, 0, fmt::format("random weights for {}", options.layer.to_string()));
  const LayerWeights weights = random_layer_weights(options.layer, options.seed);
  report_progress(0, 0, "uploading the layer");
  MoeLayerOptions lo;
  lo.max_tokens = buckets.back();
  lo.device = options.device;
  lo.use_tune_cache = false;  // the timings must not depend on an earlier cache
  const MoeLayer layer(weights, lo);
  report.metadata = tune_metadata_of(gpus.at(static_cast<std::size_t>(layer.device())));
  const ArchInfo& arch = gpu::LayerTuning::arch(layer);
  const KernelResources& resources = gpu::LayerTuning::resources(layer);

  // What to time: only candidates the planner accepts on this device with measured registers.
  std::vector<Job> jobs;
  int total = 0;
  for (const auto b : buckets) {
    for (const auto kind : {GemmKind::kGateUp, GemmKind::kDown}) {
      const LayerGemmPlan plan = plan_layer_gemm(options.layer, b, kind, arch, &resources);
      if (!plan.ok) fail(Errc::kDoesNotFit, "{}", plan.refusal);
      Job job{b, kind,
              configs.empty() ? tune_candidates(plan, max_configs) : tune_candidates_named(plan, configs),
              plan.pick.verdict.family + " " + plan.pick.verdict.label};
      total += static_cast<int>(job.candidates.size());
      jobs.push_back(std::move(job));
    }
  }
  // A configuration asked for by name that no GEMM and bucket accepts is most likely a typo.
  for (const auto& label : configs) {
    const bool found =
        std::any_of(jobs.begin(), jobs.end(), [&](const Job& j) { return names_any(j.candidates, label); });
    if (!found) {
      fail(Errc::kInvalidArgument,
           "configuration '{}' is not one the planner accepts for {} on this GPU at any of the token "
           "buckets tuned; `fp4moe plan --arch local` lists the candidates and their labels (e.g. '{}')",
           label, options.layer.to_string(), jobs.front().pick_label);
    }
  }

  int done = 0;
  for (const auto b : buckets) {
    gpu::LayerTuning timer(layer, b, options.seed + static_cast<std::uint64_t>(b));
    TuneEntry entry;
    entry.shape = tune_shape_of(options.layer);
    entry.bucket = b;
    for (const auto& job : jobs) {
      if (job.bucket != b) continue;
      TunedGemm best;
      // The candidates are timed interleaved (a sample of each in turn, gpu::LayerTuning::time_gemms):
      // at prefill sizes the GPU's clock drifts under its power cap over a run.
      std::vector<GemmChoice> choices;
      for (const auto& c : job.candidates) choices.push_back(choice_of_candidate(c));
      const int n = static_cast<int>(choices.size());
      const auto on_sample = [&](int round, int i) {
        const auto& c = job.candidates[static_cast<std::size_t>(i)];
        report_progress(done + (round * n + i) / samples, total,
                        fmt::format("T={} {} {} (sample {}/{})", b, gemm_kind_name(job.gemm),
                                    c.family + " " + c.label, round + 1, samples));
      };
      // Whole forwards (gpu::LayerTuning): the down GEMM's candidates beside the first GEMM's best
      // of this bucket (the jobs of a bucket run gate/up first), the first GEMM's beside the layer's
      // own down pick.
      std::optional<GemmChoice> other;
      if (job.gemm == GemmKind::kDown && entry.gate_up.us > 0) other = entry.gate_up.choice;
      const std::vector<gpu::GemmTiming> timings =
          timer.time_gemms(job.gemm, choices, warmup, samples, on_sample, other);
      for (std::size_t i = 0; i < job.candidates.size(); ++i) {
        const auto& c = job.candidates[i];
        TuneTiming t;
        t.bucket = b;
        t.gemm = job.gemm;
        t.choice = choices[i];
        t.label = c.family + " " + c.label;
        t.estimated_us = c.cost_us;
        t.median_us = timings[i].median();
        t.layer_pick = t.label == job.pick_label;
        if (best.us == 0 || t.median_us < best.us) best = {t.choice, t.median_us};
        report.timings.push_back(t);
      }
      done += n;
      (job.gemm == GemmKind::kGateUp ? entry.gate_up : entry.down) = best;
    }
    report.entries.push_back(entry);
  }
  report_progress(total, total, "done");

  TuneCache cache;
  const TuneCacheLoad existing = load_tune_cache(report.cache_path, report.metadata);
  if (existing.cache) {
    cache = *existing.cache;
  } else if (!existing.message.empty()) {
    report.note = "replaced: " + existing.message;
  }
  cache.metadata = report.metadata;
  for (const auto& e : report.entries) cache.put(e);
  write_tune_cache(cache, report.cache_path);
  return report;
}

std::string TuneReport::to_string() const {
  std::string s = fmt::format("tuned on {}\ncache: {}\n", metadata.to_string(), cache_path);
  if (!note.empty()) s += note + "\n";
  for (const auto& e : entries) {
    for (const auto kind : {GemmKind::kGateUp, GemmKind::kDown}) {
      const TunedGemm& best = kind == GemmKind::kGateUp ? e.gate_up : e.down;
      const TuneTiming* pick = nullptr;
      std::string rows;
      int n = 0;
      for (const auto& t : timings) {
        if (t.bucket != e.bucket || t.gemm != kind) continue;
        ++n;
        if (t.layer_pick) pick = &t;
        std::string mark;
        if (t.choice == best.choice) mark = "fastest";
        if (t.layer_pick) mark += std::string(mark.empty() ? "" : ", ") + "the layer's pick without a cache";
        rows += fmt::format("    {:<30}{:>12.2f}{:>14.2f}  {}\n", t.label, t.estimated_us, t.median_us, mark);
      }
      s += fmt::format("\nbucket T={} ({} to {} tokens), {}: {} candidate(s) timed\n", e.bucket, e.bucket,
                       2 * e.bucket - 1, gemm_kind_name(kind), n);
      // est. us: the planner's estimate of the GEMM; forward us: the whole forward measured with it.
      s += fmt::format("    {:<30}{:>12}{:>14}\n", "config", "est. us", "forward us");
      s += rows;
      if (pick != nullptr && best.us > 0) {
        s += fmt::format("  fastest: {} {:.2f} us a forward, {:.2f}x the layer's pick ({:.2f} us)\n",
                         gemm_choice_label(best.choice), best.us, pick->median_us / best.us, pick->median_us);
      }
    }
  }
  // One line per bucket: what the cache changes and what it gains a whole forward. The layer's own
  // forward is gate/up's row for its pick (the down GEMM as the layer picks it); the cache's is the
  // down GEMM's fastest row, timed beside gate/up's fastest.
  std::string summary;
  for (const auto& e : entries) {
    const auto find = [&](GemmKind kind, auto&& match) -> const TuneTiming* {
      for (const auto& t : timings) {
        if (t.bucket == e.bucket && t.gemm == kind && match(t)) return &t;
      }
      return nullptr;
    };
    const auto change = [&](GemmKind kind, const TunedGemm& best) -> std::string {
      const TuneTiming* pick = find(kind, [](const TuneTiming& t) { return t.layer_pick; });
      const TuneTiming* fastest = find(kind, [&](const TuneTiming& t) { return t.choice == best.choice; });
      if (fastest == nullptr) return "-";
      if (pick == nullptr) return fastest->label;
      return pick == fastest ? pick->label + " (kept)" : pick->label + " -> " + fastest->label;
    };
    const TuneTiming* own = find(GemmKind::kGateUp, [](const TuneTiming& t) { return t.layer_pick; });
    std::string forward = "-";
    if (own != nullptr && e.down.us > 0) {
      forward =
          fmt::format("{:.2f} -> {:.2f} us ({:.2f}x)", own->median_us, e.down.us, own->median_us / e.down.us);
    }
    summary += fmt::format("  T={:<6} gate/up {}; down {}; a forward {}\n", e.bucket,
                           change(GemmKind::kGateUp, e.gate_up), change(GemmKind::kDown, e.down), forward);
  }
  if (!summary.empty()) {
    s +=
        "\nsummary, per bucket: the layer's pick -> the cache's, and a whole forward with each (> 1.00x: the "
        "cache is faster)\n" +
        summary;
  }
  return s;
}

}  // namespace fp4moe
