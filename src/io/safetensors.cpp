#include "fp4moe/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include <fmt/ranges.h>

#include "common/fail.hpp"
#include "io/file_util.hpp"

namespace fp4moe {
namespace {

using json = nlohmann::json;

struct DtypeEntry {
  Dtype dtype;
  std::string_view name;
  int bits;
};

constexpr std::array<DtypeEntry, 20> kDtypes{{
    {Dtype::kBool, "BOOL", 8},      {Dtype::kF4, "F4", 4},          {Dtype::kF6E2M3, "F6_E2M3", 6},
    {Dtype::kF6E3M2, "F6_E3M2", 6}, {Dtype::kU8, "U8", 8},          {Dtype::kI8, "I8", 8},
    {Dtype::kF8E5M2, "F8_E5M2", 8}, {Dtype::kF8E4M3, "F8_E4M3", 8}, {Dtype::kF8E8M0, "F8_E8M0", 8},
    {Dtype::kI16, "I16", 16},       {Dtype::kU16, "U16", 16},       {Dtype::kF16, "F16", 16},
    {Dtype::kBF16, "BF16", 16},     {Dtype::kI32, "I32", 32},       {Dtype::kU32, "U32", 32},
    {Dtype::kF32, "F32", 32},       {Dtype::kF64, "F64", 64},       {Dtype::kI64, "I64", 64},
    {Dtype::kU64, "U64", 64},       {Dtype::kC64, "C64", 64},
}};

std::string known_dtype_list() {
  std::string s;
  for (const auto& d : kDtypes) {
    if (!s.empty()) s += ", ";
    s += d.name;
  }
  return s;
}

// NOTE: nlohmann's parser is iterative, but a header of 100 MB of '[' would still build a value
// whose destruction recurses; a valid header nests 3 deep, so anything deeper than this is
// rejected before parsing.
constexpr int kMaxJsonDepth = 16;

// Returns the offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), or npos.
std::size_t first_bad_utf8(std::span<const std::uint8_t> s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const std::uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    std::uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (s.size() - i < static_cast<std::size_t>(len)) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (int k = 2; k < len; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

// The deepest nesting of arrays and objects outside strings.
int json_depth(std::span<const std::uint8_t> s) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const std::uint8_t c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > kMaxJsonDepth) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

std::uint64_t read_u64_le(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A JSON value that must be a non-negative integer that fits in `max`.
std::optional<std::uint64_t> as_index(const json& v, std::uint64_t max) {
  if (!v.is_number_integer()) return std::nullopt;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > max) return std::nullopt;
    return u;
  }
  const auto i = v.get<std::int64_t>();
  if (i < 0 || static_cast<std::uint64_t>(i) > max) return std::nullopt;
  return static_cast<std::uint64_t>(i);
}

TensorInfo parse_tensor_entry(const std::string& name, const json& entry, std::string_view file) {
  if (name.empty()) fail(Errc::kBadFile, "{}: a tensor has an empty name", file);
  if (!entry.is_object()) {
    fail(Errc::kBadFile,
         "{}: tensor '{}': entry is a JSON {}, expected an object with dtype, shape and "
         "data_offsets",
         file, name, entry.type_name());
  }
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail(Errc::kBadFile, "{}: tensor '{}': unknown field '{}' (expected dtype, shape, data_offsets)", file,
           name, key);
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) fail(Errc::kBadFile, "{}: tensor '{}': missing field '{}'", file, name, key);
  }
  TensorInfo t;
  t.name = name;
  const json& dtype = entry["dtype"];
  if (!dtype.is_string()) fail(Errc::kBadFile, "{}: tensor '{}': dtype is not a string", file, name);
  const auto parsed = parse_dtype(dtype.get_ref<const std::string&>());
  if (!parsed) {
    fail(Errc::kBadFile, "{}: tensor '{}': unknown dtype '{}' (known: {})", file, name,
         dtype.get_ref<const std::string&>(), known_dtype_list());
  }
  t.dtype = *parsed;

  const json& shape = entry["shape"];
  if (!shape.is_array()) fail(Errc::kBadFile, "{}: tensor '{}': shape is not an array", file, name);
  // numel is tracked in unsigned 128-bit-safe steps: each factor is checked before multiplying.
  std::uint64_t numel = 1;
  bool overflow = false;
  constexpr std::uint64_t kMaxDim = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const auto dim = as_index(shape[i], kMaxDim);
    if (!dim) {
      fail(Errc::kBadFile, "{}: tensor '{}': shape[{}] = {} is not a non-negative 64-bit integer", file, name,
           i, shape[i].dump());
    }
    t.shape.push_back(static_cast<std::int64_t>(*dim));
    if (*dim != 0 && numel > std::numeric_limits<std::uint64_t>::max() / *dim) overflow = true;
    numel *= *dim;
  }
  if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) {
    overflow = false;
    numel = 0;
  }
  const int bits = dtype_bits(t.dtype);
  if (overflow || numel > std::numeric_limits<std::uint64_t>::max() / static_cast<std::uint64_t>(bits)) {
    fail(Errc::kBadFile, "{}: tensor '{}': shape {} x {} bits overflows 64 bits", file, name,
         t.shape_string(), bits);
  }
  const std::uint64_t total_bits = numel * static_cast<std::uint64_t>(bits);
  if (total_bits % 8 != 0) {
    fail(Errc::kBadFile, "{}: tensor '{}': {} has {} elements of {} bits, not a whole number of bytes", file,
         name, dtype_name(t.dtype), numel, bits);
  }

  const json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(Errc::kBadFile, "{}: tensor '{}': data_offsets is {}, expected [begin, end]", file, name,
         offsets.dump());
  }
  const auto begin = as_index(offsets[0], std::numeric_limits<std::uint64_t>::max());
  const auto end = as_index(offsets[1], std::numeric_limits<std::uint64_t>::max());
  if (!begin || !end) {
    fail(Errc::kBadFile, "{}: tensor '{}': data_offsets {} are not non-negative 64-bit integers", file, name,
         offsets.dump());
  }
  if (*end < *begin) {
    fail(Errc::kBadFile, "{}: tensor '{}': data_offsets [{}, {}] end before they begin", file, name, *begin,
         *end);
  }
  t.begin = *begin;
  t.end = *end;
  if (t.end - t.begin != total_bits / 8) {
    fail(Errc::kBadFile, "{}: tensor '{}': {} {} is {} bytes but data_offsets [{}, {}] span {} bytes", file,
         name, dtype_name(t.dtype), t.shape_string(), total_bits / 8, t.begin, t.end, t.end - t.begin);
  }
  return t;
}

}  // namespace

std::string_view dtype_name(Dtype dtype) noexcept {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

std::optional<Dtype> parse_dtype(std::string_view name) noexcept {
  for (const auto& d : kDtypes) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

int dtype_bits(Dtype dtype) noexcept {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.bits;
  }
  return 8;
}

std::int64_t TensorInfo::numel() const noexcept {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

SafetensorsHeader parse_safetensors(std::span<const std::uint8_t> file, std::string_view file_name) {
  if (file.size() < 8) {
    fail(Errc::kBadFile, "{}: file is {} bytes, too short for the 8-byte header length", file_name,
         file.size());
  }
  const std::uint64_t header_len = read_u64_le(file.data());
  if (header_len > kMaxSafetensorsHeaderBytes) {
    fail(Errc::kBadFile, "{}: header length {} exceeds the limit of {} bytes", file_name, header_len,
         kMaxSafetensorsHeaderBytes);
  }
  if (header_len > file.size() - 8) {
    fail(Errc::kBadFile, "{}: header length {} runs past the end of the file ({} bytes, so at most {})",
         file_name, header_len, file.size(), file.size() - 8);
  }
  const auto text = file.subspan(8, header_len);
  if (const auto bad = first_bad_utf8(text); bad != std::string_view::npos) {
    fail(Errc::kBadFile, "{}: header is not valid UTF-8 (byte 0x{:02x} at header offset {})", file_name,
         text[bad], bad);
  }
  if (const int depth = json_depth(text); depth > kMaxJsonDepth) {
    fail(Errc::kBadFile, "{}: header JSON nests deeper than {} levels", file_name, kMaxJsonDepth);
  }

  // Duplicate names would make the file mean two things: nlohmann keeps the last one silently,
  // so keys at the top level are collected while parsing.
  std::set<std::string> seen;
  std::string duplicate;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && duplicate.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& e) {
    fail(Errc::kBadFile, "{}: header is not valid JSON: {}", file_name, e.what());
  }
  if (!duplicate.empty())
    fail(Errc::kBadFile, "{}: tensor '{}' is named twice in the header", file_name, duplicate);
  if (!header.is_object()) {
    fail(Errc::kBadFile, "{}: header is a JSON {}, expected an object", file_name, header.type_name());
  }

  SafetensorsHeader h;
  h.data_offset = 8 + header_len;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        fail(Errc::kBadFile, "{}: __metadata__ is a JSON {}, expected an object of strings", file_name,
             value.type_name());
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          fail(Errc::kBadFile, "{}: __metadata__ '{}' is a JSON {}, expected a string", file_name, mk,
               mv.type_name());
        }
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(parse_tensor_entry(key, value, file_name));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::uint64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.begin < expected) {
      fail(Errc::kBadFile, "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", file_name, prev->name,
           prev->begin, prev->end, t.name, t.begin, t.end);
    }
    if (t.begin > expected) {
      if (prev == nullptr) {
        fail(Errc::kBadFile, "{}: gap of {} bytes before the first tensor '{}' (begins at {})", file_name,
             t.begin, t.name, t.begin);
      }
      fail(Errc::kBadFile, "{}: gap of {} bytes between '{}' (ends at {}) and '{}' (begins at {})", file_name,
           t.begin - expected, prev->name, expected, t.name, t.begin);
    }
    expected = t.end;
    prev = &t;
  }
  const std::uint64_t data_bytes = file.size() - h.data_offset;
  if (expected != data_bytes) {
    fail(Errc::kBadFile,
         "{}: file is {} bytes but the header says 8 + {} + {} = {} (tensor data {} bytes, {} in the file)",
         file_name, file.size(), header_len, expected, h.data_offset + expected, expected, data_bytes);
  }
  return h;
}

// ---- SafetensorsFile ------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      header_(std::move(other.header_)),
      index_(std::move(other.index_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) munmap(const_cast<std::uint8_t*>(map_), size_);
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    header_ = std::move(other.header_);
    index_ = std::move(other.index_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(const_cast<std::uint8_t*>(map_), size_);
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string name = path.string();
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(Errc::kIo, "{}: cannot open: {}", name, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(Errc::kIo, "{}: cannot stat: {}", name, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(Errc::kBadFile, "{}: not a regular file", name);
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail(Errc::kBadFile, "{}: file is {} bytes, too short for the 8-byte header length", name, size);
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) fail(Errc::kIo, "{}: cannot map {} bytes: {}", name, size, std::strerror(map_err));

  SafetensorsFile f;
  f.path_ = path;
  f.map_ = static_cast<const std::uint8_t*>(map);
  f.size_ = size;
  f.header_ = parse_safetensors({f.map_, size}, name);
  for (std::size_t i = 0; i < f.header_.tensors.size(); ++i) f.index_.emplace(f.header_.tensors[i].name, i);
  return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const noexcept {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

const TensorInfo& SafetensorsFile::tensor(std::string_view name) const {
  const auto* t = find(name);
  if (t == nullptr) fail(Errc::kBadFile, "{}: no tensor named '{}'", path_.string(), name);
  return *t;
}

std::span<const std::uint8_t> SafetensorsFile::data(const TensorInfo& tensor) const noexcept {
  return {map_ + header_.data_offset + tensor.begin, static_cast<std::size_t>(tensor.bytes())};
}

// ---- ShardedSafetensors ---------------------------------------------------------------------

namespace {

constexpr std::string_view kIndexName = "model.safetensors.index.json";

json read_json_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail(Errc::kIo, "{}: cannot read: {}", path.string(), ec.message());
  if (size > kMaxSafetensorsHeaderBytes) {
    fail(Errc::kBadFile, "{}: {} bytes is larger than the {} bytes a JSON index may have", path.string(),
         size, kMaxSafetensorsHeaderBytes);
  }
  const std::string text = read_small_file(path);
  const auto bytes = std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  if (const auto bad = first_bad_utf8(bytes); bad != std::string_view::npos) {
    fail(Errc::kBadFile, "{}: not valid UTF-8 (byte offset {})", path.string(), bad);
  }
  if (json_depth(bytes) > kMaxJsonDepth) {
    fail(Errc::kBadFile, "{}: JSON nests deeper than {} levels", path.string(), kMaxJsonDepth);
  }
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(Errc::kBadFile, "{}: not valid JSON: {}", path.string(), e.what());
  }
}

}  // namespace

ShardedSafetensors ShardedSafetensors::open(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  ShardedSafetensors model;
  fs::path index;
  if (fs::is_directory(path)) {
    if (fs::exists(path / kIndexName)) {
      index = path / kIndexName;
    } else {
      std::vector<fs::path> found;
      for (const auto& e : fs::directory_iterator(path)) {
        if (e.path().extension() == ".safetensors") found.push_back(e.path());
      }
      std::sort(found.begin(), found.end());
      if (found.empty())
        fail(Errc::kBadFile, "{}: no .safetensors file and no {}", path.string(), kIndexName);
      if (found.size() > 1) {
        std::vector<std::string> names;
        for (const auto& f : found) names.push_back(f.filename().string());
        fail(Errc::kBadFile, "{}: {} .safetensors files and no {} to say which tensors they hold: {}",
             path.string(), found.size(), kIndexName, fmt::join(names, ", "));
      }
      model.files_.push_back(SafetensorsFile::open(found.front()));
    }
  } else if (path.extension() == ".json") {
    index = path;
  } else {
    model.files_.push_back(SafetensorsFile::open(path));
  }

  if (index.empty()) {
    const auto& tensors = model.files_.front().tensors();
    for (std::size_t i = 0; i < tensors.size(); ++i) model.where_.emplace(tensors[i].name, std::pair{0, i});
    return model;
  }

  model.index_path_ = index;
  const json j = read_json_file(index);
  const std::string iname = index.string();
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    fail(Errc::kBadFile, "{}: expected a JSON object with a \"weight_map\" object", iname);
  }
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> tensors listed for it
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string()) {
      fail(Errc::kBadFile, "{}: weight_map['{}'] is a JSON {}, expected a file name", iname, tensor,
           shard.type_name());
    }
    const auto& s = shard.get_ref<const std::string&>();
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos ||
        s.find('\\') != std::string::npos || s.find('\0') != std::string::npos) {
      fail(Errc::kBadFile, "{}: weight_map['{}'] = '{}' is not a plain file name in the index's directory",
           iname, tensor, s);
    }
    by_shard[s].push_back(tensor);
  }
  if (by_shard.empty()) fail(Errc::kBadFile, "{}: weight_map is empty", iname);
  const fs::path dir = index.parent_path();
  for (const auto& [shard, listed] : by_shard) {
    model.files_.push_back(SafetensorsFile::open(dir / shard));
    const std::size_t fi = model.files_.size() - 1;
    const SafetensorsFile& f = model.files_.back();
    for (const auto& name : listed) {
      if (f.find(name) == nullptr) {
        fail(Errc::kBadFile, "{}: lists tensor '{}' in {}, which does not hold it", iname, name, shard);
      }
    }
    const auto& tensors = f.tensors();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const auto& name = tensors[i].name;
      const auto listed_in = j["weight_map"].find(name);
      if (listed_in == j["weight_map"].end() || listed_in->get_ref<const std::string&>() != shard) {
        fail(Errc::kBadFile, "{}: holds tensor '{}', which {} {}", f.path().string(), name, iname,
             listed_in == j["weight_map"].end() ? std::string("does not list")
                                                : "lists in " + listed_in->get<std::string>());
      }
      model.where_.emplace(name, std::pair{fi, i});
    }
  }
  return model;
}

std::vector<std::string> ShardedSafetensors::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, loc] : where_) out.push_back(name);
  return out;
}

const TensorInfo* ShardedSafetensors::find(std::string_view name) const noexcept {
  const auto it = where_.find(name);
  if (it == where_.end()) return nullptr;
  return &files_[it->second.first].tensors()[it->second.second];
}

const TensorInfo& ShardedSafetensors::tensor(std::string_view name) const {
  const auto* t = find(name);
  if (t == nullptr) {
    fail(Errc::kBadFile, "{}: no tensor named '{}'",
         index_path_ ? index_path_->string() : files_.front().path().string(), name);
  }
  return *t;
}

const SafetensorsFile& ShardedSafetensors::file_of(std::string_view name) const {
  tensor(name);
  return files_[where_.find(name)->second.first];
}

std::span<const std::uint8_t> ShardedSafetensors::data(std::string_view name) const {
  const auto& t = tensor(name);
  return file_of(name).data(t);
}

// ---- SafetensorsWriter ----------------------------------------------------------------------

SafetensorsWriter::Entry& SafetensorsWriter::declare(std::string name, Dtype dtype,
                                                     std::vector<std::int64_t> shape) {
  if (name.empty()) fail(Errc::kInvalidArgument, "safetensors writer: a tensor needs a name");
  if (name == "__metadata__") fail(Errc::kInvalidArgument, "safetensors writer: '__metadata__' is reserved");
  const auto bytes = std::span(reinterpret_cast<const std::uint8_t*>(name.data()), name.size());
  if (first_bad_utf8(bytes) != std::string_view::npos) {
    fail(Errc::kInvalidArgument, "safetensors writer: tensor name '{}' is not valid UTF-8", name);
  }
  for (const auto& e : entries_) {
    if (e.name == name) fail(Errc::kInvalidArgument, "safetensors writer: tensor '{}' added twice", name);
  }
  std::uint64_t numel = 1;
  for (const auto d : shape) {
    if (d < 0)
      fail(Errc::kInvalidArgument, "safetensors writer: tensor '{}' has a negative dimension {}", name, d);
    numel *= static_cast<std::uint64_t>(d);
  }
  const std::uint64_t bits = numel * static_cast<std::uint64_t>(dtype_bits(dtype));
  if (bits % 8 != 0) {
    fail(Errc::kInvalidArgument,
         "safetensors writer: tensor '{}': {} elements of {} is not a whole number of bytes", name, numel,
         dtype_name(dtype));
  }
  Entry e{std::move(name), dtype, std::move(shape), bits / 8, {}, {}, {}};
  entries_.push_back(std::move(e));
  return entries_.back();
}

void SafetensorsWriter::add(std::string name, Dtype dtype, std::vector<std::int64_t> shape,
                            std::span<const std::uint8_t> bytes) {
  Entry& e = declare(std::move(name), dtype, std::move(shape));
  if (bytes.size() != e.bytes) {
    const std::string n = e.name;
    const std::uint64_t want = e.bytes;
    entries_.pop_back();
    fail(Errc::kInvalidArgument, "safetensors writer: tensor '{}' needs {} bytes, got {}", n, want,
         bytes.size());
  }
  e.owned.assign(bytes.begin(), bytes.end());
  e.view = e.owned;
}

void SafetensorsWriter::add_view(std::string name, Dtype dtype, std::vector<std::int64_t> shape,
                                 std::span<const std::uint8_t> bytes) {
  Entry& e = declare(std::move(name), dtype, std::move(shape));
  if (bytes.size() != e.bytes) {
    const std::string n = e.name;
    const std::uint64_t want = e.bytes;
    entries_.pop_back();
    fail(Errc::kInvalidArgument, "safetensors writer: tensor '{}' needs {} bytes, got {}", n, want,
         bytes.size());
  }
  e.view = bytes;
}

void SafetensorsWriter::add_produced(std::string name, Dtype dtype, std::vector<std::int64_t> shape,
                                     Producer producer) {
  declare(std::move(name), dtype, std::move(shape)).producer = std::move(producer);
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::uint64_t SafetensorsWriter::data_bytes() const noexcept {
  std::uint64_t total = 0;
  for (const auto& e : entries_) total += e.bytes;
  return total;
}

void SafetensorsWriter::write(const std::filesystem::path& path,
                              const std::function<void(std::string_view, std::uint64_t)>& progress) const {
  std::vector<const Entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    const int ba = dtype_bits(a->dtype), bb = dtype_bits(b->dtype);
    return ba != bb ? ba > bb : a->name < b->name;
  });

  json header = json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::uint64_t offset = 0;
  for (const Entry* e : order) {
    header[e->name] = {
        {"dtype", dtype_name(e->dtype)}, {"shape", e->shape}, {"data_offsets", {offset, offset + e->bytes}}};
    offset += e->bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::array<std::uint8_t, 8> len{};
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(text.size()) >> (8 * i));

  AtomicFile out(path);
  out.write(len);
  out.write({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
  std::uint64_t written = 0;
  std::vector<std::uint8_t> buffer;
  for (const Entry* e : order) {
    if (e->producer) {
      buffer.assign(e->bytes, 0);
      e->producer(buffer);
      out.write(buffer);
    } else {
      out.write(e->view);
    }
    written += e->bytes;
    if (progress) progress(e->name, written);
  }
  buffer = {};
  out.commit();
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  AtomicFile out(path);
  out.write({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
  out.commit();
}

}  // namespace fp4moe
