// File helpers for the io part: atomic replacement of a file, and reading a small text file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace fp4moe {

// Writes a file that appears at `path` only when commit() succeeds: the bytes go to a temporary
// file in the same directory (so the rename cannot cross file systems), which commit() flushes
// to disk and renames over `path`. Destroyed without commit(), it removes the temporary file, so
// a failed or interrupted write never leaves a truncated file under the final name.
class AtomicFile {
 public:
  explicit AtomicFile(const std::filesystem::path& path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  void write(std::span<const std::uint8_t> bytes);
  void commit();

 private:
  std::filesystem::path path_;
  std::filesystem::path temp_;
  int fd_ = -1;
};

// Copies a regular file to `to` through an AtomicFile.
void copy_file_atomically(const std::filesystem::path& from, const std::filesystem::path& to);

// The whole content of a file the caller knows to be small (JSON configs).
std::string read_small_file(const std::filesystem::path& path);

}  // namespace fp4moe
