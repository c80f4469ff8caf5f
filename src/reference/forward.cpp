// The CPU reference forward pass.
//
// Work is grouped by expert: every (expert, token) pair that routing produced becomes a row of
// that expert's job, and each weight row is dequantized once and applied to all of the job's
// tokens. Three parallel phases, each writing values that exactly one work item computes:
//   A. gate/up: items = (job, 16 rows of I): a[n, i] = bf16(act(gate_i . x_n, up_i . x_n));
//   B. down:    items = (job, 16 rows of H): y[slot, h] = down_h . a[n];
//   C. reduce:  items = 16 tokens: out[t, h] = bf16(sum_j w_j * y[t*k + j, h] (+ y_shared[t, h])).
// Every value is computed by one fixed sequence of float operations whichever thread runs it, so
// the result is bitwise the same for any thread count.
#include <limits>

#include "common/fail.hpp"
#include "formats/dequantize_row.hpp"
#include "fp4moe/detail/portable_math.hpp"
#include "fp4moe/reference.hpp"
#include "model/parallel_for.hpp"

namespace fp4moe {
namespace {

using detail::pm_add;
using detail::pm_mul;

constexpr std::int64_t kRowsPerItem = 16;
constexpr std::int64_t kTokensPerItem = 16;

// A dot product of n floats (n a multiple of 8, which every block size guarantees) in a fixed
// order: 8 interleaved fp32 partial sums (lane l takes the elements i = l mod 8, in order), then a
// pairwise tree. The explicit lanes let the compiler vectorize without reassociating anything.
float dot(const float* a, const float* b, std::int64_t n) {
  float acc[8] = {};
  for (std::int64_t i = 0; i < n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] = pm_add(acc[l], pm_mul(a[i + l], b[i + l]));
  }
  return pm_add(pm_add(pm_add(acc[0], acc[1]), pm_add(acc[2], acc[3])),
                pm_add(pm_add(acc[4], acc[5]), pm_add(acc[6], acc[7])));
}

float activate(const LayerDesc& d, float g, float u) {
  if (d.activation == Activation::kSwiGLU) return pm_mul(detail::portable_silu(g), u);
  // Written with comparisons rather than std::fmin/fminf so that a NaN g or u stays NaN.
  const float limit = d.swiglu_limit;
  g = g > limit ? limit : g;
  u = u > limit ? limit : (u < -limit ? -limit : u);
  return pm_mul(pm_mul(g, detail::portable_sigmoid(pm_mul(d.swiglu_alpha, g))), pm_add(u, 1.0f));
}

// One expert and the tokens routed to it.
struct Job {
  const ExpertWeights* weights = nullptr;
  std::int64_t intermediate = 0;
  std::vector<std::int64_t> tokens;  // token of each row, ascending
  std::vector<std::int64_t> slots;   // the row's slot in the y buffer
  std::vector<float> a;              // [tokens, intermediate], BF16 values
};

struct Item {
  std::size_t job;
  std::int64_t begin, end;  // rows of I (phase A) or of H (phase B)
};

std::vector<Item> row_items(const std::vector<Job>& jobs, bool down) {
  std::vector<Item> items;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const std::int64_t rows = down ? jobs[j].weights->down.rows : jobs[j].intermediate;
    for (std::int64_t r = 0; r < rows; r += kRowsPerItem)
      items.push_back({j, r, std::min(rows, r + kRowsPerItem)});
  }
  return items;
}

void check_routing(const LayerDesc& d, const Routing& routing) {
  require(routing.tokens >= 0, "routing: tokens={} is negative", routing.tokens);
  require(routing.top_k == d.top_k, "routing: top_k={}, expected the layer's top_k={}", routing.top_k,
          d.top_k);
  require(routing.tokens <= std::numeric_limits<std::int64_t>::max() / d.top_k / d.hidden,
          "routing: tokens={} is too large", routing.tokens);
  const std::int64_t n = routing.tokens * routing.top_k;
  require(static_cast<std::int64_t>(routing.ids.size()) == n &&
              static_cast<std::int64_t>(routing.weights.size()) == n,
          "routing: {} ids and {} weights, expected tokens * top_k = {} * {} = {} of each",
          routing.ids.size(), routing.weights.size(), routing.tokens, routing.top_k, n);
  for (std::int64_t s = 0; s < n; ++s) {
    const std::int32_t id = routing.ids[static_cast<std::size_t>(s)];
    require(id >= 0 && id < d.experts, "routing: token {} pick {} is expert {}, expected 0..{}", s / d.top_k,
            s % d.top_k, id, d.experts - 1);
  }
}

}  // namespace

ReferenceResult reference_forward_routed(const LayerWeights& weights, std::span<const Bf16> x,
                                         const Routing& routing, const ReferenceOptions& options) {
  weights.validate();
  const LayerDesc& d = weights.desc;
  check_routing(d, routing);
  const std::int64_t tokens = routing.tokens;
  const std::int64_t k = d.top_k;
  const std::int64_t hidden = d.hidden;
  require(static_cast<std::int64_t>(x.size()) == tokens * hidden,
          "x holds {} values, expected tokens * hidden = {} * {} = {}", x.size(), tokens, hidden,
          tokens * hidden);
  const int threads = detail::resolve_threads(options.threads);

  ReferenceResult result;
  result.routing = routing;
  result.out.resize(static_cast<std::size_t>(tokens * hidden));
  if (tokens == 0) return result;

  std::vector<float> xf(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xf[i] = x[i].to_float();

  // Jobs: the routed experts with at least one token, then the shared expert (every token). The
  // y buffer holds slot t*k + j for pick j of token t, then slot tokens*k + t for the shared expert.
  std::vector<Job> jobs(static_cast<std::size_t>(d.experts));
  for (std::int64_t s = 0; s < tokens * k; ++s) {
    Job& job = jobs[static_cast<std::size_t>(routing.ids[static_cast<std::size_t>(s)])];
    job.tokens.push_back(s / k);
    job.slots.push_back(s);
  }
  for (std::size_t e = 0; e < jobs.size(); ++e) {
    jobs[e].weights = &weights.experts[e];
    jobs[e].intermediate = d.intermediate;
  }
  std::erase_if(jobs, [](const Job& j) { return j.tokens.empty(); });
  if (weights.shared) {
    Job& job = jobs.emplace_back();
    job.weights = &*weights.shared;
    job.intermediate = d.shared_intermediate;
    for (std::int64_t t = 0; t < tokens; ++t) {
      job.tokens.push_back(t);
      job.slots.push_back(tokens * k + t);
    }
  }
  for (Job& job : jobs) job.a.resize(job.tokens.size() * static_cast<std::size_t>(job.intermediate));
  const std::int64_t slots = tokens * k + (weights.shared ? tokens : 0);
  std::vector<float> y(static_cast<std::size_t>(slots * hidden));

  const std::vector<Item> gate_up_items = row_items(jobs, false);
  detail::parallel_for(static_cast<std::int64_t>(gate_up_items.size()), threads, [&](std::int64_t i) {
    const Item& item = gate_up_items[static_cast<std::size_t>(i)];
    Job& job = jobs[item.job];
    const ExpertWeights& w = *job.weights;
    std::vector<float> gate_row(static_cast<std::size_t>(hidden));
    std::vector<float> up_row(static_cast<std::size_t>(hidden));
    for (std::int64_t r = item.begin; r < item.end; ++r) {
      detail::dequantize_row(w.gate, r, gate_row.data());
      detail::dequantize_row(w.up, r, up_row.data());
      for (std::size_t n = 0; n < job.tokens.size(); ++n) {
        const float* xt = xf.data() + job.tokens[n] * hidden;
        float g = dot(gate_row.data(), xt, hidden);
        float u = dot(up_row.data(), xt, hidden);
        if (d.expert_bias) {
          g = pm_add(g, w.gate_bias[static_cast<std::size_t>(r)]);
          u = pm_add(u, w.up_bias[static_cast<std::size_t>(r)]);
        }
        job.a[n * static_cast<std::size_t>(job.intermediate) + static_cast<std::size_t>(r)] =
            round_to_bf16(activate(d, g, u));
      }
    }
  });

  const std::vector<Item> down_items = row_items(jobs, true);
  detail::parallel_for(static_cast<std::int64_t>(down_items.size()), threads, [&](std::int64_t i) {
    const Item& item = down_items[static_cast<std::size_t>(i)];
    const Job& job = jobs[item.job];
    const ExpertWeights& w = *job.weights;
    std::vector<float> down_row(static_cast<std::size_t>(job.intermediate));
    for (std::int64_t h = item.begin; h < item.end; ++h) {
      detail::dequantize_row(w.down, h, down_row.data());
      for (std::size_t n = 0; n < job.tokens.size(); ++n) {
        float v = dot(down_row.data(), job.a.data() + n * static_cast<std::size_t>(job.intermediate),
                      job.intermediate);
        if (d.expert_bias) v = pm_add(v, w.down_bias[static_cast<std::size_t>(h)]);
        y[static_cast<std::size_t>(job.slots[n] * hidden + h)] = v;
      }
    }
  });

  const std::int64_t token_items = (tokens + kTokensPerItem - 1) / kTokensPerItem;
  detail::parallel_for(token_items, threads, [&](std::int64_t i) {
    for (std::int64_t t = i * kTokensPerItem; t < std::min(tokens, (i + 1) * kTokensPerItem); ++t) {
      const float* w = routing.weights.data() + t * k;
      for (std::int64_t h = 0; h < hidden; ++h) {
        float acc = pm_mul(w[0], y[static_cast<std::size_t>((t * k) * hidden + h)]);
        for (std::int64_t j = 1; j < k; ++j)
          acc = pm_add(acc, pm_mul(w[j], y[static_cast<std::size_t>((t * k + j) * hidden + h)]));
        if (weights.shared) acc = pm_add(acc, y[static_cast<std::size_t>((tokens * k + t) * hidden + h)]);
        result.out[static_cast<std::size_t>(t * hidden + h)] = Bf16::from_float(acc);
      }
    }
  });
  return result;
}

ReferenceResult reference_forward(const LayerWeights& weights, std::span<const Bf16> x,
                                  std::span<const float> router_logits, std::int64_t tokens,
                                  const ReferenceOptions& options) {
  weights.validate();
  const LayerDesc& d = weights.desc;
  require(tokens >= 0 && tokens <= std::numeric_limits<std::int64_t>::max() / d.hidden,
          "reference_forward: tokens={} is out of range", tokens);
  require(static_cast<std::int64_t>(x.size()) == tokens * d.hidden,
          "x holds {} values, expected tokens * hidden = {} * {} = {}", x.size(), tokens, d.hidden,
          tokens * d.hidden);
  return reference_forward_routed(weights, x, route(d, router_logits, tokens, weights.correction_bias),
                                  options);
}

std::vector<float> router_logits(const LayerWeights& weights, std::span<const Bf16> x, std::int64_t tokens) {
  weights.validate();
  const LayerDesc& d = weights.desc;
  require(!weights.router_weight.empty(), "router_logits: the layer has no router_weight (expected [{}, {}])",
          d.experts, d.hidden);
  require(tokens >= 0 && tokens <= std::numeric_limits<std::int64_t>::max() / d.hidden / d.experts,
          "router_logits: tokens={} is out of range", tokens);
  require(static_cast<std::int64_t>(x.size()) == tokens * d.hidden,
          "router_logits: x holds {} values, expected tokens * hidden = {} * {} = {}", x.size(), tokens,
          d.hidden, tokens * d.hidden);
  std::vector<float> logits(static_cast<std::size_t>(tokens * d.experts));
  const std::int64_t token_items = (tokens + kTokensPerItem - 1) / kTokensPerItem;
  detail::parallel_for(token_items, detail::resolve_threads(0), [&](std::int64_t i) {
    std::vector<float> xt(static_cast<std::size_t>(d.hidden));
    for (std::int64_t t = i * kTokensPerItem; t < std::min(tokens, (i + 1) * kTokensPerItem); ++t) {
      for (std::int64_t h = 0; h < d.hidden; ++h)
        xt[static_cast<std::size_t>(h)] = x[static_cast<std::size_t>(t * d.hidden + h)].to_float();
      for (std::int64_t e = 0; e < d.experts; ++e) {
        float v = dot(weights.router_weight.data() + e * d.hidden, xt.data(), d.hidden);
        if (!weights.router_logit_bias.empty())
          v = pm_add(v, weights.router_logit_bias[static_cast<std::size_t>(e)]);
        logits[static_cast<std::size_t>(t * d.experts + e)] = v;
      }
    }
  });
  return logits;
}

}  // namespace fp4moe
