#include "cli/layer_options.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fp4moe/formats.hpp"
#include "fp4moe/layer.hpp"

namespace fp4moe::cli {

void LayerShapeOptions::add_to(CLI::App& cmd) {
  cmd.add_option("--shape", shape,
                 "Layer preset: " + fmt::format("{}", fmt::join(layer_preset_names(), ", ")))
      ->capture_default_str();
  cmd.add_option("--hidden", hidden, "Override the preset's hidden size");
  cmd.add_option("--intermediate", intermediate, "Override the preset's expert intermediate size");
  cmd.add_option("--experts", experts, "Override the preset's number of routed experts");
  cmd.add_option("--top-k", top_k, "Override the preset's experts per token");
  cmd.add_option("--shared", shared, "Override the shared expert's intermediate size (0: none)");
  cmd.add_option("--router", router, "Override the router: softmax, sigmoid-group, topk-softmax");
  cmd.add_option("--format", format, "Override the weight format: nvfp4, mxfp4");
  cmd.add_option("--activation", activation, "Override the activation: swiglu, swiglu-clamped");
}

bool LayerShapeOptions::overridden() const {
  return hidden || intermediate || experts || top_k || shared >= 0 || !router.empty() || !format.empty() ||
         !activation.empty();
}

void LayerShapeOptions::apply(LayerDesc& d) const {
  if (hidden) d.hidden = hidden;
  if (intermediate) d.intermediate = intermediate;
  if (experts) d.experts = experts;
  if (top_k) d.top_k = top_k;
  if (shared >= 0) d.shared_intermediate = shared;
  if (!router.empty()) d.router = parse_router_kind(router);
  if (!format.empty()) d.format = parse_weight_format(format);
  if (!activation.empty()) d.activation = parse_activation(activation);
}

}  // namespace fp4moe::cli
