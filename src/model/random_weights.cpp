// Random layer weights drawn directly as E2M1 codes and scale codes: a full GLM-5 layer (9.7e9
// values, 5.4 GB) takes seconds, where quantizing random floats would take minutes.
//
// Every matrix draws from its own splitmix64 stream seeded by (seed, expert, stream), and every
// matrix is one work item, so the bytes never depend on the thread count.
#include <array>
#include <cstdint>

#include "fp4moe/bf16.hpp"
#include "fp4moe/detail/portable_math.hpp"
#include "model/parallel_for.hpp"
#include "model/random_weights.hpp"

namespace fp4moe {
namespace detail {
namespace {

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return mix64(state_);
  }
  // Uniform in [0, 1) with 24 random bits: exact in float, the same on every platform.
  float uniform() { return static_cast<float>(next() >> 40) * 0x1p-24f; }

 private:
  std::uint64_t state_;
};

enum Stream : std::uint64_t {
  kGate,
  kUp,
  kDown,
  kGateUpGlobalScale,
  kDownGlobalScale,
  kBiases,
  kCorrectionBias
};

SplitMix64 stream(std::uint64_t seed, std::int64_t expert, Stream s) {
  return SplitMix64(mix64(seed) ^ mix64((static_cast<std::uint64_t>(expert) << 4) + s + 1));
}

// E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 drawn with counts out of 128 that follow ModelOpt's
// output for Gaussian weights: a block's amax (about 2 sigma for 16 Gaussian values) maps to 6, so
// values are |N(0, 3)| rounded to the E2M1 grid, whose rounding intervals (midpoints 0.25, 0.75,
// 1.25, 1.75, 2.5, 3.5, 5) hold 6.6%, 13.1%, 12.6%, 11.7%, 15.5%, 16.1%, 14.8% and 9.5%.
constexpr std::array<int, 8> kMagnitudeCounts = {8, 17, 16, 15, 20, 21, 19, 12};

// A code from 8 random bits: bit 7 the sign, bits 0-6 the magnitude. Zero is always +0.
constexpr std::uint8_t e2m1_code_from_bits(unsigned bits) {
  unsigned r = bits & 127u;
  std::uint8_t magnitude = 0;
  while (r >= static_cast<unsigned>(kMagnitudeCounts[magnitude])) r -= kMagnitudeCounts[magnitude++];
  if (magnitude == 0) return 0;
  return static_cast<std::uint8_t>(magnitude | ((bits >> 7) << 3));
}

// A packed byte (two codes) from 16 random bits.
const std::array<std::uint8_t, 65536>& packed_byte_table() {
  static const auto table = [] {
    std::array<std::uint8_t, 65536> t{};
    for (unsigned i = 0; i < t.size(); ++i) {
      t[i] = static_cast<std::uint8_t>(e2m1_code_from_bits(i & 0xffu) | (e2m1_code_from_bits(i >> 8) << 4));
    }
    return t;
  }();
  return table;
}

// Each 64-bit draw gives four 16-bit fields; `from_field` maps one to a byte.
template <typename FromField>
void fill_bytes(std::vector<std::uint8_t>& bytes, SplitMix64& rng, const FromField& from_field) {
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const std::uint64_t u = rng.next();
    for (int f = 0; f < 4; ++f) bytes[i + f] = from_field(static_cast<unsigned>((u >> (16 * f)) & 0xffffu));
  }
  if (i < n) {
    const std::uint64_t u = rng.next();
    for (int f = 0; i < n; ++i, ++f) bytes[i] = from_field(static_cast<unsigned>((u >> (16 * f)) & 0xffffu));
  }
}

// NVFP4 block scales: E4M3 codes 0x68..0x7e (64..448), uniform over the codes and so roughly
// uniform in log2: ModelOpt maps the tensor's largest block to 448 and smaller blocks below it.
constexpr std::uint8_t kE4M3Code64 = 0x68;
constexpr unsigned kE4M3CodesTo448 = 0x7e - 0x68 + 1;
// MXFP4 block scales: UE8M0 codes 119..122 (2^-8..2^-5), so that weights are ~0.01-0.05.
constexpr std::uint8_t kUe8m0Code2PowMinus8 = 119;

// NVFP4 weight_scale_2 log-uniform in [2e-5, 1e-4): with codes ~2 and scales ~200, weights are
// ~0.01-0.05 in magnitude, as in trained checkpoints. portable_exp keeps it platform independent.
float draw_global_scale(SplitMix64 rng) {
  constexpr float kLow = 2e-5f;
  constexpr float kLn5 = 1.60943791243f;  // ln(1e-4 / 2e-5)
  return pm_mul(kLow, portable_exp(pm_mul(rng.uniform(), kLn5)));
}

QuantizedMatrix random_matrix(WeightFormat format, std::int64_t rows, std::int64_t cols, float global_scale,
                              SplitMix64 rng) {
  QuantizedMatrix q;
  q.format = format;
  q.rows = rows;
  q.cols = cols;
  q.global_scale = format == WeightFormat::kNvfp4 ? global_scale : 1.0f;
  q.packed.resize(static_cast<std::size_t>(rows * (cols / 2)));
  q.scales.resize(static_cast<std::size_t>(rows * (cols / block_size(format))));
  const auto& table = packed_byte_table();
  fill_bytes(q.packed, rng, [&table](unsigned field) { return table[field]; });
  if (format == WeightFormat::kNvfp4) {
    fill_bytes(q.scales, rng, [](unsigned field) {
      return static_cast<std::uint8_t>(kE4M3Code64 + ((field * kE4M3CodesTo448) >> 16));
    });
  } else {
    fill_bytes(q.scales, rng,
               [](unsigned field) { return static_cast<std::uint8_t>(kUe8m0Code2PowMinus8 + (field & 3u)); });
  }
  return q;
}

// Biases as gpt-oss stores them (BF16), small: uniform in [-0.05, 0.05).
std::vector<float> random_bias(std::int64_t size, SplitMix64& rng) {
  std::vector<float> bias(static_cast<std::size_t>(size));
  for (float& b : bias) b = round_to_bf16(pm_mul(pm_add(rng.uniform(), -0.5f), 0.1f));
  return bias;
}

}  // namespace

LayerWeights random_layer_weights(const LayerDesc& desc, std::uint64_t seed, int threads) {
  desc.validate();
  LayerWeights w;
  w.desc = desc;
  w.experts.resize(static_cast<std::size_t>(desc.experts));
  if (desc.shared_intermediate > 0) w.shared.emplace();
  const std::int64_t expert_count = desc.experts + (w.shared ? 1 : 0);  // the shared expert is number E
  auto expert_at = [&w](std::int64_t e) -> ExpertWeights& {
    return e < static_cast<std::int64_t>(w.experts.size()) ? w.experts[static_cast<std::size_t>(e)]
                                                           : *w.shared;
  };
  parallel_for(expert_count * 3, resolve_threads(threads), [&](std::int64_t item) {
    const std::int64_t e = item / 3;
    const std::int64_t inter = e < desc.experts ? desc.intermediate : desc.shared_intermediate;
    ExpertWeights& ew = expert_at(e);
    // gate_proj and up_proj share one weight_scale_2, as in ModelOpt checkpoints.
    const float gate_up_scale = draw_global_scale(stream(seed, e, kGateUpGlobalScale));
    switch (item % 3) {
      case 0:
        ew.gate = random_matrix(desc.format, inter, desc.hidden, gate_up_scale, stream(seed, e, kGate));
        break;
      case 1:
        ew.up = random_matrix(desc.format, inter, desc.hidden, gate_up_scale, stream(seed, e, kUp));
        break;
      default:
        ew.down = random_matrix(desc.format, desc.hidden, inter,
                                draw_global_scale(stream(seed, e, kDownGlobalScale)), stream(seed, e, kDown));
    }
  });
  if (desc.expert_bias) {
    for (std::int64_t e = 0; e < expert_count; ++e) {
      const std::int64_t inter = e < desc.experts ? desc.intermediate : desc.shared_intermediate;
      SplitMix64 rng = stream(seed, e, kBiases);
      ExpertWeights& ew = expert_at(e);
      ew.gate_bias = random_bias(inter, rng);
      ew.up_bias = random_bias(inter, rng);
      ew.down_bias = random_bias(desc.hidden, rng);
    }
  }
  if (desc.router == RouterKind::kSigmoidGroupTopK) {
    // e_score_correction_bias: small next to the spread of sigmoid scores, so it shifts near-ties
    // without deciding every pick. Uniform in [-0.05, 0.05).
    SplitMix64 rng = stream(seed, expert_count, kCorrectionBias);
    w.correction_bias.resize(static_cast<std::size_t>(desc.experts));
    for (float& b : w.correction_bias) b = pm_mul(pm_add(rng.uniform(), -0.5f), 0.1f);
  }
  return w;
}

}  // namespace detail

LayerWeights random_layer_weights(const LayerDesc& desc, std::uint64_t seed) {
  return detail::random_layer_weights(desc, seed, 0);
}

}  // namespace fp4moe
