// Internals shared by the checkpoint code: tensor-name grammar, config.json, value conversion.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "fp4moe/checkpoint.hpp"
#include "fp4moe/safetensors.hpp"

namespace fp4moe::io {

// A tensor name inside a MoE block, split into its parts:
//   <stem>layers.<L>.<mlp|block_sparse_moe>.experts.<e>.<proj>.<suffix>      kExpert
//   <stem>layers.<L>.<mlp|block_sparse_moe>.experts.<fused>                  kFused (gpt-oss)
//   <stem>layers.<L>.<mlp>.shared_experts.<proj>.<suffix>                     kShared
//   <stem>layers.<L>.<mlp|block_sparse_moe>.<gate|router>.<suffix>            kRouter
// proj is normalised: w1 -> gate_proj, w3 -> up_proj, w2 -> down_proj (Mixtral's names).
struct MoeName {
  enum class Kind : std::uint8_t { kExpert, kFused, kShared, kRouter };
  Kind kind = Kind::kExpert;
  std::int64_t layer = 0;
  std::string prefix;  // "<stem>layers.<L>.mlp"
  std::int64_t expert = -1;
  std::string proj;    // gate_proj, up_proj, down_proj (kExpert, kShared); gate or router (kRouter)
  std::string suffix;  // weight, weight_scale, ...; for kFused the whole last part
};
std::optional<MoeName> parse_moe_name(std::string_view name);

// The MoE tensors of one block (one prefix), by role. Pointers into the ShardedSafetensors.
struct MoeTensors {
  std::int64_t layer = 0;
  std::string prefix;
  std::map<std::tuple<std::int64_t, std::string, std::string>, const TensorInfo*>
      experts;                                                              // (e, proj, suffix)
  std::map<std::pair<std::string, std::string>, const TensorInfo*> shared;  // (proj, suffix)
  std::map<std::string, const TensorInfo*> fused;                           // suffix
  std::map<std::pair<std::string, std::string>, const TensorInfo*> router;  // (gate|router, suffix)

  const TensorInfo* expert(std::int64_t e, const std::string& proj, const std::string& suffix) const;
  const TensorInfo* shared_tensor(const std::string& proj, const std::string& suffix) const;
  const TensorInfo* fused_tensor(const std::string& suffix) const;
  const TensorInfo* router_tensor(const std::string& which, const std::string& suffix) const;
  bool has_experts() const { return !experts.empty() || !fused.empty(); }
};
std::optional<ExpertLayout> detect_layout(const MoeTensors& m);  // nullopt: no expert weight found
// "0-2, 5": the layers that have a MoE block.
std::string layer_list(const std::map<std::string, MoeTensors>& blocks);
// Every MoE block of the model, by prefix; only those of `layer` when given.
std::map<std::string, MoeTensors> index_moe_tensors(const ShardedSafetensors& model,
                                                    std::optional<std::int64_t> layer = std::nullopt);

// '*' matches any run of characters (dots included), '?' one character, anything else itself.
bool wildcard_match(std::string_view pattern, std::string_view text);

// config.json of a model directory; nullopt when there is none.
std::optional<nlohmann::json> read_config(const std::filesystem::path& dir);
// The object that holds the language model's fields: config itself, or its "text_config".
const nlohmann::json& text_config(const nlohmann::json& config);
std::optional<QuantConfig> read_quant_config(const std::filesystem::path& dir);
LayerDesc layer_desc_from_config(const nlohmann::json& config, const std::optional<QuantConfig>& quant,
                                 const std::string& where);

bool is_float_dtype(Dtype dtype) noexcept;  // F16, BF16, F32
// Element i of a BF16, F16 or F32 tensor, read with memcpy (mapped data may be unaligned).
float load_float(Dtype dtype, const std::uint8_t* data, std::int64_t i) noexcept;
// Elements [begin, begin + out.size()) of a BF16, F16 or F32 tensor as floats.
void to_float(Dtype dtype, std::span<const std::uint8_t> data, std::int64_t begin, std::span<float> out);

// Throws naming the tensor unless it has this dtype and shape.
void expect_tensor(const ShardedSafetensors& model, const TensorInfo& t, std::initializer_list<Dtype> dtypes,
                   std::span<const std::int64_t> shape);

// A display name for where a model lives, for messages.
std::string model_label(const ShardedSafetensors& model);

}  // namespace fp4moe::io
