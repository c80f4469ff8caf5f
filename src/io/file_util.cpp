#include "io/file_util.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/fail.hpp"

namespace fp4moe {

AtomicFile::AtomicFile(const std::filesystem::path& path) : path_(path) {
  // pid + a counter keep concurrent writers (threads or processes) off each other's temp files.
  static std::atomic<unsigned> counter{0};
  temp_ = path;
  temp_.replace_filename(fmt::format(".{}.tmp-{}-{}", path.filename().string(), getpid(), counter++));
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    fail(Errc::kIo, "{}: cannot create {}: {}", path.string(), temp_.string(), std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_.c_str());
  }
}

void AtomicFile::write(std::span<const std::uint8_t> bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(Errc::kIo, "{}: write failed after {} bytes: {}", temp_.string(), done, std::strerror(errno));
    }
    done += static_cast<std::size_t>(n);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail(Errc::kIo, "{}: fsync failed: {}", temp_.string(), std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp_.c_str());
    fail(Errc::kIo, "{}: close failed: {}", temp_.string(), std::strerror(err));
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_.c_str());
    fail(Errc::kIo, "cannot rename {} to {}: {}", temp_.string(), path_.string(), std::strerror(err));
  }
}

void copy_file_atomically(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) fail(Errc::kIo, "{}: cannot open: {}", from.string(), std::strerror(errno));
  AtomicFile out(to);
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    out.write({reinterpret_cast<const std::uint8_t*>(buffer.data()), n});
  }
  if (in.bad()) fail(Errc::kIo, "{}: read failed", from.string());
  out.commit();
}

std::string read_small_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Errc::kIo, "{}: cannot open: {}", path.string(), std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(Errc::kIo, "{}: read failed", path.string());
  return ss.str();
}

}  // namespace fp4moe
