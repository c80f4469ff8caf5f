// fp4moe run: one MoE layer of a model directory on given or random hidden states, with an
// optional check against the CPU reference.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "fp4moe/checkpoint.hpp"
#include "fp4moe/device.hpp"
#include "fp4moe/error.hpp"
#include "fp4moe/moe_layer.hpp"
#include "fp4moe/reference.hpp"
#include "fp4moe/safetensors.hpp"
#include "io/checkpoint_internal.hpp"

namespace fp4moe::cli {
namespace {

// NOTE: the output is BF16 (8 significant bits): rounding alone moves an element by up to 2^-9
// relative, and a backend that sums in another order can round the other way. 1e-2 relative L2
// leaves a wide margin over that while catching any real mistake (a wrong expert or scale gives
// errors of order 1).
constexpr double kDefaultTolerance = 1e-2;

enum class Backend { kCpuReference, kGpu };

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::kCpuReference:
      return "cpu-reference";
    case Backend::kGpu:
      return "gpu";
  }
  return "?";
}

// The backend that runs the layer, and why it was picked. "auto" takes the GPU when there is one
// and this build can drive it.
Backend choose_backend(const std::string& requested, std::string& why) {
  std::string no_gpu;
  const bool gpus = !list_gpus(&no_gpu).empty();
  if (requested == "cpu") {
    why = "asked for";
    return Backend::kCpuReference;
  }
  if (requested != "auto" && requested != "gpu") {
    throw Error(Errc::kInvalidArgument, fmt::format("--backend {}: expected auto, cpu or gpu", requested));
  }
  if (gpus) {
    why = requested == "gpu" ? "asked for" : "a GPU is present";
    return Backend::kGpu;
  }
  const std::string reason = "no GPU: " + no_gpu;
  if (requested == "gpu") throw Error(Errc::kUnsupported, "--backend gpu: " + reason);
  why = reason;
  return Backend::kCpuReference;
}

ReferenceResult run_backend(Backend backend, const LayerWeights& w, std::span<const Bf16> x,
                            std::span<const float> logits, std::int64_t tokens, int threads) {
  switch (backend) {
    case Backend::kCpuReference:
      return reference_forward(w, x, logits, tokens, ReferenceOptions{threads});
    case Backend::kGpu:
      return gpu_forward(w, x, logits, tokens);
  }
  throw Error(Errc::kInternal, "run: unhandled backend");
}

// Standard normal BF16 values from a fixed generator (Box-Muller on 53-bit uniforms), so a seed
// gives the same input on every platform.
std::vector<Bf16> random_hidden(std::int64_t count, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  const auto uniform = [&] { return (static_cast<double>(gen() >> 11) + 0.5) * 0x1p-53; };
  std::vector<Bf16> x(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < x.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform())), phi = 2.0 * M_PI * uniform();
    x[i] = Bf16::from_float(static_cast<float>(r * std::cos(phi)));
    if (i + 1 < x.size()) x[i + 1] = Bf16::from_float(static_cast<float>(r * std::sin(phi)));
  }
  return x;
}

// The hidden states in `path`: the tensor "hidden_states", or the file's only tensor; [T, H].
std::vector<Bf16> read_hidden(const std::string& path, std::int64_t hidden, std::int64_t& tokens,
                              std::string& what) {
  const auto f = SafetensorsFile::open(path);
  const TensorInfo* t = f.find("hidden_states");
  if (t == nullptr && f.tensors().size() == 1) t = &f.tensors().front();
  if (t == nullptr) {
    throw Error(Errc::kBadFile, fmt::format("{}: no tensor 'hidden_states' and {} tensors (expected one)",
                                            path, f.tensors().size()));
  }
  if (t->shape.size() != 2 || t->shape[1] != hidden ||
      (t->dtype != Dtype::kBF16 && t->dtype != Dtype::kF16 && t->dtype != Dtype::kF32)) {
    throw Error(Errc::kBadFile, fmt::format("{}: '{}' is {} {}, expected BF16, F16 or F32 [tokens, {}]", path,
                                            t->name, dtype_name(t->dtype), t->shape_string(), hidden));
  }
  tokens = t->shape[0];
  what = fmt::format("{} tensor '{}' {} {}", path, t->name, dtype_name(t->dtype), t->shape_string());
  const auto data = f.data(*t);
  std::vector<Bf16> x(static_cast<std::size_t>(t->numel()));
  std::vector<float> values(x.size());
  io::to_float(t->dtype, data, 0, values);  // F32 rounds to BF16 below (nearest even)
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = Bf16::from_float(values[i]);
  return x;
}

struct Comparison {
  double rel_l2 = 0.0;
  std::int64_t values_differ = 0;
  std::int64_t picks_differ = 0;
  std::int64_t first_pick_differ = -1;
  double max_weight_diff = 0.0;
};

Comparison compare(const ReferenceResult& got, const ReferenceResult& ref) {
  Comparison c;
  double diff2 = 0.0, ref2 = 0.0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const double g = got.out[i].to_float(), r = ref.out[i].to_float();
    diff2 += (g - r) * (g - r);
    ref2 += r * r;
    if (got.out[i].bits != ref.out[i].bits) ++c.values_differ;
  }
  c.rel_l2 = ref2 > 0.0 ? std::sqrt(diff2 / ref2) : (diff2 > 0.0 ? INFINITY : 0.0);
  for (std::size_t i = 0; i < ref.routing.ids.size(); ++i) {
    if (got.routing.ids[i] != ref.routing.ids[i] && c.picks_differ++ == 0)
      c.first_pick_differ = static_cast<std::int64_t>(i);
    c.max_weight_diff = std::max(
        c.max_weight_diff, std::fabs(static_cast<double>(got.routing.weights[i]) - ref.routing.weights[i]));
  }
  return c;
}

void write_output(const std::string& path, const ReferenceResult& r, std::span<const Bf16> x,
                  std::int64_t tokens, std::int64_t hidden, std::int64_t top_k, const std::string& model,
                  std::int64_t layer, Backend backend) {
  SafetensorsWriter w;
  const auto bytes = [](const auto& v) {
    return std::span(reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * sizeof(v[0]));
  };
  w.add("output", Dtype::kBF16, {tokens, hidden}, bytes(r.out));
  w.add("hidden_states", Dtype::kBF16, {tokens, hidden}, bytes(x));
  w.add("routing_ids", Dtype::kI32, {tokens, top_k}, bytes(r.routing.ids));
  w.add("routing_weights", Dtype::kF32, {tokens, top_k}, bytes(r.routing.weights));
  w.set_metadata("model", model);
  w.set_metadata("layer", std::to_string(layer));
  w.set_metadata("backend", std::string(backend_name(backend)));
  w.write(path);
}

struct Args {
  std::string model, input, output, backend = "auto";
  std::int64_t layer = -1;
  std::int64_t tokens = 1;
  std::uint64_t seed = 1;
  bool check = false;
  double tolerance = kDefaultTolerance;
  int threads = 0;
};

void run(const Args& a) {
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto t0 = Clock::now();
  const LayerWeights w = load_moe_layer(a.model, a.layer);
  const LayerDesc& d = w.desc;
  fmt::print("layer {} of {}: {}\n", a.layer, a.model, d.to_string());
  fmt::print("loaded in {:.2f} s\n", seconds(t0));

  std::int64_t tokens = a.tokens;
  std::string what;
  std::vector<Bf16> x;
  if (!a.input.empty()) {
    x = read_hidden(a.input, d.hidden, tokens, what);
  } else {
    if (tokens < 0) throw Error(Errc::kInvalidArgument, fmt::format("--tokens {}: expected >= 0", tokens));
    x = random_hidden(tokens * d.hidden, a.seed);
    what = fmt::format("random standard normal BF16, seed {}", a.seed);
  }
  fmt::print("input: {} tokens ({})\n", tokens, what);

  std::string why;
  const Backend backend = choose_backend(a.backend, why);
  fmt::print("backend: {} ({})\n", backend_name(backend), why);
  const std::vector<float> logits = router_logits(w, x, tokens);
  t0 = Clock::now();
  const ReferenceResult out = run_backend(backend, w, x, logits, tokens, a.threads);
  fmt::print("ran in {:.3f} ms\n", seconds(t0) * 1e3);
  double norm2 = 0.0;
  for (const auto v : out.out) norm2 += static_cast<double>(v.to_float()) * v.to_float();
  fmt::print("output: BF16 [{}, {}], L2 norm {:.6g}\n", tokens, d.hidden, std::sqrt(norm2));
  if (!a.output.empty()) {
    write_output(a.output, out, x, tokens, d.hidden, d.top_k, a.model, a.layer, backend);
    fmt::print("wrote {} (output, hidden_states, routing_ids, routing_weights)\n", a.output);
  }
  if (!a.check) return;

  const ReferenceResult ref = reference_forward(w, x, logits, tokens, ReferenceOptions{a.threads});
  const Comparison c = compare(out, ref);
  fmt::print("check: {} vs the CPU reference: relative L2 error {:.3g} ({} of {} values differ)\n",
             backend_name(backend), c.rel_l2, c.values_differ, ref.out.size());
  if (c.picks_differ == 0) {
    fmt::print("check: routing ids identical ({} picks), max |weight difference| {:.3g}\n",
               ref.routing.ids.size(), c.max_weight_diff);
  } else {
    const auto i = c.first_pick_differ;
    fmt::print(
        "check: routing ids differ in {} of {} picks, the first at token {} rank {}: expert {} vs {}\n",
        c.picks_differ, ref.routing.ids.size(), i / d.top_k, i % d.top_k, out.routing.ids[i],
        ref.routing.ids[i]);
  }
  const bool pass = c.picks_differ == 0 && c.rel_l2 <= a.tolerance;
  fmt::print("check: {} (tolerance {:g})\n", pass ? "PASS" : "FAIL", a.tolerance);
  if (!pass)
    throw Error(Errc::kInvalidArgument, "run --check: the backend's output does not match the reference");
}

}  // namespace

void register_run(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd =
      app.add_subcommand("run", "Run one MoE layer of a model directory (GPU when present, else CPU)");
  cmd->add_option("--model", args->model, "model directory (config.json + safetensors)")->required();
  cmd->add_option("--layer", args->layer, "layer index")->required();
  auto* tokens =
      cmd->add_option("--tokens", args->tokens, "random standard normal hidden states for T tokens")
          ->capture_default_str();
  cmd->add_option("--input", args->input,
                  "hidden states from a safetensors file ('hidden_states' or its only tensor)")
      ->excludes(tokens);
  cmd->add_option("--output", args->output,
                  "write output, hidden_states and routing to this safetensors file");
  cmd->add_option("--seed", args->seed, "seed of the random hidden states")->capture_default_str();
  cmd->add_option("--backend", args->backend, "auto, cpu or gpu")->capture_default_str();
  cmd->add_flag("--check", args->check, "compare with the CPU reference: relative L2 error and routing ids");
  cmd->add_option("--tolerance", args->tolerance, "largest relative L2 error --check accepts")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "CPU threads (0: all cores)")->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace fp4moe::cli
