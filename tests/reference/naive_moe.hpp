// An independent, naive evaluation of a MoE layer for testing the reference: written from the
// definitions in docs/NUMERICS.md, sharing no code with src/reference. Everything is in double,
// except the selection scores, which must be the definition's float values so that the picks
// match exactly (a double sigmoid would flip near-ties the float definition does not).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "fp4moe/bf16.hpp"
#include "fp4moe/detail/portable_math.hpp"
#include "fp4moe/formats.hpp"
#include "fp4moe/layer.hpp"

namespace fp4moe::test {

// Indices 0..n-1 stably sorted by score, larger first, NaN after every number: equal scores keep
// index order.
inline std::vector<int> order_by_score(const std::vector<float>& score) {
  std::vector<int> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
    const float sa = score[a], sb = score[b];
    if (std::isnan(sa) || std::isnan(sb)) return !std::isnan(sa) && std::isnan(sb);
    return sa > sb;
  });
  return idx;
}

struct NaiveRouting {
  std::vector<std::int32_t> ids;
  std::vector<double> weights;
};

inline NaiveRouting naive_route(const LayerDesc& d, const std::vector<float>& logits, std::int64_t tokens,
                                const std::vector<float>& correction_bias) {
  NaiveRouting r;
  const int e_count = static_cast<int>(d.experts);
  const int k = static_cast<int>(d.top_k);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::vector<float> l(logits.begin() + t * e_count, logits.begin() + (t + 1) * e_count);
    std::vector<int> picks;
    std::vector<double> w;
    if (d.router == RouterKind::kSigmoidGroupTopK) {
      std::vector<float> c(e_count);
      for (int i = 0; i < e_count; ++i) c[i] = detail::portable_sigmoid(l[i]) + correction_bias[i];
      const int group_size = e_count / static_cast<int>(d.n_group);
      std::vector<float> group_score(static_cast<std::size_t>(d.n_group));
      for (int g = 0; g < d.n_group; ++g) {
        std::vector<float> members(c.begin() + g * group_size, c.begin() + (g + 1) * group_size);
        const auto order = order_by_score(members);
        group_score[g] = group_size == 1 ? members[order[0]] : members[order[0]] + members[order[1]];
      }
      const auto group_order = order_by_score(group_score);
      std::vector<bool> kept(static_cast<std::size_t>(d.n_group), false);
      for (int g = 0; g < d.topk_group; ++g) kept[group_order[g]] = true;
      // Candidates in id order, so that the stable sort breaks ties by the lower id.
      std::vector<int> candidates;
      std::vector<float> candidate_score;
      for (int i = 0; i < e_count; ++i) {
        if (!kept[i / group_size]) continue;
        candidates.push_back(i);
        candidate_score.push_back(c[i]);
      }
      const auto order = order_by_score(candidate_score);
      for (int j = 0; j < k; ++j) picks.push_back(candidates[order[j]]);
      double sum = 0;
      for (int p : picks) {
        w.push_back(1.0 / (1.0 + std::exp(-static_cast<double>(l[p]))));
        sum += w.back();
      }
      for (double& v : w) v = (d.renormalize ? v / (sum + 1e-20) : v) * d.routed_scaling_factor;
    } else {
      const auto order = order_by_score(l);
      picks.assign(order.begin(), order.begin() + k);
      const double m = l[order[0]];
      if (d.router == RouterKind::kSoftmaxTopK) {
        double sum = 0;
        for (float v : l) sum += std::exp(v - m);
        double picked = 0;
        for (int p : picks) {
          w.push_back(std::exp(l[p] - m) / sum);
          picked += w.back();
        }
        if (d.renormalize) {
          for (double& v : w) v /= picked;
        }
      } else {
        double sum = 0;
        for (int p : picks) sum += std::exp(l[p] - m);
        for (int p : picks) w.push_back(std::exp(l[p] - m) / sum);
      }
    }
    r.ids.insert(r.ids.end(), picks.begin(), picks.end());
    r.weights.insert(r.weights.end(), w.begin(), w.end());
  }
  return r;
}

// e2m1 * scale * global in double, from the codecs.
inline std::vector<double> naive_dequantize(const QuantizedMatrix& q) {
  const std::int64_t block = q.format == WeightFormat::kNvfp4 ? 16 : 32;
  std::vector<double> out(static_cast<std::size_t>(q.rows * q.cols));
  for (std::int64_t r = 0; r < q.rows; ++r) {
    for (std::int64_t c = 0; c < q.cols; ++c) {
      const std::uint8_t byte = q.packed[static_cast<std::size_t>((r * q.cols + c) / 2)];
      const std::uint8_t code = c % 2 == 0 ? byte & 15 : byte >> 4;
      const std::uint8_t s = q.scales[static_cast<std::size_t>(r * (q.cols / block) + c / block)];
      const double scale = q.format == WeightFormat::kNvfp4 ? e4m3_to_float(s) : std::ldexp(1.0, s - 127);
      out[static_cast<std::size_t>(r * q.cols + c)] =
          static_cast<double>(e2m1_to_float(code)) * scale * q.global_scale;
    }
  }
  return out;
}

struct NaiveExpert {
  std::vector<double> gate, up, down;  // [I, H], [I, H], [H, I]
  std::int64_t intermediate = 0;
};

inline NaiveExpert naive_expert(const ExpertWeights& w) {
  return {naive_dequantize(w.gate), naive_dequantize(w.up), naive_dequantize(w.down), w.gate.rows};
}

// One expert applied to one token, in double: no intermediate rounding.
inline std::vector<double> naive_expert_output(const LayerDesc& d, const NaiveExpert& e,
                                               const ExpertWeights& w, const double* x,
                                               std::int64_t* clamp_hits) {
  const std::int64_t h_count = d.hidden;
  std::vector<double> a(static_cast<std::size_t>(e.intermediate));
  for (std::int64_t i = 0; i < e.intermediate; ++i) {
    double g = 0, u = 0;
    for (std::int64_t h = 0; h < h_count; ++h) {
      g += e.gate[static_cast<std::size_t>(i * h_count + h)] * x[h];
      u += e.up[static_cast<std::size_t>(i * h_count + h)] * x[h];
    }
    if (d.expert_bias) {
      g += w.gate_bias[static_cast<std::size_t>(i)];
      u += w.up_bias[static_cast<std::size_t>(i)];
    }
    if (d.activation == Activation::kSwiGLU) {
      a[static_cast<std::size_t>(i)] = g / (1.0 + std::exp(-g)) * u;
    } else {
      const double limit = d.swiglu_limit;
      if (clamp_hits && (g > limit || std::fabs(u) > limit)) ++*clamp_hits;
      g = std::min(g, limit);
      u = std::clamp(u, -limit, limit);
      a[static_cast<std::size_t>(i)] =
          g / (1.0 + std::exp(-static_cast<double>(d.swiglu_alpha) * g)) * (u + 1.0);
    }
  }
  std::vector<double> y(static_cast<std::size_t>(h_count));
  for (std::int64_t h = 0; h < h_count; ++h) {
    double acc = 0;
    for (std::int64_t i = 0; i < e.intermediate; ++i)
      acc += e.down[static_cast<std::size_t>(h * e.intermediate + i)] * a[static_cast<std::size_t>(i)];
    if (d.expert_bias) acc += w.down_bias[static_cast<std::size_t>(h)];
    y[static_cast<std::size_t>(h)] = acc;
  }
  return y;
}

struct NaiveResult {
  NaiveRouting routing;
  std::vector<double> out;      // [T, H]
  std::int64_t clamp_hits = 0;  // clamped SwiGLU: (row, token) pairs where the clamp changed g or u
};

inline NaiveResult naive_forward(const LayerWeights& w, const std::vector<Bf16>& x,
                                 const std::vector<float>& logits, std::int64_t tokens) {
  const LayerDesc& d = w.desc;
  NaiveResult r;
  r.routing = naive_route(d, logits, tokens, w.correction_bias);
  std::vector<NaiveExpert> experts;
  for (const auto& e : w.experts) experts.push_back(naive_expert(e));
  const NaiveExpert shared = w.shared ? naive_expert(*w.shared) : NaiveExpert{};
  r.out.assign(static_cast<std::size_t>(tokens * d.hidden), 0.0);
  std::vector<double> xt(static_cast<std::size_t>(d.hidden));
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < d.hidden; ++h)
      xt[static_cast<std::size_t>(h)] = x[static_cast<std::size_t>(t * d.hidden + h)].to_float();
    double* out = r.out.data() + t * d.hidden;
    for (std::int64_t j = 0; j < d.top_k; ++j) {
      const auto id = static_cast<std::size_t>(r.routing.ids[static_cast<std::size_t>(t * d.top_k + j)]);
      const auto y = naive_expert_output(d, experts[id], w.experts[id], xt.data(), &r.clamp_hits);
      for (std::int64_t h = 0; h < d.hidden; ++h)
        out[h] +=
            r.routing.weights[static_cast<std::size_t>(t * d.top_k + j)] * y[static_cast<std::size_t>(h)];
    }
    if (w.shared) {
      const auto y = naive_expert_output(d, shared, *w.shared, xt.data(), nullptr);
      for (std::int64_t h = 0; h < d.hidden; ++h) out[h] += y[static_cast<std::size_t>(h)];
    }
  }
  return r;
}

}  // namespace fp4moe::test
