// A minimal parallel loop over std::thread for host code that must be deterministic for any thread
// count: items are independent, so which thread runs which item never changes a result.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "common/fail.hpp"

namespace fp4moe::detail {

// 0 means one thread per hardware thread (at least 1). Negative counts are an error.
inline int resolve_threads(int requested) {
  require(requested >= 0, "threads={} is negative: expected 0 (all hardware threads) or a positive count",
          requested);
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Runs fn(i) for every i in [0, items) on up to `threads` threads (the caller is one of them),
// handing out items in order from a shared counter. The first exception thrown by fn stops the
// hand-out and is rethrown once every thread has joined.
template <typename Fn>
void parallel_for(std::int64_t items, int threads, const Fn& fn) {
  const auto workers = static_cast<int>(std::clamp<std::int64_t>(items, 1, std::max(threads, 1)));
  std::atomic<std::int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (std::int64_t i = next++; i < items && !failed; i = next++) {
      try {
        fn(i);
      } catch (...) {
        const std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(workers - 1));
  for (int w = 1; w < workers; ++w) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // the system refused another thread: the ones started (and this one) do all the items
    }
  }
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace fp4moe::detail
