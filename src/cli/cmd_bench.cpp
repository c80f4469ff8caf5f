// fp4moe bench: the layer's speed against the in-run ceilings and the BF16 cuBLAS layer.
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "bench/bench.hpp"
#include "cli/commands.hpp"
#include "cli/layer_options.hpp"
#include "common/fail.hpp"
#include "fp4moe/device.hpp"

namespace fp4moe::cli {
namespace {

std::vector<std::int64_t> parse_tokens(const std::string& s) {
  std::vector<std::int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(used == item.size() && v >= 1,
            "--tokens: '{}' is not a positive integer (expected e.g. 1,16,256)", item);
    out.push_back(v);
  }
  require(!out.empty(), "--tokens: empty list");
  return out;
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("bench", "Time the layer against the hardware's limits and a BF16 cuBLAS layer");
  struct Opts {
    LayerShapeOptions layer;
    std::string tokens;
    int iterations = 50, warmup = 5, sets = 4, small_expert_tokens = -1;
    bool no_baseline = false, cpu = false, stages = false, no_l2_prefetch = false, no_small_experts = false,
         no_l2_evict_first = false, no_shared_prefetch = false, no_fused_routing = false,
         caller_routing = false, trace_clock = false, uniform_routing = false;
    std::uint64_t seed = 1;
    double sustain = 0.0;
    std::string json;
  };
  auto o = std::make_shared<Opts>();
  o->layer.add_to(*cmd);
  cmd->add_option("--tokens", o->tokens,
                  "Comma-separated token counts (default 1,4,16,64,256,1024,4096,16384; CPU: 1,4,16,64)");
  cmd->add_option("--iterations", o->iterations, "Timed runs per token count (median, min, max)")
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Warm-up runs per input set")->capture_default_str();
  cmd->add_option("--sets", o->sets, "Input sets rotated between runs")->capture_default_str();
  cmd->add_flag("--no-baseline", o->no_baseline, "Skip the BF16 cuBLAS layer");
  cmd->add_flag("--cpu", o->cpu, "Run the CPU reference backend even where a GPU is present");
  cmd->add_flag("--stages", o->stages,
                "Also time each stage of the forward in place (routing, gather, gate/up, down, finalize: "
                "differences of forwards stopped after each; GPU only)");
  cmd->add_flag("--no-l2-prefetch", o->no_l2_prefetch,
                "Turn off the decode GEMM2's L2 prefetch (MoeLayerOptions::l2_prefetch; for A/B runs)");
  cmd->add_flag("--no-l2-evict-first", o->no_l2_evict_first,
                "Stream the decode kernel's weights with L2's normal eviction priority, not evict-first "
                "(MoeLayerOptions::l2_evict_first; for A/B runs)");
  cmd->add_flag("--no-shared-prefetch", o->no_shared_prefetch,
                "Turn off the shared expert's L2 prefetch while the first GEMM routes "
                "(MoeLayerOptions::shared_prefetch; for A/B runs)");
  cmd->add_flag(
      "--caller-routing", o->caller_routing,
      "Time forward_routed, the path of engines that route themselves: each input set's top-k ids "
      "and weights are computed once before, by fp4moe's router, and given (GPU only; no --stages)");
  cmd->add_flag("--no-fused-routing", o->no_fused_routing,
                "Route with the routing kernel at decode sizes, not in the first GEMM's CTAs "
                "(MoeLayerOptions::fused_routing; for A/B runs)");
  cmd->add_flag("--no-small-expert-launch", o->no_small_experts,
                "Run the experts of at most 16 tokens on the wgmma kernel too, not on the stream kernel "
                "(MoeLayerOptions::small_expert_launch; for A/B runs)");
  cmd->add_option("--small-expert-tokens", o->small_expert_tokens,
                  "The most tokens of an expert that the small-expert launch takes: 8 or 16, -1 the layer's "
                  "choice (MoeLayerOptions::small_expert_tokens; for A/B runs)")
      ->capture_default_str();
  cmd->add_option("--sustain", o->sustain,
                  "Also replay each token count's forward back to back for this many seconds (an engine's "
                  "steady load, where the GPU may run at its power cap): time per forward, average power and "
                  "energy per forward from the GPU's energy counter (NVML; GPU only)")
      ->capture_default_str();
  cmd->add_flag("--trace-clock", o->trace_clock,
                "Read the SM clock (NVML) after every timed run of the layer: the JSON gets each run's "
                "time and clock, the table the runs at the highest clock against the slower ones (GPU only)");
  cmd->add_flag("--uniform-routing", o->uniform_routing,
                "Zero the router's correction bias in the random layer, so that each token's top-k is a "
                "uniform random set of experts (the routing of the BENCH.md anchors: every expert active "
                "from T=256); by default its random bias gives a few experts ~3x the mean load");
  cmd->add_option("--seed", o->seed, "Seed of the random weights and inputs")->capture_default_str();
  cmd->add_option("--json", o->json, "Also write the results as JSON to this file");
  cmd->callback([o, cmd] {
    std::string why;
    const bool gpu = !o->cpu && !list_gpus(&why).empty();
    bench::BenchOptions b;
    const bool shape_given = cmd->count("--shape") > 0;
    if (gpu || shape_given) {
      b.desc = layer_preset(o->layer.shape);
      b.shape_name = o->layer.shape;
    } else {
      b.desc = bench::cpu_default_desc();
      b.shape_name = "cpu-small";
    }
    o->layer.apply(b.desc);
    if (o->layer.overridden()) b.shape_name += "-custom";
    b.desc.validate();
    b.tokens = o->tokens.empty() ? (gpu ? std::vector<std::int64_t>{1, 4, 16, 64, 256, 1024, 4096, 16384}
                                        : std::vector<std::int64_t>{1, 4, 16, 64})
                                 : parse_tokens(o->tokens);
    require(o->iterations >= 1, "--iterations = {} must be at least 1", o->iterations);
    require(o->sets >= 1, "--sets = {} must be at least 1", o->sets);
    b.iterations = o->iterations;
    b.warmup = o->warmup;
    b.input_sets = o->sets;
    b.baseline = !o->no_baseline;
    require(!o->stages || gpu, "--stages times the GPU kernels; this run has no GPU ({})",
            o->cpu ? "--cpu given" : why);
    b.stages = o->stages;
    b.l2_prefetch = !o->no_l2_prefetch;
    b.l2_evict_first = !o->no_l2_evict_first;
    b.shared_prefetch = !o->no_shared_prefetch;
    b.small_expert_launch = !o->no_small_experts;
    b.fused_routing = !o->no_fused_routing;
    require(!o->caller_routing || (gpu && !o->stages),
            "--caller-routing times the GPU layer's forward_routed, without --stages ({})",
            !gpu ? (o->cpu ? std::string("--cpu given") : why) : std::string("--stages given"));
    b.caller_routing = o->caller_routing;
    b.small_expert_tokens = o->small_expert_tokens;
    require(o->sustain >= 0.0 && o->sustain <= 600.0, "--sustain = {} must be 0 (off) to 600 seconds",
            o->sustain);
    require(o->sustain == 0.0 || gpu, "--sustain replays the GPU layer; this run has no GPU ({})",
            o->cpu ? "--cpu given" : why);
    b.sustain_s = o->sustain;
    require(!o->trace_clock || gpu, "--trace-clock reads the GPU's clock; this run has no GPU ({})",
            o->cpu ? "--cpu given" : why);
    b.trace_clock = o->trace_clock;
    b.seed = o->seed;
    b.cpu = o->cpu;
    b.uniform_routing = o->uniform_routing;
    const bench::BenchReport r =
        bench::run_bench(b, [](const std::string& msg) { fmt::print(stderr, "bench: {}\n", msg); });
    fmt::print("{}", bench::format_table(r));
    if (!o->json.empty()) {
      std::ofstream f(o->json);
      if (!f) fail(Errc::kIo, "cannot write --json file '{}'", o->json);
      f << bench::to_json(r).dump(2) << "\n";
    }
  });
}

}  // namespace fp4moe::cli
