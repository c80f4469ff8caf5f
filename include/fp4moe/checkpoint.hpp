// fp4moe: model checkpoints as users hold them (Hugging Face directories of safetensors).
//
//   inspect_model        what a file or model directory holds: tensors, quantization, MoE layers,
//                        and anomalies (NaN/Inf, zero scales, gate/up scales that differ).
//   load_moe_layer       one MoE layer as LayerDesc + LayerWeights, from the ModelOpt NVFP4
//                        layout, the same layout with MXFP4 scales, or gpt-oss MXFP4 blocks.
//   quantize_checkpoint  BF16/F16/F32 weights -> the ModelOpt NVFP4 (or MXFP4) layout.
//
// Names, dtypes, shapes and the rules checked are listed in docs/CHECKPOINTS.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp4moe/formats.hpp"
#include "fp4moe/layer.hpp"
#include "fp4moe/safetensors.hpp"

namespace fp4moe {

// How a MoE layer's routed experts are stored.
enum class ExpertLayout : std::uint8_t {
  // experts.{e}.{gate,up,down}_proj.{weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
  // weight_scale_2 F32 [], input_scale F32 [] (optional)}
  kModelOptNvfp4,
  // the same names with weight_scale U8 or F8_E8M0 [N, K/32] and no weight_scale_2
  // (what `fp4moe quantize --format mxfp4` writes)
  kModelOptMxfp4,
  // experts.gate_up_proj_{blocks U8 [E, 2I, H/32, 16], scales U8 [E, 2I, H/32], bias [E, 2I]}
  // with gate and up rows interleaved (even rows gate), experts.down_proj_{blocks,scales,bias}
  kGptOssMxfp4,
  // experts.{e}.{gate,up,down}_proj.weight in BF16, F16 or F32
  kUnquantized,
};
std::string_view expert_layout_name(ExpertLayout layout) noexcept;  // "modelopt-nvfp4", ...

// The quantization a model declares: hf_quant_config.json ("quantization" block) or, without
// it, the "quantization_config" block of config.json.
struct QuantConfig {
  std::string source;                        // "hf_quant_config.json" or "config.json quantization_config"
  std::string algo;                          // quant_algo or quant_method as written ("NVFP4", "mxfp4")
  std::optional<WeightFormat> format;        // when algo names NVFP4 or MXFP4
  std::string producer;                      // "modelopt 0.29.0", when given
  int group_size = 0;                        // 0 when not given
  std::vector<std::string> exclude_modules;  // wildcards: '*' any run of characters, '?' one

  // The first exclude pattern matching `module` (a tensor name less its last component), or "".
  std::string excluded_by(std::string_view module) const;
};

struct MoeLayerInfo {
  std::int64_t layer = 0;
  std::string prefix;  // "model.layers.3.mlp"
  ExpertLayout layout = ExpertLayout::kModelOptNvfp4;
  std::int64_t experts = 0;  // routed experts found
  std::int64_t hidden = 0;   // from the tensor shapes (0 when they could not tell)
  std::int64_t intermediate = 0;
  std::int64_t shared_intermediate = 0;  // 0: no shared expert
  std::string router;                    // the router weight's tensor name, "" when none
  bool correction_bias = false;          // e_score_correction_bias present
};

struct ModelInfo {
  std::filesystem::path path;
  std::vector<std::filesystem::path> files;  // the safetensors files
  std::vector<TensorInfo> tensors;           // every tensor, sorted by name
  std::uint64_t tensor_bytes = 0;
  std::string model_type;         // config.json "model_type", "" without config.json
  std::optional<LayerDesc> desc;  // the MoE layer config.json describes
  std::string desc_error;         // why desc is absent, when there is a config.json
  std::optional<QuantConfig> quant;
  std::vector<MoeLayerInfo> moe_layers;  // ascending layer index
  std::vector<std::string> warnings;
};

struct InspectOptions {
  // Reads the values of scale tensors and floating-point tensors to find NaN, Inf and zero or
  // negative scales. Without it only the headers are read.
  bool scan_values = true;
};

// `path`: a .safetensors file, an index file, or a model directory.
ModelInfo inspect_model(const std::filesystem::path& path, const InspectOptions& options = {});

// The MoE layer that a model directory's config.json describes (format from its quantization
// block when present, else NVFP4). Throws naming the missing or bad field.
LayerDesc read_layer_desc(const std::filesystem::path& model_dir);

// Layer `layer` of a model directory: desc from config.json checked against the tensors, the
// routed experts, the shared expert, the router weight (and bias or correction bias), each tensor
// copied once from the mapped files. Throws Error (kBadFile) naming the tensor and the numbers
// for a missing tensor, a wrong dtype or shape, gate/up weight_scale_2 that differ, a
// non-finite or non-positive weight_scale_2, a NaN block scale, or experts left unquantized.
LayerWeights load_moe_layer(const std::filesystem::path& model_dir, std::int64_t layer);

// Tensors `fp4moe quantize` keeps unquantized whatever --exclude says (ECMAScript regex, searched
// in the tensor name): routers, embeddings, lm_head.
inline constexpr std::string_view kDefaultQuantizeExclude =
    R"((^|\.)(gate|router|shared_expert_gate|embed_tokens|lm_head)\.weight$)";

struct QuantizeOptions {
  WeightFormat format = WeightFormat::kNvfp4;
  std::vector<std::string> exclude;  // more regexes, in addition to kDefaultQuantizeExclude
  int threads = 0;                   // 0: std::thread::hardware_concurrency()
};

struct QuantizeProgress {
  std::uint64_t done_bytes = 0;   // input bytes processed
  std::uint64_t total_bytes = 0;  // input bytes in all
  std::string_view file;          // the output file being written
};

struct QuantizeReport {
  std::vector<std::filesystem::path> written;  // every file written
  std::int64_t quantized = 0;                  // matrices quantized
  std::int64_t excluded = 0;                   // eligible matrices kept by an exclude regex
  std::int64_t not_block_multiple = 0;         // 2-D .weight tensors whose K is not a multiple of the block
  std::int64_t copied = 0;                     // tensors copied unchanged (excluded ones included)
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
};

// `in`: a .safetensors file or a model directory. `out`: a path ending in .safetensors (one
// file; `in` must then be a file) or a directory (created if missing) that receives the
// quantized shards under their input names, a new index when `in` has one, hf_quant_config.json,
// and a copy of the other top-level files of `in` (config.json, tokenizer, ...).
// Every 2-D BF16/F16/F32 tensor whose name ends in ".weight", whose K (second dimension) is a
// multiple of the block and that no exclude regex matches becomes X.weight U8 [N, K/2],
// X.weight_scale F8_E4M3 [N, K/16] and X.weight_scale_2 F32 [] (NVFP4, ModelOpt recipe; gate_proj
// and up_proj of one module share weight_scale_2, from the larger amax) or X.weight U8 [N, K/2],
// X.weight_scale U8 [N, K/32] (MXFP4). Other tensors are copied unchanged. Refuses a model that
// already declares a quantization. Each output file appears atomically.
QuantizeReport quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                   const QuantizeOptions& options,
                                   const std::function<void(const QuantizeProgress&)>& progress = {});

}  // namespace fp4moe
