// kernels::StreamSplit: the stream kernel's even split of items x K chunks over a grid's warps.
// The kernel trusts these properties (every unit streamed once, the partial slots and counters
// of cut items distinct), so they are checked here exhaustively over small grids and at the
// sizes the decode path launches.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "kernels/stream_gemm_layout.hpp"

namespace fp4moe {
namespace {

using kernels::StreamSplit;

// Walks the split the way the kernel does (a warp's run in item segments) and checks it.
void check_split(std::int64_t items, std::int64_t chunks, std::int64_t launched) {
  SCOPED_TRACE("items " + std::to_string(items) + " chunks " + std::to_string(chunks) + " warps " +
               std::to_string(launched));
  const StreamSplit s = StreamSplit::of(items, chunks, launched);
  const std::int64_t units = items * chunks;
  ASSERT_EQ(s.warps, std::min(launched, units));
  std::vector<int> streamed(static_cast<std::size_t>(units), 0);
  std::vector<std::vector<std::int64_t>> contributors(static_cast<std::size_t>(items));
  std::set<std::int64_t> slots;
  std::int64_t longest = 0, shortest = units;
  for (std::int64_t w = 0; w < s.warps; ++w) {
    const std::int64_t b = s.begin(w), e = s.begin(w + 1);
    ASSERT_LT(b, e) << "warp " << w << " has no unit";
    longest = std::max(longest, e - b);
    shortest = std::min(shortest, e - b);
    for (std::int64_t u = b; u < e; ++u) {
      ++streamed[static_cast<std::size_t>(u)];
      ASSERT_EQ(s.owner(u), w) << "unit " << u;
    }
    for (std::int64_t u = b; u < e;) {
      const std::int64_t item = u / chunks;
      const std::int64_t c0 = u - item * chunks;
      const std::int64_t c1 = std::min(chunks, c0 + (e - u));
      u += c1 - c0;
      contributors[static_cast<std::size_t>(item)].push_back(w);
      if (c0 == 0 && c1 == chunks) continue;  // whole: stored directly
      const std::int64_t slot = s.partial_slot(w, item);
      ASSERT_TRUE(slot == 2 * w || slot == 2 * w + 1);
      ASSERT_TRUE(slots.insert(slot).second) << "slot " << slot << " used twice";
    }
  }
  EXPECT_LE(longest - shortest, 1);  // even
  for (std::int64_t u = 0; u < units; ++u) ASSERT_EQ(streamed[static_cast<std::size_t>(u)], 1) << u;
  std::set<std::int64_t> counters;
  for (std::int64_t i = 0; i < items; ++i) {
    const auto& c = contributors[static_cast<std::size_t>(i)];
    // The contributors are exactly first_warp .. last_warp, in order.
    ASSERT_EQ(c.front(), s.first_warp(i));
    ASSERT_EQ(c.back(), s.last_warp(i));
    ASSERT_EQ(static_cast<std::int64_t>(c.size()), s.last_warp(i) - s.first_warp(i) + 1);
    if (c.size() > 1) {
      ASSERT_TRUE(counters.insert(s.first_warp(i)).second) << "counter shared, item " << i;
    }
  }
}

TEST(StreamSplit, EveryUnitOnceEvenRunsDistinctSlotsAndCounters) {
  for (std::int64_t items = 1; items <= 12; ++items)
    for (std::int64_t chunks = 1; chunks <= 7; ++chunks)
      for (std::int64_t warps = 1; warps <= 40; ++warps) check_split(items, chunks, warps);
}

TEST(StreamSplit, DecodeSizes) {
  // GLM-5 at T=1 on an H200 with 2 x 8-warp CTAs per SM: 9 experts (8 routed + the shared one)
  // x 64 row blocks of the first GEMM x 96 chunks, and 96 row blocks x 32 chunks of the second.
  check_split(576, 96, 2112);
  check_split(864, 32, 2112);
  // More warps than units, and a prime number of warps.
  check_split(3, 5, 2112);
  check_split(1000, 3, 1031);
}

TEST(StreamSplit, NoUnitsMeansOneIdleWarp) {
  const StreamSplit s = StreamSplit::of(0, 96, 2112);
  EXPECT_EQ(s.units, 0);
  EXPECT_EQ(s.warps, 1);
}

}  // namespace
}  // namespace fp4moe
