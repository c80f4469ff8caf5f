// One expert GEMM's configuration of a MoeLayer timed in the layer's forward, for the autotuner
// (src/tune): whole forwards with the configuration in place, so what is timed is what a forward
// runs. Implemented in moe_layer.cpp (it reads the layer's internals).
// CUDA-free: host code without nvcc includes it; without CUDA every entry point throws
// Error (kUnsupported).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "fp4moe/arch.hpp"
#include "fp4moe/moe_layer.hpp"
#include "fp4moe/planner.hpp"

namespace fp4moe::gpu {

struct GemmTiming {
  std::vector<double> us;  // microseconds per launch, one value per sample
  int launches_per_sample = 1;
  double median() const;
};

class LayerTuning {
 public:
  // The architecture (the device's figures) and the measured kernel resources the layer plans with.
  static const ArchInfo& arch(const MoeLayer& layer);
  static const KernelResources& resources(const MoeLayer& layer);

  // Random device inputs of `tokens` tokens for `layer` (x bf16 ~ N(0, 1), logits fp32 ~ N(0, 2),
  // deterministic in seed) and a stream of its own. tokens <= the layer's max_tokens.
  LayerTuning(const MoeLayer& layer, std::int64_t tokens, std::uint64_t seed);
  ~LayerTuning();
  LayerTuning(const LayerTuning&) = delete;
  LayerTuning& operator=(const LayerTuning&) = delete;

  // Times GEMM `which` run with `choice`: first the layer's decision with `choice` forced, so a
  // configuration the planner rejects throws Error with the planner's reason and is never
  // launched; then whole forwards of the layer with that decision (the other GEMM as the layer
  // picks it), captured as CUDA graphs, one per input set of four rotated as `fp4moe bench`
  // rotates them: `warmup` forwards, and `samples` samples of back-to-back forwards between two
  // CUDA events (as many per sample as take about 200 us, at most 100). So what is timed is what a
  // forward runs with the choice: its routing (fused into the first GEMM at decode sizes where
  // the choice allows), tail and small-expert launches, PDL overlap and finalize, with the
  // weights coming from memory as in a forward (timed alone, back to back, a small layer's GEMM
  // found its weights in L2). GemmTiming::us are microseconds per forward.
  GemmTiming time_gemm(GemmKind which, const GemmChoice& choice, int warmup, int samples);
  // The same for several choices, interleaved: every choice is checked first (a rejected one
  // throws before anything runs); then round r = 0 .. samples-1 takes sample r of each choice in
  // turn (round 0 after capturing its forwards, its `warmup` forwards and the sizing forward,
  // later rounds after one settling forward), so that drift over the run (clocks under the power
  // cap) reaches every choice alike. progress(round, index), if set, is called before each sample.
  // `other`, when given, runs the other GEMM in every forward instead of the layer's pick (the
  // tuner's best for it so far); it is checked by the planner first as well.
  std::vector<GemmTiming> time_gemms(GemmKind which, const std::vector<GemmChoice>& choices, int warmup,
                                     int samples, const std::function<void(int, int)>& progress = {},
                                     const std::optional<GemmChoice>& other = std::nullopt);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe::gpu
