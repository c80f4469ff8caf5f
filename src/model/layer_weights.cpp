// LayerWeights::validate: every size the reference and the GPU paths rely on, checked up front.
#include <string>

#include "common/fail.hpp"
#include "fp4moe/layer.hpp"

namespace fp4moe {
namespace {

void check_matrix(const std::string& where, const QuantizedMatrix& m, WeightFormat format, std::int64_t rows,
                  std::int64_t cols) {
  require(m.format == format, "{}: format {}, expected {} (the layer's format)", where, format_name(m.format),
          format_name(format));
  require(m.rows == rows && m.cols == cols, "{}: shape [{}, {}], expected [{}, {}]", where, m.rows, m.cols,
          rows, cols);
  try {
    m.validate();
  } catch (const Error& e) {
    fail(e.code(), "{}: {}", where, e.what());
  }
}

void check_bias(const std::string& where, const std::vector<float>& bias, bool present, std::int64_t size) {
  if (present) {
    require(static_cast<std::int64_t>(bias.size()) == size, "{}: {} values, expected {} (expert_bias is set)",
            where, bias.size(), size);
  } else {
    require(bias.empty(), "{}: {} values, expected none (expert_bias is not set)", where, bias.size());
  }
}

void check_expert(const std::string& name, const ExpertWeights& w, const LayerDesc& d,
                  std::int64_t intermediate) {
  check_matrix(name + " gate", w.gate, d.format, intermediate, d.hidden);
  check_matrix(name + " up", w.up, d.format, intermediate, d.hidden);
  check_matrix(name + " down", w.down, d.format, d.hidden, intermediate);
  check_bias(name + " gate_bias", w.gate_bias, d.expert_bias, intermediate);
  check_bias(name + " up_bias", w.up_bias, d.expert_bias, intermediate);
  check_bias(name + " down_bias", w.down_bias, d.expert_bias, d.hidden);
}

}  // namespace

void LayerWeights::validate() const {
  desc.validate();
  require(static_cast<std::int64_t>(experts.size()) == desc.experts,
          "layer weights hold {} experts, expected {}", experts.size(), desc.experts);
  for (std::size_t e = 0; e < experts.size(); ++e) {
    check_expert("expert " + std::to_string(e), experts[e], desc, desc.intermediate);
  }
  if (desc.shared_intermediate > 0) {
    require(shared.has_value(), "shared expert missing: shared_intermediate={} expects one",
            desc.shared_intermediate);
    check_expert("shared expert", *shared, desc, desc.shared_intermediate);
  } else {
    require(!shared.has_value(), "shared expert present, but shared_intermediate=0 expects none");
  }
  if (desc.router == RouterKind::kSigmoidGroupTopK) {
    require(static_cast<std::int64_t>(correction_bias.size()) == desc.experts,
            "correction_bias holds {} values, expected experts={} (sigmoid-group router)",
            correction_bias.size(), desc.experts);
  } else {
    require(correction_bias.empty(), "correction_bias holds {} values, expected none for the {} router",
            correction_bias.size(), router_name(desc.router));
  }
  if (!router_weight.empty()) {
    require(static_cast<std::int64_t>(router_weight.size()) == desc.experts * desc.hidden,
            "router_weight holds {} values, expected experts * hidden = {} * {} = {}", router_weight.size(),
            desc.experts, desc.hidden, desc.experts * desc.hidden);
  }
  require(router_logit_bias.empty() ||
              (!router_weight.empty() && static_cast<std::int64_t>(router_logit_bias.size()) == desc.experts),
          "router_logit_bias holds {} values, expected none or experts={} (and only with a router_weight)",
          router_logit_bias.size(), desc.experts);
}

}  // namespace fp4moe
