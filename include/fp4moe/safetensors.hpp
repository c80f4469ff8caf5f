// fp4moe: safetensors files, read memory-mapped and written atomically.
//
// A safetensors file is: a little-endian u64 N, N bytes of UTF-8 JSON naming each tensor's dtype,
// shape and byte range (relative to byte 8 + N), then the tensors' bytes. Reading validates the
// whole header before any tensor is handed out: header length (at most 100,000,000 bytes and
// inside the file), UTF-8 JSON of the expected shape, known dtypes, shape x dtype size equal to
// the byte range (overflow checked), ranges in bounds, contiguous, no gaps or overlaps, and the
// file length equal to 8 + N + the end of the last tensor. Every rejection is an Error (kBadFile)
// naming the file, the tensor and the numbers. See docs/CHECKPOINTS.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe {

// The safetensors dtypes, by their names in the header.
enum class Dtype : std::uint8_t {
  kBool,
  kF4,      // E2M1, 4 bits: two per byte, element 2j in the low nibble
  kF6E2M3,  // 6-bit floats, packed
  kF6E3M2,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kF8E8M0,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
  kC64,
};

std::string_view dtype_name(Dtype dtype) noexcept;  // "BF16", "F8_E4M3", ...
std::optional<Dtype> parse_dtype(std::string_view name) noexcept;
int dtype_bits(Dtype dtype) noexcept;  // 4 for F4, 6 for F6_*, 8 for U8, ..., 64 for C64

inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte range relative to the start of the data (8 + header length)
  std::uint64_t end = 0;

  std::int64_t numel() const noexcept;  // 1 for a 0-rank tensor
  std::uint64_t bytes() const noexcept { return end - begin; }
  std::string shape_string() const;  // "[2048, 3072]", "[]"
};

// A parsed and fully validated header.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // sorted by begin (file order)
  std::map<std::string, std::string> metadata;
  std::uint64_t data_offset = 0;  // 8 + header length
};

// Validates a whole file held in memory (`file` is every byte of it) and returns its header.
// `file_name` is only used in messages. This is what SafetensorsFile::open runs on the mapping,
// and what the fuzzer drives.
SafetensorsHeader parse_safetensors(std::span<const std::uint8_t> file, std::string_view file_name);

// A read-only memory-mapped safetensors file. Moving is cheap; the mapping lives as long as the
// object (spans from data() must not outlive it). Tensor bytes are read straight from the page
// cache: nothing is copied until the caller copies a tensor.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::filesystem::path& path() const noexcept { return path_; }
  std::uint64_t file_size() const noexcept { return size_; }
  const std::vector<TensorInfo>& tensors() const noexcept { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const noexcept { return header_.metadata; }

  const TensorInfo* find(std::string_view name) const noexcept;
  const TensorInfo& tensor(std::string_view name) const;  // throws naming the file and tensor
  std::span<const std::uint8_t> data(const TensorInfo& tensor) const noexcept;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  const std::uint8_t* map_ = nullptr;
  std::uint64_t size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, std::size_t, std::less<>> index_;  // name -> position in tensors()
};

// The tensors of a model stored as one file or as shards listed by model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor: shard file}}). The index and the shards must agree:
// every listed tensor is in its shard, every shard tensor is listed, no name is in two shards,
// shard names are plain file names in the index's directory.
class ShardedSafetensors {
 public:
  // `path`: a .safetensors file, a *.index.json file, or a directory holding
  // model.safetensors.index.json, or else exactly one .safetensors file.
  static ShardedSafetensors open(const std::filesystem::path& path);

  const std::vector<SafetensorsFile>& files() const noexcept { return files_; }
  std::vector<std::string> names() const;  // sorted
  std::size_t size() const noexcept { return where_.size(); }
  const TensorInfo* find(std::string_view name) const noexcept;
  const TensorInfo& tensor(std::string_view name) const;  // throws naming the model and tensor
  const SafetensorsFile& file_of(std::string_view name) const;
  std::span<const std::uint8_t> data(std::string_view name) const;
  // The index file's path, when the model is sharded.
  const std::optional<std::filesystem::path>& index_path() const noexcept { return index_path_; }

 private:
  std::vector<SafetensorsFile> files_;
  // name -> (file, position in that file's tensors())
  std::map<std::string, std::pair<std::size_t, std::size_t>, std::less<>> where_;
  std::optional<std::filesystem::path> index_path_;
};

// Builds a safetensors file: tensors are declared first (name, dtype, shape and where their bytes
// come from), then written in one pass, so only one produced tensor is in memory at a time.
// write() follows the spec: the JSON header (tensors and "__metadata__") padded with spaces to a
// multiple of 8 bytes; tensors laid out by decreasing dtype size, then by name, so that every
// tensor starts at a multiple of its element size. The file appears atomically: it is written to
// a temporary file in the same directory, flushed, and renamed over `path`.
class SafetensorsWriter {
 public:
  // Fills exactly the tensor's byte count.
  using Producer = std::function<void(std::span<std::uint8_t> out)>;

  // Copies `bytes`, whose size must be shape x dtype size.
  void add(std::string name, Dtype dtype, std::vector<std::int64_t> shape,
           std::span<const std::uint8_t> bytes);
  // Keeps a view of `bytes` (the caller keeps it alive until write() returns).
  void add_view(std::string name, Dtype dtype, std::vector<std::int64_t> shape,
                std::span<const std::uint8_t> bytes);
  // Calls `producer` during write().
  void add_produced(std::string name, Dtype dtype, std::vector<std::int64_t> shape, Producer producer);
  void set_metadata(std::string key, std::string value);

  std::size_t size() const noexcept { return entries_.size(); }
  std::uint64_t data_bytes() const noexcept;  // the sum of the tensors' byte counts

  // `progress(tensor name, bytes written so far)` is called after each tensor.
  void write(const std::filesystem::path& path,
             const std::function<void(std::string_view, std::uint64_t)>& progress = {}) const;

 private:
  struct Entry {
    std::string name;
    Dtype dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t bytes;
    std::vector<std::uint8_t> owned;
    std::span<const std::uint8_t> view;
    Producer producer;
  };
  Entry& declare(std::string name, Dtype dtype, std::vector<std::int64_t> shape);
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes `text` to `path` atomically (temporary file + rename), for the JSON files next to shards.
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

}  // namespace fp4moe
