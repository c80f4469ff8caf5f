// A parallel loop for the io part's bulk work (copying experts, quantizing rows).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace fp4moe::io {

inline int thread_count(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Calls fn(i) for i in [0, n) on up to `threads` threads, items handed out one at a time. The
// first exception thrown stops the handing out and is rethrown here after every thread joined.
template <typename Fn>
void parallel_for(std::int64_t n, int threads, Fn&& fn) {
  const int workers =
      static_cast<int>(std::min<std::int64_t>(std::max(1, threads), std::max<std::int64_t>(n, 1)));
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&] {
    for (std::int64_t i = next++; i < n; i = next++) {
      try {
        fn(i);
      } catch (...) {
        const std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        next = n;
      }
    }
  };
  if (workers <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < workers; ++t) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace fp4moe::io
