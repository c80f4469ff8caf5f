// The tune cache: its keys (metadata, layer shape, token bucket), its JSON form, where it lives,
// and the atomic write (docs/TUNING.md).
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "common/fail.hpp"
#include "fp4moe/tune.hpp"
#include "fp4moe/version.hpp"
#include "io/file_util.hpp"

namespace fp4moe {
namespace {

constexpr const char* kFormat = "fp4moe-tune-cache";
constexpr int kFormatVersion = 1;

std::string cc_text(int sm) {
  return fmt::format("{}.{}", sm / 10, sm % 10);
}

// Reading with the path of every field in the message: "tune.json: entries[2].gate_up.stages ...".
class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {}

  const nlohmann::json& at(const nlohmann::json& obj, const std::string& where, const char* key) const {
    if (!obj.is_object()) fail(Errc::kBadFile, "{}: {} is not an object", origin_, where);
    const auto it = obj.find(key);
    if (it == obj.end()) fail(Errc::kBadFile, "{}: {} has no \"{}\"", origin_, where, key);
    return *it;
  }
  std::string text(const nlohmann::json& obj, const std::string& where, const char* key) const {
    const auto& v = at(obj, where, key);
    if (!v.is_string()) fail(Errc::kBadFile, "{}: {}.{} is not a string ({})", origin_, where, key, v.dump());
    return v.get<std::string>();
  }
  std::int64_t positive(const nlohmann::json& obj, const std::string& where, const char* key,
                        std::int64_t min = 1) const {
    const auto& v = at(obj, where, key);
    if (!v.is_number_integer() || v.get<std::int64_t>() < min) {
      fail(Errc::kBadFile, "{}: {}.{} is not an integer >= {} ({})", origin_, where, key, min, v.dump());
    }
    return v.get<std::int64_t>();
  }
  int small(const nlohmann::json& obj, const std::string& where, const char* key) const {
    const std::int64_t v = positive(obj, where, key);
    if (v > 1024)
      fail(Errc::kBadFile, "{}: {}.{} = {} is not a kernel parameter (1..1024)", origin_, where, key, v);
    return static_cast<int>(v);
  }
  // A name parsed by the layer model's own parser; its error becomes a file error.
  template <typename F>
  auto name(const nlohmann::json& obj, const std::string& where, const char* key, F parse) const {
    const std::string s = text(obj, where, key);
    try {
      return parse(s);
    } catch (const Error& e) {
      fail(Errc::kBadFile, "{}: {}.{}: {}", origin_, where, key, e.what());
    }
  }
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
};

nlohmann::json gemm_json(const TunedGemm& g) {
  return {{"kernel", std::string(gemm_kernel_name(g.choice.kernel))},
          {"m_tiles", g.choice.m_tiles},
          {"n_tiles", g.choice.n_tiles},
          {"stages", g.choice.stages},
          {"warps", g.choice.warps},
          {"k_split", g.choice.k_split},
          {"label", gemm_choice_label(g.choice)},
          {"us", g.us}};
}

TunedGemm gemm_from_json(const Reader& r, const nlohmann::json& j, const std::string& where) {
  TunedGemm g;
  const std::string kernel = r.text(j, where, "kernel");
  bool known = false;
  for (const auto k : {GemmKernel::kStream, GemmKernel::kTile, GemmKernel::kWgmma}) {
    if (kernel == gemm_kernel_name(k)) {
      g.choice.kernel = k;
      known = true;
    }
  }
  if (!known)
    fail(Errc::kBadFile, "{}: {}.kernel '{}' is not stream, tile or wgmma", r.origin(), where, kernel);
  g.choice.m_tiles = r.small(j, where, "m_tiles");
  g.choice.n_tiles = r.small(j, where, "n_tiles");
  g.choice.stages = r.small(j, where, "stages");
  g.choice.warps = r.small(j, where, "warps");
  g.choice.k_split = r.small(j, where, "k_split");
  const auto& us = r.at(j, where, "us");
  if (!us.is_number() || us.get<double>() < 0) {
    fail(Errc::kBadFile, "{}: {}.us is not a non-negative number ({})", r.origin(), where, us.dump());
  }
  g.us = us.get<double>();
  return g;
}

// The fields of two metadata that differ, as "GPU NVIDIA H100, CUDA 12.8" (a's values).
std::string differing(const TuneMetadata& a, const TuneMetadata& b) {
  std::string s;
  const auto add = [&s](const std::string& part) { s += (s.empty() ? "" : ", ") + part; };
  if (a.gpu != b.gpu) add("GPU " + a.gpu);
  if (a.sm != b.sm) add("compute capability " + cc_text(a.sm));
  if (a.cuda != b.cuda) add("CUDA " + a.cuda);
  if (a.fp4moe != b.fp4moe) add("fp4moe " + a.fp4moe);
  return s;
}

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

}  // namespace

std::string TuneMetadata::to_string() const {
  return fmt::format("{}, compute capability {}, CUDA {}, fp4moe {}", gpu, cc_text(sm), cuda, fp4moe);
}

TuneMetadata tune_metadata_of(const GpuInfo& gpu) {
  return {gpu.name, gpu.sm(), cuda_runtime_version(), version()};
}

std::int64_t token_bucket(std::int64_t tokens) {
  require(tokens >= 1, "tokens = {}: a token bucket needs at least 1 token", tokens);
  std::int64_t b = 1;
  while (b <= tokens / 2) b *= 2;
  return b;
}

std::string TuneShape::to_string() const {
  return fmt::format("H={} I={} E={} k={} {} {} {} shared={}", hidden, intermediate, experts, top_k,
                     router_name(router), format_name(format), activation_name(activation),
                     shared_intermediate);
}

TuneShape tune_shape_of(const LayerDesc& l) {
  return {l.hidden, l.intermediate, l.experts,    l.top_k,
          l.router, l.format,       l.activation, l.shared_intermediate};
}

const TuneEntry* TuneCache::find(const LayerDesc& layer, std::int64_t tokens) const {
  const TuneShape shape = tune_shape_of(layer);
  const std::int64_t bucket = token_bucket(tokens);
  for (const auto& e : entries) {
    if (e.shape == shape && e.bucket == bucket) return &e;
  }
  return nullptr;
}

void TuneCache::put(const TuneEntry& entry) {
  for (auto& e : entries) {
    if (e.shape == entry.shape && e.bucket == entry.bucket) {
      e = entry;
      return;
    }
  }
  entries.push_back(entry);
}

std::string TuneCache::to_json() const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["format_version"] = kFormatVersion;
  j["metadata"] = {{"gpu", metadata.gpu},
                   {"compute_capability", cc_text(metadata.sm)},
                   {"cuda", metadata.cuda},
                   {"fp4moe", metadata.fp4moe}};
  auto arr = nlohmann::json::array();
  for (const auto& e : entries) {
    const TuneShape& s = e.shape;
    arr.push_back({{"shape",
                    {{"hidden", s.hidden},
                     {"intermediate", s.intermediate},
                     {"experts", s.experts},
                     {"top_k", s.top_k},
                     {"router", std::string(router_name(s.router))},
                     {"format", std::string(format_name(s.format))},
                     {"activation", std::string(activation_name(s.activation))},
                     {"shared_intermediate", s.shared_intermediate}}},
                   {"tokens_bucket", e.bucket},
                   {"gate_up", gemm_json(e.gate_up)},
                   {"down", gemm_json(e.down)}});
  }
  j["entries"] = arr;
  return j.dump(2) + "\n";
}

TuneCache TuneCache::from_json(std::string_view text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(Errc::kBadFile, "{}: not JSON ({})", origin, e.what());
  }
  const Reader r(origin);
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat) {
    fail(Errc::kBadFile, "{}: not an fp4moe tune cache (no \"format\": \"{}\")", origin, kFormat);
  }
  const std::int64_t version = r.positive(j, "the file", "format_version");
  if (version != kFormatVersion) {
    fail(Errc::kBadFile, "{}: format_version {} (this fp4moe reads version {})", origin, version,
         kFormatVersion);
  }
  TuneCache cache;
  const auto& meta = r.at(j, "the file", "metadata");
  cache.metadata.gpu = r.text(meta, "metadata", "gpu");
  const std::string cc = r.text(meta, "metadata", "compute_capability");
  if (cc.size() != 3 || cc[1] != '.' || cc[0] < '1' || cc[0] > '9' || cc[2] < '0' || cc[2] > '9') {
    fail(Errc::kBadFile, "{}: metadata.compute_capability '{}' is not <major>.<minor> (e.g. 9.0)", origin,
         cc);
  }
  cache.metadata.sm = (cc[0] - '0') * 10 + (cc[2] - '0');
  cache.metadata.cuda = r.text(meta, "metadata", "cuda");
  cache.metadata.fp4moe = r.text(meta, "metadata", "fp4moe");
  const auto& entries = r.at(j, "the file", "entries");
  if (!entries.is_array()) fail(Errc::kBadFile, "{}: entries is not an array", origin);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string where = fmt::format("entries[{}]", i);
    const auto& e = entries[i];
    TuneEntry entry;
    const auto& s = r.at(e, where, "shape");
    const std::string sw = where + ".shape";
    entry.shape.hidden = r.positive(s, sw, "hidden");
    entry.shape.intermediate = r.positive(s, sw, "intermediate");
    entry.shape.experts = r.positive(s, sw, "experts");
    entry.shape.top_k = r.positive(s, sw, "top_k");
    entry.shape.router = r.name(s, sw, "router", parse_router_kind);
    entry.shape.format = r.name(s, sw, "format", parse_weight_format);
    entry.shape.activation = r.name(s, sw, "activation", parse_activation);
    entry.shape.shared_intermediate = r.positive(s, sw, "shared_intermediate", 0);
    entry.bucket = r.positive(e, where, "tokens_bucket");
    if (token_bucket(entry.bucket) != entry.bucket) {
      fail(Errc::kBadFile, "{}: {}.tokens_bucket = {} is not a power of two", origin, where, entry.bucket);
    }
    entry.gate_up = gemm_from_json(r, r.at(e, where, "gate_up"), where + ".gate_up");
    entry.down = gemm_from_json(r, r.at(e, where, "down"), where + ".down");
    cache.put(entry);
  }
  return cache;
}

std::optional<GemmPreference> tuned_preference(const TuneCache& cache, const std::string& path,
                                               const LayerDesc& layer, std::int64_t tokens, GemmKind which) {
  const TuneEntry* e = cache.find(layer, tokens);
  if (e == nullptr) return std::nullopt;
  return GemmPreference{which == GemmKind::kGateUp ? e->gate_up.choice : e->down.choice, PickSource::kTuned,
                        fmt::format("tune cache {}, bucket {}", path, e->bucket)};
}

std::string tune_cache_path(const std::string& option) {
  if (!option.empty()) return option;
  const auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "");
  };
  if (const std::string p = env("FP4MOE_TUNE_CACHE"); !p.empty()) return p;
  // NOTE: the XDG Base Directory specification ignores a relative XDG_CACHE_HOME.
  if (const std::string x = env("XDG_CACHE_HOME"); !x.empty() && x.front() == '/')
    return x + "/fp4moe/tune.json";
  if (const std::string h = env("HOME"); !h.empty()) return h + "/.cache/fp4moe/tune.json";
  return {};
}

TuneCache read_tune_cache(const std::string& path) {
  return TuneCache::from_json(read_small_file(path), path);
}

void write_tune_cache(const TuneCache& cache, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    if (ec)
      fail(Errc::kIo, "cannot create the directory {} for the tune cache: {}", p.parent_path().string(),
           ec.message());
  }
  const std::string text = cache.to_json();
  AtomicFile out(p);
  out.write({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
  out.commit();
}

TuneCacheLoad load_tune_cache(const std::string& path, const TuneMetadata& device) {
  TuneCacheLoad load;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return load;
  const char* fallback = "until it is remade with fp4moe tune, the planner and dispatcher decide";
  TuneCache cache;
  try {
    cache = read_tune_cache(path);
  } catch (const Error& e) {
    load.message = one_line(fmt::format("tune cache ignored: {} ({})", e.what(), fallback));
    return load;
  }
  if (!(cache.metadata == device)) {
    load.message =
        one_line(fmt::format("tune cache {} ignored: it was made with {}, this is {} ({})", path,
                             differing(cache.metadata, device), differing(device, cache.metadata), fallback));
    return load;
  }
  load.cache = std::move(cache);
  return load;
}

}  // namespace fp4moe
